"""What the real components report, seen through the testbed: scheduling
verdicts, quota refusals, PVC checks, Job completion and persistence."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod

from kubetrain.testbed.cluster import Testbed
from kubetrain.testbed.pools import POOL_LABEL
from tests.kube import create, eventually, get

pytestmark = pytest.mark.testbed

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def job(
    name: str,
    *,
    gpus: int = 0,
    tolerate: bool = True,
    annotations: dict[str, str] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    backoff_limit: int = 0,
) -> dict[str, Any]:
    resources: dict[str, Any] = {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    if gpus:
        resources["limits"]["nvidia.com/gpu"] = str(gpus)
        resources["requests"]["nvidia.com/gpu"] = str(gpus)
    container: dict[str, Any] = {
        "name": "trainer",
        "image": "registry.example/trainer:1",
        "resources": resources,
    }
    spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if gpus and tolerate:
        spec["tolerations"] = [GPU_TOLERATION]
    if volumes:
        spec["volumes"] = volumes
        container["volumeMounts"] = [
            {"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {"metadata": {"annotations": annotations or {}}, "spec": spec},
        },
    }


def job_pods(kube: Client, namespace: str, name: str) -> list[Pod]:
    return list(kube.list(Pod, namespace=namespace, labels={"job-name": name}))


def unschedulable_message(kube: Client, namespace: str, name: str) -> str | None:
    for pod in job_pods(kube, namespace, name):
        for cond in (pod.status and pod.status.conditions) or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.message:
                assert cond.reason == "Unschedulable"
                return cond.message
    return None


def job_condition(kube: Client, namespace: str, name: str, kind: str) -> Any:
    found = kube.get(Job, name, namespace=namespace)
    for cond in (found.status and found.status.conditions) or []:
        if cond.type == kind and cond.status == "True":
            return cond
    return None


def test_default_pool_nodes_advertise_eight_gpus(kube: Client):
    nodes = list(kube.list(Node, labels={POOL_LABEL: "default"}))
    assert len(nodes) == 4
    gpus = {n.metadata.name: (n.status.allocatable or {}).get("nvidia.com/gpu") for n in nodes}
    assert sorted(v for v in gpus.values() if v) == ["8", "8"]
    for node in nodes:
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready
        assert ready[0].status == "True"


def test_sixteen_gpus_is_unschedulable_with_the_schedulers_message(kube: Client, namespace: str):
    create(kube, job("big", gpus=16), namespace)
    message = eventually(
        lambda: unschedulable_message(kube, namespace, "big"), 60, what="a FailedScheduling verdict"
    )
    assert "Insufficient nvidia.com/gpu" in message
    assert message.startswith("0/4 nodes are available")


def test_missing_toleration_names_the_taint(kube: Client, namespace: str):
    create(kube, job("no-tol", gpus=1, tolerate=False), namespace)
    message = eventually(
        lambda: unschedulable_message(kube, namespace, "no-tol"),
        60,
        what="a FailedScheduling verdict",
    )
    assert "untolerated taint {nvidia.com/gpu: present}" in message


def test_fitting_job_completes(kube: Client, namespace: str):
    create(kube, job("fits", gpus=1, annotations={"testbed.kubetrain.io/run": "1s"}), namespace)
    eventually(
        lambda: job_condition(kube, namespace, "fits", "Complete"),
        60,
        what="Job condition Complete",
    )
    (pod,) = job_pods(kube, namespace, "fits")
    assert pod.spec.nodeName.startswith("gpu-h100-")
    assert pod.status.phase == "Succeeded"
    assert pod.status.containerStatuses[0].state.terminated.reason == "Completed"


def test_exit_code_annotation_gives_a_terminated_container(kube: Client, namespace: str):
    create(
        kube,
        job(
            "crash",
            annotations={
                "testbed.kubetrain.io/run": "1s",
                "testbed.kubetrain.io/exit-code": "3",
                "testbed.kubetrain.io/termination-message": "loss is NaN at step 120",
            },
        ),
        namespace,
    )
    eventually(
        lambda: job_condition(kube, namespace, "crash", "Failed"), 60, what="Job condition Failed"
    )
    (pod,) = job_pods(kube, namespace, "crash")
    assert pod.status.phase == "Failed"
    terminated = pod.status.containerStatuses[0].state.terminated
    assert (terminated.exitCode, terminated.reason) == (3, "Error")
    assert terminated.message == "loss is NaN at step 120"


def test_quota_refusal_is_a_failed_create_event(kube: Client, namespace: str):
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "8"}},
        },
        namespace,
    )
    # The quota controller must have computed usage before admission enforces it.
    eventually(lambda: _quota_used(kube, namespace), 30, what="quota status")
    create(kube, job("over-quota", gpus=9), namespace)

    def refusal() -> str | None:
        for event in kube.list(Event, namespace=namespace):
            if event.reason == "FailedCreate" and event.involvedObject.name == "over-quota":
                return event.message
        return None

    message = eventually(refusal, 60, what="a FailedCreate event")
    assert "exceeded quota: gpus" in message
    assert "requested: requests.nvidia.com/gpu=9" in message
    assert job_pods(kube, namespace, "over-quota") == []


def _quota_used(kube: Client, namespace: str) -> bool:
    from lightkube.resources.core_v1 import ResourceQuota

    quota = kube.get(ResourceQuota, "gpus", namespace=namespace)
    return bool(quota.status and quota.status.used is not None)


def test_missing_pvc_is_named_by_the_scheduler(kube: Client, namespace: str):
    volumes = [{"name": "dataset", "persistentVolumeClaim": {"claimName": "no-such-claim"}}]
    create(kube, job("no-pvc", volumes=volumes), namespace)
    message = eventually(
        lambda: unschedulable_message(kube, namespace, "no-pvc"),
        60,
        what="a FailedScheduling verdict",
    )
    assert 'persistentvolumeclaim "no-such-claim" not found' in message


def test_unbound_pvc_is_reported_by_the_scheduler(kube: Client, namespace: str):
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "dataset"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
        namespace,
    )
    volumes = [{"name": "dataset", "persistentVolumeClaim": {"claimName": "dataset"}}]
    create(kube, job("unbound", volumes=volumes), namespace)
    message = eventually(
        lambda: unschedulable_message(kube, namespace, "unbound"),
        60,
        what="a FailedScheduling verdict",
    )
    assert "pod has unbound immediate PersistentVolumeClaims" in message


def test_apiserver_restart_keeps_every_object(testbed: Testbed, kube: Client, namespace: str):
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "survivor"},
            "data": {"epoch": "7"},
        },
        namespace,
    )
    before = {n.metadata.name for n in kube.list(Node)}
    testbed.stop_component("kube-apiserver")
    assert testbed.running()["kube-apiserver"] is False
    testbed.start_component("kube-apiserver")
    assert get(kube, ConfigMap, "survivor", namespace).data == {"epoch": "7"}
    assert {n.metadata.name for n in kube.list(Node)} == before
