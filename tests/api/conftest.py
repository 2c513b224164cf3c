"""API tests run the real ASGI app on a real database, once on SQLite and once on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import Tokens, make_tokens
from tests.isolated import isolated_settings
from tests.pg import backend, database_url, db, postgres_server

__all__ = [  # fixtures, re-exported for pytest
    "backend",
    "database_url",
    "db",
    "isolated_settings",
    "postgres_server",
]


@pytest.fixture
def changes() -> list[str]:
    """One entry per call of the app's on_change hook."""
    return []


@pytest.fixture
def settings(db: Database) -> ServerSettings:
    return ServerSettings(database_url=db.url.render_as_string(hide_password=False))


@pytest.fixture
def app(settings: ServerSettings, db: Database, changes: list[str]) -> FastAPI:
    return create_app(settings, db, on_change=lambda: changes.append("changed"))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def tokens(db: Database) -> Tokens:
    return make_tokens(db)
