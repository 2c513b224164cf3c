"""The reliability suite: the API under generated and hostile input (SQLite and PostgreSQL),
and the whole control plane under faults on the testbed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubetrain.testbed.cluster import Testbed
from tests.api.conftest import app, changes, client, settings, tokens
from tests.cli.conftest import server, use
from tests.e2e.conftest import Server
from tests.pg import backend, database_url, db, postgres_server

__all__ = [  # fixtures, re-exported for pytest
    "app",
    "backend",
    "changes",
    "client",
    "database_url",
    "db",
    "postgres_server",
    "server",
    "settings",
    "tokens",
    "use",
]


@contextmanager
def unled_server(
    testbed: Testbed,
    tmp_path: Path,
    database_url: str | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """One `kubetrain serve` (on SQLite unless `database_url`, with `env` added to its
    environment) without leader election: a restart after SIGKILL would otherwise wait out
    the dead process's Lease (15 s) each time, and only one runs at once."""
    srv = Server(
        database_url=database_url or f"sqlite:///{tmp_path / 'kubetrain.db'}",
        log=tmp_path / "serve.log",
        kubeconfig=testbed.kubeconfig,
        args=["--no-leader-elect"],
        extra_env=dict(env or {}),
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
