"""What the benchmarks share: a real `kubetrain serve` subprocess, percentiles, tables."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

from kubetrain.testbed.processes import pick_free_ports

CLI = [sys.executable, "-m", "kubetrain.cli.main"]
RESULTS = Path(__file__).parent / "results"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def table(header: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int]) -> str:
    def cell(value: object, width: int, first: bool) -> str:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        return f"{text:<{width}}" if first else f"{text:>{width}}"

    lines = [
        "".join(cell(h, w, i == 0) for i, (h, w) in enumerate(zip(header, widths, strict=False)))
    ]
    for row in rows:
        lines.append(
            "".join(cell(v, w, i == 0) for i, (v, w) in enumerate(zip(row, widths, strict=False)))
        )
    return "\n".join(lines)


@dataclass
class Serve:
    """`kubetrain serve` on a free loopback port, with an admin token for all projects."""

    database_url: str
    log: Path
    kubeconfig: Path | None = None
    args: list[str] = field(default_factory=list)
    url: str = ""
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {**os.environ, "KUBETRAIN_DATABASE_URL": self.database_url}
        if self.kubeconfig is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        return env

    def start(self, timeout: float = 60) -> Serve:
        self.token = subprocess.run(
            [*CLI, "token", "create", "--project", "*", "--role", "admin", "--name", "bench"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        (port,) = pick_free_ports(1)
        self.url = f"http://127.0.0.1:{port}"
        log = open(self.log, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            [*CLI, "serve", "--host", "127.0.0.1", "--port", str(port), *self.args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()  # the child holds its own descriptor
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kubetrain serve exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"kubetrain serve not ready:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, timeout=60, headers={"Authorization": f"Bearer {self.token}"}
        )

    def __enter__(self) -> Serve:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def training_job(
    name: str, project: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project, "annotations": annotations or {}},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        },
    }
