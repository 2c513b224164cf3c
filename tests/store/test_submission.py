"""Submitting jobs: the first history row, idempotent replays, conflicts, and races."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    IdempotencyConflict,
    Job,
    Source,
    Submission,
    Transition,
    TransitionKind,
    job_history,
    submit_job,
)
from kubetrain.store._unique import insert_unless_exists
from tests.store.builders import SPEC, T0, at, digest_of, new_job

pytestmark = pytest.mark.db


def count(session: Session, model: type[Job] | type[Transition]) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


def submit(
    session: Session, spec: dict[str, object], key: str | None, project: str = "ai-training"
) -> Submission:
    return submit_job(
        session,
        project=project,
        name="train",
        owner="alice",
        namespace=project,
        spec=spec,
        idempotency_key=key,
        digest=digest_of(spec),
        now=T0,
    )


def test_a_new_job_is_created_with_its_first_history_row(db: Database) -> None:
    with db.transaction() as session:
        result = submit(session, SPEC, None)
    job = result.job
    assert not result.replayed
    assert (job.business_state, job.reason) == (BusinessState.CREATED, ReasonCode.JOB_NOT_CREATED)
    assert job.next_dispatch_at == T0  # due for the dispatcher at once
    assert job.spec == SPEC
    assert job.spec_digest == digest_of(SPEC)
    with db.read_only() as session:
        [row] = job_history(session, "ai-training", job.id)
    assert (row.kind, row.source, row.from_state, row.to_state, row.to_reason) == (
        TransitionKind.BUSINESS,
        Source.API,
        None,
        BusinessState.CREATED,
        ReasonCode.JOB_NOT_CREATED,
    )
    with db.read_only() as session:
        # Empty JSON columns are SQL NULL, not the JSON value null (what an explicit None
        # would store), like those of rows the ORM writes.
        assert session.scalar(text("SELECT diagnosis IS NULL FROM jobs"))
        assert session.scalar(text("SELECT detail IS NULL FROM transitions"))
        stored = session.get(Job, job.id)
        assert stored is not None
        session.refresh(stored)
        assert stored.next_dispatch_at == T0
        assert (stored.current_attempt, stored.cancel_requested, stored.k8s_job_name) == (
            0,
            False,
            None,
        )


def test_same_key_same_spec_is_a_replay(db: Database) -> None:
    with db.transaction() as session:
        first = submit(session, {"a": 1, "b": {"c": 2}}, "key-1")
    with db.transaction() as session:
        # Same spec, keys in another order: the same canonical JSON.
        again = submit(session, {"b": {"c": 2}, "a": 1}, "key-1")
    assert again.replayed
    assert not first.replayed
    assert again.job.id == first.job.id
    with db.read_only() as session:
        assert count(session, Job) == 1
        assert count(session, Transition) == 1


def test_same_key_other_spec_is_a_conflict(db: Database) -> None:
    with db.transaction() as session:
        first = submit(session, SPEC, "key-1")
    with pytest.raises(IdempotencyConflict) as caught, db.transaction() as session:
        submit(session, {**SPEC, "image": "other"}, "key-1")
    assert caught.value.existing_job_id == first.job.id
    with db.read_only() as session:
        assert count(session, Job) == 1
        assert count(session, Transition) == 1


def test_keys_are_scoped_to_a_project(db: Database) -> None:
    with db.transaction() as session:
        one = submit(session, SPEC, "key-1", project="team-a")
        other = submit(session, {"x": 1}, "key-1", project="team-b")
    assert not other.replayed
    assert one.job.id != other.job.id


def test_without_a_key_every_submission_is_a_new_job(db: Database) -> None:
    with db.transaction() as session:
        ids = {submit(session, SPEC, None).job.id for _ in range(3)}
    assert len(ids) == 3


def test_twenty_concurrent_submissions_with_one_key_make_one_job(db: Database) -> None:
    clients = 20
    barrier = threading.Barrier(clients)

    def client(_: int) -> tuple[str, bool]:
        barrier.wait()  # all twenty race for the same key at once
        with db.transaction() as session:
            result = submit(session, SPEC, "retry-storm")
            return result.job.id, result.replayed

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    assert len({job_id for job_id, _ in results}) == 1
    assert sorted(replayed for _, replayed in results) == [False] + [True] * (clients - 1)
    with db.read_only() as session:
        assert count(session, Job) == 1
        assert count(session, Transition) == 1  # one CREATED row, not twenty


def test_a_lost_race_finds_the_winner(db: Database) -> None:
    """The path taken when a concurrent insert wins between our lookup and our insert
    (on SQLite, where writers are serialised, it is forced here): the unique constraint
    fails our insert, the savepoint is rolled back, and the lookup finds the winner."""
    with db.transaction() as session:
        winner = new_job(session, idempotency_key="k")
    with db.transaction() as session:
        lookups = []

        def find() -> Job | None:
            lookups.append(1)
            if len(lookups) == 1:
                return None  # the stale lookup that missed the winner
            return session.scalars(select(Job).where(Job.idempotency_key == "k")).one()

        def make() -> Job:
            return Job(
                id="loser", project="ai-training", name="train", owner="bob", spec={},
                spec_digest="", idempotency_key="k", namespace="ai-training",
                business_state=BusinessState.CREATED, reason=ReasonCode.JOB_NOT_CREATED,
                created_at=T0, updated_at=T0,
            )  # fmt: skip

        found, inserted = insert_unless_exists(session, find, make)
        assert (found.id, inserted, len(lookups)) == (winner.id, False, 2)
        # The rest of the transaction survived the failed insert.
        new_job(session, name="after", now=at(1))
    with db.read_only() as session:
        assert count(session, Job) == 2


def test_a_caller_digest_decides_what_counts_as_the_same_spec(db: Database) -> None:
    # The API passes the domain's digest, which equates spellings of one amount.
    one = {**SPEC, "cpu": "1"}
    thousand_milli = {**SPEC, "cpu": "1000m"}
    with db.transaction() as session:
        first = submit_job(
            session, project="ai-training", name="train", owner="alice", namespace="ai-training",
            spec=one, idempotency_key="k", digest="same", now=T0,
        )  # fmt: skip
    with db.transaction() as session:
        again = submit_job(
            session, project="ai-training", name="train", owner="alice", namespace="ai-training",
            spec=thousand_milli, idempotency_key="k", digest="same", now=T0,
        )  # fmt: skip
    assert again.replayed
    assert again.job.id == first.job.id
    assert first.job.spec_digest == "same"
    with pytest.raises(IdempotencyConflict), db.transaction() as session:
        submit_job(
            session, project="ai-training", name="train", owner="alice", namespace="ai-training",
            spec=one, idempotency_key="k", digest="other", now=T0,
        )  # fmt: skip
