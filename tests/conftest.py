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
from tests.kube import KUEUE_STATE_ENV, eventually, get

# The suite runs in parallel workers (pytest-xdist, `--dist loadgroup`, see the
# Makefile). Each worker is a whole pytest session with session fixtures of its own
# (a `default` testbed, a PostgreSQL server), so tests that stop the API server or
# PostgreSQL disturb only their own worker. A module's tests stay together on one
# worker (its module fixtures, such as a `kubetrain serve`, are made once), and every
# test that needs one of the costly testbeds joins that testbed's group, so that each
# is started once in the whole run: the real-node pool (two kubelets, containerds;
# twice: once for tests/realnode, once for the recorded real scenarios), Kueue, and
# the `no-gpu` pool. Groups run longest first.
_REAL = frozenset({"real_testbed", "real_kube"})
_GROUP_ORDER = ("real-pool", "real-scenarios", "kueue", "no-gpu")


def _group(item: pytest.Item) -> str:
    names = frozenset(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    # The recorded scenarios ask for their pool's testbed by name, at run time.
    scenario = callspec.params.get("scenario") if callspec is not None else None
    if not hasattr(scenario, "pool"):  # a parameter of that name that is no Scenario
        scenario = None
    if names & _REAL:
        return "real-pool"
    if scenario is not None and (
        scenario.stop_device_plugin or (scenario.pool == "real" and scenario.queue is None)
    ):
        # A real pool of its own on another worker: the real-node modules and the real
        # scenarios (each made twice) together were the run's longest line.
        return "real-scenarios"
    if "kueue_testbed" in names or (scenario is not None and scenario.queue is not None):
        return "kueue"
    if "no_gpu_testbed" in names or (scenario is not None and scenario.pool == "no-gpu"):
        return "no-gpu"
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    groups = {item: _group(item) for item in items}
    for item, group in groups.items():
        item.add_marker(pytest.mark.xdist_group(group))

    def rank(item: pytest.Item) -> int:
        group = groups[item]
        return _GROUP_ORDER.index(group) if group in _GROUP_ORDER else len(_GROUP_ORDER)

    # Stable: within a group, and among the module groups, the collection's order.
    items.sort(key=rank)


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
def no_gpu_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A testbed on the `no-gpu` pool (no node has a GPU)."""
    bed = Testbed.up(tmp_path_factory.mktemp("no-gpu") / "bed", "no-gpu")
    try:
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="session")
def kueue_testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A `default`-pool testbed with Kueue (`testbed up --kueue`) and the recording
    scenarios' queues: ClusterQueue `gpus` (8 GPUs) behind LocalQueues `team`."""
    from tests.fixtures.record import kueue_setup

    bed = Testbed.up(tmp_path_factory.mktemp("kueue") / "bed", "default", kueue=True)
    os.environ[KUEUE_STATE_ENV] = str(bed.state_dir)
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
