"""What people and other controllers do to kubetrain's Jobs behind its back."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.types import CascadeType

from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import (
    FATE,
    assert_valid_path,
    business_path,
    get,
    submit,
    wait_for,
)
from tests.kube import eventually

pytestmark = pytest.mark.testbed


def test_a_job_deleted_with_kubectl_fails_as_job_deleted(
    server: Server, project: str, kube: Client
):
    body = training_job("deleted-behind-our-back", project)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING")
    kube.delete(Job, job["kubernetes_job"], namespace=project, cascade=CascadeType.BACKGROUND)
    job = wait_for(server, project, job_id, "FAILED", "JOB_DELETED", timeout=90)
    assert job["finished_at"] is not None
    path = business_path(server, project, job_id)
    assert path[-2:] == [("RUNNING", "TRAINING"), ("FAILED", "JOB_DELETED")]
    assert_valid_path(path)


def test_an_evicted_pod_is_replaced_without_using_a_retry(server: Server, project: str):
    body = training_job("evicted", project, retries=0)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "evicted", f"{FATE}/run": "2s"}
    job_id = submit(server, project, body).json()["id"]

    def replaced() -> Any:
        attempts = get(server, project, job_id, "/attempts")["items"]
        return attempts if len(attempts) >= 2 else None

    attempts = eventually(replaced, 60, what="a second attempt after the eviction")
    first = attempts[0]
    assert (first["phase"], first["raw_reason"]) == ("Failed", "Evicted")
    # retries: 0, yet the job lives on: the podFailurePolicy ignores disruptions.
    reasons = [r for _, r in business_path(server, project, job_id)]
    assert "EVICTED" in reasons
    assert "FAILED" not in [s for s, _ in business_path(server, project, job_id)]
    with server.client() as http:
        assert http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel").status_code == 200
