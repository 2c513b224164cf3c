"""A GPU node deleted under running jobs (scaled down, the instance gone), through kubetrain's
server on the testbed: Pod garbage collection fails the node's Pods with DisruptionTarget, the
Job controller makes new Pods without using a retry (kubetrain's podFailurePolicy), the business
state says NODE_LOST meanwhile, and each job goes on as attempt 2 and succeeds. The jobs on the
other node are untouched.

The wait is Kubernetes' own: PodGC looks for orphans every 20 s and gives a vanished node 40 s
to come back, so a lost Pod is replaced 40-80 s after its node went. The jobs run longer than
that (100 s): KWOK still plays the kubelet of a deleted node's Pods, and would otherwise let
attempt 1 finish before PodGC takes it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod

from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import assert_valid_path, business_path, get, submit, wait_for
from tests.fixtures.record import restore_nodes
from tests.kube import eventually
from tests.reliability.conftest import unled_server

pytestmark = [pytest.mark.testbed, pytest.mark.faults]

FATE = "testbed.kubetrain.io"
RUN = 100  # seconds each attempt runs
# PodGC's quarantine (40 s) and period (20 s), the replacement's run and our polling.
BOUND = 80.0 + RUN + 60


@pytest.fixture
def server(testbed: Testbed, tmp_path: Path) -> Iterator[Server]:
    with unled_server(testbed, tmp_path) as srv:
        yield srv


class PodConditions:
    """Every DisruptionTarget condition the Pods of a namespace carried, from a watch: PodGC's
    Failed status lives only until the Job controller lets the Pod go."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.seen: dict[str, tuple[str | None, str | None]] = {}  # pod -> (phase, reason)
        self.first_at: float | None = None  # monotonic time of the first one
        self._kube = Client(config=KubeConfig.from_file(kubeconfig), field_manager="tests")
        self._namespace = namespace
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            for _, pod in self._kube.watch(Pod, namespace=self._namespace):
                for cond in pod.status.conditions or []:
                    if cond.type == "DisruptionTarget" and cond.status == "True":
                        self.seen[pod.metadata.name] = (pod.status.phase, cond.reason)
                        self.first_at = self.first_at or time.monotonic()
        except httpx.TransportError:
            # A later test restarts the API server under this daemon thread; what the
            # test needed was seen while it ran.
            return


def test_a_deleted_node_s_jobs_continue_as_attempt_2_without_a_retry(
    server: Server, kube: Client, testbed: Testbed
) -> None:
    project = f"nodeloss-{uuid.uuid4().hex[:8]}"
    watch = PodConditions(testbed.kubeconfig, project)
    ids = []
    for index in range(3):
        body = training_job(
            f"lost-{index}",
            project,
            retries=0,
            resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 1},
        )
        body["metadata"]["annotations"] = {f"{FATE}/run": f"{RUN}s"}
        ids.append(submit(server, project, body).json()["id"])
    started = time.monotonic()
    jobs = {job_id: wait_for(server, project, job_id, "RUNNING", "TRAINING") for job_id in ids}
    lost_node = jobs[ids[0]]["node"]
    lost = [job_id for job_id, job in jobs.items() if job["node"] == lost_node]
    kept = [job_id for job_id in ids if job_id not in lost]
    deleted_at = time.monotonic()
    kube.delete(Node, lost_node)
    try:
        for job_id in lost:
            # Until PodGC fails the Pod, it still says Running on a node that is gone.
            wait_for(server, project, job_id, "QUEUED", "NODE_LOST", timeout=30)
        for job_id in ids:
            wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED", timeout=BOUND)
        took = time.monotonic() - deleted_at
    finally:
        restore_nodes(kube, "default")
    print(
        f"node {lost_node} deleted under {len(lost)} of {len(ids)} jobs; "
        f"all succeeded {took:.0f} s later"
    )
    assert time.monotonic() - started < BOUND + 60

    for job_id in lost:
        path = business_path(server, project, job_id)
        assert_valid_path(path)
        at = path.index(("QUEUED", "NODE_LOST"))
        assert ("RUNNING", "TRAINING") in path[:at]
        assert ("RUNNING", "TRAINING") in path[at:]
        attempts = get(server, project, job_id, "/attempts")["items"]
        assert [a["attempt"] for a in attempts] == [1, 2], attempts
        first, second = attempts
        assert first["node"] == lost_node
        assert second["node"] != lost_node
        # Attempt 1 last seen failed by PodGC, or (gone) with its node not found.
        assert first["raw_reason"] in ("DeletionByPodGC", "NotFound"), first
        # retries: 0, yet the job lives on: the podFailurePolicy ignored the disruption.
        k8s: Any = kube.get(Job, f"kt-{job_id}", namespace=project)
        assert not k8s.status.failed, k8s.status
    for job_id in kept:
        assert len(get(server, project, job_id, "/attempts")["items"]) == 1
        assert ("QUEUED", "NODE_LOST") not in business_path(server, project, job_id)

    # The Pods on the lost node failed with DisruptionTarget, written by Pod GC.
    disrupted = eventually(lambda: dict(watch.seen) or None, 10, what="a DisruptionTarget")
    assert set(disrupted.values()) == {("Failed", "DeletionByPodGC")}, disrupted
    assert len(disrupted) == len(lost)
    assert watch.first_at is not None
    print(f"Pod GC failed the lost Pods {watch.first_at - deleted_at:.0f} s after the deletion")
