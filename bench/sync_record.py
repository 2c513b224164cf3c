"""The syncer's recording: CPU per job of recording a batch, step by step.

For each database (a SQLite file; PostgreSQL from tests/pg.py, fsync off), a fresh
migrated database with `--jobs` QUEUED jobs, then five batches of all of them, as the
syncer records a job's life: its Pod pending (a first attempt, a runtime and a business
row), running, evicted and replaced (attempt 2), succeeded, and that last replayed
(nothing to write). Each batch is recorded as the syncer records it (control/syncer.py):
planned from a read, then, unless the plan is empty, written in one transaction
(`record_planned`; a tree without it plans again there, `record_synced`), timed by the
process's CPU (user + system).

Side by side in the same run, in turn, each in a process of its own:

* this tree's `src`, and with `--baseline-src DIR` another tree's (e.g. an older
  commit's `src`, from `git archive`), the same bench code driving both;
* the floor, in each process: the same number of history rows inserted as one Core
  `executemany`, nothing read, nothing returned.

    .venv/bin/python bench/sync_record.py [--jobs 300] [--rounds 3]
        [--databases sqlite postgresql] [--baseline-src DIR]

Prints a table and writes bench/results/sync_record.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.*
from _common import RESULTS, table
from sqlalchemy import insert
from tests.store.builders import DONE, EVICTED, PENDING, RUNNING, SECOND, new_job

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import Database, PodObservation, sync
from kubetrain.store.models import Source, Transition, TransitionKind
from kubetrain.store.sync import SyncedJob, plan_synced, record_synced

T0 = datetime(2026, 12, 1, tzinfo=UTC)
Q, R, S = BusinessState.QUEUED, BusinessState.RUNNING, BusinessState.SUCCEEDED
STEPS: dict[str, tuple[list[PodObservation], BusinessState, ReasonCode]] = {
    "pending": ([PENDING], Q, ReasonCode.INSUFFICIENT_CPU),
    "running": ([RUNNING], R, ReasonCode.TRAINING),
    "replaced": ([EVICTED, SECOND], Q, ReasonCode.SCHEDULING),
    "done": ([EVICTED, DONE], S, ReasonCode.COMPLETED),
    "replay": ([EVICTED, DONE], S, ReasonCode.COMPLETED),
}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def synced(job_id: str, step: str) -> SyncedJob:
    pods, state, reason = STEPS[step]
    return SyncedJob(
        job_id=job_id,
        pods=pods,
        state=state,
        reason=reason,
        raw_reason=pods[-1].raw_reason,
        raw_message=pods[-1].raw_message,
        message=f"{state} {reason}",
        attempt=len(pods),
        detail={"link": "scheduler", "waitable": True},
        diagnosis={"reason": str(reason), "pods": len(pods), "link": "scheduler"},
    )


def worker(url: str, jobs: int) -> dict[str, Any]:
    """In this process (its `src` on PYTHONPATH): CPU ms per job of each step's batch."""
    db = Database(url)
    db.upgrade()
    with db.transaction() as session:
        ids = [new_job(session, name=f"j{i}", state=Q).id for i in range(jobs)]
    out: dict[str, Any] = {}
    for number, step in enumerate(STEPS):
        batch = [synced(job_id, step) for job_id in ids]
        now = T0 + timedelta(minutes=number + 1)
        began = cpu_seconds()
        with db.read_only() as session:
            plan = plan_synced(session, batch, now=now, lock=False)
        if not plan.empty:
            with db.transaction() as session:
                if hasattr(sync, "record_planned"):
                    sync.record_planned(session, batch, plan)
                else:  # the syncer before it: planned again under the lock
                    record_synced(session, batch, now=now)
        out[step] = round(1000 * (cpu_seconds() - began) / jobs, 3)
    rows = [
        {
            "job_id": job_id,
            "at": T0,
            "source": Source.SYNCER,
            "kind": TransitionKind.RUNTIME,
            "from_state": "Pending",
            "to_state": "Running",
            "from_reason": None,
            "to_reason": None,
            "raw_reason": None,
            "raw_message": None,
            "attempt": 1,
            "detail": {"changed": ["pod_phase"]},
        }
        for job_id in ids
        for _ in range(2)
    ]
    began = cpu_seconds()
    with db.engine.begin() as connection:
        connection.execute(insert(Transition), rows)  # Core: a Connection, no ORM bulk
    out["floor"] = round(1000 * (cpu_seconds() - began) / jobs, 3)
    db.dispose()
    return out


def run_side(src: Path, url: str, jobs: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, __file__, "--worker", url, "--jobs", str(jobs)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the worker on {src} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="jobs per batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--databases", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--baseline-src", type=Path, help="another tree's src, run in turn")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.jobs)))
        return
    sides = {"this tree": Path(__file__).resolve().parent.parent / "src"}
    if args.baseline_src:
        sides["baseline"] = args.baseline_src.resolve()
    report: dict[str, Any] = {"jobs": args.jobs, "rounds": args.rounds, "results": {}}
    server = None
    try:
        for database in args.databases:
            if database == "postgresql" and server is None:
                from tests.pg import PostgresServer

                server = PostgresServer.start()
            for _ in range(args.rounds):
                for side, src in sides.items():
                    if database == "postgresql":
                        assert server is not None
                        url = server.create_database(f"bench_sync_{uuid.uuid4().hex[:8]}")
                    else:
                        url = f"sqlite:///{tempfile.mkdtemp(prefix='kubetrain-sync-')}/x.db"
                    result = run_side(src, url, args.jobs)
                    print(f"  {database} {side}: {result}", flush=True)
                    report["results"].setdefault(f"{database}: {side}", []).append(result)
    finally:
        if server is not None:
            server.stop()
    rows = []
    for name, results in report["results"].items():
        medians = {k: statistics.median(r[k] for r in results) for k in [*STEPS, "floor"]}
        rows.append([name, *medians.values(), sum(medians[s] for s in STEPS)])
    print(f"CPU ms per job of a batch of {args.jobs}, median of {args.rounds} rounds")
    print(table(["", *STEPS, "floor", "all steps"], rows, [24, 9, 9, 9, 9, 9, 9, 10]))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sync_record.json").write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS / 'sync_record.json'}")


if __name__ == "__main__":
    main()
