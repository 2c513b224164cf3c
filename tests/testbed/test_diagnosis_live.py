"""diagnose() on a snapshot taken from the live testbed: the real scheduler's verdict, read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.core_v1 import Pod

from kubetrain.domain.diagnosis import JobFacts, diagnose
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState, ReasonCode
from tests.fixtures.record import SCENARIOS, manifest, snapshot
from tests.kube import eventually

pytestmark = pytest.mark.testbed


def test_a_job_too_big_for_any_node_is_queued_and_never_fits(kube: Client, namespace: str) -> None:
    scenario = next(s for s in SCENARIOS if s.name == "insufficient-gpu")
    job = manifest(scenario)
    created: Any = from_dict(job)
    kube.create(created, namespace=namespace)

    def verdict() -> bool:
        pods = list(kube.list(Pod, namespace=namespace))
        return any(
            c.type == "PodScheduled" and c.reason == "Unschedulable"
            for p in pods
            for c in (p.status and p.status.conditions) or []
        )

    eventually(verdict, 60, what="the scheduler's verdict")
    name = job["metadata"]["name"]
    facts = JobFacts(name=name, k8s_name=name, namespace=namespace, dispatched=True)
    dumped = Snapshot.from_list(snapshot(kube, namespace))
    d = diagnose(facts, dumped.for_job(name, namespace), datetime.now(UTC))
    assert (d.state, d.reason, d.waitable) == (
        BusinessState.QUEUED,
        ReasonCode.INSUFFICIENT_GPU,
        False,
    )
    assert d.raw_reason == "Unschedulable"
    assert d.blockers[0].nodes == 4
    assert "the largest node has 8" in d.explanation
