"""Reading jobs: project scoping, names, filters and keyset pagination."""

from __future__ import annotations

import base64

import pytest

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    MAX_PAGE_SIZE,
    Database,
    InvalidCursor,
    Source,
    apply_business_change,
    get_job,
    get_job_any_project,
    job_history,
    list_jobs,
    list_unfinished_jobs,
)
from tests.store.builders import T0, at, new_job

pytestmark = pytest.mark.db


def test_a_job_is_visible_only_in_its_project(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, project="team-a")
    with db.read_only() as session:
        assert get_job(session, "team-a", job.id) is not None
        assert get_job(session, "team-b", job.id) is None
        assert job_history(session, "team-b", job.id) == []
        assert list_jobs(session, "team-b").jobs == []
        assert get_job_any_project(session, job.id) is not None


def test_by_name_is_the_newest_of_that_name(db: Database) -> None:
    with db.transaction() as session:
        new_job(session, name="train", now=at(0))
        newest = new_job(session, name="train", now=at(10))
        new_job(session, name="other", now=at(20))
        new_job(session, name="train", project="elsewhere", now=at(30))
    with db.read_only() as session:
        [found] = list_jobs(session, "ai-training", name="train", limit=1).jobs
        assert found.id == newest.id
        assert list_jobs(session, "ai-training", name="missing", limit=1).jobs == []


def test_filters_by_state_reason_and_name(db: Database) -> None:
    with db.transaction() as session:
        queued_gpu = new_job(session, name="a", now=at(1), state=BusinessState.QUEUED)
        apply_business_change(
            session, queued_gpu.id, BusinessState.QUEUED, ReasonCode.INSUFFICIENT_GPU,
            source=Source.SYNCER, now=at(2),
        )  # fmt: skip
        queued = new_job(session, name="b", now=at(3), state=BusinessState.QUEUED)
        running = new_job(session, name="c", now=at(4), state=BusinessState.RUNNING)
        failed = new_job(session, name="a", now=at(5), state=BusinessState.FAILED)
    with db.read_only() as session:

        def ids(**filters: object) -> list[str]:
            return [job.id for job in list_jobs(session, "ai-training", **filters).jobs]

        assert ids(states=[BusinessState.QUEUED]) == [queued.id, queued_gpu.id]
        assert ids(reasons=[ReasonCode.INSUFFICIENT_GPU]) == [queued_gpu.id]
        assert ids(states=[BusinessState.QUEUED], reasons=[ReasonCode.SCHEDULING]) == [queued.id]
        assert ids(states=[BusinessState.RUNNING, BusinessState.FAILED]) == [failed.id, running.id]
        assert ids(name="a") == [failed.id, queued_gpu.id]
        assert ids(states=[BusinessState.SUCCEEDED]) == []
        unfinished = [job.id for job in list_unfinished_jobs(session)]
        assert unfinished == [queued_gpu.id, queued.id, running.id]


def test_pages_are_stable_while_jobs_are_submitted(db: Database) -> None:
    with db.transaction() as session:
        # Seven jobs, three of them in the same microsecond: the id breaks the tie.
        originals = [new_job(session, name=f"j{i}", now=at(min(i, 4))).id for i in range(7)]
    newest_first = sorted(
        originals, key=lambda job_id: (min(originals.index(job_id), 4), job_id), reverse=True
    )
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        with db.read_only() as session:
            page = list_jobs(session, "ai-training", limit=3, cursor=cursor)
        seen += [job.id for job in page.jobs]
        pages += 1
        # Submissions between pages land before the first page, not in the rest.
        with db.transaction() as session:
            new_job(session, name=f"late{pages}", now=at(100 + pages))
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == newest_first
    assert pages == 3


def test_page_size_is_clamped(db: Database) -> None:
    with db.transaction() as session:
        for i in range(3):
            new_job(session, name=f"j{i}", now=at(i))
    with db.read_only() as session:
        assert len(list_jobs(session, "ai-training", limit=0).jobs) == 1
        page = list_jobs(session, "ai-training", limit=MAX_PAGE_SIZE + 1000)
        assert len(page.jobs) == 3
        assert page.next_cursor is None


@pytest.mark.parametrize(
    "cursor",
    [
        "not base64 at all!",
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(b'{"a": 1}').decode(),
        base64.urlsafe_b64encode(b'["2026-01-01T00:00:00", "id"]').decode(),  # naive
        base64.urlsafe_b64encode(b'["2026-01-01T00:00:00+00:00", 5]').decode(),
    ],
)
def test_foreign_cursors_are_refused(db: Database, cursor: str) -> None:
    with db.read_only() as session, pytest.raises(InvalidCursor):
        list_jobs(session, "ai-training", cursor=cursor)


def test_cursor_survives_round_trip_with_offsets(db: Database) -> None:
    with db.transaction() as session:
        first = new_job(session, name="old", now=T0)
        second = new_job(session, name="new", now=at(0.000001))
    with db.read_only() as session:
        page = list_jobs(session, "ai-training", limit=1)
        assert [job.id for job in page.jobs] == [second.id]
        rest = list_jobs(session, "ai-training", limit=1, cursor=page.next_cursor)
        assert [job.id for job in rest.jobs] == [first.id]
        assert rest.next_cursor is None
