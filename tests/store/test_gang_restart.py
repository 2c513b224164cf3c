"""A gang's attempts and restart in the store: one attempt row per rank under the Job's
attempt number, and a restart recorded once into the dispatcher's outbox (store/sync.py,
store/outbox.py) while the job stays QUEUED: never FAILED and back."""

from __future__ import annotations

import dataclasses

import pytest

from kubetrain.domain.diagnosis import GangRestart
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    PodObservation,
    WaitedForAttempt,
    claim_due_jobs,
    get_job_any_project,
    job_history,
    list_attempts,
    record_dispatch_outcomes,
)
from kubetrain.store.outbox import RESTART_POLL
from kubetrain.store.sync import SyncedJob, plan_synced, record_synced
from tests.store.builders import T0, at, new_job

pytestmark = pytest.mark.db

Q, R = BusinessState.QUEUED, BusinessState.RUNNING


def rank(n: int, attempt: int, uid: str) -> PodObservation:
    return PodObservation(
        pod_name=f"kt-g-{n}-{uid}",
        pod_uid=uid,
        node=f"gpu-{n}",
        pod_phase="Running",
        container_state="running",
        rank=n,
        attempt=attempt,
    )


def synced(
    job_id: str,
    pods: list[PodObservation],
    state: BusinessState,
    reason: ReasonCode,
    restart: GangRestart | None = None,
    message: str | None = None,
) -> SyncedJob:
    return SyncedJob(
        job_id=job_id,
        pods=pods,
        state=state,
        reason=reason,
        raw_reason=None,
        raw_message=None,
        message=message,
        attempt=pods[-1].attempt if pods else None,
        detail=None,
        diagnosis={"reason": str(reason)},
        restart=restart,
    )


def test_a_gang_attempt_is_one_row_per_rank_and_a_restart_is_recorded_once(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=Q)
        first = [rank(0, 1, "a0"), rank(1, 1, "a1")]
        record_synced(session, [synced(job.id, first, R, ReasonCode.RENDEZVOUS)], now=at(1))
    with db.read_only() as session:
        rows = list_attempts(session, job.id)
        assert [(a.number, a.rank, a.pod_uid) for a in rows] == [(1, 0, "a0"), (1, 1, "a1")]
        assert get_job_any_project(session, job.id).current_attempt == 1

    # Rank 1 failed; the Job failed: restart as attempt 2, one retry counted.
    ended = [rank(0, 1, "a0"), dataclasses.replace(rank(1, 1, "a1"), pod_phase="Failed")]
    restart = GangRestart(2, True, 1, "job-uid-1")
    said = "retrying: attempt 2 of the whole gang starts (1 of 1 retries used)"
    step = synced(job.id, ended, Q, ReasonCode.EXIT_NONZERO, restart, said)
    with db.transaction() as session:
        record_synced(session, [step], now=at(2))
    with db.read_only() as session:
        stored = get_job_any_project(session, job.id)
        assert (stored.business_state, stored.reason) == (Q, ReasonCode.EXIT_NONZERO)
        assert stored.reason_message == said
        assert (stored.current_attempt, stored.retries_used) == (2, 1)
        assert (stored.restart_job_uid, stored.next_dispatch_at) == ("job-uid-1", at(2))
        # A replay of the ended attempt writes nothing: the restart is in the outbox.
        assert plan_synced(session, [step], now=at(3), lock=False).empty

    # The dispatcher claims it while it is QUEUED, and its create clears the outbox.
    with db.transaction() as session:
        assert [j.id for j in claim_due_jobs(session, now=at(3))] == [job.id]
        record_dispatch_outcomes(session, failed={job.id: ("PreviousAttempt", "...")}, now=at(4))
    with db.read_only() as session:
        stored = get_job_any_project(session, job.id)
        assert (stored.business_state, stored.reason) == (Q, ReasonCode.EXIT_NONZERO)
        assert stored.restart_job_uid == "job-uid-1"
        assert stored.next_dispatch_at is not None
        assert stored.next_dispatch_at > at(4)
        assert stored.last_dispatch_error == "PreviousAttempt: ..."
    with db.transaction() as session:
        record_dispatch_outcomes(session, dispatched={job.id: "kt-g"}, now=at(6))
    with db.read_only() as session:
        stored = get_job_any_project(session, job.id)
        assert (stored.restart_job_uid, stored.next_dispatch_at) == (None, None)
        assert (stored.business_state, stored.current_attempt) == (Q, 2)

    # Attempt 2's ranks: two more rows under number 2.
    second = [rank(0, 2, "b0"), rank(1, 2, "b1")]
    with db.transaction() as session:
        record_synced(session, [synced(job.id, second, R, ReasonCode.RENDEZVOUS)], now=at(7))
    with db.read_only() as session:
        numbered = [(a.number, a.rank) for a in list_attempts(session, job.id)]
        assert numbered == [(1, 0), (1, 1), (2, 0), (2, 1)]
        states = [
            (row.to_state, row.to_reason, row.attempt)
            for row in job_history(session, "ai-training", job.id)
            if row.kind == "business"
        ][-3:]
        assert states == [
            (R, ReasonCode.RENDEZVOUS, 1),
            (Q, ReasonCode.EXIT_NONZERO, 1),
            (R, ReasonCode.RENDEZVOUS, 2),
        ]
        runtime = [
            (row.attempt, (row.detail or {}).get("rank"))
            for row in job_history(session, "ai-training", job.id)
            if row.kind == "runtime"
        ]
        assert {(1, 0), (1, 1), (2, 0), (2, 1)} <= set(runtime)


def test_a_restart_waits_for_the_ended_attempts_pods_and_the_history_says_how_long(
    db: Database,
) -> None:
    with db.transaction() as session:
        job = new_job(session, state=Q)
        first = [rank(0, 1, "a0"), rank(1, 1, "a1")]
        record_synced(session, [synced(job.id, first, R, ReasonCode.RENDEZVOUS)], now=at(1))
        restart = GangRestart(2, True, 1, "job-uid-1")
        step = synced(job.id, first, Q, ReasonCode.EXIT_NONZERO, restart, "retrying")
        record_synced(session, [step], now=at(2))
    left = ["kt-g-0-a0 (Running, terminating)"]
    with db.transaction() as session:
        assert [j.id for j in claim_due_jobs(session, now=at(3))] == [job.id]
        record_dispatch_outcomes(session, waiting={job.id: left}, now=at(3))
    with db.read_only() as session:
        stored = get_job_any_project(session, job.id)
        # Still QUEUED with the ended attempt's cause; no failure counted, no backoff.
        assert (stored.business_state, stored.reason) == (Q, ReasonCode.EXIT_NONZERO)
        assert stored.restart_job_uid == "job-uid-1"
        assert stored.next_dispatch_at == at(3) + RESTART_POLL
        assert (stored.dispatch_attempts, stored.last_dispatch_error) == (0, None)
        assert stored.reason_message == (
            "retrying; waiting for attempt 1's Pods to end: kt-g-0-a0 (Running, terminating)"
        )
    with db.transaction() as session:  # asked again: the words replaced, not appended
        record_dispatch_outcomes(
            session, waiting={job.id: ["kt-g-0-a0 (Unknown, terminating)"]}, now=at(4)
        )
    with db.read_only() as session:
        stored = get_job_any_project(session, job.id)
        assert stored.reason_message == (
            "retrying; waiting for attempt 1's Pods to end: kt-g-0-a0 (Unknown, terminating)"
        )
    wait = WaitedForAttempt(attempt=1, since=at(3), seconds=31.5, pods=left)
    with db.transaction() as session:
        assert [j.id for j in claim_due_jobs(session, now=at(35))] == [job.id]
        record_dispatch_outcomes(
            session, dispatched={job.id: "kt-g"}, waited={job.id: wait}, now=at(35)
        )
    with db.read_only() as session:
        assert get_job_any_project(session, job.id).restart_job_uid is None
        (row,) = [
            r
            for r in job_history(session, "ai-training", job.id)
            if r.raw_reason == "PreviousAttemptEnded"
        ]
        assert (row.kind, row.attempt) == ("runtime", 1)
        assert row.raw_message == (
            "attempt 2 created once every Pod of attempt 1 had ended: waited 31.5 s for "
            "kt-g-0-a0 (Running, terminating)"
        )
        assert row.detail is not None
        assert row.detail["waited_seconds"] == 31.5


def test_a_restart_of_a_cancelled_job_is_never_recorded(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=BusinessState.CANCELLED)
        step = synced(job.id, [], Q, ReasonCode.EXIT_NONZERO, GangRestart(2, True, 1, "job-uid-1"))
        record_synced(session, [step], now=T0)
    with db.read_only() as session:
        stored = get_job_any_project(session, job.id)
        assert (stored.restart_job_uid, stored.current_attempt) == (None, 0)
        assert stored.business_state is BusinessState.CANCELLED
