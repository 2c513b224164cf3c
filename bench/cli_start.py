"""How fast the `kubetrain` command answers, against a bare interpreter start.

Side by side in the same run, each a fresh process, alternated round by round
so that the machine's load falls on all alike:

* `python -c pass`: the bare start, the unit of the targets;
* `kubetrain --help`;
* `kubetrain get jobs`: the HTTP client path, settings to printed table, against a
  loopback stub answering an empty page (the server's own time is not the CLI's);
* `kubetrain why --from-file` on a recorded 4-node dump (untolerated-taint.json).

Each command runs as the console script does (`from kubetrain.cli.main import
main`). Targets: --help and get jobs under 10x the bare start, why under 25x
(medians). Prints a table, writes bench/results/cli_start.json, exits 1 on a miss.

    .venv/bin/python bench/cli_start.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from _common import RESULTS, table

DUMP = Path(__file__).resolve().parent.parent / "tests/fixtures/snapshots/untolerated-taint.json"
ENTRY = "import sys; from kubetrain.cli.main import main; sys.exit(main())"
TARGETS = {"--help": 10.0, "get jobs": 10.0, "why --from-file": 25.0}


class _EmptyPage(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"items": [], "next_cursor": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def _time(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv[3:] or argv}: exit {done.returncode}: {done.stderr.strip()}")
    return elapsed


def main() -> int:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--rounds", type=int, default=15)
    rounds = options.parse_args().rounds

    server = ThreadingHTTPServer(("127.0.0.1", 0), _EmptyPage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as home:
        env = {
            **os.environ,
            "KUBETRAIN_CONFIG": str(Path(home) / "absent.toml"),
            "KUBETRAIN_URL": f"http://127.0.0.1:{server.server_address[1]}",
            "KUBETRAIN_TOKEN": "kt_bench",  # the stub checks nothing
            "KUBETRAIN_PROJECT": "bench",
        }
        python = sys.executable
        commands = {
            "bare start": [python, "-c", "pass"],
            "--help": [python, "-c", ENTRY, "--help"],
            "get jobs": [python, "-c", ENTRY, "get", "jobs"],
            "why --from-file": [python, "-c", ENTRY, "why", "--from-file", str(DUMP)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # warm the file cache and the bytecode
            _time(argv, env)
        for _ in range(rounds):
            for name, argv in commands.items():
                times[name].append(_time(argv, env))
    server.shutdown()

    bare = statistics.median(times["bare start"])
    rows, results, missed = [], {}, []
    for name, values in times.items():
        median = statistics.median(values)
        ratio = median / bare
        target = TARGETS.get(name)
        verdict = "-" if target is None else ("met" if ratio < target else "MISSED")
        if verdict == "MISSED":
            missed.append(name)
        rows.append((name, median * 1000, min(values) * 1000, ratio, target or "", verdict))
        results[name] = {
            "median_s": median,
            "min_s": min(values),
            "times_s": values,
            "ratio_to_bare": ratio,
            "target_ratio": target,
        }
    print(
        table(
            ("command", "median ms", "min ms", "x bare", "target x", ""),
            rows,
            (18, 11, 9, 9, 10, 8),
        )
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli_start.json").write_text(
        json.dumps({"rounds": rounds, "python": sys.version, "commands": results}, indent=2)
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
