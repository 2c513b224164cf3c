"""A real `kubetrain serve` process against the testbed and a real database.

The server runs as a subprocess (so tests can SIGKILL and restart it); tests
talk to it over HTTP only. It is parametrized over SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from kubetrain.testbed.cluster import Testbed
from kubetrain.testbed.processes import pick_free_ports
from tests.pg import postgres_server

__all__ = ["postgres_server"]  # a fixture, re-exported for pytest

CLI = [sys.executable, "-m", "kubetrain.cli.main"]


@dataclass
class Server:
    url: str
    database_url: str
    kubeconfig: Path
    log: Path
    env: dict[str, str]
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)

    def start(self, timeout: float = 60) -> None:
        log = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        port = self.url.rsplit(":", 1)[1]
        self.proc = subprocess.Popen(
            [*CLI, "serve", "--host", "127.0.0.1", "--port", port, *self.extra_args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kubetrain serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"kubetrain serve not ready:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "KUBETRAIN_URL": self.url, "KUBETRAIN_TOKEN": token or self.token}
        return subprocess.run(
            [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            timeout=30,
            headers={"Authorization": f"Bearer {token or self.token}"},
        )

    def make_token(self, project: str, role: str) -> str:
        result = self.cli("token", "create", "--project", project, "--role", role)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()


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
    (port,) = pick_free_ports(1)
    env = {
        **os.environ,
        "KUBETRAIN_DATABASE_URL": database_url,
        "KUBECONFIG": str(testbed.kubeconfig),
        "KUBETRAIN_LOG_FORMAT": "json",
    }
    srv = Server(
        url=f"http://127.0.0.1:{port}",
        database_url=database_url,
        kubeconfig=testbed.kubeconfig,
        log=tmp / "serve.log",
        env=env,
    )
    srv.token = srv.make_token("*", "admin")
    srv.start()
    try:
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
