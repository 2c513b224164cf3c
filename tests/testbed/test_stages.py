"""The KWOK stages that let a test choose a Pod's fate by annotation."""

from __future__ import annotations

import time
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Event

from tests.kube import create, eventually
from tests.testbed.test_cluster import job, job_pods

pytestmark = pytest.mark.testbed

FATE = "testbed.kubetrain.io/fate"


def waiting_reason(kube: Client, namespace: str, name: str) -> str | None:
    for pod in job_pods(kube, namespace, name):
        for status in (pod.status and pod.status.containerStatuses) or []:
            if status.state and status.state.waiting:
                return status.state.waiting.reason
    return None


def pod_events(kube: Client, namespace: str) -> list[tuple[Any, Any, Any]]:
    return [
        (e.type, e.reason, e.message)
        for e in kube.list(Event, namespace=namespace)
        if e.involvedObject.kind == "Pod"
    ]


def test_default_fate_runs_then_exits_zero(kube: Client, namespace: str):
    create(kube, job("plain", annotations={"testbed.kubetrain.io/run": "2s"}), namespace)

    def running():
        pods = job_pods(kube, namespace, "plain")
        return pods and pods[0].status.phase == "Running" and pods[0]

    pod = eventually(running, 30, what="the Pod running")
    assert pod.status.containerStatuses[0].state.running.startedAt is not None
    assert pod.status.podIP

    def finished():
        pods = job_pods(kube, namespace, "plain")
        return pods[0].status.phase == "Succeeded" and pods[0]

    pod = eventually(finished, 30, what="the Pod succeeded")
    terminated = pod.status.containerStatuses[0].state.terminated
    assert terminated.exitCode == 0
    # Ran for the annotated time, not at once.
    assert (terminated.finishedAt - terminated.startedAt).total_seconds() >= 1.5


def test_image_pull_failure_then_backoff_with_events(kube: Client, namespace: str):
    create(kube, job("pull", annotations={FATE: "image-pull-failure"}), namespace)
    eventually(
        lambda: waiting_reason(kube, namespace, "pull") == "ErrImagePull", 30, what="ErrImagePull"
    )
    eventually(
        lambda: waiting_reason(kube, namespace, "pull") == "ImagePullBackOff",
        30,
        what="ImagePullBackOff",
    )
    (pod,) = job_pods(kube, namespace, "pull")
    assert pod.status.phase == "Pending"
    assert "registry.example/trainer:1" in pod.status.containerStatuses[0].state.waiting.message

    def pull_events() -> list[tuple[Any, Any, Any]] | None:
        events = pod_events(kube, namespace)
        return events if {r for _, r, _ in events} >= {"Failed", "BackOff"} else None

    events = eventually(pull_events, 30, what="Failed and BackOff events")
    assert any(
        t == "Warning" and r == "Failed" and "Failed to pull image" in m for t, r, m in events
    )


def test_mount_failure_stays_container_creating(kube: Client, namespace: str):
    create(kube, job("mount", annotations={FATE: "mount-failure"}), namespace)
    eventually(
        lambda: waiting_reason(kube, namespace, "mount") == "ContainerCreating",
        30,
        what="ContainerCreating",
    )
    events = eventually(
        lambda: [e for e in pod_events(kube, namespace) if e[1] == "FailedMount"],
        30,
        what="a FailedMount event",
    )
    assert events[0][0] == "Warning"
    assert "MountVolume.SetUp failed" in events[0][2]
    (pod,) = job_pods(kube, namespace, "mount")
    assert pod.status.phase == "Pending"
    assert not pod.status.podIP


def test_oom_killed_exits_137(kube: Client, namespace: str):
    create(kube, job("oom", annotations={FATE: "oom", "testbed.kubetrain.io/run": "1s"}), namespace)

    def terminated():
        pods = job_pods(kube, namespace, "oom")
        statuses = pods and pods[0].status.containerStatuses
        state = statuses and statuses[0].state
        return state and state.terminated

    state = eventually(terminated, 30, what="the container terminated")
    assert (state.reason, state.exitCode) == ("OOMKilled", 137)
    assert job_pods(kube, namespace, "oom")[0].status.phase == "Failed"


def test_config_error(kube: Client, namespace: str):
    create(
        kube,
        job(
            "config",
            annotations={
                FATE: "config-error",
                "testbed.kubetrain.io/message": 'secret "wandb" not found',
            },
        ),
        namespace,
    )
    eventually(
        lambda: waiting_reason(kube, namespace, "config") == "CreateContainerConfigError",
        30,
        what="CreateContainerConfigError",
    )
    (pod,) = job_pods(kube, namespace, "config")
    assert pod.status.containerStatuses[0].state.waiting.message == 'secret "wandb" not found'
    assert pod.status.phase == "Pending"


def test_hang_keeps_running(kube: Client, namespace: str):
    create(
        kube, job("hang", annotations={FATE: "hang", "testbed.kubetrain.io/run": "1s"}), namespace
    )
    eventually(
        lambda: (p := job_pods(kube, namespace, "hang")) and p[0].status.phase == "Running",
        30,
        what="the Pod running",
    )
    time.sleep(3)  # past the run time: a hanging Pod must not exit
    assert job_pods(kube, namespace, "hang")[0].status.phase == "Running"
