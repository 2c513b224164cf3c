"""CLI tests: the real `kubetrain` command against a real uvicorn server on a free port,
on a SQLite file and on a PostgreSQL database."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from kubetrain.api import create_app
from kubetrain.settings import ServerSettings
from kubetrain.store import ALL_PROJECTS, Database, Role, create_token
from tests.isolated import isolated_settings
from tests.pg import backend, database_url, db, postgres_server

__all__ = [  # fixtures, re-exported for pytest
    "backend",
    "database_url",
    "db",
    "isolated_settings",
    "postgres_server",
]

PROJECT = "ai-training"


@dataclass
class Server:
    url: str
    db: Database
    database_url: str
    requests: list[str] = field(default_factory=list)  # "METHOD PATH" of each request
    tokens: dict[str, str] = field(default_factory=dict)  # "role@project" -> plaintext


class _Recorder:
    """Counts what reaches the server, so a test can say no request was made."""

    def __init__(self, app: ASGIApp, seen: list[str]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append(f"{scope['method']} {scope['path']}")
        await self.app(scope, receive, send)


@pytest.fixture
def server(db: Database) -> Iterator[Server]:
    url = db.url.render_as_string(hide_password=False)
    settings = ServerSettings(database_url=url)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    running = Server(url=f"http://127.0.0.1:{port}", db=db, database_url=url)
    app = _Recorder(create_app(settings, db), running.requests)
    uv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    with db.transaction() as session:
        for role in Role:
            for project in (PROJECT, ALL_PROJECTS):
                _token, plaintext = create_token(
                    session, name=f"{role}-{project}", role=role, project=project
                )
                running.tokens[f"{role}@{project}"] = plaintext
    try:
        yield running
    finally:
        uv.should_exit = True
        thread.join(timeout=20)
        sock.close()


@pytest.fixture
def use(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Point the client commands at the server, with a token of the given role@project."""

    def as_(token: str | None = f"submitter@{PROJECT}", project: str | None = PROJECT) -> None:
        monkeypatch.setenv("KUBETRAIN_URL", server.url)
        if token is None:
            monkeypatch.delenv("KUBETRAIN_TOKEN", raising=False)
        else:
            monkeypatch.setenv("KUBETRAIN_TOKEN", server.tokens.get(token, token))
        if project is None:
            monkeypatch.delenv("KUBETRAIN_PROJECT", raising=False)
        else:
            monkeypatch.setenv("KUBETRAIN_PROJECT", project)

    as_()
    return as_
