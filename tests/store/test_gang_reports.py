"""The server holds a gang at its least advanced rank: rank 0's TRAINING report is not the
gang's while rank 1 waits in its preflight (rendezvous-reachable, for rank 0's port), as
was seen live; the syncer reads every rank's last phase and check from the reports."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime

import pytest

from kubetrain.cluster.cache import ClusterCache
from kubetrain.control.syncer import Syncer
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import Database, Job, ReportEvent, record_reports
from tests.store.builders import new_job
from tests.unit.test_cache import feed

pytestmark = pytest.mark.db

R = ReasonCode
T0 = datetime(2026, 12, 2, 15, 20, tzinfo=UTC)
PROJECT = "fixture-gang-running-7953"  # the recorded dump's namespace
RANKS = {0: "kt-gang-running-0-nkcgv", 1: "kt-gang-running-1-cnss6"}


def _report(db: Database, job_id: str, rank: int, seq: int, phase: str, **more: str) -> None:
    with db.transaction() as session:
        event = ReportEvent(seq, T0, "phase", {"phase": phase, **more})
        record_reports(session, job_id, RANKS[rank], [event], rank=rank, now=T0)


def _state(db: Database, job_id: str) -> tuple[BusinessState, ReasonCode, str]:
    with db.read_only() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.business_state, job.reason, job.reason_message or ""


def test_rank_0_training_is_not_the_gangs_while_rank_1_is_in_its_preflight(
    db: Database,
) -> None:
    cache = ClusterCache(http=None)
    with db.transaction() as session:
        job = new_job(
            session,
            name="gang-running",
            project=PROJECT,
            spec={"spec": {"image": "trainer:1", "workers": 2}},
            state=BusinessState.QUEUED,
        )
        job.k8s_job_name = "kt-gang-running"
        job_id = job.id
    feed(cache, "gang-running", job_id)
    syncer = Syncer(db, cache, resync_interval=0.05, clock=lambda: T0)
    _report(db, job_id, 0, 1, "TRAINING")
    _report(db, job_id, 1, 1, "PREFLIGHT", check="rendezvous-reachable")

    async def until(reason: ReasonCode) -> tuple[BusinessState, ReasonCode, str]:
        for _ in range(200):
            if (state := _state(db, job_id))[1] is reason:
                return state
            await asyncio.sleep(0.05)
        pytest.fail(f"the job stayed {_state(db, job_id)}, never {reason}")

    async def scenario() -> None:
        loops = asyncio.gather(syncer._work(), syncer._resync())
        try:
            state, _, message = await until(R.RENDEZVOUS)
            assert state is BusinessState.RUNNING
            assert "rank 1 in its preflight check rendezvous-reachable" in message
            _report(db, job_id, 1, 2, "TRAINING")
            await until(R.TRAINING)
        finally:
            loops.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loops

    asyncio.run(scenario())
