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
from kubetrain.store import (
    Database,
    Job,
    ReportEvent,
    Source,
    cancel_stalled_job,
    job_history,
    record_reports,
)
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
CANCELLING_SPEC: dict[str, Any] = {"spec": RUNNING_SPEC["spec"] | {"cancelAfterStall": "30m"}}


def test_stall_after_is_read_from_the_spec_in_the_database(db: Database) -> None:
    with db.transaction() as session:
        named = new_job(session, name="a", spec=CANCELLING_SPEC).id
        unnamed = new_job(session, name="b").id
    with db.read_only() as session:
        facts = sync_facts(session, [named, unnamed])
    assert facts[named].stall_after == 600
    assert facts[named].cancel_after_stall == 1800
    assert facts[unnamed].stall_after is None
    assert facts[unnamed].cancel_after_stall is None


def _running_job(db: Database, cache: ClusterCache, spec: dict[str, Any] = RUNNING_SPEC) -> str:
    with db.transaction() as session:
        job = new_job(
            session,
            name="running",
            project=PROJECT,
            spec=spec,
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


def test_a_job_stalled_past_its_cancel_after_stall_is_cancelled_as_a_user_would(
    db: Database,
) -> None:
    cache = ClusterCache(http=None)
    job_id = _running_job(db, cache, CANCELLING_SPEC)
    now = [T0]
    woken: list[bool] = []
    syncer = Syncer(
        db,
        cache,
        resync_interval=0.05,
        clock=lambda: now[0],
        on_cancelled=lambda: woken.append(True),
    )
    _report(db, job_id, 1, "phase", T0, phase="TRAINING")
    _report(db, job_id, 2, "step", T0 + timedelta(minutes=1), step=800, metrics={})

    async def scenario() -> None:
        loops = asyncio.gather(syncer._work(), syncer._resync())
        try:
            # No step since T0+1m: NO_PROGRESS from T0+11m; 30m of it runs out at T0+41m.
            now[0] = T0 + timedelta(minutes=12)
            await _until(db, job_id, R.NO_PROGRESS)
            now[0] = T0 + timedelta(minutes=40)
            # Two more rounds, the second begun after the clock moved: the cancel is
            # not yet due.
            syncs = syncer.stats.syncs
            for _ in range(200):
                if syncer.stats.syncs >= syncs + 2:
                    break
                await asyncio.sleep(0.02)
            assert syncer.stats.syncs >= syncs + 2, "the resync never synced the job again"
            assert _reason(db, job_id) == (BusinessState.RUNNING, R.NO_PROGRESS)
            now[0] = T0 + timedelta(minutes=42)
            await _until(db, job_id, R.CANCELLED)
            # The dispatcher is told once the round that committed the cancel ends.
            for _ in range(200):
                if woken:
                    break
                await asyncio.sleep(0.02)
        finally:
            loops.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loops

    asyncio.run(scenario())
    assert _reason(db, job_id) == (BusinessState.CANCELLED, R.CANCELLED)
    assert woken  # the dispatcher is told: it deletes the Kubernetes Job
    with db.read_only() as session:
        job = session.get(Job, job_id)
        assert job is not None
        # What a user's cancel leaves: the flag, and the job back in the outbox for the
        # dispatcher to delete its Kubernetes Job.
        assert job.cancel_requested
        assert job.next_dispatch_at == T0 + timedelta(minutes=42)
        rows = job_history(session, PROJECT, job_id, kind=TransitionKind.BUSINESS)
    last = rows[-1]
    assert (last.from_reason, last.to_state, last.to_reason) == (
        R.NO_PROGRESS,
        BusinessState.CANCELLED,
        R.CANCELLED,
    )
    assert last.source == Source.SYNCER
    said = (
        "cancelled for no progress: NO_PROGRESS for over 30m (spec.cancelAfterStall), "
        "no step since 2026-12-02 15:21:00Z (stall threshold 10m)"
    )
    assert last.detail == {"message": said}
    assert job.reason_message == said  # what kubetrain get job and the page say


def test_a_job_whose_steps_came_back_is_not_cancelled_for_a_stale_stall(db: Database) -> None:
    # The syncer read NO_PROGRESS; a step arrived (the job is TRAINING again) before it
    # cancelled: the cancel, checked under the row's lock, does nothing.
    with db.transaction() as session:
        job = new_job(session, name="a", spec=CANCELLING_SPEC, state=BusinessState.RUNNING)
        job.k8s_job_name = "kt-a"
        job_id = job.id
    with db.transaction() as session:
        assert not cancel_stalled_job(session, job_id, message="stale", now=T0)
    with db.read_only() as session:
        after = session.get(Job, job_id)
        assert after is not None
        assert (after.business_state, after.cancel_requested) == (BusinessState.RUNNING, False)


def test_a_nan_loss_is_loss_not_finite_and_cancelled_when_the_spec_asks(db: Database) -> None:
    cache = ClusterCache(http=None)
    job_id = _running_job(db, cache)
    with db.transaction() as session:
        assert sync_facts(session, [job_id])[job_id].cancel_on_non_finite_loss is False
    syncer = Syncer(db, cache, resync_interval=0.05, clock=lambda: T0 + timedelta(minutes=2))
    _report(db, job_id, 1, "phase", T0, phase="TRAINING")
    _report(db, job_id, 2, "step", T0 + timedelta(minutes=1), step=2, metrics={"loss": "NaN"})

    async def scenario() -> None:
        loops = asyncio.gather(syncer._work(), syncer._resync())
        try:
            await _until(db, job_id, R.LOSS_NOT_FINITE)
            with db.read_only() as session:
                rows = job_history(session, PROJECT, job_id, kind=TransitionKind.BUSINESS)
            # The history row is the webhooks' outbox: reason_changed and not_waitable.
            assert (rows[-1].from_reason, rows[-1].to_reason) == (
                R.TRAINING,
                R.LOSS_NOT_FINITE,
            )
            assert rows[-1].detail["waitable"] is False  # not_waitable goes out too
            await asyncio.sleep(0.2)  # resyncs: without the spec's flag it only says so
            assert _reason(db, job_id) == (BusinessState.RUNNING, R.LOSS_NOT_FINITE)
            with db.transaction() as session:
                job = session.get(Job, job_id)
                assert job is not None
                job.spec = {"spec": RUNNING_SPEC["spec"] | {"cancelOnNonFiniteLoss": True}}
            await _until(db, job_id, R.CANCELLED)
        finally:
            loops.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loops

    asyncio.run(scenario())
    with db.read_only() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert job.cancel_requested
        assert job.reason_message == (
            "cancelled for a non-finite loss: Step 2 reported loss = NaN "
            "(spec.cancelOnNonFiniteLoss)"
        )
