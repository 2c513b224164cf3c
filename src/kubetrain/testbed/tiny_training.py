"""A tiny training run for the real-node pool: real torch on CPU, real checkpoints.

    kubetrain run -- python -m kubetrain.testbed.tiny_training --steps 80 --every 5

A two-layer network learns a fixed linear map from batches drawn from torch's
global random generator. Every `--every` steps it saves a checkpoint to
$KUBETRAIN_CHECKPOINT_DIR through kubetrain's CheckpointManager (model,
optimizer, scheduler and the random generators), bound to the dataset version,
this file's sha256 and the parameters; a new Pod resumes from the newest valid
one. It reports each step to kubetrain serve (kubetrain.runtime.progress) and
prints each step's loss exactly (`repr`) and, at the end, the sha256 of the
final weights: a run resumed from a checkpoint prints the same lines from there
on as a run never interrupted, and the same digest, bit for bit (one thread, so
the order of floating-point sums never changes).

`--step-seconds` only paces the run (a node can be lost mid-way); it is not
part of the binding.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kubetrain.runtime import progress
from kubetrain.runtime.checkpoint import CheckpointManager

if TYPE_CHECKING:
    import torch


def code_version() -> str:
    return "sha256:" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def weights_sha256(model: torch.nn.Module) -> str:
    """The digest of every parameter's bytes, in the state dict's order."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiny_training")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pace: sleep per step")
    args = parser.parse_args(argv)
    root = os.environ.get("KUBETRAIN_CHECKPOINT_DIR")
    if not root:
        print("tiny_training: KUBETRAIN_CHECKPOINT_DIR is not set", file=sys.stderr)
        return 2

    import torch

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    target = torch.randn(8, 1, generator=torch.Generator().manual_seed(1234))
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    params = {"steps": args.steps, "every": args.every, "seed": args.seed, "lr": args.lr}
    binding = {
        "dataset_version": os.environ.get("KUBETRAIN_DATASET_VERSION", "none"),
        "code_version": code_version(),
        "params": params,
    }
    manager = CheckpointManager(root, keep_last=3, binding=binding)
    start = manager.resume(model=model, optimizer=optimizer, scheduler=scheduler) or 0
    if manager.resumed is not None:
        print(f"resumed from step {start} (written by {manager.resumed.pod})", flush=True)
    else:
        print("starting from step 0", flush=True)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(16, 8)  # the global generator: saved and restored by the manager
        y = x @ target + 0.1 * torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
        progress.step(step, loss=loss.item(), lr=float(scheduler.get_last_lr()[0]))
        if step % args.every == 0 or step == args.steps:
            manager.save(
                step, model=model, optimizer=optimizer, scheduler=scheduler, blocking=False
            )
        time.sleep(args.step_seconds)
    manager.close()
    print(f"final weights sha256 {weights_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
