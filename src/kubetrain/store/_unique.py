"""Insert a row unless a unique constraint says it already exists, without races.

A lookup followed by an insert is not enough under concurrency: two writers can
both see nothing and both insert. The unique constraint decides; the loser's
insert fails inside a SAVEPOINT, which is rolled back without losing the rest
of the caller's transaction, and a fresh lookup finds the winner's row (on
PostgreSQL the failing insert waits for the winner to commit, and READ
COMMITTED lets the next statement see it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kubetrain.store.models import Base

# The winner's row can vanish between our failed insert and the lookup only if
# its transaction rolled back; each such loss costs one more try.
INSERT_TRIES = 5

R = TypeVar("R", bound=Base)


def insert_unless_exists(
    session: Session,
    find: Callable[[], R | None],
    make: Callable[[], R],
    companions: Callable[[R], list[Base]] = lambda _row: [],
) -> tuple[R, bool]:
    """`(existing, False)` if `find()` finds the row, else `(make(), True)` once inserted.

    `companions(row)` are written in the same savepoint after the row itself
    (e.g. its first history row, which refers to it).
    """
    error: IntegrityError | None = None
    for _ in range(INSERT_TRIES):
        existing = find()
        if existing is not None:
            return existing, False
        row = make()
        try:
            with session.begin_nested():
                session.add(row)
                session.flush()
                session.add_all(companions(row))
        except IntegrityError as exc:
            error = exc
            continue
        return row, True
    assert error is not None  # every try ended in an IntegrityError
    raise error
