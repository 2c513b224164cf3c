"""The dispatcher's outbox: claims, backoff with the raw error kept, and leaving it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    JobNotFound,
    Source,
    apply_business_change,
    claim_due_jobs,
    dispatch_backoff,
    get_job,
    job_history,
    lock_jobs,
    record_dispatch_outcomes,
    release_claims,
    request_cancel,
    retry_backed_off_now,
)
from kubetrain.store.metrics import STATE_DURATIONS_KEY
from tests.store.builders import (
    T0,
    at,
    mark_deleted,
    mark_dispatched,
    new_job,
    record_dispatch_failure,
)

pytestmark = pytest.mark.db


def claimed_ids(db: Database, seconds: float, limit: int = 20) -> list[str]:
    with db.transaction() as session:
        return [job.id for job in claim_due_jobs(session, now=at(seconds), limit=limit)]


def test_backoff_doubles_up_to_a_cap() -> None:
    assert [dispatch_backoff(n).total_seconds() for n in range(1, 6)] == [1, 2, 4, 8, 16]
    assert dispatch_backoff(50) == dispatch_backoff(10_000) == timedelta(minutes=5)


def test_claims_take_due_jobs_oldest_first_and_hold_them(db: Database) -> None:
    with db.transaction() as session:
        first = new_job(session, name="first", now=at(0))
        second = new_job(session, name="second", now=at(1))
        new_job(session, name="future", now=at(100))
        new_job(session, name="queued", now=at(0), state=BusinessState.QUEUED)
    assert claimed_ids(db, 10, limit=1) == [first.id]
    assert claimed_ids(db, 10) == [second.id]
    assert claimed_ids(db, 10) == []  # both held
    # A dispatcher that died holding them: due again once the hold ends.
    assert claimed_ids(db, 10 + 61) == [first.id, second.id]


def test_a_failure_keeps_the_raw_error_and_backs_off(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
    now = 0.0
    for failures in (1, 2, 3):
        assert claimed_ids(db, now) == [job.id]
        with db.transaction() as session:
            record_dispatch_failure(
                session, job.id, raw_reason="ConnectionRefused",
                raw_message=f"connect to 127.0.0.1:6443 failed ({failures})", now=at(now),
            )  # fmt: skip
        delay = dispatch_backoff(failures).total_seconds()
        assert claimed_ids(db, now + delay - 0.001) == []
        now += delay
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.business_state, stored.reason) == (
            BusinessState.CREATED,
            ReasonCode.JOB_NOT_CREATED,
        )
        assert (stored.raw_reason, stored.raw_message) == (
            "ConnectionRefused",
            "connect to 127.0.0.1:6443 failed (3)",
        )
        assert stored.dispatch_attempts == 3
        assert stored.last_dispatch_error == f"ConnectionRefused: {stored.raw_message}"
        assert stored.next_dispatch_at == at(now)
        assert len(job_history(session, "ai-training", job.id)) == 1  # retries are not changes


def test_dispatched_jobs_leave_the_outbox_as_queued(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
        record_dispatch_failure(session, job.id, raw_reason="Timeout", raw_message="...", now=T0)
    assert claimed_ids(db, 5) == [job.id]
    with db.transaction() as session:
        row = mark_dispatched(session, job.id, k8s_job_name="kt-abc12", now=at(6))
        assert row is not None
        assert (row.to_state, row.to_reason, row.source) == (
            BusinessState.QUEUED,
            ReasonCode.SCHEDULING,
            Source.DISPATCHER,
        )
    assert claimed_ids(db, 10_000) == []
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.k8s_job_name, stored.next_dispatch_at, stored.last_dispatch_error) == (
            "kt-abc12",
            None,
            None,
        )
        assert stored.raw_reason is None  # the old dispatch error no longer describes it


def test_marking_after_the_syncer_moved_on_only_records_the_name(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
        for state, reason in (
            (BusinessState.QUEUED, ReasonCode.SCHEDULING),
            (BusinessState.RUNNING, ReasonCode.TRAINING),
        ):  # the syncer's steps
            apply_business_change(session, job.id, state, reason, source=Source.SYNCER)
        assert mark_dispatched(session, job.id, k8s_job_name="kt-abc12", now=at(1)) is None
        record_dispatch_failure(session, job.id, raw_reason="late", raw_message="late", now=at(2))
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.business_state, stored.k8s_job_name) == (BusinessState.RUNNING, "kt-abc12")
        assert (stored.dispatch_attempts, stored.raw_reason) == (0, None)


def test_cancel_is_a_flag_idempotent_and_scoped(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
        done = new_job(session, name="done", state=BusinessState.SUCCEEDED)
    for _ in range(2):
        with db.transaction() as session:
            flagged = request_cancel(session, "ai-training", job.id, now=at(1))
            assert flagged is not None
            assert flagged.cancel_requested
            assert flagged.updated_at == at(1)
    with db.transaction() as session:
        assert request_cancel(session, "someone-else", job.id) is None
        finished = request_cancel(session, "ai-training", done.id)
        assert finished is not None
        assert not finished.cancel_requested
    # The dispatcher still sees a cancelled CREATED job, to finish it instead of creating it.
    with db.transaction() as session:
        [claimed] = claim_due_jobs(session, now=at(2))
        assert claimed.cancel_requested
        apply_business_change(
            session, claimed.id, BusinessState.CANCELLED, ReasonCode.CANCELLED,
            source=Source.DISPATCHER, now=at(2),
        )  # fmt: skip
    assert claimed_ids(db, 10_000) == []
    with db.read_only() as session:
        assert len(job_history(session, "ai-training", job.id)) == 2


# SKIP LOCKED needs two open write transactions at once, which SQLite never has.
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_concurrent_claimers_take_disjoint_jobs_without_waiting(db: Database) -> None:
    with db.transaction() as session:
        jobs = [new_job(session, name=f"j{i}", now=at(i)).id for i in range(4)]
    with db.transaction() as one:
        first = [job.id for job in claim_due_jobs(one, limit=2, now=at(10))]
        one.flush()
        with db.transaction() as two:  # while `one` still holds its rows
            two.connection().exec_driver_sql("SET LOCAL lock_timeout = '2s'")
            second = [job.id for job in claim_due_jobs(two, limit=10, now=at(10))]
    assert first == jobs[:2]
    assert second == jobs[2:]


def deletions(db: Database, seconds: float) -> list[str]:
    from kubetrain.store import claim_due_deletions

    with db.transaction() as session:
        return [job.id for job in claim_due_deletions(session, now=at(seconds))]


def test_a_cancelled_dispatched_job_is_due_for_deletion_until_marked(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, now=at(0))
        mark_dispatched(session, job.id, k8s_job_name="kt-x", now=at(1))
    assert deletions(db, 2) == []  # nothing to delete before a cancel
    with db.transaction() as session:  # as the API cancels: flag, then CANCELLED
        request_cancel(session, job.project, job.id, now=at(3))
        apply_business_change(
            session,
            job.id,
            BusinessState.CANCELLED,
            ReasonCode.CANCELLED,
            source=Source.API,
            now=at(3),
        )
    assert deletions(db, 3) == [job.id]
    assert deletions(db, 4) == []  # held while the dispatcher deletes
    with db.transaction() as session:
        mark_deleted(session, job.id, now=at(5))
    assert deletions(db, 500) == []


def test_cancelled_while_the_create_was_in_flight_stays_due_for_deletion(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, now=at(0))
    assert claimed_ids(db, 1) == [job.id]
    with db.transaction() as session:  # the user cancels: no Job known yet
        request_cancel(session, job.project, job.id, now=at(2))
        apply_business_change(
            session,
            job.id,
            BusinessState.CANCELLED,
            ReasonCode.CANCELLED,
            source=Source.API,
            now=at(2),
        )
    with db.transaction() as session:  # then the create returns
        mark_dispatched(session, job.id, k8s_job_name="kt-x", now=at(3))
    assert deletions(db, 3) == [job.id]
    with db.read_only() as session:
        assert get_job(session, job.project, job.id).business_state == BusinessState.CANCELLED


def test_after_an_outage_backed_off_jobs_are_due_at_once(db: Database) -> None:
    with db.transaction() as session:
        failed = [new_job(session, name=f"failed-{i}", now=at(0)) for i in range(3)]
        fresh = new_job(session, name="never-tried", now=at(0))
        queued = new_job(session, name="queued", now=at(0), state=BusinessState.QUEUED)
    for attempts, job in enumerate(failed, start=3):
        for n in range(attempts):  # backoffs of 4, 8 and 16 s by the end
            with db.transaction() as session:
                record_dispatch_failure(
                    session, job.id, raw_reason="ConnectError",
                    raw_message="connection refused", now=at(n),
                )  # fmt: skip
    with db.transaction() as session:
        mark_dispatched(session, queued.id, k8s_job_name=f"kt-{queued.id}", now=at(1))
    assert claimed_ids(db, 5) == [fresh.id]  # the others back off until 6, 11 and 20 s
    with db.transaction() as session:
        assert retry_backed_off_now(session, now=at(5)) == 3  # not the queued one
    assert sorted(claimed_ids(db, 5)) == sorted(job.id for job in failed)


def test_a_new_term_releases_the_claims_and_backoffs_before_it(db: Database) -> None:
    with db.transaction() as session:
        held = new_job(session, name="held", now=at(0))
        backed_off = new_job(session, name="backed-off", now=at(0))
        record_dispatch_failure(
            session, backed_off.id, raw_reason="ConnectError",
            raw_message="connection refused", now=at(1), backoff=lambda _: timedelta(seconds=30),
        )  # fmt: skip
        deleting = new_job(session, name="deleting", now=at(0))
        mark_dispatched(session, deleting.id, k8s_job_name="kt-x", now=at(1))
        queued = new_job(session, name="queued", now=at(0), state=BusinessState.QUEUED)
        cancel(session, deleting.id, 2)
    assert claimed_ids(db, 2) == [held.id]  # the old leader's claim, held until 62 s;
    # `backed-off` waits until 31 s
    assert deletions(db, 2) == [deleting.id]
    assert claimed_ids(db, 3) == deletions(db, 3) == []
    with db.transaction() as session:
        assert release_claims(session, now=at(3)) == 3  # not the queued one
    assert sorted(claimed_ids(db, 3)) == sorted([held.id, backed_off.id])
    assert deletions(db, 3) == [deleting.id]
    with db.transaction() as session:
        assert get_job(session, queued.project, queued.id).next_dispatch_at == at(0)  # untouched


def cancel(session: Any, job_id: str, seconds: float) -> None:
    """As the API cancels: the flag, then CANCELLED."""
    request_cancel(session, "ai-training", job_id, now=at(seconds))
    apply_business_change(
        session, job_id, BusinessState.CANCELLED, ReasonCode.CANCELLED,
        source=Source.API, now=at(seconds),
    )  # fmt: skip


def test_a_round_records_every_outcome_at_once(db: Database) -> None:
    with db.transaction() as session:
        created = new_job(session, name="created", now=at(0))
        refused = new_job(session, name="refused", now=at(0))
        overtaken = new_job(session, name="overtaken", now=at(0))
        in_flight = new_job(session, name="cancelled-in-flight", now=at(0))
        deleted = new_job(session, name="deleted", now=at(0))
        mark_dispatched(session, deleted.id, k8s_job_name="kt-deleted", now=at(1))
    assert len(claimed_ids(db, 2)) == 4
    assert deletions(db, 2) == []
    with db.transaction() as session:
        # While the creates are in flight: the syncer sees one Job run, a user cancels
        # one job being created and one whose Job exists.
        for state, reason in (
            (BusinessState.QUEUED, ReasonCode.SCHEDULING),
            (BusinessState.RUNNING, ReasonCode.TRAINING),
        ):
            apply_business_change(
                session, overtaken.id, state, reason, source=Source.SYNCER, now=at(3)
            )
        cancel(session, in_flight.id, 3)
        cancel(session, deleted.id, 3)
    assert deletions(db, 3) == [deleted.id]
    with db.transaction() as session:
        rows = record_dispatch_outcomes(
            session,
            dispatched={
                created.id: "kt-created",
                overtaken.id: "kt-overtaken",
                in_flight.id: "kt-in-flight",
            },
            failed={refused.id: ("Forbidden", "exceeded quota: jobs")},
            deleted=[deleted.id],
            now=at(5),
        )
        # Only the job that was still CREATED moved, after 5 s in CREATED.
        assert session.info[STATE_DURATIONS_KEY] == [("CREATED", 5.0)]
    assert [(row.job_id, row.to_state, row.to_reason) for row in rows.values()] == [
        (created.id, BusinessState.QUEUED, ReasonCode.SCHEDULING)
    ]
    with db.read_only() as session:
        states = {
            job.id: (stored := get_job(session, "ai-training", job.id))
            and (stored.business_state, stored.k8s_job_name)
            for job in (created, refused, overtaken, in_flight, deleted)
        }
        failed = get_job(session, "ai-training", refused.id)
        assert failed is not None
        assert (failed.raw_reason, failed.dispatch_attempts, failed.next_dispatch_at) == (
            "Forbidden",
            1,
            at(6),
        )
    assert states == {
        created.id: (BusinessState.QUEUED, "kt-created"),
        refused.id: (BusinessState.CREATED, None),
        overtaken.id: (BusinessState.RUNNING, "kt-overtaken"),
        in_flight.id: (BusinessState.CANCELLED, "kt-in-flight"),
        deleted.id: (BusinessState.CANCELLED, "kt-deleted"),
    }
    assert claimed_ids(db, 6) == [refused.id]  # due after its backoff, the others never
    assert deletions(db, 500) == [in_flight.id]  # its Job, made after the cancel, goes next


def test_an_unknown_job_is_refused(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
    with pytest.raises(JobNotFound), db.transaction() as session:
        record_dispatch_outcomes(session, dispatched={job.id: "kt-a", "no-such-job": "kt-b"})
    with db.read_only() as session:  # and the caller's transaction wrote nothing
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.business_state, stored.k8s_job_name) == (BusinessState.CREATED, None)


def test_lock_jobs_reads_a_batch_by_id_and_leaves_out_unknown_ids(db: Database) -> None:
    with db.transaction() as session:
        jobs = [new_job(session, name=f"j{i}").id for i in range(3)]
    with db.transaction() as session:
        locked = lock_jobs(session, [*reversed(jobs), "no-such-job"])
        assert list(locked) == sorted(jobs)  # the order the rows were locked in
        assert all(locked[job_id].id == job_id for job_id in jobs)


@contextmanager
def counting_statements(db: Database) -> Iterator[list[str]]:
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


def test_a_round_reads_as_often_for_forty_jobs_as_for_four(db: Database) -> None:
    """The rows of a round are read (and locked) at once, not one locked read, one
    re-read and one history query per job; the writes are the ORM's flush."""

    def reads(n: int, offset: float) -> list[str]:
        with db.transaction() as session:
            jobs = [new_job(session, name=f"n{n}-{i}", now=at(offset)).id for i in range(n)]
        half = n // 2
        with counting_statements(db) as statements, db.transaction() as session:
            record_dispatch_outcomes(
                session,
                dispatched={job_id: f"kt-{job_id}" for job_id in jobs[:half]},
                failed={job_id: ("ServiceUnavailable", "etcd") for job_id in jobs[half:]},
                now=at(offset + 1),
            )
        return [statement for statement in statements if statement == "SELECT"]

    # the jobs, their history, their projects' webhooks (for the webhooks' outbox)
    assert reads(40, 10) == reads(4, 0) == ["SELECT", "SELECT", "SELECT"]
