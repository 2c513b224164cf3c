"""The typed client's transport (cluster/client.py): connections kept for a whole dispatch
round, except where the environment sends the API server's traffic through a proxy,
which httpx honours only without a transport of ours; likewise the creates go through
kubetrain's own connections (cluster/wire.py), or through httpx where a proxy is named.
(That the connections are kept is tested against the API server:
tests/testbed/test_cluster_client.py.)"""

from __future__ import annotations

import pytest
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from kubetrain.cluster.client import _transport, _ViaHttpx, creating_client
from kubetrain.cluster.wire import Connections

pytestmark = pytest.mark.unit

PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def config(server: str = "https://api.cluster.example:6443") -> SingleConfig:
    cluster = {"server": server, "insecure-skip-tls-verify": True}
    loaded = KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    ).get()
    assert loaded is not None
    return loaded


@pytest.fixture(autouse=True)
def no_proxy_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*PROXIES, "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def test_without_a_proxy_the_transport_keeps_a_rounds_connections() -> None:
    assert _transport(config()) is not None


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "https_proxy", "ALL_PROXY"])
def test_a_proxy_for_the_server_leaves_httpx_its_own_transport(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "http://proxy.example:3128")
    assert _transport(config()) is None


def test_a_proxy_the_server_is_exempt_from_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", ".cluster.example,10.0.0.0/8")
    assert _transport(config()) is not None
    # A proxy for the other scheme only is not this server's.
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    assert _transport(config()) is not None


def test_the_creates_go_through_our_connections_unless_a_proxy_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert isinstance(creating_client(config()), Connections)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    assert isinstance(creating_client(config()), _ViaHttpx)
