"""What the progress reporter costs training when the control plane is down.

Side by side in the same run, alternated round by round so that the machine's
load falls on both alike:

* steps: `--steps` calls of `Reporter.step()` against a server that answers at
  once (the baseline), and against one that takes the first batch and never
  answers (the reporter's queue fills and drops). Target: the down server's
  median round under 2x the answering one's (training never waits for the network);
  the unit of the old test's bound (1,000 steps under 1 s) is printed beside it.
* close: `Reporter.close(--bound)` with one event queued, against the server
  that answers (the baseline) and the one that never does. Target: under 2x the
  bound (a flush is bounded whatever the server does).

The standard library and kubetrain.runtime only, like the runtime itself. Prints a
table, writes bench/results/progress.json, exits 1 on a miss.

    .venv/bin/python bench/progress.py [--rounds 15] [--steps 1000] [--bound 0.5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from _common import RESULTS, table

from kubetrain.runtime.progress import Reporter

STEP_RATIO, CLOSE_RATIO = 2.0, 2.0


@contextmanager
def _server(answers: bool) -> Iterator[str]:
    """A reports endpoint that answers 202 at once, or holds every request until stopped."""
    stop = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            if not answers:
                stop.wait()
            self.send_response(202)
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def _reporter(url: str, timeout: float) -> Reporter:
    return Reporter(url, "job-bench", "token", "job-bench-0", backoff=(0.05,), timeout=timeout)


def _steps(url: str, steps: int) -> float:
    reporter = _reporter(url, timeout=60)
    reporter.phase("TRAINING")
    began = time.perf_counter()
    for step in range(1, steps + 1):
        reporter.step(step, loss=0.5)
    took = time.perf_counter() - began
    reporter.close(0)
    return took


def _close(url: str, bound: float) -> float:
    reporter = _reporter(url, timeout=0.2)
    reporter.step(1, loss=1.0)
    began = time.perf_counter()
    reporter.close(bound)
    return time.perf_counter() - began


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--rounds", type=int, default=15)
    options.add_argument("--steps", type=int, default=1000)
    options.add_argument("--bound", type=float, default=0.5)
    args = options.parse_args()

    cases = ("steps up", "steps down", "close up", "close down")
    samples: dict[str, list[float]] = {k: [] for k in cases}
    with _server(answers=True) as up, _server(answers=False) as down:
        for _ in range(args.rounds):
            samples["steps up"].append(_steps(up, args.steps))
            samples["steps down"].append(_steps(down, args.steps))
            samples["close up"].append(_close(up, args.bound))
            samples["close down"].append(_close(down, args.bound))
    median = {k: statistics.median(v) for k, v in samples.items()}
    step_ratio = median["steps down"] / median["steps up"]
    close_ratio = median["close down"] / args.bound
    missed = [
        what
        for what, ratio, target in (
            ("steps", step_ratio, STEP_RATIO),
            ("close", close_ratio, CLOSE_RATIO),
        )
        if ratio >= target
    ]
    rows = [
        [f"{args.steps} steps, server answers (baseline)", median["steps up"] * 1000, "-", "-"],
        [
            f"{args.steps} steps, server never answers",
            median["steps down"] * 1000,
            step_ratio,
            f"< {STEP_RATIO}x baseline",
        ],
        ["close, server answers (baseline)", median["close up"] * 1000, "-", "-"],
        [
            f"close({args.bound}), server never answers",
            median["close down"] * 1000,
            close_ratio,
            f"< {CLOSE_RATIO}x bound",
        ],
    ]
    print(f"{args.rounds} rounds; medians")
    print(table(["case", "ms", "ratio", "target"], rows, [44, 10, 8, 18]))
    print("targets: " + ("MISSED " + ", ".join(missed) if missed else "met"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "progress.json"
    report = {
        "rounds": args.rounds,
        "steps": args.steps,
        "bound_s": args.bound,
        "median_s": {k: round(v, 4) for k, v in median.items()},
        "step_ratio": round(step_ratio, 2),
        "close_ratio": round(close_ratio, 2),
        "missed": missed,
    }
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
