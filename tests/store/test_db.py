"""The database handle: URLs, SQLite's settings, time zones, writers in many threads, and
the pool's check of idle PostgreSQL connections."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import InternalError, OperationalError

from kubetrain.store import Database, default_sqlite_url, get_job, lock_job, normalize_url
from kubetrain.store import db as db_module
from tests.store.builders import T0, new_job, writer_held

pytestmark = pytest.mark.db


def test_default_sqlite_url_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_sqlite_url() == f"sqlite:///{tmp_path}/xdg/kubetrain/kubetrain.db"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_sqlite_url() == f"sqlite:///{tmp_path}/home/.local/share/kubetrain/kubetrain.db"


def test_default_sqlite_database_is_created_with_its_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "fresh"))
    database = Database(default_sqlite_url())
    database.upgrade()
    database.dispose()
    assert (tmp_path / "fresh" / "kubetrain" / "kubetrain.db").is_file()


def test_libpq_urls_use_psycopg() -> None:
    assert normalize_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("postgres://u@h/db").drivername == "postgresql+psycopg"
    assert normalize_url("sqlite:///x.db").drivername == "sqlite"
    with pytest.raises(ValueError, match="unsupported database"):
        Database("mysql://u@h/db")


def test_sqlite_settings(tmp_path: Path) -> None:
    database = Database(f"sqlite:///{tmp_path / 'k.db'}")
    with database.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    database.dispose()


def test_times_come_back_aware_in_utc(db: Database) -> None:
    plus_two = timezone(timedelta(hours=2))
    with db.transaction() as session:
        job = new_job(session, now=T0.astimezone(plus_two))
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        session.expire(stored)  # read back from the database, not the identity map
        assert stored.created_at == T0
        assert stored.created_at.utcoffset() == timedelta(0)


def test_naive_times_are_refused(db: Database) -> None:
    with pytest.raises(Exception, match="naive datetime"), db.transaction() as session:
        new_job(session, now=datetime(2026, 1, 1))


# SQLite has no read-only transactions; its read_only() merely takes no lock.
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_read_only_refuses_writes_on_postgresql(db: Database) -> None:
    with pytest.raises(InternalError, match="read-only"), db.read_only() as session:
        new_job(session)


def test_readers_do_not_wait_for_a_writer(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
    with db.transaction() as writer:
        lock_job(writer, job.id).owner = "bob"
        writer.flush()
        # The writer holds its lock; a reader sees the committed state at once.
        with db.read_only() as reader:
            assert reader.execute(text("SELECT owner FROM jobs")).scalar() == "alice"


def test_concurrent_read_modify_write_loses_nothing(db: Database) -> None:
    """Threads that read a row and then write it: on SQLite a deferred transaction would
    fail with "database is locked"; on PostgreSQL an unlocked read would lose updates."""
    with db.transaction() as session:
        job = new_job(session)
    threads_n, rounds = 8, 5
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def work() -> None:
        try:
            barrier.wait()
            for _ in range(rounds):
                with db.transaction() as session:
                    locked = lock_job(session, job.id)
                    locked.dispatch_attempts = locked.dispatch_attempts + 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert stored.dispatch_attempts == threads_n * rounds


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_sqlite_writer_waits_for_this_process_writer_lock_then_fails_as_locked(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writers of one process queue on the Database's lock, not in SQLite's polling busy
    handler; one that waits past the busy timeout fails as SQLite would (the API's 503)."""
    monkeypatch.setattr(db_module, "SQLITE_BUSY_TIMEOUT_S", 0.2)
    with (
        writer_held(db),
        pytest.raises(OperationalError, match="database is locked"),
        db.transaction(),
    ):
        pass
    with db.transaction() as session:  # free again
        new_job(session, name="after")


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_postgresql_connection_that_died_while_idle_is_replaced_before_use(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle check (db._ping_after_idle) in place of pool_pre_ping: a pooled
    connection whose server process went away costs a reconnect, not a failed request."""
    with db.transaction() as session:
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar()
    url = db.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [pid])
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 0.0)  # it has been idle "long enough"
    with db.transaction() as session:
        assert session.execute(text("SELECT pg_backend_pid()")).scalar() != pid


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_postgresql_connection_used_a_moment_ago_is_not_pinged(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    pings: list[object] = []
    real_ping = db.engine.dialect.do_ping

    def counted(dbapi_connection: object) -> bool:
        pings.append(dbapi_connection)
        return real_ping(dbapi_connection)

    monkeypatch.setattr(db.engine.dialect, "do_ping", counted)
    for _ in range(3):
        with db.transaction() as session:
            session.execute(text("SELECT 1"))
    assert pings == []  # a round trip saved on each transaction
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 0.0)
    with db.transaction() as session:
        session.execute(text("SELECT 1"))
    assert len(pings) == 1
