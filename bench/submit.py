"""Submissions per second and p50/p99 latency of POST /api/v1/projects/{p}/jobs.

Against a real `kubetrain serve --no-control` subprocess (API and database only;
no testbed), on SQLite and on PostgreSQL, with N client threads each sending M
submissions (each its own Idempotency-Key). Side by side in the same run:

* the same clients on `GET /healthz`: the HTTP framework's floor;
* raw `store.submit_job` inserts in this process, N threads, one transaction
  each: the database's floor.

Prints a table and writes bench/results/submit.json.

    .venv/bin/python bench/submit.py [--threads 8] [--per-thread 250]
        [--databases sqlite postgresql]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg

from _common import RESULTS, Serve, percentile, table, training_job

from kubetrain.store import Database, submit_job

TARGET_PER_S = 200


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


def http_phase(server: Serve, threads: int, per_thread: int, what: str) -> dict[str, Any]:
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
    spec = training_job("x", "raw")["spec"]
    try:

        def make(index: int) -> Callable[[int], None]:
            def insert(i: int) -> None:
                with db.transaction() as session:
                    submit_job(
                        session,
                        project="raw",
                        name=f"r-{run}-{index}-{i}",
                        owner="bench",
                        namespace="raw",
                        spec=spec,
                        idempotency_key=f"{run}-{index}-{i}",
                    )

            return insert

        return run_threads(threads, per_thread, make)
    finally:
        db.dispose()


def bench_database(kind: str, url: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = Serve(url, root / f"serve-{kind}.log", args=["--no-control"]).start()
    with server:
        # Warm-up: imports, connection pools, SQLite's WAL file.
        http_phase(server, args.threads, 5, "submit")
        out = {
            "healthz": http_phase(server, args.threads, args.per_thread, "healthz"),
            "submit": http_phase(server, args.threads, args.per_thread, "submit"),
        }
    # The server is stopped, so the raw inserts have the machine (and the database) alone.
    out["raw_submit_job"] = raw_phase(url, args.threads, args.per_thread)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--per-thread", type=int, default=250)
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    args = parser.parse_args()
    report: dict[str, Any] = {
        "threads": args.threads,
        "per_thread": args.per_thread,
        "server": "kubetrain serve --no-control (API + database, no control loops)",
        "target_per_s": TARGET_PER_S,
        "databases": {},
    }
    with tempfile.TemporaryDirectory(prefix="kubetrain-bench-") as tmp:
        root = Path(tmp)
        for kind in args.databases:
            if kind == "sqlite":
                report["databases"][kind] = bench_database(
                    kind, f"sqlite:///{root / 'bench.db'}", root, args
                )
                continue
            from tests.pg import PostgresServer

            pg = PostgresServer.start()
            try:
                url = pg.create_database("kubetrain_bench")
                report["databases"][kind] = bench_database(kind, url, root, args)
            finally:
                pg.stop()
    rows = []
    for kind, phases in report["databases"].items():
        for phase in ("healthz", "submit", "raw_submit_job"):
            r = phases[phase]
            label = {"healthz": "GET /healthz (HTTP floor)", "submit": "POST jobs"}.get(
                phase, "store.submit_job in-process"
            )
            rows.append([f"{kind}: {label}", r["per_s"], r["p50_ms"], r["p99_ms"], r["errors"]])
    print(f"{args.threads} threads x {args.per_thread} requests; kubetrain serve --no-control")
    print(table(["what", "per s", "p50 ms", "p99 ms", "errors"], rows, [44, 10, 10, 10, 8]))
    for kind, phases in report["databases"].items():
        rate = phases["submit"]["per_s"]
        verdict = "met" if rate >= TARGET_PER_S else "MISSED"
        print(f"{kind}: {rate:.0f} submissions/s, target >= {TARGET_PER_S}: {verdict}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "submit.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
