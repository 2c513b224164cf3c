"""The production layout on the testbed: an API replica (`serve --no-control`) and a
control-loop replica (`serve --no-api`) sharing one database. The job goes through
the API replica; the other one creates and follows it, and serves only its probes
and metrics (what its Deployment's kubelet and Prometheus read)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import submit, wait_for

pytestmark = pytest.mark.testbed


@pytest.fixture
def replicas(testbed: Testbed, tmp_path: Path) -> Iterator[tuple[Server, Server]]:
    url = f"sqlite:///{tmp_path / 'kubetrain.db'}"
    api = Server(database_url=url, log=tmp_path / "api.log", args=["--no-control"])
    # Its own Lease namespace: the module's shared server leads in `default`.
    control = Server(
        database_url=url,
        log=tmp_path / "control.log",
        kubeconfig=testbed.kubeconfig,
        args=["--no-api", "--lease-namespace", "kube-public"],
    )
    api.start()
    try:
        control.start()  # /readyz on the control replica: database and watches
        try:
            control.wait_leading()
            yield api, control
        finally:
            control.stop()
    finally:
        api.stop()


def test_an_api_replica_and_a_control_replica_run_a_job_together(
    replicas: tuple[Server, Server], project: str
):
    api, control = replicas
    resp = submit(api, project, training_job("split", project))
    assert resp.status_code == 201, resp.text
    job = wait_for(api, project, resp.json()["id"], "SUCCEEDED", "COMPLETED")
    assert job["exit_code"] == 0
    metrics = httpx.get(f"{control.url}/metrics", timeout=5).text
    assert "kubetrain_leader 1.0" in metrics
    assert "kubetrain_sync_round_seconds_count" in metrics
    # The control replica serves no API: no job can be read or submitted there.
    with control.client() as http:
        assert http.get(f"/api/v1/projects/{project}/jobs").status_code == 404
    assert httpx.get(f"{api.url}/metrics", timeout=5).status_code == 200
