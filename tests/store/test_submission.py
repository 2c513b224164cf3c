"""Submitting jobs: the first history row, idempotent replays, conflicts, and races."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import psycopg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import func, insert, make_url, select, text
from sqlalchemy.orm import Session

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    IdempotencyConflict,
    Job,
    NewSubmission,
    Source,
    Submission,
    Transition,
    TransitionKind,
    job_history,
    submit_and_commit,
    submit_job,
    submit_many_and_commit,
)
from kubetrain.store import db as db_module
from kubetrain.store import jobs as jobs_module
from kubetrain.store import webhooks as webhooks_module
from kubetrain.store._unique import insert_unless_exists
from kubetrain.store.models import WebhookDelivery
from kubetrain.store.webhooks import create_webhook
from tests.store.builders import SPEC, T0, at, digest_of, new_job, writer_held

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


# -- submit_and_commit: the API's path, on the driver's cursor ----------------------


def queued(
    spec: dict[str, object], key: str | None, project: str = "ai-training", now: datetime = T0
) -> NewSubmission:
    return NewSubmission(
        project=project,
        name="train",
        owner="alice",
        namespace=project,
        spec=spec,
        digest=digest_of(spec),
        idempotency_key=key,
        now=now,
    )


def commit(
    db: Database,
    spec: dict[str, object],
    key: str | None,
    project: str = "ai-training",
    now: datetime = T0,
) -> Submission:
    return submit_and_commit(db, queued(spec, key, project, now))


def test_the_driver_stores_what_sqlalchemy_would_store(db: Database) -> None:
    """The values as stored (read back raw, past SQLAlchemy's types: SQLite's text of a
    time, the JSON's text), of the job and its first history row, are those of rows
    inserted with the same values through the session's execution; NULLs stay NULL."""
    first = commit(db, SPEC, "k-1")
    assert not first.replayed
    job = first.job
    columns = [c.name for c in Job.__table__.c if c.name != "diagnosis"]
    with db.transaction() as session:
        values = {name: getattr(job, name) for name in columns}
        session.execute(
            insert(Job).values({**values, "id": "by-sqlalchemy", "idempotency_key": "2"})
        )
        session.execute(
            insert(Transition).values(
                job_id="by-sqlalchemy", at=T0, source=Source.API, kind=TransitionKind.BUSINESS,
                to_state=BusinessState.CREATED, to_reason=ReasonCode.JOB_NOT_CREATED,
            )
        )  # fmt: skip
    with db.read_only() as session:
        jobs = {row.id: dict(row._mapping) for row in session.execute(text("SELECT * FROM jobs"))}
        rows = {
            row.job_id: dict(row._mapping)
            for row in session.execute(text("SELECT * FROM transitions"))
        }
    mine, theirs = jobs[job.id], jobs["by-sqlalchemy"]
    assert {**mine, "id": None, "idempotency_key": None} == {
        **theirs,
        "id": None,
        "idempotency_key": None,
    }
    assert mine["diagnosis"] is None
    assert {**rows[job.id], "id": None, "job_id": None} == {
        **rows["by-sqlalchemy"],
        "id": None,
        "job_id": None,
    }
    assert rows[job.id]["detail"] is None
    # The job handed back holds what the row holds, with nothing left to load.
    assert (job.business_state, job.reason, job.current_attempt, job.diagnosis) == (
        BusinessState.CREATED,
        ReasonCode.JOB_NOT_CREATED,
        0,
        None,
    )
    assert (job.created_at, job.next_dispatch_at, job.spec) == (T0, T0, SPEC)
    assert job.spec_digest == digest_of(SPEC)


def test_submit_and_commit_replays_the_same_spec_and_refuses_another(db: Database) -> None:
    first = commit(db, {"a": 1, "b": {"c": 2}}, "key-1")
    again = commit(db, {"b": {"c": 2}, "a": 1}, "key-1", now=at(5))
    assert (again.replayed, again.job.id) == (True, first.job.id)
    assert again.job.created_at == T0  # the first job, read back
    with pytest.raises(IdempotencyConflict) as caught:
        commit(db, {"a": 2}, "key-1")
    assert caught.value.existing_job_id == first.job.id
    other = commit(db, {"a": 2}, "key-1", project="team-b")  # keys are per project
    assert not other.replayed
    no_key = {commit(db, SPEC, None).job.id for _ in range(2)}
    assert len(no_key) == 2
    with db.read_only() as session:
        assert count(session, Job) == 4
        assert count(session, Transition) == 4  # no row for a replay or a conflict


def test_twenty_concurrent_submit_and_commits_with_one_key_make_one_job(db: Database) -> None:
    clients = 20
    barrier = threading.Barrier(clients)

    def client(_: int) -> tuple[str, bool]:
        barrier.wait()
        result = commit(db, SPEC, "retry-storm")
        return result.job.id, result.replayed

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, range(clients)))
    assert len({job_id for job_id, _ in results}) == 1
    assert sorted(replayed for _, replayed in results) == [False] + [True] * (clients - 1)
    with db.read_only() as session:
        assert (count(session, Job), count(session, Transition)) == (1, 1)


@pytest.mark.parametrize("path", ["submit_and_commit", "submit_job", "one_batch"])
def test_a_new_job_is_queued_for_each_webhook_of_its_project(db: Database, path: str) -> None:
    with db.transaction() as session:
        hooks = {
            create_webhook(
                session, project="ai-training", url=f"https://hooks.example/{i}", events=[],
                created_by="admin", now=T0,
            )[0].id
            for i in range(2)
        }  # fmt: skip
        create_webhook(
            session, project="team-b", url="https://hooks.example/b", events=[],
            created_by="admin", now=T0,
        )  # fmt: skip
    if path == "submit_and_commit":
        job_id = commit(db, SPEC, "k").job.id
        replay = commit(db, SPEC, "k")
        quiet = commit(db, SPEC, None, project="team-c").job.id
    elif path == "one_batch":
        batch = [queued(SPEC, "k"), queued(SPEC, "k"), queued(SPEC, None, project="team-c")]
        first, again, other = submit_many_and_commit(db, batch)
        assert isinstance(first, Submission)
        assert isinstance(again, Submission)
        assert isinstance(other, Submission)
        job_id, replay, quiet = first.job.id, again, other.job.id
    else:
        with db.transaction() as session:
            job_id = submit(session, SPEC, "k").job.id
            replay = submit(session, SPEC, "k")
            quiet = submit(session, SPEC, None, project="team-c").job.id
    assert replay.replayed
    with db.read_only() as session:
        [row] = job_history(session, "ai-training", job_id)
        delivered = session.execute(
            select(
                WebhookDelivery.webhook_id, WebhookDelivery.transition_id, WebhookDelivery.event_key
            )
        ).all()
        assert job_history(session, "team-c", quiet)  # written, with nothing to deliver
    assert {hook for hook, _, _ in delivered} == hooks  # the project's, not team-b's
    assert {transition for _, transition, _ in delivered} == {row.id}
    keys = [key for _, _, key in delivered]
    assert len(set(keys)) == 2
    assert all(len(key) == 32 and int(key, 16) >= 0 for key in keys)


def deliveries_refused(db: Database, monkeypatch: pytest.MonkeyPatch, project: str) -> None:
    """A webhook in `project`, and its submissions' delivery rows made to name no
    webhook: a foreign key the database refuses, failing those submissions alone."""
    real = webhooks_module.deliveries

    def broken(row_id: int, hooks: object) -> list[dict[str, object]]:
        return [{**row, "webhook_id": "no-such-webhook"} for row in real(row_id, ["x"])]

    with db.transaction() as session:
        create_webhook(
            session, project=project, url="https://hooks.example/", events=[],
            created_by="admin", now=T0,
        )  # fmt: skip
    monkeypatch.setattr(jobs_module, "deliveries", broken)


def test_a_failed_submit_and_commit_writes_nothing_and_leaves_a_sqlalchemy_error(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver error mid-transaction rolls the whole submission back and leaves as
    SQLAlchemy's error (what the API's handlers answer); the pool's connection is
    fine for the next one."""
    deliveries_refused(db, monkeypatch, "ai-training")
    with pytest.raises(sa_exc.IntegrityError):  # the delivery's foreign key
        commit(db, SPEC, "k")
    monkeypatch.undo()
    with db.read_only() as session:
        assert (count(session, Job), count(session, Transition)) == (0, 0)
    assert not commit(db, SPEC, "k").replayed


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_submit_and_commit_queues_on_the_writer_lock_and_fails_as_locked(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_module, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    with writer_held(db), pytest.raises(sa_exc.OperationalError, match="database is locked"):
        commit(db, SPEC, "k")
    assert not commit(db, SPEC, "k").replayed


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_lost_postgresql_connection_is_a_503_error_and_replaced(db: Database) -> None:
    """A pooled connection whose server process went away (used a moment ago: not
    pinged) fails the submission as SQLAlchemy would fail it, invalidated (the API's
    503), and is replaced: the next submission goes through."""
    commit(db, SPEC, "first")
    with db.transaction() as session:
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar()
    url = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(sa_exc.DBAPIError) as caught:
        commit(db, SPEC, "lost")
    assert isinstance(caught.value, sa_exc.OperationalError)
    assert caught.value.connection_invalidated
    assert not commit(db, SPEC, "lost").replayed
    with db.read_only() as session:
        assert count(session, Job) == 2


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_postgresql_server_that_refuses_connections_is_a_503_error(db: Database) -> None:
    """No connection can be made (the server stopped, as the reliability tests stop it):
    the submission fails as SQLAlchemy's OperationalError (the API's 503), not as the
    driver's own error (a 500)."""
    with socket.socket() as probe:  # a port on which nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = Database(db.url.set(port=port).render_as_string(hide_password=False))
    try:
        with pytest.raises(sa_exc.OperationalError, match="Connection refused"):
            commit(refused, SPEC, "refused")
    finally:
        refused.dispose()


# -- submit_many_and_commit: a batch in one transaction (the API's group commit) ------


def told(outcome: Submission | Exception) -> str:
    """An outcome in words: new, the replay or conflict of which job, or the error."""
    if isinstance(outcome, IdempotencyConflict):
        return f"conflict with {outcome.existing_job_id}"
    if isinstance(outcome, Exception):
        return type(outcome).__name__
    return f"replay of {outcome.job.id}" if outcome.replayed else "new"


def test_a_batch_gives_what_the_same_submissions_one_after_another_give(db: Database) -> None:
    """New jobs, a key taken before the batch (replay and conflict), and one key twice
    within the batch (the second a replay of the first, a third with another spec a
    conflict), all in one transaction."""
    before = commit(db, SPEC, "old")
    outcomes = submit_many_and_commit(
        db,
        [
            queued(SPEC, "a"),
            queued(SPEC, None),
            queued(SPEC, "old"),  # replay of the earlier job
            queued({"x": 1}, "old"),  # conflict with it
            queued({"y": 1}, "twice"),
            queued({"y": 1}, "twice"),  # replay of the batch's own job
            queued({"y": 2}, "twice"),  # conflict with it
            queued(SPEC, "a", project="team-b"),  # keys are per project
        ],
    )
    new, no_key, replay, _, first, _, _, other = outcomes
    assert isinstance(replay, Submission)
    assert isinstance(first, Submission)
    assert [told(each) for each in outcomes] == [
        "new",
        "new",
        f"replay of {before.job.id}",
        f"conflict with {before.job.id}",
        "new",
        f"replay of {first.job.id}",
        f"conflict with {first.job.id}",
        "new",
    ]
    with db.read_only() as session:
        assert (count(session, Job), count(session, Transition)) == (5, 5)
        for each in (new, no_key, first, other):
            assert isinstance(each, Submission)
            assert len(job_history(session, each.job.project, each.job.id)) == 1


def test_one_failing_submission_fails_only_itself(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission whose statements fail (here its project's webhook delivery row, made
    to name no webhook: a foreign key the database refuses) rolls the batch back; each
    is then written alone: the others are stored, it alone fails, nothing of it half
    written."""
    deliveries_refused(db, monkeypatch, "hooked")
    outcomes = submit_many_and_commit(
        db, [queued(SPEC, "1"), queued(SPEC, "2", project="hooked"), queued(SPEC, "3")]
    )
    monkeypatch.undo()
    one, _, three = outcomes
    assert [told(each) for each in outcomes] == ["new", "IntegrityError", "new"]
    assert isinstance(one, Submission)
    assert isinstance(three, Submission)
    with db.read_only() as session:
        stored = set(session.scalars(select(Job.id)))
        assert stored == {one.job.id, three.job.id}
        assert count(session, Transition) == 2
        assert not session.scalars(select(WebhookDelivery)).all()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_locked_database_fails_the_whole_batch_once_and_writes_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database unreachable (here SQLite's writer lock held past the busy timeout):
    every submission of the batch gets the error (the API's 503) after one timeout,
    not one timeout each, and nothing is written."""
    monkeypatch.setattr(db_module, "SQLITE_BUSY_TIMEOUT_S", 0.3)
    with writer_held(db):
        began = time.monotonic()
        outcomes = submit_many_and_commit(db, [queued(SPEC, str(i)) for i in range(5)])
        waited = time.monotonic() - began
    assert [told(each) for each in outcomes] == ["OperationalError"] * 5
    assert waited < 1.0
    with db.read_only() as session:
        assert session.scalars(select(Job.name)).all() == ["holder"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_postgresql_server_that_refuses_connections_fails_every_submission_of_a_batch(
    db: Database,
) -> None:
    with socket.socket() as probe:  # a port on which nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    refused = Database(db.url.set(port=port).render_as_string(hide_password=False))
    try:
        outcomes = submit_many_and_commit(refused, [queued(SPEC, "1"), queued(SPEC, "2")])
    finally:
        refused.dispose()
    assert [told(each) for each in outcomes] == ["OperationalError"] * 2
    with db.read_only() as session:
        assert count(session, Job) == 0


def test_each_statement_knows_whether_it_returns_rows() -> None:
    """Known when compiled, not asked of the cursor after each execution."""
    for url in ("postgresql+psycopg://", "sqlite://"):
        dialect = make_url(url).get_dialect()()
        statements = jobs_module._compile_statements(dialect)
        assert statements.hooks.returns_rows
        assert not statements.delivery.returns_rows
        for each in (statements.job_and_first_row, statements.job, statements.first_row):
            assert each is None or each.returns_rows  # an INSERT's RETURNING, a SELECT
