"""tiny_training's run as a gang: each rank its own data order and dropout, gradients summed
over gloo (CPU). Run by torchrun, one per worker:

    torchrun tests/runtime/tiny_gang.py ROOT STEPS BLOCKING

ROOT is the shared checkpoint directory; each rank appends `step loss` lines to
ROOT/losses-<rank>, writes its pid to ROOT/pids/rank-<rank> (torchrun starts it in
a session of its own, which the test kills too) and rank 0 writes ROOT/final.pt.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from kubetrain.runtime.checkpoint import CheckpointManager
from tests.runtime.tiny_training import BINDING, build, data

SAVE_EVERY = 5


def main(root: Path, steps: int, blocking: bool) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://, from what torchrun sets
    rank, world = dist.get_rank(), dist.get_world_size()
    pids = root / "pids"
    pids.mkdir(exist_ok=True)
    (pids / f"rank-{rank}.tmp").write_text(str(os.getpid()))
    (pids / f"rank-{rank}.tmp").rename(pids / f"rank-{rank}")
    model, optimizer, scheduler = build()  # the same initial weights on every rank
    torch.manual_seed(100 + rank)  # then each rank its own batches and dropout masks
    random.seed(100 + rank)
    x, y = data()
    manager = CheckpointManager(root, keep_last=2, binding=BINDING)
    start = manager.resume(model=model, optimizer=optimizer, scheduler=scheduler) or 0
    with (root / f"losses-{rank}").open("a") as log:
        log.write(f"resumed {start}\n")
        log.flush()
        for step in range(start + 1, steps + 1):
            batch = torch.randperm(len(x))[:32]
            noise = random.random() * 1e-3  # noqa: S311 - state the resume must restore
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch]) + noise
            loss.backward()  # type: ignore[no-untyped-call]
            for parameter in model.parameters():
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad)  # two ranks: a + b, the same bits on both
                parameter.grad /= world
            optimizer.step()
            scheduler.step()
            log.write(f"{step} {loss.item().hex()}\n")
            log.flush()
            if step % SAVE_EVERY == 0:
                manager.save(
                    step, model=model, optimizer=optimizer, scheduler=scheduler, blocking=blocking
                )
    manager.close()
    if rank == 0:
        torch.save(model.state_dict(), root / "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "blocking")
