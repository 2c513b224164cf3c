"""Every recorded scenario happens again on the live testbed and diagnoses as its
recorded fixture does: each catalog code the fixtures cover is reproduced by the
real scheduler, quota admission, Job controller and KWOK stages, not only read
from an old dump. Record-only scenarios (`Scenario.live` false: they need a testbed
configured otherwise than the shared ones) are left out."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig

from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot
from kubetrain.testbed.cluster import Testbed
from tests.fixtures.record import (
    LIVE_SCENARIOS,
    Scenario,
    clean_up,
    device_plugin_stopped,
    reproduce,
)
from tests.unit.test_diagnosis import CASES

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def no_gpu_kube(no_gpu_testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(no_gpu_testbed.kubeconfig), field_manager="scenarios")


@pytest.fixture(scope="module")
def kueue_kube(kueue_testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(kueue_testbed.kubeconfig), field_manager="scenarios")


@pytest.mark.parametrize("scenario", LIVE_SCENARIOS, ids=lambda s: s.name)
def test_the_scenario_reproduces_live_with_its_recorded_diagnosis(
    scenario: Scenario, request: pytest.FixtureRequest
) -> None:
    pool_kube = {"default": "kube", "no-gpu": "no_gpu_kube", "real": "real_kube"}[scenario.pool]
    if scenario.queue is not None:
        pool_kube = "kueue_kube"
    kube: Client = request.getfixturevalue(pool_kube)
    if scenario.stop_device_plugin:
        with device_plugin_stopped(request.getfixturevalue("real_testbed"), scenario):
            ns, dump = reproduce(kube, scenario)
    else:
        ns, dump = reproduce(kube, scenario)
    try:
        name = f"kt-{scenario.name}"
        facts = JobFacts(name=name, k8s_name=name, namespace=ns, dispatched=True)
        d = diagnose(facts, Snapshot.from_list(dump).for_job(name, ns), datetime.now(UTC))
    finally:
        clean_up(kube, ns, scenario)
    expected = CASES[scenario.name]
    assert (d.state, d.reason, d.waitable) == (expected.state, expected.reason, expected.waitable)
    assert [(b.reason, b.nodes) for b in d.blockers] == list(expected.blockers)
    assert d.raw_reason == expected.raw_reason
