"""Core statements run on the database driver's own cursor, for the submission path.

SQLAlchemy compiles each statement once per dialect, and its types' bind processors
convert the values (a UTC datetime, a JSON document, an enum), so a row is stored
exactly as through `Connection.execute`. What is skipped is the per-execution
machinery around the driver's call: a submission's begin, three statements and
commit on SQLite took 0.50 ms of CPU through an ORM session, 0.36 ms through a
Connection and 0.12 ms on the driver's cursor, SQLite's own work being ~20 µs a
statement (docs/benchmarks.md, "The submission on the driver"). Errors still leave
as SQLAlchemy's (`wrap_errors`), so callers and the API's 503 handling see no
difference; what does not see these statements is SQLAlchemy's own statement
logging (`echo`) and its execution events (`before_cursor_execute`).

Only statements whose parameters are all plain binds qualify: no expanding IN lists,
no literal rendering (`compile` refuses the others).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ClauseElement, Dialect, Engine
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import DBAPICursor
from sqlalchemy.pool import PoolProxiedConnection
from sqlalchemy.sql.compiler import SQLCompiler

_Processor = Callable[[Any], Any] | None


@dataclass(frozen=True, slots=True)
class Compiled:
    """One statement's SQL for one dialect, and how to turn values into its parameters."""

    sql: str
    names: tuple[str, ...]  # the bind names, in the driver's order when positional
    processors: tuple[_Processor, ...]
    positional: bool
    # Known when compiled: asking the cursor (`description`) made psycopg build its
    # columns on every execution (~2 % of a submission's interpreter time there).
    returns_rows: bool

    def parameters(self, values: Mapping[str, Any]) -> Sequence[Any] | dict[str, Any]:
        converted = [
            values[name] if process is None else process(values[name])
            for name, process in zip(self.names, self.processors, strict=True)
        ]
        if self.positional:
            return tuple(converted)
        return dict(zip(self.names, converted, strict=True))


def compile_for(statement: ClauseElement, dialect: Dialect) -> Compiled:
    """`statement` compiled for `dialect`, with every bind's processor: once per process.
    Every bind must be given by name at execution (`bindparam(name)`, no value of its own)."""
    compiled = statement.compile(dialect=dialect)
    assert isinstance(compiled, SQLCompiler)
    binds = {name: bind for bind, name in compiled.bind_names.items()}
    given = [name for name, bind in binds.items() if not bind.required]
    if given or compiled.literal_execute_params or compiled.post_compile_params:
        raise ValueError(f"not plain binds to give at execution: {given or 'expanding'}")
    if compiled.escaped_bind_names:
        raise ValueError("bind names the driver would need escaped are not supported")
    if compiled.positional:
        assert compiled.positiontup is not None
        names = tuple(compiled.positiontup)
    else:
        names = tuple(binds)
    processors = tuple(binds[n].type.dialect_impl(dialect).bind_processor(dialect) for n in names)
    writes = compiled.isinsert or compiled.isupdate or compiled.isdelete
    returns_rows = bool(compiled.returning) or not writes  # a SELECT, or a write's RETURNING
    return Compiled(compiled.string, names, processors, compiled.positional, returns_rows)


def execute(cursor: DBAPICursor, statement: Compiled, values: Mapping[str, Any]) -> list[Any]:
    """Run the statement with `values` (by bind name); the rows it returned, if any."""
    cursor.execute(statement.sql, statement.parameters(values))
    return list(cursor.fetchall()) if statement.returns_rows else []


def execute_many(
    cursor: DBAPICursor, statement: Compiled, rows: Sequence[Mapping[str, Any]]
) -> None:
    """Run the statement (returning nothing) once per row of values."""
    parameters: Any = [statement.parameters(values) for values in rows]  # all of one kind
    cursor.executemany(statement.sql, parameters)


def connect(engine: Engine) -> PoolProxiedConnection:
    """A pooled connection; one that cannot be made (the server down, refusing) fails as
    SQLAlchemy's error, as `engine.connect()` fails (`raw_connection` leaves the driver's)."""
    dialect = engine.dialect
    try:
        return engine.raw_connection()
    except dialect.loaded_dbapi.Error as exc:
        raise _as_sqlalchemys(exc, dialect, lost=dialect.is_disconnect(exc, None, None)) from exc


@contextmanager
def wrap_errors(engine: Engine, connection: PoolProxiedConnection) -> Iterator[None]:
    """The driver's errors on `connection` as SQLAlchemy's (`OperationalError`,
    `IntegrityError`, ...), as `Connection.execute` raises them. One that says the
    connection is lost also invalidates it and the pool's older connections, as
    SQLAlchemy does, so that they are replaced rather than failing one by one."""
    dialect = engine.dialect
    try:
        yield
    except dialect.loaded_dbapi.Error as exc:
        lost = connection.is_valid and dialect.is_disconnect(exc, connection.dbapi_connection, None)
        if lost:
            engine.pool._invalidate(connection, exc)  # what Connection's error handling calls
        raise _as_sqlalchemys(exc, dialect, lost=lost) from exc


def _as_sqlalchemys(exc: Exception, dialect: Dialect, *, lost: bool) -> sa_exc.StatementError:
    """The driver's error as SQLAlchemy's class for it (`OperationalError`, ...)."""
    return sa_exc.DBAPIError.instance(
        None, None, exc, dialect.loaded_dbapi.Error, connection_invalidated=lost, dialect=dialect
    )
