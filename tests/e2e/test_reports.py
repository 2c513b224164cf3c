"""A Pod's runtime reports through kubetrain's API with its job's token, read from the
Secret the dispatcher made, as the Pod would: the job moves RUNNING/PREFLIGHT ->
RUNNING/TRAINING, and the Secret goes with the Job."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import ApiError, Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Secret

from kubetrain.domain.manifest import status_secret_name
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE, get, submit, wait_for
from tests.kube import eventually

pytestmark = pytest.mark.testbed


def report(server: Server, job_id: str, token: str, pod: str, *events: dict[str, Any]) -> Any:
    return httpx.post(
        f"{server.url}/api/v1/jobs/{job_id}/reports",
        json={"pod": pod, "events": list(events)},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_a_pod_reports_preflight_then_training_with_its_jobs_token(
    server: Server, project: str, kube: Client
):
    body = training_job("reporting", project)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING")
    pod, k8s_job = job["runtime"]["pod"], job["kubernetes_job"]

    secret = kube.get(Secret, status_secret_name(job_id), namespace=project)
    owner = kube.get(Job, k8s_job, namespace=project)
    assert [(o.kind, o.name, o.uid) for o in secret.metadata.ownerReferences] == [
        ("Job", k8s_job, owner.metadata.uid)
    ]
    token = base64.b64decode(secret.data["token"]).decode()
    # The token reaches the container only through the Secret, never as a plain value.
    env = owner.spec.template.spec.containers[0].env
    assert all(token not in (e.value or "") for e in env)
    ref = next(e for e in env if e.name == "KUBETRAIN_STATUS_TOKEN").valueFrom.secretKeyRef
    assert (ref.name, ref.key) == (secret.metadata.name, "token")

    t = datetime.now(UTC).isoformat()  # the server takes times near its clock only
    assert report(server, job_id, server.token, pod).status_code == 401  # a user's token
    answer = report(
        server, job_id, token, pod, {"seq": 0, "time": t, "type": "phase", "phase": "PREFLIGHT"}
    )
    assert answer.status_code == 202, answer.text
    wait_for(server, project, job_id, "RUNNING", "PREFLIGHT", timeout=30)
    report(
        server,
        job_id,
        token,
        pod,
        {"seq": 1, "time": t, "type": "phase", "phase": "TRAINING"},
        {"seq": 2, "time": t, "type": "step", "step": 5, "metrics": {"loss": 1.5}},
    )
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING", timeout=30)
    assert (job["progress"]["phase"], job["progress"]["step"]) == ("TRAINING", 5)
    reasons = [
        row["to_reason"]
        for row in get(server, project, job_id, "/history")["items"]
        if row["kind"] == "business"
    ]
    assert reasons[-3:] == ["TRAINING", "PREFLIGHT", "TRAINING"]

    with server.client() as http:
        assert http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel").status_code == 200

    def secret_gone() -> bool:
        try:
            kube.get(Secret, status_secret_name(job_id), namespace=project)
        except ApiError as exc:
            return exc.status.code == 404
        return False

    eventually(secret_gone, 60, what="the status Secret collected with its Job")


def test_a_failed_preflight_fails_the_job_at_once_naming_the_check(
    server: Server, project: str, kube: Client
):
    line = (
        "preflight failed: gpu-visible: expected 1 GPU, found 0 "
        "(checked NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES, /dev/nvidia*, nvidia-smi -L)"
    )
    body = training_job("no-gpu-inside", project, retries=3)
    body["metadata"]["annotations"] = {
        f"{FATE}/run": "1s",
        f"{FATE}/exit-code": "86",
        f"{FATE}/termination-message": line,
    }
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "FAILED", "PREFLIGHT_FAILED")
    # The podFailurePolicy's FailJob: no second attempt although retries is 3.
    assert (job["attempt"], job["exit_code"]) == (1, 86)
    assert job["runtime"]["termination_message"] == line
    assert "gpu-visible: expected 1 GPU, found 0" in job["message"]
    assert job["reason_detail"]["link"] == "preflight"
    diagnosis = get(server, project, job_id, "/diagnosis")
    marks = {link["link"]: link["state"] for link in diagnosis["chain"]}
    assert (marks["preflight"], marks["training"]) == ("failed", "not-reached")

    def failed_by_policy() -> bool:
        conditions = kube.get(Job, job["kubernetes_job"], namespace=project).status.conditions
        return any(c.type == "Failed" and c.reason == "PodFailurePolicy" for c in conditions or [])

    eventually(failed_by_policy, 30, what="the Job failed by its podFailurePolicy")
