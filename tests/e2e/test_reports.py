"""A Pod's runtime reports through kubetrain's API with the ServiceAccount token bound
to it, issued by the API server as the kubelet asks for the one it projects (KWOK's
Pods run nothing, so the test asks for it): the job moves RUNNING/PREFLIGHT ->
RUNNING/TRAINING. Another Pod's token, a token for another audience and the token of
a Pod that is gone are refused; kubetrain made no Secret."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod, Secret

from kubetrain.domain.manifest import LABEL_JOB_ID, STATUS_TOKEN_FILE
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE, get, submit, wait_for
from tests.kube import bound_token, eventually

pytestmark = pytest.mark.testbed

T = datetime.now(UTC).isoformat()  # the server takes times near its clock only
STEP = {"seq": 9, "time": T, "type": "step", "step": 1}


def report(server: Server, job_id: str, token: str, pod: str, *events: dict[str, Any]) -> Any:
    return httpx.post(
        f"{server.url}/api/v1/jobs/{job_id}/reports",
        json={"pod": pod, "events": list(events)},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


def running(server: Server, project: str, kube: Client, name: str) -> tuple[str, Any]:
    """A job that runs until cancelled, and its Pod."""
    body = training_job(name, project)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING")
    return job_id, kube.get(Pod, job["runtime"]["pod"], namespace=project)


def test_a_pod_reports_with_its_own_token_and_another_pods_is_refused(
    server: Server, project: str, kube: Client
):
    job_id, pod = running(server, project, kube, "reporting")
    name = pod.metadata.name
    # The Job is the one object kubetrain made: the token comes from the kubelet, for
    # kubetrain's audience, at the file the runtime reads.
    assert list(kube.list(Secret, namespace=project, labels={LABEL_JOB_ID: job_id})) == []
    env = {e.name: e for e in pod.spec.containers[0].env}
    assert env["KUBETRAIN_STATUS_TOKEN_FILE"].value == STATUS_TOKEN_FILE
    (volume,) = pod.spec.volumes
    assert volume.projected.sources[0].serviceAccountToken.audience == "kubetrain"

    token = bound_token(kube, project, pod)
    assert report(server, job_id, server.token, name).status_code == 401  # a user's token
    # The Pod's own token for another audience (the API server's) is not kubetrain's.
    assert report(server, job_id, bound_token(kube, project, pod, None), name).status_code == 401
    answer = report(
        server, job_id, token, name, {"seq": 0, "time": T, "type": "phase", "phase": "PREFLIGHT"}
    )
    assert answer.status_code == 202, answer.text
    wait_for(server, project, job_id, "RUNNING", "PREFLIGHT", timeout=30)
    report(
        server,
        job_id,
        token,
        name,
        {"seq": 1, "time": T, "type": "phase", "phase": "TRAINING"},
        {"seq": 2, "time": T, "type": "step", "step": 5, "metrics": {"loss": 1.5}},
    )
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING", timeout=30)
    assert (job["progress"]["phase"], job["progress"]["step"]) == ("TRAINING", 5)
    reasons = [
        row["to_reason"]
        for row in get(server, project, job_id, "/history")["items"]
        if row["kind"] == "business"
    ]
    assert reasons[-3:] == ["TRAINING", "PREFLIGHT", "TRAINING"]

    # Another job's Pod, with the token bound to it: heard for its job, not for this one.
    other_id, other = running(server, project, kube, "neighbour")
    theirs = bound_token(kube, project, other)
    refused = report(server, job_id, theirs, other.metadata.name, STEP)
    assert refused.status_code == 403, refused.text
    assert report(server, other_id, theirs, other.metadata.name, STEP).status_code == 202

    # Once the Pod is gone its token is worth nothing, whatever its expiry says.
    with server.client() as http:
        assert http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel").status_code == 200
    eventually(
        lambda: report(server, job_id, token, name, STEP).status_code == 401,
        60,
        what="the deleted Pod's token refused",
    )


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
