"""A gang under the real Kueue keeps its place across a restart: kubetrain restarts it in
place (its Job suspended and resumed as the next attempt), so its Workload stays admitted
and a job submitted after it and queued behind it in the same ClusterQueue waits until
the gang is done with the quota, not the other way round.

On the session's Kueue testbed (a ClusterQueue of its own, 8 GPUs), through `kubetrain serve`:
a 2-worker gang of 4 GPUs each fills the queue, every rank exits 1 after a few seconds
(KWOK's fates), `retries: 1`; an 8-GPU job submitted while attempt 1 runs waits behind it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Service

from kubetrain.domain.manifest import CONTROLLER_UID, LABEL_ATTEMPT
from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import get, submit, wait_for
from tests.fixtures.record import Workload
from tests.kube import eventually
from tests.kube import get as kube_get
from tests.reliability.conftest import unled_server
from tests.testbed.test_kueue import queue_namespace

pytestmark = [pytest.mark.testbed, pytest.mark.faults]

FATE = "testbed.kubetrain.io"


@pytest.fixture
def kk(kueue_testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(kueue_testbed.kubeconfig), field_manager="tests")


@pytest.fixture
def server(kueue_testbed: Testbed, tmp_path: Path) -> Iterator[Server]:
    with unled_server(kueue_testbed, tmp_path) as srv:
        yield srv


@pytest.fixture
def project(kk: Client) -> Iterator[str]:
    """A namespace with LocalQueue `team` of its own ClusterQueue, made before kubetrain's
    first job there (kubetrain leaves a namespace that exists as it is)."""
    with queue_namespace(kk, "kueue-gang") as name:
        yield name


def _reserved(workload: Any) -> bool:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c["type"] == "QuotaReserved" and c["status"] == "True" for c in conditions)


def _workloads_of(kk: Client, namespace: str, job_uid: str) -> list[Any]:
    return [
        w
        for w in kk.list(Workload, namespace=namespace)
        if any(o["uid"] == job_uid for o in w["metadata"].get("ownerReferences", []))
    ]


class Sampler(threading.Thread):
    """Every 0.2 s: the gang's Pods alive by attempt, and whether the job behind holds
    quota. Records any moment two attempts' Pods were alive together, and what the job
    behind had when an attempt-2 Pod was first seen running."""

    def __init__(self, kk: Client, namespace: str, gang: str, behind: str) -> None:
        super().__init__(daemon=True)
        self.kk, self.namespace, self.gang, self.behind = kk, namespace, gang, behind
        self.stop = threading.Event()
        self.overlaps: list[dict[str, set[str]]] = []
        self.behind_reserved_at_attempt_2: bool | None = None
        self.samples = 0

    def run(self) -> None:
        while not self.stop.wait(0.2):
            alive: dict[str, set[str]] = {}
            running_2 = False
            for pod in self.kk.list(Pod, namespace=self.namespace, labels={"job-name": self.gang}):
                phase = pod.status.phase if pod.status else None
                attempt = ((pod.metadata.labels or {}) if pod.metadata else {}).get(LABEL_ATTEMPT)
                if phase in ("Succeeded", "Failed") or attempt is None:
                    continue
                alive.setdefault(attempt, set()).add(pod.metadata.name if pod.metadata else "?")
                running_2 = running_2 or (attempt == "2" and phase == "Running")
            self.samples += 1
            if len(alive) > 1:
                self.overlaps.append(alive)
            if running_2 and self.behind_reserved_at_attempt_2 is None:
                job = self.kk.get(Job, self.behind, namespace=self.namespace)
                uid = job.metadata.uid if job.metadata else ""
                self.behind_reserved_at_attempt_2 = any(
                    _reserved(w) for w in _workloads_of(self.kk, self.namespace, uid or "")
                )


@pytest.mark.timeout(300)
def test_a_gang_restarted_under_kueue_is_readmitted_before_the_job_queued_behind_it(
    server: Server, kk: Client, project: str
) -> None:
    gpus = {"requests": {"cpu": "1", "memory": "1Gi"}}
    body = training_job(
        "gang", project, workers=2, retries=1, queue="team", resources={**gpus, "gpus": 4}
    )
    body["metadata"]["annotations"] = {f"{FATE}/run": "8s", f"{FATE}/exit-code": "1"}
    gang_id = submit(server, project, body).json()["id"]
    gang = f"kt-{gang_id}"

    def admitted() -> Any:
        job = kube_get(kk, Job, gang, project)
        uid = job.metadata.uid if job is not None and job.metadata else None
        found = [w for w in _workloads_of(kk, project, uid) if _reserved(w)] if uid else []
        return (uid, found[0]) if found else None

    job_uid, workload = eventually(admitted, 60, what="the gang's Workload to be admitted")

    behind_body = training_job("behind", project, queue="team", resources={**gpus, "gpus": 8})
    behind_body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    behind_id = submit(server, project, behind_body).json()["id"]
    behind = f"kt-{behind_id}"
    wait_for(server, project, behind_id, "QUEUED", "WAITING_FOR_QUOTA", timeout=60)

    sampler = Sampler(kk, project, gang, behind)
    sampler.start()
    try:
        done = wait_for(server, project, gang_id, "FAILED", "EXIT_NONZERO", timeout=180)
    finally:
        sampler.stop.set()
        sampler.join()
    assert (done["attempt"], done["retries_used"]) == (2, 1)
    # One Job, one Workload: attempt 2 ran on the admission attempt 1 had.
    final: Any = kk.get(Job, gang, namespace=project)
    assert final.metadata.uid == job_uid
    assert final.metadata.labels[LABEL_ATTEMPT] == "2"
    assert [w["metadata"]["uid"] for w in _workloads_of(kk, project, job_uid)] == [
        workload["metadata"]["uid"]
    ]
    # Rank 0's name leads to the current attempt's Pods only: the Service, the Job's, kept.
    service: Any = kk.get(Service, gang, namespace=project)
    assert service.spec.selector == {CONTROLLER_UID: job_uid, LABEL_ATTEMPT: "2"}
    # Attempt 2 ran while the job submitted after the gang still waited behind it.
    assert sampler.behind_reserved_at_attempt_2 is False, sampler.samples
    assert sampler.overlaps == []
    # The gang done with the quota, the job behind it gets it.
    wait_for(server, project, behind_id, "RUNNING", "TRAINING", timeout=60)
    rows = get(server, project, gang_id, "/history")["items"]
    (waited,) = [r for r in rows if r["raw_reason"] == "PreviousAttemptEnded"]
    assert waited["attempt"] == 1
    assert waited["raw_message"].startswith("attempt 2 resumed in place")
