"""A `kubetrain serve` subprocess on a free loopback port, for the demo, the
end-to-end tests and the benchmarks (one way to start, wait for and stop it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx

from kubetrain.testbed.processes import pick_free_ports

CLI = [sys.executable, "-m", "kubetrain.cli.main"]


@dataclass
class LocalServer:
    database_url: str
    log: Path
    kubeconfig: Path | None = None
    args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    token: str = ""
    port: int = field(default_factory=lambda: pick_free_ports(1)[0])
    # Real-node Pods reach this machine at the testbed bridge's address, not loopback.
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, **self.extra_env, "KUBETRAIN_DATABASE_URL": self.database_url}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def create_token(self, project: str, role: str, name: str | None = None) -> str:
        """A token straight from the database (how the first admin is made)."""
        argv = [*CLI, "token", "create", "--project", project, "--role", role]
        if name:
            argv += ["--name", name]
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"kubetrain token create failed: {result.stderr.strip()}")
        return result.stdout.strip()

    def start(self, timeout: float = 60) -> LocalServer:
        """Start (again, on the same port) and wait for /readyz; an admin token for
        every project is made on the first start."""
        if not self.token:
            self.token = self.create_token("*", "admin", "local-admin")
        with open(self.log, "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [*CLI, "serve", "--host", self.host, "--port", str(self.port), *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kubetrain serve exited:\n{self._tail()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"kubetrain serve not ready:\n{self._tail()}")

    def stop(self) -> None:
        """SIGTERM (the server hands its Lease over), SIGKILL if it lingers."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is cleaned up or handed over."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            timeout=60,
            headers={"Authorization": f"Bearer {token or self.token}"},
        )

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"
