"""Logs and GPU-seconds through `kubetrain serve` on the testbed's default pool, whose GPU
nodes are KWOK's fake nodes: they run no containers, so a job there has no logs, and
kubetrain says so plainly (through the API and `kubetrain logs`).

The logs of a real container need a real kubelet: the tests that read them belong with
the real-node pool (branch real-nodes), once it is merged.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE, get, submit, wait_for

pytestmark = pytest.mark.testbed


def test_a_job_on_a_fake_node_has_no_logs_and_counts_its_gpu_seconds(
    server: Server, project: str
) -> None:
    body = training_job(
        "fake-logs", project, resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 1}
    )
    body["metadata"]["annotations"] = {f"{FATE}/run": "120s"}
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING")
    with server.client() as http:
        answer = http.get(f"/api/v1/projects/{project}/jobs/{job_id}/logs")
    assert answer.status_code == 409, answer.text
    problem = answer.json()
    assert problem["type"] == "urn:kubetrain:problem:fake-node"
    assert f"runs on {job['node']}, a fake node" in problem["detail"]
    assert "fake nodes run no containers and have no logs" in problem["detail"]
    shown = server.cli("logs", job_id, "-p", project)
    assert shown.returncode == 1
    assert "fake nodes run no containers and have no logs" in shown.stderr
    assert "Traceback" not in shown.stderr
    # Bound by the real scheduler: its GPU is held from then, and counted.
    usage = get(server, project, job_id)["gpu_seconds"]
    (attempt,) = usage["attempts"]
    assert attempt["bound_at"] is not None
    assert attempt["gpus"] == 1
    assert usage["total"] > 0
