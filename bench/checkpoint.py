"""Checkpoint save time: CheckpointManager vs torch.save vs torch.distributed.checkpoint vs disk.

One run, one directory, the same state (a model of --size MiB of float32
weights plus an SGD momentum buffer of the same size, so the state is twice
--size): the raw sequential write speed of the disk (8 MiB writes + fsync),
`torch.save` alone and followed by an fsync, `torch.distributed.checkpoint.save`
(single process), `CheckpointManager.save` blocking, and the time an async
save blocks the loop next to the time of copying the state into host memory.
Each is repeated --repeat times; the median is reported.

    .venv/bin/python bench/checkpoint.py --size 256 --dir /tmp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, table

from kubetrain.runtime.checkpoint import CheckpointManager

MIB = 1 << 20
CHUNK = 8 * MIB


def _model(size_mib: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    side = int((size_mib * MIB / 4 / 4) ** 0.5)  # four square float32 layers
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(4)])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, side)).sum().backward()
    optimizer.step()  # creates the momentum buffers
    return model, optimizer


def _median(repeat: int, run: Callable[[int], None]) -> float:
    times = []
    for index in range(repeat):
        started = time.perf_counter()
        run(index)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="MiB of weights (state: twice)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer = _model(args.size)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 2
    work = Path(tempfile.mkdtemp(prefix="kubetrain-bench-", dir=args.dir))
    block = os.urandom(CHUNK)
    results: dict[str, float] = {}
    try:

        def raw(index: int) -> None:
            path = work / f"raw-{index}"
            with path.open("wb", buffering=0) as out:
                for _ in range(state_bytes // CHUNK):
                    out.write(block)
                os.fsync(out.fileno())

        def plain(index: int) -> None:
            torch.save(state, work / f"plain-{index}.pt")

        def plain_fsync(index: int) -> None:
            torch.save(state, work / f"plainf-{index}.pt")
            _fsync(work / f"plainf-{index}.pt")

        def dcp(index: int) -> None:
            from torch.distributed.checkpoint import state_dict_saver

            state_dict_saver.save(state, checkpoint_id=str(work / f"dcp-{index}"))

        manager = CheckpointManager(work / "managed", keep_last=1)

        def managed(index: int) -> None:
            manager.save(index, model=model, optimizer=optimizer)

        def copy_to_host(index: int) -> None:
            {k: v.detach().clone() for k, v in model.state_dict().items()}
            {k: v for k, v in optimizer.state_dict().items()}
            for group in optimizer.state.values():
                for value in group.values():
                    if isinstance(value, torch.Tensor):
                        value.clone()

        async_manager = CheckpointManager(work / "async", keep_last=1)

        def async_blocking(index: int) -> None:
            async_manager.wait()  # the previous write is not the loop's time here
            started = time.perf_counter()
            async_manager.save(index, model=model, optimizer=optimizer, blocking=False)
            results.setdefault("_async", 0.0)
            results["_async_runs"] = results.get("_async_runs", 0.0) + 1
            results["_async"] += time.perf_counter() - started

        for name, run in [
            ("raw disk write + fsync", raw),
            ("torch.save", plain),
            ("torch.save + fsync", plain_fsync),
            ("torch.distributed.checkpoint.save", dcp),
            ("CheckpointManager.save", managed),
            ("copy state to host memory", copy_to_host),
        ]:
            results[name] = _median(args.repeat, run)
            for leftover in work.glob("raw-*"):
                leftover.unlink()
        for index in range(args.repeat):
            async_blocking(index)
        async_manager.close()
        results["CheckpointManager.save(blocking=False), blocked"] = results.pop(
            "_async"
        ) / results.pop("_async_runs")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rows = [
        (name, seconds, state_bytes / MIB / seconds if "copy" not in name else float("nan"))
        for name, seconds in results.items()
    ]
    print(f"state: {state_bytes / MIB:.0f} MiB, dir: {args.dir}, median of {args.repeat}")
    print(table(["what", "seconds", "MiB/s"], rows, [52, 10, 10]))
    base = results["torch.save"]
    ratios: dict[str, Any] = {
        "managed_vs_torch_save": results["CheckpointManager.save"] / base,
        "managed_vs_torch_save_fsync": results["CheckpointManager.save"]
        / results["torch.save + fsync"],
        "managed_vs_raw_bandwidth": results["raw disk write + fsync"]
        / results["CheckpointManager.save"],
        "async_blocked_vs_host_copy": results["CheckpointManager.save(blocking=False), blocked"]
        / results["copy state to host memory"],
    }
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "checkpoint.json").write_text(
        json.dumps(
            {
                "state_mib": state_bytes / MIB,
                "dir": args.dir,
                "repeat": args.repeat,
                "seconds": results,
                "ratios": ratios,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
