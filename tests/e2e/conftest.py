"""A real `kubetrain serve` process against the testbed and a real database.

The server runs as a subprocess (so tests can SIGKILL and restart it); tests
talk to it over HTTP only. It is parametrized over SQLite and PostgreSQL.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest

from kubetrain.local_server import CLI, LocalServer
from kubetrain.testbed.cluster import Testbed
from tests.pg import postgres_server

__all__ = ["postgres_server"]  # a fixture, re-exported for pytest


class Server(LocalServer):
    """The shared `kubetrain serve` subprocess, plus the CLI and tokens for tests."""

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "KUBETRAIN_URL": self.url, "KUBETRAIN_TOKEN": token or self.token}
        return subprocess.run(
            [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    def make_token(self, project: str, role: str) -> str:
        return self.create_token(project, role)

    def wait_leading(self, timeout: float = 60) -> None:
        """Until this server holds the Lease and its watches have listed: a server
        started right after another one on the same testbed waits out that one's
        Lease first, and a job submitted meanwhile would skip states."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leading = "kubetrain_leader 1.0" in httpx.get(f"{self.url}/metrics", timeout=5).text
            if leading and httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                return
            time.sleep(0.2)
        raise RuntimeError(f"kubetrain serve did not take the Lease in {timeout} s")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(
    request: pytest.FixtureRequest, testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("server")
    if request.param == "sqlite":
        database_url = f"sqlite:///{tmp / 'kubetrain.db'}"
    else:
        pg = request.getfixturevalue("postgres_server")
        database_url = pg.create_database(f"e2e_{uuid.uuid4().hex[:8]}")
    srv = Server(database_url=database_url, log=tmp / "serve.log", kubeconfig=testbed.kubeconfig)
    # Pods report to this server; each Job gets its own status-token Secret.
    srv.extra_env["KUBETRAIN_STATUS_URL"] = srv.url
    srv.start()
    try:
        srv.wait_leading()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def project() -> str:
    """A fresh project per test; kubetrain creates its namespace on first dispatch."""
    return f"e2e-{uuid.uuid4().hex[:8]}"


def training_job(name: str, project: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}},
            **spec,
        },
    }
    return body
