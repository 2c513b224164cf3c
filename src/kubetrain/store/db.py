"""The database handle: one engine and its sessions, for SQLite (embedded) or PostgreSQL.

SQLite is set up for many threads of one process: WAL (readers never block the
writer), foreign keys on, a busy timeout, and write transactions that start
with `BEGIN IMMEDIATE`. The last matters most: a deferred transaction that
reads and then writes can find, at its first write, that another writer went
first; SQLite then fails at once with "database is locked" instead of waiting,
because waiting could not make its snapshot current. Taking the write lock at
BEGIN makes writers queue on the busy timeout instead. Reads that need no
lock use `Database.read_only()`.

Within one process, writers also queue on a lock of the `Database` before
BEGIN. SQLite's busy handler polls: a waiting writer sleeps 1, 2, 5, 10, ...
up to 100 ms between tries, so under contention the lock sat free while
every waiter slept, and eight API threads submitting at once spent most of
their time asleep (p99 over 500 ms at a p50 of 3 ms). A thread lock hands
over at once. Other processes on the same file still meet the busy timeout.

PostgreSQL runs at READ COMMITTED (its default), which the repositories rely
on: after a unique violation, a fresh SELECT sees the row that won.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection, Engine, create_engine, event, make_url
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine.interfaces import DBAPIConnection, DBAPICursor
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from kubetrain.store._driver import connect, wrap_errors

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 30  # a writer waits this long for the lock before failing
# Any constant works; it only has to be the same in every kubetrain process, so
# replicas starting together run the migrations one at a time.
MIGRATION_LOCK_KEY = 0x6B756265747261  # "kubetra"
_BEGIN_OPTION = "kubetrain_sqlite_begin"
# A pooled connection unused this long is checked before use (_ping_after_idle).
PING_AFTER_IDLE_S = 1.0
_IDLE_SINCE = "kubetrain_idle_since"


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/kubetrain`, by default `~/.local/share/kubetrain`."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kubetrain"


def default_sqlite_url() -> str:
    """The embedded default: a SQLite file in the user's data directory."""
    return f"sqlite:///{default_data_dir() / 'kubetrain.db'}"


def normalize_url(url: str | URL) -> URL:
    """Accept libpq-style `postgresql://` and `postgres://` URLs; we ship psycopg 3 only."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


class Database:
    """An engine plus session factories. Create one per process and share it across threads."""

    def __init__(self, url: str | URL, *, echo: bool = False, **engine_options: Any) -> None:
        """`engine_options` go to `create_engine` (e.g. `pool_size` for many API threads)."""
        self.url = normalize_url(url)
        self.dialect = self.url.get_backend_name()
        if self.dialect == "sqlite":
            self.engine = _sqlite_engine(self.url, echo=echo, **engine_options)
        elif self.dialect == "postgresql":
            self.engine = create_engine(self.url, echo=echo, **engine_options)
            if not engine_options.get("pool_pre_ping"):
                _ping_after_idle(self.engine)
        else:
            raise ValueError(
                f"unsupported database {self.url.drivername!r}: use sqlite or postgresql"
            )
        # Objects stay usable after commit: the API serialises them afterwards.
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        if self.dialect == "sqlite":
            reader = self.engine.execution_options(**{_BEGIN_OPTION: "DEFERRED"})
        else:
            reader = self.engine.execution_options(postgresql_readonly=True)
        self._readers = sessionmaker(reader, expire_on_commit=False)
        # Reentrant, as SQLite's lock is not: a thread that nests a second write
        # transaction waits out the busy timeout and fails, as it did before.
        self._writer = threading.RLock() if self.dialect == "sqlite" else None

    def __repr__(self) -> str:
        return f"Database({self.url.render_as_string(hide_password=True)!r})"

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session in one read-write transaction: committed on exit, rolled back on error."""
        with self._writing(), self._sessions() as session, session.begin():
            yield session

    @contextmanager
    def driver_transaction(self) -> Iterator[DBAPICursor]:
        """`transaction` on a pooled connection's driver cursor, for statements compiled
        once (store/_driver.py): the submission path, where the session's begin and commit
        cost more than its statements. Committed on exit, rolled back on error; the
        driver's errors leave as SQLAlchemy's."""
        with self._writing():
            connection = connect(self.engine)
            try:
                with wrap_errors(self.engine, connection):
                    cursor = connection.cursor()
                    try:
                        if self.dialect == "sqlite":
                            cursor.execute("BEGIN IMMEDIATE")  # as `_begin` does
                        yield cursor
                    except BaseException:
                        # The first error is the one to tell; a connection too broken to
                        # roll back is then the pool's to reset or replace.
                        with suppress(self.engine.dialect.loaded_dbapi.Error):
                            connection.rollback()
                        raise
                    finally:
                        cursor.close()
                    connection.commit()
            finally:
                connection.close()  # back to the pool

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write transaction's turn: SQLite's writers queue on `_writer` (the module's
        docstring says why); PostgreSQL's need none."""
        if self._writer is None:
            yield
            return
        if not self._writer.acquire(timeout=SQLITE_BUSY_TIMEOUT_S):
            # What SQLite itself would say after its busy timeout (the API answers 503).
            raise sa_exc.OperationalError(
                "BEGIN IMMEDIATE", None, sqlite3.OperationalError("database is locked")
            )
        try:
            yield
        finally:
            self._writer.release()

    @contextmanager
    def read_only(self) -> Iterator[Session]:
        """A session for reads: never waits for writers on SQLite, READ ONLY on PostgreSQL."""
        with self._readers() as session, session.begin():
            yield session

    def session(self) -> Session:
        """A bare session, for callers that manage transactions themselves."""
        return self._sessions()

    def dispose(self) -> None:
        self.engine.dispose()

    # -- migrations ---------------------------------------------------------

    def alembic_config(self) -> Config:
        """Alembic's configuration for this database; no alembic.ini is needed.

        For a new migration after changing the models:
        `command.revision(db.alembic_config(), autogenerate=True, message=...)`.
        """
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        config.set_main_option(
            "sqlalchemy.url", self.url.render_as_string(hide_password=False).replace("%", "%%")
        )
        return config

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema to `revision` (by default the newest), in one transaction."""
        attempts = 5 if self.dialect == "sqlite" else 1
        for attempt in range(1, attempts + 1):
            try:
                self._upgrade(revision)
                return
            except sa_exc.OperationalError as exc:
                # Replicas starting at once on a new SQLite file: switching it to
                # WAL, or a read turning into a write, can meet "database is locked"
                # without the busy handler's wait. The migration rolled back whole.
                if attempt == attempts or "locked" not in str(exc):
                    raise
                time.sleep(0.2 * attempt)

    def _upgrade(self, revision: str) -> None:
        config = self.alembic_config()
        with self.engine.connect() as connection:
            if self.dialect == "sqlite":
                # SQLite alters a table by rebuilding it, and dropping the old copy
                # of a referenced table would trip the foreign keys; the pragma is a
                # no-op inside a transaction, so it is set before BEGIN, and the
                # keys are checked once the migration is done.
                _set_sqlite_foreign_keys(connection, on=False)
            try:
                with connection.begin():
                    if self.dialect == "postgresql":
                        connection.exec_driver_sql(
                            f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
                        )
                    config.attributes["connection"] = connection
                    command.upgrade(config, revision)
                    if self.dialect == "sqlite":
                        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                        if broken:
                            raise RuntimeError(f"migration broke foreign keys: {broken[:10]}")
            finally:
                if self.dialect == "sqlite":
                    # The connection goes back to the pool: restore what _configure set.
                    _set_sqlite_foreign_keys(connection, on=True)

    def current_revision(self) -> str | None:
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def head_revision(self) -> str | None:
        return ScriptDirectory.from_config(self.alembic_config()).get_current_head()


def _sqlite_engine(url: URL, *, echo: bool, **engine_options: Any) -> Engine:
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        # SQLite creates the file but not its directory (e.g. a fresh ~/.local/share).
        Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S, **engine_options.pop("connect_args", {})}
    engine = create_engine(url, echo=echo, connect_args=connect_args, **engine_options)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
        # Take BEGIN away from the sqlite3 module (which would emit a deferred one
        # lazily, and none at all before SELECTs or SAVEPOINTs); `_begin` emits ours.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable in WAL mode except for the last commits on power loss.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_S * 1000}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        mode = connection.get_execution_options().get(_BEGIN_OPTION, "IMMEDIATE")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _ping_after_idle(engine: Engine) -> None:
    """Check a pooled PostgreSQL connection before use if it sat idle for a while.

    A server restart or failover should cost one reconnect, not a failed
    request per pooled connection. SQLAlchemy's `pool_pre_ping` checks every
    checkout, a round trip on each transaction (a fifth of a submission's time
    on PostgreSQL); a connection handed back moments ago was alive then, so
    only one idle for PING_AFTER_IDLE_S is checked. What is given up: a
    request whose connection was in use within that second before a restart
    fails (503), and SQLAlchemy then replaces the pool's older connections.
    """

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry, _proxy: Any) -> None:
        idle_since = record.info.get(_IDLE_SINCE)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return  # new, or in use a moment ago
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the driver's own error: the connection is gone
            raise sa_exc.DisconnectionError("the pooled connection is dead") from exc
        if not alive:
            raise sa_exc.DisconnectionError("the pooled connection is dead")


def _set_sqlite_foreign_keys(connection: Connection, *, on: bool) -> None:
    # On the DBAPI connection itself: through SQLAlchemy, the statement would
    # first begin a transaction, inside which SQLite ignores this pragma.
    raw = connection.connection.dbapi_connection
    assert raw is not None  # an open connection has one
    cursor = raw.cursor()
    cursor.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    cursor.close()
