"""Submissions per second and p50/p99 latency of POST /api/v1/projects/{p}/jobs.

Against a real `kubetrain serve --no-control` subprocess (API and database only;
no testbed; one process), on SQLite and on PostgreSQL, with N client threads
each sending M submissions (each its own Idempotency-Key). Side by side in the
same run:

* the same clients on `GET /healthz`: the HTTP framework's floor;
* with `--baseline-src DIR`, the same POST jobs against a second server run
  from another source tree (e.g. /work/main/src, the code before a change),
  in rounds alternating with this tree's (`--rounds`), each on its own fresh
  database: before/after in the same conditions;
* raw `store.submit_and_commit` inserts (the API's store call) in this process,
  N threads, one transaction each: the database's floor.

Each HTTP phase also reports the server's CPU time per answer (from /proc):
on a shared, noisy machine the rates move with the other work, that figure
much less. Prints a table and writes bench/results/submit.json.

    .venv/bin/python bench/submit.py [--threads 8] [--per-thread 250]
        [--databases sqlite postgresql] [--baseline-src DIR] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg

from _common import RESULTS, percentile, table
from _plots import paired_bars
from _serve import Serve, training_job

from kubetrain.domain.spec import parse_training_job, spec_digest
from kubetrain.store import Database, NewSubmission, submit_and_commit

TARGET_PER_S = 200
TARGET_RATIO = 0.6  # POST jobs against GET /healthz of the same server, same run (#28)


def run_threads(
    threads: int, per_thread: int, make: Callable[[int], Callable[[int], None]]
) -> dict[str, Any]:
    """`make(thread)` returns the per-request call; returns throughput and latencies in ms."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def worker(index: int) -> None:
        call = make(index)
        mine: list[float] = []
        start.wait()
        for i in range(per_thread):
            began = time.perf_counter()
            try:
                call(i)
            except Exception as exc:
                with lock:
                    errors.append(repr(exc)[:200])
                continue
            mine.append((time.perf_counter() - began) * 1000)
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for thread in pool:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in pool:
        thread.join()
    wall = time.perf_counter() - began
    return {
        "requests": threads * per_thread,
        "ok": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "wall_s": round(wall, 3),
        "per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
    }


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def http_phase(server: Serve, threads: int, per_thread: int, what: str) -> dict[str, Any]:
    """The phase's throughput and latencies, and the server's CPU time per answered request:
    the figure that the other work on a shared machine disturbs least."""
    assert server.proc is not None
    cpu_before = process_cpu_s(server.proc.pid)
    result = _http_phase(server, threads, per_thread, what)
    cpu = process_cpu_s(server.proc.pid) - cpu_before
    result["server_cpu_ms"] = round(cpu * 1000 / max(1, result["ok"]), 2)
    return result


def _http_phase(server: Serve, threads: int, per_thread: int, what: str) -> dict[str, Any]:
    run = uuid.uuid4().hex[:6]

    def make(index: int) -> Callable[[int], None]:
        client = server.client()
        project = f"bench-{index % 4}"

        def healthz(_: int) -> None:
            client.get("/healthz").raise_for_status()

        def submit(i: int) -> None:
            name = f"b-{run}-{index}-{i}"
            response = client.post(
                f"/api/v1/projects/{project}/jobs",
                json=training_job(name, project),
                headers={"Idempotency-Key": f"{run}-{index}-{i}"},
            )
            if response.status_code != 201:
                raise RuntimeError(f"{response.status_code} {response.text[:150]}")

        client.get("/healthz")  # connect before the clock starts
        return healthz if what == "healthz" else submit

    return run_threads(threads, per_thread, make)


def raw_phase(database_url: str, threads: int, per_thread: int) -> dict[str, Any]:
    from kubetrain.cli.serve import open_database

    db: Database = open_database(database_url)  # the server's own engine options
    run = uuid.uuid4().hex[:6]
    document = training_job("x", "raw")
    spec = document["spec"]
    digest = spec_digest(parse_training_job(document, project="raw"))
    try:

        def make(index: int) -> Callable[[int], None]:
            def insert(i: int) -> None:
                submit_and_commit(
                    db,
                    NewSubmission(
                        project="raw",
                        name=f"r-{run}-{index}-{i}",
                        owner="bench",
                        namespace="raw",
                        spec=spec,
                        digest=digest,
                        idempotency_key=f"{run}-{index}-{i}",
                    ),
                )

            return insert

        cpu_before = time.process_time()
        result = run_threads(threads, per_thread, make)
        result["cpu_ms"] = round(
            (time.process_time() - cpu_before) * 1000 / max(1, result["ok"]), 2
        )
        return result
    finally:
        db.dispose()


def bench_database(
    kind: str, urls: list[str], root: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """`urls`: one fresh database for this tree's server, and one for the baseline's."""
    server = Serve(urls[0], root / f"serve-{kind}.log", args=["--no-control"])
    servers = [server.start()]
    if args.baseline_src:
        baseline = Serve(
            urls[1],
            root / f"serve-{kind}-baseline.log",
            args=["--no-control"],
            extra_env={"PYTHONPATH": str(args.baseline_src)},
        )
        servers.append(baseline.start())
    try:
        for each in servers:  # warm-up: imports, connection pools, SQLite's WAL file
            http_phase(each, args.threads, 5, "submit")
        out: dict[str, Any] = {
            "healthz": http_phase(server, args.threads, args.per_thread, "healthz"),
            "submit_rounds": [],
            "baseline_rounds": [],
        }
        # Rounds alternate between the two servers, so a burst of other work on a
        # shared machine falls on both alike.
        for _ in range(args.rounds):
            out["submit_rounds"].append(http_phase(server, args.threads, args.per_thread, "submit"))
            if args.baseline_src:
                out["baseline_rounds"].append(
                    http_phase(servers[1], args.threads, args.per_thread, "submit")
                )
    finally:
        for each in servers:
            each.stop()
    out["submit"] = _median(out["submit_rounds"])
    if args.baseline_src:
        out["baseline_submit"] = _median(out["baseline_rounds"])
    # The servers are stopped, so the raw inserts have the machine (and the database) alone.
    out["raw_submit"] = raw_phase(urls[0], args.threads, args.per_thread)
    return out


def _median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median rate (the lower middle one of an even count)."""
    return sorted(rounds, key=lambda r: r["per_s"])[(len(rounds) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--per-thread", type=int, default=250)
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="also run POST jobs against a server from this source tree (e.g. main's src/)",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="POST jobs rounds per server (the median is shown)"
    )
    args = parser.parse_args()
    report: dict[str, Any] = {
        "threads": args.threads,
        "per_thread": args.per_thread,
        "rounds": args.rounds,
        "baseline_src": str(args.baseline_src) if args.baseline_src else None,
        "server": "kubetrain serve --no-control (API + database, no control loops), one process",
        "target_per_s": TARGET_PER_S,
        "target_ratio_to_healthz": TARGET_RATIO,
        "databases": {},
    }
    with tempfile.TemporaryDirectory(prefix="kubetrain-bench-") as tmp:
        root = Path(tmp)
        for kind in args.databases:
            if kind == "sqlite":
                urls = [f"sqlite:///{root / name}" for name in ("bench.db", "baseline.db")]
                report["databases"][kind] = bench_database(kind, urls, root, args)
                continue
            from tests.pg import PostgresServer

            pg = PostgresServer.start()
            try:
                urls = [pg.create_database(name) for name in ("kubetrain_bench", "baseline")]
                report["databases"][kind] = bench_database(kind, urls, root, args)
            finally:
                pg.stop()
    labels = {
        "healthz": "GET /healthz (HTTP floor)",
        "submit": "POST jobs",
        "baseline_submit": "POST jobs, baseline",
        "raw_submit": "store.submit_and_commit in-process",
    }
    rows = []
    for kind, phases in report["databases"].items():
        for phase, label in labels.items():
            if phase in phases:
                r = phases[phase]
                rows.append(
                    [
                        f"{kind}: {label}",
                        r["per_s"],
                        r["p50_ms"],
                        r["p99_ms"],
                        r.get("server_cpu_ms", r.get("cpu_ms")),
                        r["errors"],
                    ]
                )
    print(
        f"{args.threads} threads x {args.per_thread} requests, median of {args.rounds} round(s); "
        "kubetrain serve --no-control, one process"
        + (f"; baseline from {args.baseline_src}" if args.baseline_src else "")
    )
    print(
        table(
            ["what", "per s", "p50 ms", "p99 ms", "cpu ms", "errors"],
            rows,
            [44, 10, 10, 10, 10, 8],
        )
    )
    print("cpu ms: the server's CPU time per answer (in-process: this process's, per insert)")
    for kind, phases in report["databases"].items():
        rate = phases["submit"]["per_s"]
        ratio = rate / phases["healthz"]["per_s"]
        phases["ratio_to_healthz"] = round(ratio, 2)
        met = rate >= TARGET_PER_S and ratio >= TARGET_RATIO
        print(
            f"{kind}: {rate:.0f} submissions/s (target >= {TARGET_PER_S}), {ratio:.2f}x "
            f"GET /healthz (target >= {TARGET_RATIO}x): {'met' if met else 'MISSED'}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "submit.json"
    path.write_text(json.dumps(report, indent=2))
    kinds = list(report["databases"])
    paired_bars(
        RESULTS / "submit.svg",
        "Submissions against the HTTP floor, same server, same run",
        kinds,
        ("POST jobs", [report["databases"][k]["submit"]["per_s"] for k in kinds]),
        ("GET /healthz", [report["databases"][k]["healthz"]["per_s"] for k in kinds]),
        "answers per second",
    )
    print(f"wrote {path} and {RESULTS / 'submit.svg'}")


if __name__ == "__main__":
    main()
