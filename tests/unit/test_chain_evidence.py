"""A link is `passed` only on evidence (domain/diagnosis/evidence.py): what each needs,
over recorded dumps changed only in the one fact under test."""

from __future__ import annotations

from typing import Any

import pytest

from kubetrain.domain.diagnosis import ChainState
from kubetrain.domain.states import Link
from tests.unit.diagnosis_helpers import NOW, dump, items, run

pytestmark = pytest.mark.unit


def marks(data: dict[str, Any], **facts: Any) -> dict[Link, ChainState]:
    return {m.link: m.state for m in run(data, **facts).chain}


def test_the_preflight_is_passed_once_the_runtime_reported_it():
    data = dump("running")
    assert marks(data)[Link.PREFLIGHT] is ChainState.NOT_OBSERVED
    pod = items(data, "Pod")[0]["metadata"]["name"]
    reported = marks(data, reported_phase=(pod, "TRAINING", NOW))
    assert reported[Link.PREFLIGHT] is ChainState.PASSED
    assert reported[Link.TRAINING] is ChainState.ACTIVE


def test_the_preflights_own_lines_in_the_last_words_are_evidence():
    # A real kubelet's termination message from the log (FallbackToLogsOnError).
    data = dump("real-exit-nonzero")
    assert marks(data)[Link.PREFLIGHT] is ChainState.PASSED
    # The same message without them (a program that is not `kubetrain run`, or a
    # KWOK Pod's) is no evidence.
    terminated = items(data, "Pod")[0]["status"]["containerStatuses"][0]["state"]["terminated"]
    lines = terminated["message"].splitlines()
    terminated["message"] = "\n".join(line for line in lines if "preflight" not in line)
    assert "loss is NaN at step 120" in terminated["message"]
    assert marks(data)[Link.PREFLIGHT] is ChainState.NOT_OBSERVED


def test_volumes_from_storage_are_needed_and_passed_once_a_container_started():
    data = dump("running")
    assert marks(data)[Link.VOLUME] is ChainState.NOT_NEEDED
    for obj in [*items(data, "Pod"), *items(data, "Job")]:
        spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
        spec.setdefault("volumes", []).append(
            {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}
        )
    assert marks(data)[Link.VOLUME] is ChainState.PASSED


def test_a_job_without_gpus_does_not_need_the_device_plugin():
    assert marks(dump("real-succeeded"))[Link.DEVICE_PLUGIN] is ChainState.NOT_NEEDED
    assert marks(dump("succeeded"))[Link.DEVICE_PLUGIN] is ChainState.PASSED


def test_a_node_is_passed_once_its_kubelet_took_the_pod_up():
    data = dump("container-creating")
    chain = marks(data)
    assert (chain[Link.SCHEDULER], chain[Link.GPU_NODE]) == (ChainState.PASSED,) * 2
    for pod in items(data, "Pod"):
        pod["status"].pop("containerStatuses", None)  # bound; the kubelet has said nothing
    chain = marks(data)
    assert chain[Link.SCHEDULER] is ChainState.PASSED
    assert chain[Link.GPU_NODE] is ChainState.NOT_OBSERVED
