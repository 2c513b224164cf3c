"""IN lists of bound values, as every query of the store that takes many ids builds them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from sqlalchemy import BindParameter, bindparam

# Bound parameters per IN list: far under SQLite's limit (32,766) and PostgreSQL's.
IN_CHUNK = 512

_T = TypeVar("_T")


def padded(values: Sequence[_T]) -> Sequence[_T]:
    """`values` for an IN list, the last repeated up to the next power of two.

    SQLAlchemy renders an IN list of each length as a statement of its own, and each
    connection keeps its prepared statements (Python's sqlite3 up to 128, psycopg its
    prepared ones): with the syncer's batches of any size, those caches filled with
    one-off statements, up to ~3.4 MB of SQLite's memory per connection for lengths
    1-128 alone (docs/benchmarks.md). Padded, a query has at most 10 lengths up to
    `IN_CHUNK`; a repeated value changes no IN list's answer."""
    size = len(values)
    if size < 2:
        return values
    bucket = 1 << (size - 1).bit_length()
    return [*values, *([values[-1]] * (bucket - size))] if bucket > size else values


def in_chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    """`ids` in IN lists of at most `IN_CHUNK`, each `padded`."""
    return [padded(ids[i : i + IN_CHUNK]) for i in range(0, len(ids), IN_CHUNK)]


# The IN list of a statement built once (`in_chunks` gives its values): `.in_(IDS)`.
IDS: BindParameter[list[str]] = bindparam("ids", expanding=True)
