"""A `kubetrain serve` the real-node pool's Pods can reach (the pool itself, `real_testbed`,
is a session fixture of tests/conftest.py, shared with the scenario replays), and the
browser tests' Chromium, to read a real run's job page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kubetrain.testbed.cluster import Testbed
from tests.chromium import artifacts, browser, page  # noqa: F401 (shared with tests/browser)
from tests.e2e.conftest import Server


@pytest.fixture(scope="module")
def real_server(
    real_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """kubetrain serve on the Pod network's gateway: the Pods' preflight and progress
    reports reach it there (their 127.0.0.1 is their own); `cli` runs kubetrain's CLI
    against it."""
    network = real_testbed.state().network
    assert network is not None
    tmp = tmp_path_factory.mktemp("real-server")
    srv = Server(
        database_url=f"sqlite:///{tmp / 'kubetrain.db'}",
        log=tmp / "serve.log",
        kubeconfig=real_testbed.kubeconfig,
        host=network.gateway,
    )
    srv.extra_env["KUBETRAIN_STATUS_URL"] = srv.url
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
