"""The syncer's batch writes (store/sync.py): each step of a job's life is recorded
through `record_synced`, in one batch with another job; the history, attempts and
job row must come out as the rules of store/transitions.py say, and a replayed step
must write nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import func, select

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    Job,
    PodObservation,
    Transition,
    TransitionKind,
    get_job_any_project,
    job_history,
    list_attempts,
)
from kubetrain.store.models import WebhookDelivery
from kubetrain.store.sync import (
    SyncedJob,
    SyncResult,
    plan_synced,
    record_planned,
    record_synced,
    sync_facts,
    unfinished_job_ids,
)
from kubetrain.store.webhooks import create_webhook
from tests.store.builders import DONE, EVICTED, PENDING, RUNNING, SECOND, at, new_job

pytestmark = pytest.mark.db

BUSINESS, RUNTIME = TransitionKind.BUSINESS, TransitionKind.RUNTIME
Q, R, S, F = (
    BusinessState.QUEUED,
    BusinessState.RUNNING,
    BusinessState.SUCCEEDED,
    BusinessState.FAILED,
)
# (pods, state, reason, raw message): a life, with replays and refused moves.
STEPS: list[tuple[list[PodObservation], BusinessState, ReasonCode, str | None]] = [
    ([PENDING], Q, ReasonCode.INSUFFICIENT_CPU, PENDING.raw_message),
    ([PENDING], Q, ReasonCode.INSUFFICIENT_CPU, PENDING.raw_message),  # replay
    ([PENDING], Q, ReasonCode.INSUFFICIENT_CPU, "0/4 nodes are available"),  # message only
    ([RUNNING], R, ReasonCode.TRAINING, None),
    ([RUNNING], R, ReasonCode.TRAINING, None),  # replay
    ([RUNNING], BusinessState.CREATED, ReasonCode.JOB_NOT_CREATED, None),  # illegal
    ([EVICTED, SECOND], Q, ReasonCode.SCHEDULING, None),  # a replacement Pod: attempt 2
    ([EVICTED, DONE], S, ReasonCode.COMPLETED, None),
    ([EVICTED, DONE], S, ReasonCode.COMPLETED, None),  # replay
    ([EVICTED, DONE], F, ReasonCode.EXIT_NONZERO, None),  # nothing leaves a terminal state
]


def synced(job_id: str, step: int) -> SyncedJob:
    pods, state, reason, raw_message = STEPS[step]
    return SyncedJob(
        job_id=job_id,
        pods=pods,
        state=state,
        reason=reason,
        raw_reason=pods[-1].raw_reason,
        raw_message=raw_message,
        message=f"{state} {reason}",
        attempt=len(pods),
        detail={"link": "scheduler", "waitable": True},
        diagnosis={"reason": str(reason), "raw_message": raw_message, "pods": len(pods)},
    )


def state_of(db: Database, job_id: str) -> dict[str, Any]:
    with db.read_only() as session:
        job = get_job_any_project(session, job_id)
        assert job is not None
        history = [
            {k: v for k, v in vars(row).items() if k not in ("_sa_instance_state", "id", "job_id")}
            for row in job_history(session, job.project, job_id)
        ]
        attempts = [
            {k: v for k, v in vars(a).items() if k not in ("_sa_instance_state", "id", "job_id")}
            for a in list_attempts(session, job_id)
        ]
        row = {
            k: v
            for k, v in vars(job).items()
            if k not in ("_sa_instance_state", "id", "name", "idempotency_key", "spec_digest")
        }
        return {"job": row, "history": history, "attempts": attempts}


def planned_first(db: Database, batch: list[SyncedJob], now: Any) -> dict[str, SyncResult]:
    """The syncer's way: a plan from a read, written (if it writes anything) under the
    lock by `record_planned`."""
    with db.read_only() as session:
        plan = plan_synced(session, batch, now=now, lock=False)
    if plan.empty:
        return plan.results
    with db.transaction() as session:
        return record_planned(session, batch, plan)


def in_one(db: Database, batch: list[SyncedJob], now: Any) -> dict[str, SyncResult]:
    with db.transaction() as session:
        return record_synced(session, batch, now=now)


@pytest.mark.parametrize("record", [in_one, planned_first], ids=["record_synced", "planned"])
def test_a_life_step_by_step(db: Database, record: Any) -> None:
    with db.transaction() as session:
        job = new_job(session, name="job", state=Q).id
        bystander = new_job(session, name="other", state=Q).id
    for step in range(len(STEPS)):
        before = state_of(db, job)
        results = record(db, [synced(job, step), synced(bystander, 0)], at(step))
        assert results[job].changed == (step in (0, 3, 6, 7)), step
        assert (results[job].refused is not None) == (step in (5, 9)), step
        after = state_of(db, job)
        if step in (1, 4, 8):  # a replay writes nothing, not even updated_at
            assert after == before, step
        if step == 2:  # the latest word is refreshed without a history row
            assert after["job"]["raw_message"] == "0/4 nodes are available"
            assert after["history"] == before["history"]
        # A refused move writes no business change but still keeps the diagnosis.
        assert after["job"]["diagnosis"] == synced(job, step).diagnosis, step
    final = state_of(db, job)
    assert [a["number"] for a in final["attempts"]] == [1, 2]
    assert final["job"]["business_state"] == S
    assert final["job"]["current_attempt"] == 2
    assert [
        (row["kind"], row["to_state"], row["to_reason"], row["attempt"]) for row in final["history"]
    ] == [
        (BUSINESS, "CREATED", ReasonCode.JOB_NOT_CREATED, None),
        (BUSINESS, Q, ReasonCode.SCHEDULING, None),
        (RUNTIME, "Pending", None, 1),
        (BUSINESS, Q, ReasonCode.INSUFFICIENT_CPU, 1),
        (RUNTIME, "Running", None, 1),
        (BUSINESS, R, ReasonCode.TRAINING, 1),
        (RUNTIME, "Failed", None, 1),
        (RUNTIME, "Pending", None, 2),
        (BUSINESS, Q, ReasonCode.SCHEDULING, 2),
        (RUNTIME, "Succeeded", None, 2),
        (BUSINESS, S, ReasonCode.COMPLETED, 2),
    ]


def test_a_job_seen_running_before_its_create_is_recorded_passes_through_queued(
    db: Database,
) -> None:
    """The watch can tell of a running Pod before the dispatcher records its create: the
    Job exists, so the history still says CREATED -> QUEUED -> RUNNING, in order."""
    with db.transaction() as session:
        job = new_job(session, name="fast", state=BusinessState.CREATED).id
    with db.transaction() as session:
        results = record_synced(session, [synced(job, 3)], now=at(1))
    assert results[job].changed
    assert results[job].refused is None
    final = state_of(db, job)
    assert final["job"]["business_state"] == R
    assert [
        (row["from_state"], row["to_state"], row["to_reason"])
        for row in final["history"]
        if row["kind"] == BUSINESS
    ] == [
        (None, "CREATED", ReasonCode.JOB_NOT_CREATED),
        ("CREATED", Q, ReasonCode.SCHEDULING),
        (Q, R, ReasonCode.TRAINING),
    ]


def test_a_pod_gone_and_rebuilt_from_events_without_its_uid_is_the_same_attempt(
    db: Database,
) -> None:
    """After Pod garbage collection an attempt is rebuilt from events, which may not
    carry the Pod's uid: it is still attempt 1 (and keeps its uid), not attempt 3."""
    with db.transaction() as session:
        job = new_job(session, name="gc", state=Q).id
    with db.transaction() as session:
        record_synced(session, [synced(job, 3)], now=at(1))  # RUNNING, uid-1
    gone = dataclasses.replace(
        RUNNING, pod_uid="", pod_phase=None, container_state=None, raw_reason="NodeLost"
    )
    lost = SyncedJob(
        job_id=job,
        pods=[gone, SECOND],
        state=Q,
        reason=ReasonCode.NODE_LOST,
        raw_reason="NodeLost",
        raw_message=None,
        message="the node was lost",
        attempt=2,
        detail=None,
        diagnosis={},
    )
    with db.transaction() as session:
        record_synced(session, [lost], now=at(2))
    attempts = state_of(db, job)["attempts"]
    assert [(a["number"], a["pod_name"], a["pod_uid"]) for a in attempts] == [
        (1, RUNNING.pod_name, "uid-1"),
        (2, SECOND.pod_name, "uid-2"),
    ]
    assert attempts[0]["raw_reason"] == "NodeLost"


def test_a_replayed_batch_writes_nothing(db: Database) -> None:
    with db.transaction() as session:
        ids = [new_job(session, name=f"j{i}", state=Q).id for i in range(3)]
    for step in (0, 3):
        with db.transaction() as session:
            record_synced(session, [synced(j, step) for j in ids], now=at(step))
    with db.read_only() as session:
        before = session.scalar(select(func.count()).select_from(Transition))
        updated = dict(session.execute(select(Job.id, Job.updated_at)).all())
    with db.read_only() as session:  # the syncer's first look: no lock, no write needed
        assert plan_synced(session, [synced(j, 3) for j in ids], now=at(99), lock=False).empty
        assert not plan_synced(session, [synced(j, 7) for j in ids], now=at(99), lock=False).empty
    with db.transaction() as session:
        results = record_synced(session, [synced(j, 3) for j in ids], now=at(99))
    assert not any(r.changed for r in results.values())
    with db.read_only() as session:
        assert session.scalar(select(func.count()).select_from(Transition)) == before
        assert dict(session.execute(select(Job.id, Job.updated_at)).all()) == updated


def test_a_plan_overtaken_before_its_write_is_planned_again(db: Database) -> None:
    """Between the syncer's read and its write another writer (a replica before it lost
    the lease, the API) recorded the same Pod: the stale plan, a first attempt and its
    rows, must not be written again; the plan made anew under the lock writes nothing."""
    with db.transaction() as session:
        job = new_job(session, name="job", state=Q).id
    batch = [synced(job, 0)]
    with db.read_only() as session:
        stale = plan_synced(session, batch, now=at(0), lock=False)
    assert stale.new_attempts
    assert stale.history
    with db.transaction() as session:
        assert record_synced(session, batch, now=at(1))[job].changed
    before = state_of(db, job)
    with db.transaction() as session:
        results = record_planned(session, batch, stale)
    assert not results[job].changed
    assert state_of(db, job) == before


def test_a_batch_writes_its_history_and_attempts_in_one_statement_each(db: Database) -> None:
    """Rows with a None in other columns (a business row has reason codes, a runtime row
    none; a row's detail may be None) have the same columns still, so a batch is one
    executemany on the driver's cursor: each run of rows with other columns was one
    statement before, the history's one per row (CPU quadratic in the batch). A None
    detail is SQL NULL, not JSON null."""
    with db.transaction() as session:
        ids = [new_job(session, name=f"j{i}", state=Q).id for i in range(30)]
    for step in (0, 6):  # a first Pod; its eviction and a replacement (attempt 2)
        with db.transaction() as session:
            batch = [synced(j, step) for j in ids]
            plan = plan_synced(session, batch, now=at(step))
            assert len({tuple(row) for row in plan.new_attempts}) == 1
            assert len({tuple(row) for row in plan.history}) == 1
            record_synced(session, batch, now=at(step))
    with db.read_only() as session:
        rows = session.scalars(select(Transition).where(Transition.job_id.in_(ids))).all()
        kinds = {row.kind for row in rows}
        assert kinds == {BUSINESS, RUNTIME}
        assert len(rows) > 2 * len(ids)
        no_detail = sum(row.detail is None for row in rows)
        assert no_detail > 0
        assert (
            session.scalar(
                select(func.count()).where(Transition.job_id.in_(ids), Transition.detail.is_(None))
            )
            == no_detail
        )


def test_a_batch_queues_the_webhooks_of_its_hooked_projects_business_rows_only(
    db: Database,
) -> None:
    """The history goes through SQLAlchemy's RETURNING only where a webhook needs the rows'
    ids: the same batch, with a job of a project with a webhook and one without, writes
    the same history for both and queues the hooked one's business rows, in order."""
    with db.transaction() as session:
        hooked = new_job(session, project="hooked", name="a", state=Q).id
        quiet = new_job(session, project="quiet", name="b", state=Q).id
        hook, _ = create_webhook(
            session, project="hooked", url="https://hooks.example/x", events=[], created_by="t"
        )
    with db.read_only() as session:
        before = session.scalar(select(func.max(Transition.id)))
    for step in (0, 3):  # pending (attempt 1), running
        with db.transaction() as session:
            record_synced(session, [synced(hooked, step), synced(quiet, step)], now=at(step))
    hooked_state, quiet_state = state_of(db, hooked), state_of(db, quiet)
    assert hooked_state["history"] == quiet_state["history"]
    with db.read_only() as session:
        business = session.scalars(
            select(Transition.id)
            .where(Transition.job_id == hooked, Transition.kind == BUSINESS)
            .where(Transition.id > before)
            .order_by(Transition.id)
        ).all()
        queued = session.scalars(
            select(WebhookDelivery.transition_id)
            .where(WebhookDelivery.webhook_id == hook.id, WebhookDelivery.transition_id > before)
            .order_by(WebhookDelivery.transition_id)
        ).all()
        quiet_rows = session.scalars(select(Transition.id).where(Transition.job_id == quiet))
        assert not set(queued) & set(quiet_rows)
    assert queued == business
    assert len(queued) == 2  # QUEUED (insufficient CPU), RUNNING


def test_facts_and_unfinished_ids_in_one_query_each(db: Database) -> None:
    with db.transaction() as session:
        waiting = new_job(session, name="a", state=Q)
        done = new_job(session, name="b", state=S)
    with db.read_only() as session:
        facts = sync_facts(session, [waiting.id, done.id, "no-such-job"])
        assert set(facts) == {waiting.id, done.id}
        assert facts[waiting.id].business_state == Q
        assert facts[waiting.id].namespace == waiting.namespace
        assert unfinished_job_ids(session) == [waiting.id]
