"""The testbed's own lifecycle: side-by-side instances, exact stops, clear errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Node

from kubetrain.testbed import cluster, processes
from kubetrain.testbed.cluster import COMPONENTS, PortTakenError, Testbed
from kubetrain.testbed.processes import PortInUseError, pick_free_ports

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


def test_picked_ports_are_free_distinct_and_below_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = pick_free_ports(10)
    assert len(set(ports)) == 10
    # Below it, no outgoing connection is handed one of them as its source port.
    assert all(processes.LISTEN_PORTS_FROM <= port < low for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("", port))


def _taken_apiserver_port(
    monkeypatch: pytest.MonkeyPatch, port: int, times: int
) -> list[list[int]]:
    """The first `times` picks give kube-apiserver `port`, as if another process had
    bound it between the pick and the bind."""
    picks: list[list[int]] = []
    real_pick = processes.pick_free_ports

    def pick(count: int) -> list[int]:
        ports = real_pick(count)
        if count >= 6 and len(picks) < times:
            ports[2] = port  # Ports' order: etcd client, etcd peer, kube-apiserver
        picks.append(ports)
        return ports

    monkeypatch.setattr(processes, "pick_free_ports", pick)
    return picks


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other process listens on, on every address."""
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        yield busy.getsockname()[1]


def test_a_port_taken_between_the_pick_and_the_bind_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy_port: int
):
    picks = _taken_apiserver_port(monkeypatch, busy_port, times=1)
    bed = Testbed.up(tmp_path / "taken", "no-gpu")
    try:
        assert picks[0][2] == busy_port
        assert bed.state().ports.apiserver != busy_port
        assert bed.running()
        assert all(bed.running().values())
        client = Client(config=KubeConfig.from_file(bed.kubeconfig))
        assert len(list(client.list(Node))) == 4
    finally:
        bed.down()


def test_a_port_taken_on_every_try_names_it_and_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy_port: int
):
    monkeypatch.setattr(cluster, "PORT_TRIES", 2)  # each try costs a start
    picks = _taken_apiserver_port(monkeypatch, busy_port, times=2)
    with pytest.raises(PortTakenError, match=f"kube-apiserver port {busy_port}: address already"):
        Testbed.up(tmp_path / "taken", "no-gpu")
    assert len(picks) == 2
    bed = Testbed(tmp_path / "taken")
    assert not any(bed.running().values()), bed.state().pids


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
