"""A gang's sharded checkpoint save vs one process saving the same total state, in one run.

--ranks processes (gloo, CPU, this machine) each hold 1/--ranks of the state
(square float32 layers plus their SGD momentum: --size MiB of weights in all, so
twice that of state) and save it together through CheckpointManager: every rank
writes and checksums its shard, rank 0 commits the one manifest. In the same
run, rank 0 alone saves the whole state (every rank's tensors, the same shapes)
with torch.save, torch.save + fsync (durable, as the manager's is) and a
single-process CheckpointManager.save. The rows run in rounds (every row once
per round, --repeat rounds after --warmup), so a change of the machine's load
touches them all alike; median and best are reported. A gang save's time runs
from a barrier all ranks leave together to one all have reached after saving.

    .venv/bin/python bench/checkpoint_gang.py --size 512 --ranks 4 --repeat 3 --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _common import RESULTS, table
from torch.multiprocessing.spawn import spawn

from kubetrain.runtime.checkpoint import CheckpointManager

MIB = 1 << 20
GANG = "{ranks} ranks: CheckpointManager.save, one shard each"
ALONE_SAVE = "1 rank: torch.save of the whole state"
ALONE_SAVE_FSYNC = "1 rank: torch.save + fsync of the whole state"
ALONE_MANAGED = "1 rank: CheckpointManager.save of the whole state"


def _shard(weights_mib: float, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Two square float32 layers of `weights_mib` in all, with their momentum buffers."""
    torch.manual_seed(seed)
    side = int((weights_mib * MIB / 4 / 2) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(2)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, side)).sum().backward()
    optimizer.step()
    return model, optimizer


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rank(rank: int, args: argparse.Namespace, port: int, work: Path, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    model, optimizer = _shard(args.size / args.ranks, seed=rank)
    gang = CheckpointManager(work / "gang", keep_last=1)
    whole: dict[str, Any] | None = None
    alone: CheckpointManager | None = None
    if rank == 0:  # every rank's shard, in one process
        shards = [_shard(args.size / args.ranks, seed=r) for r in range(args.ranks)]
        whole = {
            "model": {
                f"{r}.{k}": v for r, (m, _) in enumerate(shards) for k, v in m.state_dict().items()
            },
            "optimizer": [o.state_dict() for _, o in shards],
        }
        alone = CheckpointManager(work / "alone", keep_last=1, distributed=False)
    times: dict[str, list[float]] = {}
    for index in range(args.warmup + args.repeat):
        rows: dict[str, float] = {}
        os.sync()  # what the rows before wrote and deleted is not this one's to flush
        dist.barrier()
        started = time.perf_counter()
        gang.save(index, model=model, optimizer=optimizer)
        dist.barrier()
        rows[GANG.format(ranks=args.ranks)] = time.perf_counter() - started
        if rank == 0:
            assert whole is not None
            assert alone is not None
            os.sync()
            started = time.perf_counter()
            torch.save(whole, work / f"plain-{index}.pt")
            rows[ALONE_SAVE] = time.perf_counter() - started
            os.unlink(work / f"plain-{index}.pt")
            os.sync()
            started = time.perf_counter()
            torch.save(whole, work / f"plainf-{index}.pt")
            _fsync(work / f"plainf-{index}.pt")
            rows[ALONE_SAVE_FSYNC] = time.perf_counter() - started
            os.unlink(work / f"plainf-{index}.pt")
            os.sync()
            started = time.perf_counter()
            alone.save(
                index, model=_Whole(whole["model"]), optimizer=None, extra=whole["optimizer"]
            )
            rows[ALONE_MANAGED] = time.perf_counter() - started
            os.sync()
        dist.barrier()
        if index >= args.warmup:
            for name, seconds in rows.items():
                times.setdefault(name, []).append(seconds)
    gang.close()
    if alone is not None:
        alone.close()
    if rank == 0:
        out.write_text(json.dumps(times))
    dist.destroy_process_group()


class _Whole(torch.nn.Module):
    """A module whose state_dict is a given dict of tensors (the whole model, all shards)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._tensors = tensors

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return self._tensors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size", type=int, default=256, help="MiB of weights in all (state: twice)"
    )
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    args = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    work = Path(tempfile.mkdtemp(prefix="kubetrain-bench-gang-", dir=args.dir))
    out = work / "times.json"
    try:
        spawn(_rank, args=(args, port, work, out), nprocs=args.ranks, join=True)  # type: ignore[no-untyped-call]
        times: dict[str, list[float]] = json.loads(out.read_text())
        state_bytes = sum(f.stat().st_size for f in (work / "gang").glob("step-*/rank-*.pt"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    best = {name: min(values) for name, values in times.items()}
    print(
        f"state: {state_bytes / MIB:.0f} MiB in {args.ranks} shards, dir: {args.dir}, "
        f"{os.cpu_count()} CPUs, {args.repeat} rounds after {args.warmup} warm-up round(s)"
    )
    print(
        table(
            ["what", "median s", "best s", "MiB/s best"],
            [(n, medians[n], best[n], state_bytes / MIB / best[n]) for n in medians],
            [52, 10, 10, 12],
        )
    )
    gang = GANG.format(ranks=args.ranks)
    ratios = {
        "gang_vs_torch_save": medians[gang] / medians[ALONE_SAVE],
        "gang_vs_torch_save_fsync": medians[gang] / medians[ALONE_SAVE_FSYNC],
        "gang_vs_one_rank_manager": medians[gang] / medians[ALONE_MANAGED],
    }
    for key, value in ratios.items():
        print(f"{key:28s} {value:6.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoint-gang.json").write_text(
        json.dumps(
            {
                "state_mib": state_bytes / MIB,
                "ranks": args.ranks,
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "dir": args.dir,
                "repeat": args.repeat,
                "warmup": args.warmup,
                "seconds": medians,
                "best_seconds": best,
                "runs": times,
                "ratios": ratios,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
