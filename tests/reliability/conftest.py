"""The reliability suite: the API under generated and hostile input (SQLite and PostgreSQL),
and the whole control plane under faults on the testbed."""

from __future__ import annotations

from tests.api.conftest import app, changes, client, settings, tokens
from tests.cli.conftest import server, use
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
