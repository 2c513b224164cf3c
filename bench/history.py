"""The jobs list over a long history: N finished jobs in one project, paged with the cursor.

For each database (a SQLite file; PostgreSQL from tests/pg.py, fsync off), N
finished jobs (default 100,000) are written as the store holds them after a
run: the jobs row (SUCCEEDED / COMPLETED, the job of bench/_serve.py as its
spec, the diagnosis of the recorded `succeeded.json` as its last diagnosis), one
attempt row and four business history rows (CREATED, QUEUED, RUNNING,
SUCCEEDED), by Core inserts in batches. Then the API app (`create_app`, in this
process, through Starlette's TestClient) answers `GET
/api/v1/projects/team/jobs?limit=50` and every following page with
`cursor=next_cursor`, to the end (N/50 pages), each answer timed. Baseline in the
same run, on the same client: `GET /healthz`, as many times. Bytes per job: the
database's size (SQLite: the file; PostgreSQL: `pg_database_size`) after the
history less the migrated empty database's, over N.

Target: the list's p99 <= 50 ms per page on both databases.

    .venv/bin/python bench/history.py [--jobs 100000] [--databases sqlite postgresql]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.pg

from _common import RESULTS, percentile, table
from _serve import training_job
from fastapi.testclient import TestClient
from sqlalchemy import insert, text

from kubetrain.api import create_app
from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.spec import parse_training_job, spec_digest
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from kubetrain.store.models import (
    ALL_PROJECTS,
    Attempt,
    Job,
    Role,
    Source,
    Transition,
    TransitionKind,
)
from kubetrain.store.tokens import create_token

SNAPSHOTS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "snapshots"
PROJECT = "team"
PAGE = 50
TARGET_P99_MS = 50.0
BATCH = 5000
START = datetime(2026, 1, 1, tzinfo=UTC)


def recorded_diagnosis() -> dict[str, Any]:
    """The diagnosis the syncer stores for a finished job: the recorded succeeded.json's."""
    data = json.loads((SNAPSHOTS / "succeeded.json").read_text())
    job = next(i for i in data["items"] if i["kind"] == "Job")
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    facts = JobFacts(name=name, k8s_name=name, namespace=namespace, dispatched=True)
    now = datetime(2026, 12, 2, 16, 0, tzinfo=UTC)
    snapshot = Snapshot.from_list(data).for_job(name, namespace)
    return diagnose(facts, snapshot, now).to_json(name)


def fill(db: Database, jobs: int) -> float:
    """`jobs` finished jobs, one second apart; the seconds it took."""
    spec = parse_training_job(training_job("history", PROJECT), project=PROJECT)
    spec_json, digest = spec.model_dump(mode="json"), spec_digest(spec)
    diagnosis = recorded_diagnosis()
    began = time.perf_counter()
    for first in range(0, jobs, BATCH):
        job_rows, attempts, history = [], [], []
        for n in range(first, min(first + BATCH, jobs)):
            job_id = str(uuid.UUID(int=n + 1))
            created = START + timedelta(seconds=n)
            finished = created + timedelta(seconds=30)
            job_rows.append(
                {
                    "id": job_id,
                    "project": PROJECT,
                    "name": f"history-{n:06d}",
                    "owner": "bench",
                    "spec": spec_json,
                    "spec_digest": digest,
                    "idempotency_key": None,
                    "namespace": PROJECT,
                    "k8s_job_name": f"kt-{job_id}",
                    "business_state": BusinessState.SUCCEEDED,
                    "reason": ReasonCode.COMPLETED,
                    "current_attempt": 1,
                    "cancel_requested": False,
                    "retries_used": 0,
                    "dispatch_attempts": 1,
                    "next_dispatch_at": None,
                    "diagnosis": diagnosis,
                    "created_at": created,
                    "updated_at": finished,
                    "finished_at": finished,
                }
            )
            attempts.append(
                {
                    "job_id": job_id,
                    "number": 1,
                    "rank": None,
                    "pod_name": f"kt-{job_id}-abcde",
                    "pod_uid": str(uuid.UUID(int=(1 << 64) + n)),
                    "node": f"node-{n % 500:03d}",
                    "pod_phase": "Succeeded",
                    "container_state": "terminated",
                    "exit_code": 0,
                    "started_at": created + timedelta(seconds=5),
                    "finished_at": finished,
                    "bound_at": created + timedelta(seconds=2),
                    "created_at": created + timedelta(seconds=1),
                    "updated_at": finished,
                }
            )
            steps = [
                (None, BusinessState.CREATED, None, ReasonCode.JOB_NOT_CREATED, 0),
                (BusinessState.CREATED, BusinessState.QUEUED, None, ReasonCode.SCHEDULING, 1),
                (BusinessState.QUEUED, BusinessState.RUNNING, None, ReasonCode.TRAINING, 5),
                (BusinessState.RUNNING, BusinessState.SUCCEEDED, None, ReasonCode.COMPLETED, 30),
            ]
            history += [
                {
                    "job_id": job_id,
                    "at": created + timedelta(seconds=after),
                    "source": Source.API if before is None else Source.SYNCER,
                    "kind": TransitionKind.BUSINESS,
                    "from_state": before,
                    "to_state": to,
                    "from_reason": from_reason,
                    "to_reason": reason,
                    "attempt": None if before is None else 1,
                }
                for before, to, from_reason, reason, after in steps
            ]
        with db.transaction() as session:
            connection = session.connection()
            connection.execute(insert(Job), job_rows)
            connection.execute(insert(Attempt), attempts)
            connection.execute(insert(Transition), history)
    return time.perf_counter() - began


def size_bytes(db: Database, url: str) -> int:
    if url.startswith("sqlite"):
        return Path(url.removeprefix("sqlite:///")).stat().st_size
    with db.read_only() as session:
        return int(
            session.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
        )


def timed(call: Callable[[], object]) -> float:
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "count": len(samples),
        "p50_ms": round(statistics.median(samples), 2),
        "p99_ms": round(percentile(samples, 99), 2),
        "max_ms": round(max(samples), 2),
    }


def bench_database(kind: str, url: str, jobs: int) -> dict[str, Any]:
    db = Database(url)
    db.upgrade()
    empty = size_bytes(db, url)
    fill_s = fill(db, jobs)
    if kind == "postgresql":
        with db.transaction() as session:
            session.execute(text("ANALYZE"))
    full = size_bytes(db, url)
    with db.transaction() as session:
        _, token = create_token(session, name="bench", role=Role.ADMIN, project=ALL_PROJECTS)
    app = create_app(ServerSettings(database_url=url), db)
    headers = {"Authorization": f"Bearer {token}"}
    pages: list[float] = []
    healthz: list[float] = []
    seen = 0
    with TestClient(app) as client:
        client.get("/healthz").raise_for_status()  # warm-up
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": PAGE}
            if cursor is not None:
                params["cursor"] = cursor
            holder: dict[str, Any] = {}

            def page(params: dict[str, Any] = params, holder: dict[str, Any] = holder) -> None:
                response = client.get(
                    f"/api/v1/projects/{PROJECT}/jobs", params=params, headers=headers
                )
                response.raise_for_status()
                holder.update(response.json())

            pages.append(timed(page))
            seen += len(holder["items"])
            healthz.append(timed(lambda: client.get("/healthz").raise_for_status()))
            cursor = holder.get("next_cursor")
            if not cursor:
                break
    db.dispose()
    assert seen == jobs, (seen, jobs)
    return {
        "jobs": jobs,
        "fill_s": round(fill_s, 1),
        "bytes_per_job": round((full - empty) / jobs),
        "database_bytes": full,
        "list_page": summary(pages),
        "healthz": summary(healthz),
        "p99_ratio": round(percentile(pages, 99) / percentile(healthz, 99), 2),
    }


@contextmanager
def database_url(kind: str, root: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{root / 'history.db'}"
        return
    from tests.pg import PostgresServer

    pg = PostgresServer.start()
    try:
        yield pg.create_database("kubetrain_history")
    finally:
        pg.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument(
        "--databases", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    args = parser.parse_args()
    report: dict[str, Any] = {"page": PAGE, "target_p99_ms": TARGET_P99_MS, "databases": {}}
    with tempfile.TemporaryDirectory(prefix="kubetrain-history-") as tmp:
        for kind in args.databases:
            with database_url(kind, Path(tmp)) as url:
                report["databases"][kind] = bench_database(kind, url, args.jobs)
            print(f"measured {kind}", flush=True)
    rows = []
    for kind, r in report["databases"].items():
        page, health = r["list_page"], r["healthz"]
        verdict = "met" if page["p99_ms"] <= TARGET_P99_MS else "MISSED"
        rows.append(
            [
                kind,
                f"{r['jobs']:,}",
                r["bytes_per_job"],
                page["p50_ms"],
                page["p99_ms"],
                health["p50_ms"],
                health["p99_ms"],
                f"{r['p99_ratio']:.1f}x",
                verdict,
            ]
        )
    print(
        f"jobs list, {PAGE} a page through every page with the cursor; ms per answer; "
        f"target p99 <= {TARGET_P99_MS:.0f} ms"
    )
    print(
        table(
            ["database", "jobs", "B/job", "list p50", "list p99", "hz p50", "hz p99", "p99 x", ""],
            rows,
            [12, 10, 8, 10, 10, 8, 8, 8, 8],
        )
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "history.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
