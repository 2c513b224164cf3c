"""A training job whose steps stop: the syncer's periodic resync marks it NO_PROGRESS with no
watch event at all, and a new step brings it back to TRAINING; spec.stallAfter is read in the
database (one JSON field, both backends)."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kubetrain.cluster.cache import ClusterCache
from kubetrain.control.syncer import Syncer
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import Database, Job, ReportEvent, job_history, record_reports
from kubetrain.store.models import TransitionKind
from kubetrain.store.sync import sync_facts
from tests.store.builders import new_job
from tests.unit.test_cache import feed

pytestmark = pytest.mark.db

R = ReasonCode
# The running dump's Pod started at 15:14:40 (recorded); our clock runs from 15:20.
T0 = datetime(2026, 12, 2, 15, 20, tzinfo=UTC)
PROJECT = "fixture-running-0e2d"  # the dump's namespace
RUNNING_SPEC: dict[str, Any] = {"spec": {"image": "trainer:1", "stallAfter": "10m"}}


def test_stall_after_is_read_from_the_spec_in_the_database(db: Database) -> None:
    with db.transaction() as session:
        named = new_job(session, name="a", spec=RUNNING_SPEC).id
        unnamed = new_job(session, name="b").id
    with db.read_only() as session:
        facts = sync_facts(session, [named, unnamed])
    assert facts[named].stall_after == 600
    assert facts[unnamed].stall_after is None


def _running_job(db: Database, cache: ClusterCache) -> str:
    with db.transaction() as session:
        job = new_job(
            session,
            name="running",
            project=PROJECT,
            spec=RUNNING_SPEC,
            state=BusinessState.RUNNING,
        )
        job.k8s_job_name = "kt-running"
        job_id = job.id
    feed(cache, "running", job_id)
    return job_id


def _report(db: Database, job_id: str, seq: int, kind: str, at: datetime, **data: Any) -> None:
    with db.transaction() as session:
        # received when sent: the stall is judged on the server's receipt times
        record_reports(
            session, job_id, "kt-running-7hzq9", [ReportEvent(seq, at, kind, data)], now=at
        )


def _reason(db: Database, job_id: str) -> tuple[BusinessState, ReasonCode]:
    with db.read_only() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.business_state, job.reason


async def _until(db: Database, job_id: str, reason: ReasonCode) -> None:
    for _ in range(200):
        if _reason(db, job_id)[1] is reason:
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"the job stayed {_reason(db, job_id)}, never {reason}")


def test_the_resync_notices_a_stall_without_any_watch_event(db: Database) -> None:
    cache = ClusterCache(http=None)
    job_id = _running_job(db, cache)
    now = [T0]
    syncer = Syncer(db, cache, resync_interval=0.05, clock=lambda: now[0])
    _report(db, job_id, 1, "phase", T0, phase="TRAINING")
    _report(db, job_id, 2, "step", T0 + timedelta(minutes=1), step=800, metrics={})

    async def scenario() -> None:
        loops = asyncio.gather(syncer._work(), syncer._resync())
        try:
            now[0] = T0 + timedelta(minutes=5)
            await _until(db, job_id, R.TRAINING)
            # Nothing changes in the cluster; only time passes.
            now[0] = T0 + timedelta(minutes=12)
            await _until(db, job_id, R.NO_PROGRESS)
            # Reports resume: back to training (the report API also marks the job).
            _report(db, job_id, 3, "step", now[0], step=801, metrics={})
            await _until(db, job_id, R.TRAINING)
        finally:
            loops.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loops

    asyncio.run(scenario())
    assert _reason(db, job_id) == (BusinessState.RUNNING, R.TRAINING)
    with db.read_only() as session:
        rows = job_history(session, PROJECT, job_id, kind=TransitionKind.BUSINESS)
        assert [t.to_reason for t in rows][-2:] == [R.NO_PROGRESS, R.TRAINING]
