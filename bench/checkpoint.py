"""Checkpoint save time: CheckpointManager vs torch.save vs torch.distributed.checkpoint vs disk.

One run, one directory, the same state (a model of --size MiB of float32
weights plus an SGD momentum buffer of the same size, so the state is twice
--size): the raw sequential write speed of the disk (8 MiB writes + fsync;
and the same with the writeback started every 32 MiB, as the manager does),
`torch.save` alone and followed by an fsync, `torch.distributed.checkpoint.save`
(single process), `CheckpointManager.save` blocking, the verification of what
it wrote (`latest_valid`, the checksum a resume computes), and the time an async
save blocks the loop next to the time of copying the state into host memory,
both into new tensors (a clone) and into tensors held from the round before
(what the manager's staging buffers are, from its second async save on).
The rows run in rounds (every row once per round, --repeat rounds), so a
change of the machine's load touches them all alike; the median is reported.
A first round (--warmup) is run and not counted: on a fresh VM, memory and
disk blocks touched for the first time cost several times what they cost
after (seen here: 2-4 s for a row that takes 0.1-0.7 s from the second round on).

    .venv/bin/python bench/checkpoint.py --size 512 --repeat 3 --dir /tmp
    python bench/checkpoint.py --size 512 --device cuda   # the state on a GPU

With --device cuda the model and its optimizer state live on the GPU: every
save then starts with a copy to host memory (torch.save's and DCP's too), the
host-copy rows copy from the GPU, and the held buffers are pinned, as the
manager's staging buffers are.

Run it with PYTHONPATH pointing at another checkout to measure that
checkout's CheckpointManager with the same script.
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
from functools import partial
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, table

from kubetrain.runtime import checkpoint
from kubetrain.runtime.checkpoint import CheckpointManager

MIB = 1 << 20
CHUNK = 8 * MIB
WRITEBACK_EVERY = 32 * MIB
DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)
ASYNC = "CheckpointManager.save(blocking=False), blocked"
VERIFY = "CheckpointManager.latest_valid (checksum, warm cache)"
HOST_COPY = "copy state to host memory (new tensors)"
HELD_COPY = "copy state into host tensors held from the last round"
NO_RATE = (HOST_COPY, HELD_COPY, ASYNC)


def _model(size_mib: int, device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    side = int((size_mib * MIB / 4 / 4) ** 0.5)  # four square float32 layers
    model = torch.nn.Sequential(*[torch.nn.Linear(side, side, bias=False) for _ in range(4)])
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, side, device=device)).sum().backward()
    optimizer.step()  # creates the momentum buffers
    return model, optimizer


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
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write")
    parser.add_argument("--device", default="cpu", help="where the state lives: cpu or cuda")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, optimizer = _model(args.size, args.device)
    on_gpu = args.device != "cpu"
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 2
    work = Path(tempfile.mkdtemp(prefix="kubetrain-bench-", dir=args.dir))
    block = os.urandom(CHUNK)
    times: dict[str, list[float]] = {}
    # CPU seconds of this process (all threads) during the row: what the load of
    # a shared machine changes least, so it shows where the wall time goes.
    cpu_times: dict[str, list[float]] = {}
    try:

        def raw(index: int, writeback: bool = False) -> None:
            path = work / f"raw-{index}"
            with path.open("wb", buffering=0) as out:
                started = 0
                for written in range(CHUNK, state_bytes + 1, CHUNK):
                    out.write(block)
                    if writeback and written - started >= WRITEBACK_EVERY:
                        os.posix_fadvise(out.fileno(), started, written - started, DONTNEED)
                        started = written
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

        def verify(index: int) -> None:
            assert manager.latest_valid() is not None  # the checksum of what `managed` wrote

        def copy_to_host(index: int) -> None:
            {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            {k: v for k, v in optimizer.state_dict().items()}
            for group in optimizer.state.values():
                for value in group.values():
                    if isinstance(value, torch.Tensor):
                        value.to("cpu", copy=True)

        def tensors() -> list[torch.Tensor]:
            found = list(model.state_dict().values())
            for group in optimizer.state.values():
                found += [value for value in group.values() if isinstance(value, torch.Tensor)]
            return found

        # Untimed: allocated once, like the manager's staging (pinned, for a GPU's state).
        held = [torch.empty_like(t, device="cpu", pin_memory=on_gpu) for t in tensors()]

        def copy_into_held(index: int) -> None:
            for target, source in zip(held, tensors(), strict=True):
                target.copy_(source)

        async_manager = CheckpointManager(work / "async", keep_last=1)

        def async_save(index: int) -> None:
            async_manager.save(index, model=model, optimizer=optimizer, blocking=False)

        rows: list[tuple[str, Callable[[int], None]]] = [
            ("raw disk write + fsync", raw),
            ("raw disk write + fsync, writeback every 32 MiB", partial(raw, writeback=True)),
            ("torch.save", plain),
            ("torch.save + fsync", plain_fsync),
            ("torch.distributed.checkpoint.save", dcp),
            ("CheckpointManager.save", managed),
            (VERIFY, verify),
            (HOST_COPY, copy_to_host),
            (HELD_COPY, copy_into_held),
            (ASYNC, async_save),
        ]
        for index in range(args.warmup + args.repeat):
            for name, run in rows:
                started, cpu = time.perf_counter(), time.process_time()
                run(index)
                if index >= args.warmup:
                    times.setdefault(name, []).append(time.perf_counter() - started)
                    cpu_times.setdefault(name, []).append(time.process_time() - cpu)
                async_manager.wait()  # the background write is not the loop's time
                for leftover in work.glob("*-*"):  # what a row wrote is not the next one's cache
                    if leftover.is_file():
                        leftover.unlink()
                    else:
                        shutil.rmtree(leftover)
                # Untimed: the journal commit that frees (and, mounted with discard,
                # trims) what was deleted would otherwise land in the next row's fsync.
                os.sync()
        async_manager.close()
        manager.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    # Median and best of the rounds: on a VM whose host is shared, a row now and
    # then takes 2-4x its usual time, CPU seconds included (time the vCPU was
    # not running counts as the process's); the best is what the code costs.
    results = {name: statistics.median(values) for name, values in times.items()}
    best = {name: min(values) for name, values in times.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpu_times.items()}
    table_rows = [
        (
            name,
            seconds,
            best[name],
            state_bytes / MIB / best[name] if name not in NO_RATE else float("nan"),
            cpu_medians[name],
        )
        for name, seconds in results.items()
    ]
    print(
        f"state: {state_bytes / MIB:.0f} MiB on {args.device}, dir: {args.dir}, "
        f"{args.repeat} rounds after {args.warmup} warm-up round(s)"
    )
    print(
        table(
            ["what", "median s", "best s", "MiB/s best", "CPU s"],
            table_rows,
            [52, 10, 10, 12, 8],
        )
    )

    def ratios_of(of: dict[str, float]) -> dict[str, float]:
        return {
            "managed_vs_torch_save": of["CheckpointManager.save"] / of["torch.save"],
            "managed_vs_torch_save_fsync": of["CheckpointManager.save"] / of["torch.save + fsync"],
            "managed_vs_raw_bandwidth": of["raw disk write + fsync"] / of["CheckpointManager.save"],
            "managed_vs_raw_writeback_bandwidth": of[
                "raw disk write + fsync, writeback every 32 MiB"
            ]
            / of["CheckpointManager.save"],
            "async_blocked_vs_host_copy": of[ASYNC] / of[HOST_COPY],
            "async_blocked_vs_held_copy": of[ASYNC] / of[HELD_COPY],
        }

    ratios: dict[str, Any] = ratios_of(results)
    best_ratios = ratios_of(best)
    print(f"{'ratio':36s} {'medians':>8s} {'bests':>8s}")
    for key, value in ratios.items():
        print(f"{key:36s} {value:8.2f} {best_ratios[key]:8.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / ("checkpoint-gpu.json" if on_gpu else "checkpoint.json")).write_text(
        json.dumps(
            {
                "state_mib": state_bytes / MIB,
                "device": args.device,
                "device_name": torch.cuda.get_device_name() if on_gpu else None,
                "torch": torch.__version__,
                "dir": args.dir,
                "repeat": args.repeat,
                "warmup": args.warmup,
                "seconds": results,
                "runs": times,
                "cpu_seconds": cpu_medians,
                "cpu_runs": cpu_times,
                "manager": str(Path(checkpoint.__file__).parent),
                "ratios": ratios,
                "best_seconds": best,
                "best_ratios": best_ratios,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
