"""Fixtures shared by every tier: a running testbed (session) and a namespace per test."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from kubetrain.testbed.build import installed
from kubetrain.testbed.cluster import Testbed
from tests.kube import eventually, get

# Session testbeds that hold real processes (two kubelets and containerds; Kueue's
# controller) cost CPU for as long as they live, and on a 2-core machine that load
# makes the timing of the fault tests drift. Their users run last, so that they start
# after the reliability tier is done.
_HEAVY_FIXTURES = ("real_testbed", "real_kube", "kueue_testbed")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def heavy(item: pytest.Item) -> bool:
        names = getattr(item, "fixturenames", ())
        return any(name in names for name in _HEAVY_FIXTURES)

    items[:] = [i for i in items if not heavy(i)] + [i for i in items if heavy(i)]


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A testbed on the `default` pool for the whole session.

    KUBETRAIN_TEST_TESTBED=DIR reuses a testbed already started with
    `kubetrain testbed up --state-dir DIR` (fast iteration; it is left running).
    """
    if reuse := os.environ.get("KUBETRAIN_TEST_TESTBED"):
        yield Testbed(Path(reuse))
        return
    if not installed().complete():
        pytest.fail("testbed binaries are not built: run `make testbed` (tests never skip this)")
    bed = Testbed.up(tmp_path_factory.mktemp("testbed") / "default", "default")
    try:
        yield bed
    finally:
        bed.down()


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


@pytest.fixture(scope="session")
def kueue_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A `default`-pool testbed with Kueue (`testbed up --kueue`) and the recording
    scenarios' queues: ClusterQueue `gpus` (8 GPUs) behind LocalQueues `team`."""
    from tests.fixtures.record import kueue_setup

    bed = Testbed.up(tmp_path_factory.mktemp("kueue") / "bed", "default", kueue=True)
    try:
        kueue_setup(bed)
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="session")
def kube(testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(testbed.kubeconfig), field_manager="tests")


@pytest.fixture
def namespace(kube: Client, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{uuid.uuid4().hex[:5]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    # The ServiceAccount admission plugin refuses Pods until the default account exists.
    eventually(
        lambda: get(kube, ServiceAccount, "default", name),
        30,
        what=f"the default ServiceAccount in {name}",
    )
    yield name
    kube.delete(Namespace, name)
