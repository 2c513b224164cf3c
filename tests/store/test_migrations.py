"""The schema comes from the migrations alone, matches the models, and migrates safely."""

from __future__ import annotations

import re
import threading

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from kubetrain.store import (
    Base,
    Database,
    PodObservation,
    job_history,
)
from kubetrain.store.webhooks import installation_id
from tests.store.builders import T0, new_job, observe

pytestmark = pytest.mark.db

TABLES = {"jobs", "attempts", "transitions", "tokens", "datasets", "reports", "progress"}


def test_upgrade_from_empty_to_head(database_url: str) -> None:
    database = Database(database_url)
    try:
        assert database.current_revision() is None
        assert TABLES.isdisjoint(inspect(database.engine).get_table_names())
        database.upgrade()
        assert database.current_revision() == database.head_revision() is not None
        assert set(inspect(database.engine).get_table_names()) >= TABLES
        database.upgrade()  # at head already: nothing to do, no error
        assert database.current_revision() == database.head_revision()
    finally:
        database.dispose()


def test_models_match_migrations(db: Database) -> None:
    """What `alembic check` asserts: autogenerate finds nothing to add to the migrations."""
    with db.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []


def test_alembic_check_passes(db: Database) -> None:
    """The same through Alembic's own command, which also runs env.py without a connection."""
    command.check(db.alembic_config())


def test_downgrade_to_empty_and_back(db: Database) -> None:
    command.downgrade(db.alembic_config(), "base")
    assert TABLES.isdisjoint(inspect(db.engine).get_table_names())
    db.upgrade()
    assert set(inspect(db.engine).get_table_names()) >= TABLES


def test_replicas_upgrading_at_once_all_succeed(database_url: str) -> None:
    """Every API replica runs `upgrade()` at start; only one may apply the migrations."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def start_replica() -> None:
        database = Database(database_url)
        try:
            barrier.wait()
            database.upgrade()
        except BaseException as exc:
            errors.append(exc)
        finally:
            database.dispose()

    threads = [threading.Thread(target=start_replica) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    database = Database(database_url)
    assert database.current_revision() == database.head_revision()
    database.dispose()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_table_rebuilds_keep_referencing_rows(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A future migration that alters `jobs` makes SQLite rebuild it (copy, drop, rename);
    the drop must not trip the foreign keys of the attempts and history pointing at it."""
    with db.transaction() as session:
        job = new_job(session)
        observe(session, job.id, PodObservation("pod", "uid"), now=T0)

    def rebuild_jobs(config: Config, _revision: str) -> None:
        operations = Operations(MigrationContext.configure(config.attributes["connection"]))
        with operations.batch_alter_table("jobs", recreate="always") as batch:
            batch.alter_column("owner", existing_type=sa.String(255), type_=sa.String(300))

    monkeypatch.setattr(command, "upgrade", rebuild_jobs)
    db.upgrade()
    with db.read_only() as session:
        assert len(job_history(session, "ai-training", job.id)) == 2
    # The pooled connection has its foreign keys back on.
    with db.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_foreign_keys_are_enforced(db: Database) -> None:
    with pytest.raises(IntegrityError), db.transaction() as session:
        session.execute(
            text(
                "INSERT INTO transitions (job_id, at, source, kind) "
                "VALUES ('no-such-job', CURRENT_TIMESTAMP, 'api', 'business')"
            )
        )


def test_a_webhooks_cursor_becomes_its_outbox_rows(database_url: str) -> None:
    """Migration 0007: what a webhook had still to receive (business rows after its cursor)
    becomes its delivery rows, each with a random event key; the installation gets its id."""
    db = Database(database_url)
    db.upgrade("0006")
    with db.transaction() as session:
        job = new_job(session)  # its CREATED row: delivered already, before the cursor
    with db.transaction() as session:
        cursor = session.scalar(text("SELECT MAX(id) FROM transitions"))
        session.execute(
            text(
                "INSERT INTO webhooks (id, project, url, secret, events, created_at, created_by,"
                " cursor, delivered, failures) VALUES ('w1', :project, 'https://h.example/',"
                " 'whsec_x', '[]', CURRENT_TIMESTAMP, 'admin', :cursor, 1, 0)"
            ),
            {"project": job.project, "cursor": cursor},
        )
        for kind in ("business", "runtime", "business"):
            session.execute(
                text(
                    "INSERT INTO transitions (job_id, at, source, kind)"
                    " VALUES (:job, CURRENT_TIMESTAMP, 'syncer', :kind)"
                ),
                {"job": job.id, "kind": kind},
            )
    db.upgrade()
    with db.read_only() as session:
        pending = session.execute(
            text("SELECT transition_id, event_key FROM webhook_deliveries ORDER BY transition_id")
        ).all()
        business = session.scalars(
            text("SELECT id FROM transitions WHERE kind = 'business' AND id > :c ORDER BY id"),
            {"c": cursor},
        ).all()
        assert [row[0] for row in pending] == business
        assert len(business) == 2
        assert all(re.fullmatch(r"[0-9a-f]{32}", row[1]) for row in pending), pending
        assert len({row[1] for row in pending}) == 2
        assert re.fullmatch(r"[0-9a-f-]{36}", installation_id(session))
    db.dispose()
