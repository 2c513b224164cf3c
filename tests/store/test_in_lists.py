"""IN lists of many ids (store/in_lists.py): a query that takes a batch of any size
renders a handful of statements, not one per batch size, and answers as before.

Each connection keeps its prepared statements (Python's sqlite3 up to 128, psycopg its
prepared ones); one statement per IN list length filled those caches with one-off
statements as the syncer's batches came in sizes 1 to 500.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from kubetrain.domain.states import BusinessState
from kubetrain.store import Database
from kubetrain.store.in_lists import IN_CHUNK, in_chunks, padded
from kubetrain.store.sync import sync_facts
from tests.store.builders import new_job

pytestmark = pytest.mark.db


def test_padded_lengths_are_powers_of_two_and_keep_every_value() -> None:
    lengths = {len(padded(list(range(n)))) for n in range(1, IN_CHUNK + 1)}
    assert lengths == {1 << k for k in range(10)}  # 1 .. 512: ten statements at most
    for n in range(0, 40):
        values = [f"id-{i}" for i in range(n)]
        out = padded(values)
        assert list(out[:n]) == values
        assert set(out) == set(values)
    chunks = in_chunks([str(i) for i in range(IN_CHUNK + 3)])
    assert [len(c) for c in chunks] == [IN_CHUNK, 4]
    assert set(chunks[1]) == {str(IN_CHUNK), str(IN_CHUNK + 1), str(IN_CHUNK + 2)}


@pytest.fixture
def statements(db: Database) -> Iterator[list[str]]:
    seen: list[str] = []

    def note(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(db.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(db.engine, "before_cursor_execute", note)


def test_batches_of_every_size_share_a_few_statements(db: Database, statements: list[str]) -> None:
    with db.transaction() as session:
        jobs = [new_job(session, name=f"j{i}", state=BusinessState.QUEUED) for i in range(5)]
    known = [job.id for job in jobs]
    statements.clear()
    with db.read_only() as session:
        for size in range(1, 101):
            ids = [*known[: size % 6], *(f"missing-{size}-{i}" for i in range(size))]
            facts = sync_facts(session, ids)
            assert set(facts) == set(known[: size % 6])  # the answer is the unpadded list's
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 100
    # Sizes 1..105 in buckets 1, 2, 4, ..., 128: eight texts (one per size unpadded).
    assert len(set(reads)) <= 8
