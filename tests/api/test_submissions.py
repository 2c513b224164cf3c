"""The submission writer (api/submissions.py): submissions queued while one is being
written go in one transaction with the outcomes of one after another; a database
that cannot be written is a 503 with nothing written; the writer's thread stops with
the app, after writing what is queued, and when idle."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import httpx2 as httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from kubetrain.api import submissions as submissions_module
from kubetrain.api.context import ApiContext
from kubetrain.api.submissions import SubmissionWriter
from kubetrain.store import (
    Database,
    Job,
    NewSubmission,
    Submission,
    Transition,
    submit_many_and_commit,
)
from kubetrain.store import db as db_module
from tests.api.builders import Tokens, submit, training_job
from tests.store.builders import SPEC, digest_of, writer_held

pytestmark = pytest.mark.db

SQLITE = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)


def counts(db: Database) -> tuple[int, int]:
    with db.read_only() as session:
        jobs = session.scalar(select(func.count()).select_from(Job)) or 0
        rows = session.scalar(select(func.count()).select_from(Transition)) or 0
    return jobs, rows


def writer_of(app: FastAPI) -> SubmissionWriter:
    context: ApiContext = app.state.kubetrain
    return context.submissions


def wait_until_queued(writer: SubmissionWriter, count: int) -> None:
    deadline = time.monotonic() + 10
    while writer._queue.qsize() < count:
        assert time.monotonic() < deadline, "the submissions never queued"
        time.sleep(0.01)


def wait_until_taken(writer: SubmissionWriter) -> None:
    """Until the writer has taken what was queued (and, SQLite's writer lock held
    elsewhere, waits for it with that batch)."""
    deadline = time.monotonic() + 10
    while writer._thread is None or writer._queue.qsize():
        assert time.monotonic() < deadline, "the writer never took the submission"
        time.sleep(0.01)
    time.sleep(0.1)  # past its taking of any more


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch the writer writes (the store's function, spied on)."""
    sizes: list[int] = []
    real = submit_many_and_commit

    def spy(db: Database, batch: Sequence[NewSubmission]) -> list[Submission | Exception]:
        sizes.append(len(batch))
        return real(db, batch)

    monkeypatch.setattr("kubetrain.api.submissions.submit_many_and_commit", spy)
    return sizes


@SQLITE
def test_submissions_queued_meanwhile_are_written_together_as_one_after_another(
    app: FastAPI, client: TestClient, tokens: Tokens, db: Database, batches: list[int]
) -> None:
    """While the first submission waits for SQLite's writer lock (held by another
    writer of the process), four more queue; they are written as one batch, with what
    one after another would answer: the same key twice is a 201 and a 200 (the same
    job), a third time with another job a 409."""
    documents = [
        (training_job("first"), "k-first"),
        (training_job("alone"), None),
        (training_job("twice"), "k-twice"),
        (training_job("twice"), "k-twice"),
        (training_job("other", workers=2), "k-twice"),
    ]
    # The token verified (its use recorded: a write) and the writer started, first.
    assert submit(client, tokens, training_job("before")).status_code == 201
    with ThreadPoolExecutor(len(documents)) as pool:
        with writer_held(db):
            document, key = documents[0]
            first = pool.submit(submit, client, tokens, document, key=key)
            wait_until_taken(writer_of(app))
            rest: list[Future[httpx.Response]] = []
            for document, key in documents[1:]:
                rest.append(pool.submit(submit, client, tokens, document, key=key))
                wait_until_queued(writer_of(app), len(rest))  # in this order
        responses = [first.result(), *(each.result() for each in rest)]
    assert batches == [1, 1, 4]
    assert [r.status_code for r in responses] == [201, 201, 201, 200, 409]
    assert responses[3].json()["id"] == responses[2].json()["id"]
    assert responses[4].json()["job_id"] == responses[2].json()["id"]
    assert counts(db) == (5, 5)  # the holder's job, the one before, and three


@SQLITE
def test_a_database_that_cannot_be_written_is_503_and_nothing_is_written(
    client: TestClient, tokens: Tokens, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert submit(client, tokens, key="before").status_code == 201  # the token verified
    monkeypatch.setattr(db_module, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    with writer_held(db):
        response = submit(client, tokens, key="k")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert counts(db) == (2, 2)  # the one before and the holder's
    assert submit(client, tokens, key="k").status_code == 201  # the writer goes on


def test_the_writer_stops_with_the_app(app: FastAPI, tokens: Tokens) -> None:
    with TestClient(app) as client:
        assert submit(client, tokens).status_code == 201
        thread = writer_of(app)._thread
        assert thread is not None
        assert thread.is_alive()
    assert not thread.is_alive()
    assert writer_of(app)._thread is None
    with TestClient(app) as client:  # and starts again with it
        assert submit(client, tokens).status_code == 201


@contextmanager
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as the server's."""
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever)
    runner.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join()
        loop.close()


def new(key: str) -> NewSubmission:
    return NewSubmission(
        project="ai-training",
        name="train",
        owner="alice",
        namespace="ai-training",
        spec=SPEC,
        digest=digest_of(SPEC),
        idempotency_key=key,
    )


@SQLITE
def test_close_writes_what_is_queued_then_stops(db: Database) -> None:
    writer = SubmissionWriter(db)
    with event_loop() as loop:
        with writer_held(db):
            futures = [asyncio.run_coroutine_threadsafe(writer.submit(new("0")), loop)]
            wait_until_taken(writer)
            futures += [
                asyncio.run_coroutine_threadsafe(writer.submit(new(str(i))), loop) for i in (1, 2)
            ]
            wait_until_queued(writer, 2)
            closing = threading.Thread(target=writer.close)
            closing.start()
            time.sleep(0.1)
            assert closing.is_alive()  # waiting for the queued submissions
        closing.join(10)
        assert not closing.is_alive()
        outcomes = [future.result(10) for future in futures]
    assert [each.replayed for each in outcomes] == [False] * 3
    assert writer._thread is None
    assert counts(db) == (4, 4)


def test_an_idle_writer_leaves_and_comes_back(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submissions_module, "IDLE_EXIT_S", 0.05)
    writer = SubmissionWriter(db)
    with event_loop() as loop:
        first = asyncio.run_coroutine_threadsafe(writer.submit(new("1")), loop).result(10)
        thread = writer._thread
        if thread is not None:  # else it has left already
            thread.join(5)
            assert not thread.is_alive()
        assert writer._thread is None
        again = asyncio.run_coroutine_threadsafe(writer.submit(new("1")), loop).result(10)
    assert (first.replayed, again.replayed, again.job.id) == (False, True, first.job.id)
    writer.close()
