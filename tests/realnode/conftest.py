"""The real-node pool for the whole session, and a `kubetrain serve` its Pods can reach."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

from kubetrain.testbed.build import installed
from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server


@pytest.fixture(scope="session")
def real_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """`kubetrain testbed up --pool real`; KUBETRAIN_TEST_REAL_TESTBED=DIR reuses one."""
    if reuse := os.environ.get("KUBETRAIN_TEST_REAL_TESTBED"):
        yield Testbed(Path(reuse))
        return
    if not installed().complete():
        pytest.fail("testbed binaries are not built: run `make testbed` (tests never skip this)")
    bed = Testbed.up(tmp_path_factory.mktemp("testbed") / "real", "real")
    try:
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="session")
def real_kube(real_testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(real_testbed.kubeconfig), field_manager="tests")


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
