"""How long the training container's preflight takes, against a bare interpreter start.

The timing bounds that were once asserted in tests/runtime/test_preflight.py live
here, where a loaded machine makes a figure late rather than a test red. Side by
side in the same run, each a fresh process, alternated round by round:

* `python -c pass`: the bare start;
* `kubetrain run --preflight` with every check passing (rank 0 of a gang of two, no
  GPU expected, a dataset, checkpoint and output directories on a tmpfs): the sum of
  the checks' own seconds (target < 2 s) and the whole process (target < 5 s);
* rank 1 whose rank 0 never listens, with a 1 s rendezvous bound: the whole process
  must fail within the bound plus starting Python (target < 5 s), never torchrun's
  600 s.

Prints a table, writes bench/results/preflight.json, exits 1 on a miss.

    .venv/bin/python bench/preflight.py [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _common import RESULTS, table

SRC = Path(__file__).resolve().parent.parent / "src"
PREFLIGHT_EXIT_CODE = 86  # kubetrain.runtime.contract; the bench imports nothing of it
TARGETS_S = {"checks (sum)": 2.0, "run --preflight": 5.0, "rendezvous refused": 5.0}


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(202)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _job_env(volume: Path, status_url: str) -> dict[str, str]:
    """The environment of tests/runtime/test_preflight.py's `job`: every check passes."""
    data = volume / "data"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.bin").write_bytes(b"a" * 1000)
    (volume / "checkpoints").mkdir()
    (volume / "output").mkdir()
    (volume / "config.json").write_text('{"lr": 0.1}')
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KUBETRAIN_", "NVIDIA_", "CUDA_"))
    }
    env.update(
        PYTHONPATH=str(SRC),
        KUBETRAIN_JOB_ID="bench-1",
        KUBETRAIN_EXPECTED_GPUS="0",
        KUBETRAIN_DATASET_PATH=str(data),
        KUBETRAIN_CONFIG_PATH=str(volume / "config.json"),
        KUBETRAIN_CHECKPOINT_DIR=str(volume / "checkpoints"),
        KUBETRAIN_OUTPUT_DIR=str(volume / "output"),
        KUBETRAIN_STATUS_URL=status_url,
        KUBETRAIN_TERMINATION_LOG=str(volume / "termination-log"),
        KUBETRAIN_WORKERS="2",
        KUBETRAIN_WORKER_INDEX="0",
        PET_NNODES="2",
        PET_NPROC_PER_NODE="1",
        PET_NODE_RANK="0",
        PET_MASTER_ADDR="localhost",
        PET_MASTER_PORT=str(_closed_port()),
    )
    return env


def _run(argv: list[str], env: dict[str, str], expect: int) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != expect:
        raise SystemExit(f"{argv}: exit {done.returncode}, not {expect}: {done.stderr[-2000:]}")
    return elapsed, done.stdout


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--rounds", type=int, default=10)
    rounds = options.parse_args().rounds

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    status_url = f"http://127.0.0.1:{server.server_address[1]}"
    volume = Path(tempfile.mkdtemp(prefix="kubetrain-bench-", dir="/dev/shm"))
    try:
        job = _job_env(volume, status_url)
        rank1 = {
            **job,
            "PET_NODE_RANK": "1",
            "KUBETRAIN_WORKER_INDEX": "1",
            "KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS": "1",
        }
        runtime = [sys.executable, "-m", "kubetrain.runtime"]
        times: dict[str, list[float]] = {name: [] for name in ("bare start", *TARGETS_S)}
        _run([*runtime, "run", "--preflight"], job, 0)  # warm the file cache and bytecode
        for _ in range(rounds):
            times["bare start"].append(_run([sys.executable, "-c", "pass"], job, 0)[0])
            took, out = _run([*runtime, "run", "--preflight"], job, 0)
            times["run --preflight"].append(took)
            times["checks (sum)"].append(sum(c["seconds"] for c in json.loads(out)["checks"]))
            refused = [*runtime, "run", "--", "true"]
            times["rendezvous refused"].append(_run(refused, rank1, PREFLIGHT_EXIT_CODE)[0])
    finally:
        server.shutdown()
        shutil.rmtree(volume, ignore_errors=True)

    bare = statistics.median(times["bare start"])
    rows, results, missed = [], {}, []
    for name, values in times.items():
        median, worst = statistics.median(values), max(values)
        target = TARGETS_S.get(name)
        verdict = "-" if target is None else ("met" if worst < target else "MISSED")
        if verdict == "MISSED":
            missed.append(name)
        rows.append((name, median * 1000, worst * 1000, median / bare, target or "", verdict))
        results[name] = {"median_s": median, "max_s": worst, "times_s": values, "target_s": target}
    print(
        table(
            ("what", "median ms", "max ms", "x bare", "target s", ""),
            rows,
            (20, 11, 9, 8, 10, 8),
        )
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "preflight.json").write_text(
        json.dumps({"rounds": rounds, "python": sys.version, "results": results}, indent=2)
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
