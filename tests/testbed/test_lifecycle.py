"""The testbed's own lifecycle: side-by-side instances, exact stops, clear errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Node

from kubetrain.testbed.cluster import COMPONENTS, Testbed
from kubetrain.testbed.processes import PortInUseError

pytestmark = pytest.mark.testbed

CLI = [sys.executable, "-m", "kubetrain.cli.main"]


def kubetrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
        check=False,
    )


def test_no_gpu_pool_side_by_side_and_down_stops_only_its_own(testbed: Testbed, tmp_path: Path):
    other = Testbed.up(tmp_path / "no-gpu", "no-gpu")
    try:
        ours, theirs = testbed.state(), other.state()
        assert set(ours.ports.named().values()).isdisjoint(theirs.ports.named().values())
        client = Client(config=KubeConfig.from_file(other.kubeconfig))
        nodes = list(client.list(Node))
        assert len(nodes) == 4
        assert all("nvidia.com/gpu" not in (n.status.capacity or {}) for n in nodes)
        assert all("nvidia.com/gpu" not in (n.status.allocatable or {}) for n in nodes)
        assert {n.metadata.labels.get("accelerator") for n in nodes} >= {"nvidia-h100"}
    finally:
        stopped = other.down()
    assert stopped == list(reversed(COMPONENTS))
    for pid in theirs.pids.values():
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )
    assert all(testbed.running().values()), "stopping one testbed touched the other"
    assert not (tmp_path / "no-gpu").exists()


def test_a_port_that_cannot_be_bound_is_named(tmp_path: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 for kube-apiserver"):
            Testbed.up(tmp_path / "clash", apiserver_port=port)
        result = kubetrain(
            "testbed", "up", "--state-dir", str(tmp_path / "clash2"), "--apiserver-port", str(port)
        )
    assert result.returncode == 1
    assert f"port {port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_and_env_commands(testbed: Testbed):
    status = kubetrain("testbed", "status", "--state-dir", str(testbed.state_dir))
    assert status.returncode == 0, status.stderr
    for component in COMPONENTS:
        assert component in status.stdout
    assert "apiserver ready: True" in status.stdout
    env = kubetrain("testbed", "env", "--state-dir", str(testbed.state_dir))
    assert env.stdout.strip() == f"export KUBECONFIG={testbed.kubeconfig}"
    nodes = kubetrain("testbed", "nodes", "--state-dir", str(testbed.state_dir))
    assert "gpu-h100-0" in nodes.stdout
    assert "nvidia.com/gpu=present:NoSchedule" in nodes.stdout


def test_status_of_a_missing_testbed(tmp_path: Path):
    result = kubetrain("testbed", "status", "--state-dir", str(tmp_path / "nothing"))
    assert result.returncode == 3
    assert "no testbed in" in result.stdout


def test_bad_pool_file_is_refused_before_anything_starts(tmp_path: Path):
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "apiVersion: testbed.kubetrain.io/v1\nkind: NodePool\nname: odd\ngroups:\n"
        "  - {name: g, count: 1, accelerators: 8, capacity: {cpu: '8', memory: 8GB, pods: '10'}}\n"
    )
    result = kubetrain("testbed", "up", "--state-dir", str(tmp_path / "s"), "--pool", str(pool))
    assert result.returncode == 1
    assert "groups.0.accelerators: unknown field" in result.stderr
    assert "capacity.memory: '8GB' is not a Kubernetes quantity" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "s").exists()
