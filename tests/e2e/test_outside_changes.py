"""What people and other controllers do to kubetrain's Jobs behind its back."""

from __future__ import annotations

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.types import CascadeType

from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE, assert_valid_path, business_path, submit, wait_for

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
