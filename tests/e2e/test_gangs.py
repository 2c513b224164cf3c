"""Gangs through `kubetrain serve` on the default pool (two 8-GPU nodes): the issue's
"done when". Two workers of 8 GPUs run one per node and succeed as an Indexed Job
with its headless Service and torchrun's environment; three can never all be placed,
and the job says which ranks hold GPUs and that waiting will not help."""

from __future__ import annotations

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Service

from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE, assert_valid_path, business_path, get, submit, wait_for
from tests.kube import eventually

pytestmark = pytest.mark.testbed

GPUS = {"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 8}


def test_two_workers_of_eight_gpus_run_one_per_node_and_succeed(
    server: Server, project: str, kube: Client
):
    body = training_job("gang", project, workers=2, resources=GPUS)
    body["metadata"]["annotations"] = {f"{FATE}/run": "3s"}
    resp = submit(server, project, body)
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED")
    name = f"kt-{job_id.lower()}"
    job = kube.get(Job, name, namespace=project)
    assert (job.spec.completionMode, job.spec.completions, job.spec.parallelism) == (
        "Indexed",
        2,
        2,
    )
    assert job.spec.template.spec.subdomain == name
    env = {e.name: e for e in job.spec.template.spec.containers[0].env}
    assert env["PET_NNODES"].value == "2"
    assert env["PET_NPROC_PER_NODE"].value == "8"
    assert env["PET_MASTER_ADDR"].value == f"{name}-0.{name}.{project}.svc"
    assert env["PET_NODE_RANK"].valueFrom.fieldRef.fieldPath == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    service = kube.get(Service, name, namespace=project)
    assert service.spec.clusterIP == "None"
    assert service.spec.publishNotReadyAddresses is True
    assert [(o.kind, o.uid) for o in service.metadata.ownerReferences] == [
        ("Job", job.metadata.uid)
    ]
    diagnosis = get(server, project, job_id, "/diagnosis")
    placed = {(a["rank"], a["node"]) for a in diagnosis["attempts"]}
    assert {rank for rank, _ in placed} == {0, 1}
    assert {node for _, node in placed} == {"gpu-h100-0", "gpu-h100-1"}  # one per node
    assert_valid_path(business_path(server, project, job_id))


def test_three_workers_of_eight_gpus_wait_partly_placed_and_never_fit(server: Server, project: str):
    body = training_job("gang3", project, workers=3, resources=GPUS)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    job_id = submit(server, project, body).json()["id"]

    def partial() -> bool:
        with server.client() as http:
            resp = http.get(f"/api/v1/projects/{project}/jobs/{job_id}/diagnosis")
        blockers = resp.json().get("blockers", []) if resp.status_code == 200 else []
        return any(b["reason"] == "GANG_PARTIAL" for b in blockers)

    eventually(partial, 60, what="GANG_PARTIAL")
    job = get(server, project, job_id)
    assert (job["business_status"], job["reason"]) == ("QUEUED", "INSUFFICIENT_GPU")
    diagnosis = get(server, project, job_id, "/diagnosis")
    assert diagnosis["waitable"] is False
    assert (
        "the gang needs 3 nodes with 8 free GPUs; the cluster has 2 such nodes"
        in (diagnosis["explanation"])
    )
    gang = next(b for b in diagnosis["blockers"] if b["reason"] == "GANG_PARTIAL")
    assert gang["detail"].startswith("2 of 3 workers placed (ranks ")
    assert "holding 16 GPUs idle" in gang["detail"]
    with server.client() as http:
        http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel").raise_for_status()
