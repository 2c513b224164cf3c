"""API tests run the real ASGI app on a real database, once on SQLite and once on PostgreSQL."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import Tokens, make_tokens
from tests.pg import backend, database_url, db, postgres_server

__all__ = ["backend", "database_url", "db", "postgres_server"]  # fixtures, re-exported for pytest


@pytest.fixture(autouse=True)
def isolated_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings from the test alone: no KUBETRAIN_* of the caller's, no config file of theirs."""
    for name in list(os.environ):
        if name.startswith("KUBETRAIN_") and not name.startswith("KUBETRAIN_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBETRAIN_CONFIG", str(tmp_path / "no-config.toml"))


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
