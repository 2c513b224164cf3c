"""`?dryRun=All` against a live testbed: each case is forecast, then submitted for real,
and the forecast's verdict and reason must be what the job then meets. A dry run
leaves nothing behind: no job, no Kubernetes Job.

One `kubetrain serve` (SQLite) for the module, on the session's `default` pool (two
8-GPU nodes tainted `nvidia.com/gpu=present:NoSchedule`, two CPU nodes). Each case
cancels its jobs, so the GPUs are free for the next.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, ResourceQuota

from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE, submit, wait_for
from tests.kube import create, eventually

pytestmark = pytest.mark.testbed

# What the job meets, per verdict: the business state it settles in.
SETTLES = {"starts-now": "RUNNING", "waits": "QUEUED", "never-fits": "QUEUED"}


@pytest.fixture(scope="module")
def dry_server(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("dry-run")
    srv = Server(
        database_url=f"sqlite:///{tmp / 'kubetrain.db'}",
        log=tmp / "serve.log",
        kubeconfig=testbed.kubeconfig,
    )
    srv.start()
    try:
        srv.wait_leading()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def project(kube: Client) -> Iterator[str]:
    name = f"dry-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


def dry_run(server: Server, project: str, body: dict[str, Any]) -> dict[str, Any]:
    with server.client() as http:
        response = http.post(f"/api/v1/projects/{project}/jobs?dryRun=All", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def nothing_left(server: Server, kube: Client, project: str, real: int) -> None:
    """Only the `real` jobs submitted for real exist, in kubetrain and in Kubernetes."""
    with server.client() as http:
        jobs = http.get(f"/api/v1/projects/{project}/jobs").json()["items"]
    assert len(jobs) == real
    assert list(kube.list(Job, namespace=project, labels={"kubetrain.io/job-id": "dry-run"})) == []


def hanging(name: str, project: str, **spec: Any) -> dict[str, Any]:
    body = training_job(name, project, **spec)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    return body


def gpus(n: int) -> dict[str, Any]:
    return {"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": n}


def agrees(server: Server, project: str, body: dict[str, Any]) -> dict[str, Any]:
    """Forecast `body`, submit it for real, and check the job meets the forecast."""
    forecast: dict[str, Any] = dry_run(server, project, body)["forecast"]
    diagnosis = forecast["diagnosis"]
    job_id = submit(server, project, body).json()["id"]
    reason = "TRAINING" if forecast["verdict"] == "starts-now" else diagnosis["reason"]
    wait_for(server, project, job_id, SETTLES[forecast["verdict"]], reason)
    if forecast["verdict"] != "starts-now":
        with server.client() as http:
            met = http.get(f"/api/v1/projects/{project}/jobs/{job_id}/diagnosis").json()
        assert met["waitable"] == diagnosis["waitable"]
    forecast["job_id"] = job_id
    return forecast


def cancel(server: Server, project: str, *job_ids: str) -> None:
    with server.client() as http:
        for job_id in job_ids:
            http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel")


def test_one_gpu_starts_now_and_sixteen_never_fit_as_the_jobs_then_do(
    dry_server: Server, kube: Client, project: str
) -> None:
    body = hanging("small", project, resources=gpus(1))
    # The session's earlier jobs may still be ending: wait for a free GPU, as a user would.
    eventually(
        lambda: dry_run(dry_server, project, body)["forecast"]["verdict"] == "starts-now",
        120,
        what="a free GPU on the pool",
    )
    small = agrees(dry_server, project, body)
    assert small["verdict"] == "starts-now"
    assert small["placements"][0]["node"].startswith("gpu-h100-")
    big = agrees(dry_server, project, training_job("big", project, resources=gpus(16)))
    assert big["verdict"] == "never-fits"
    assert (big["diagnosis"]["reason"], big["diagnosis"]["waitable"]) == (
        "INSUFFICIENT_GPU",
        False,
    )
    nothing_left(dry_server, kube, project, real=2)
    cancel(dry_server, project, small["job_id"], big["job_id"])


def test_a_quota_held_by_a_running_job_waits_and_a_larger_job_never_fits(
    dry_server: Server, kube: Client, project: str
) -> None:
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "1"}},
        },
        project,
    )
    eventually(
        lambda: kube.get(ResourceQuota, "gpus", namespace=project).status, 30, what="quota status"
    )
    holder = submit(dry_server, project, hanging("holder", project, resources=gpus(1)))
    holder_id = holder.json()["id"]
    wait_for(dry_server, project, holder_id, "RUNNING", "TRAINING")

    behind = agrees(dry_server, project, training_job("behind", project, resources=gpus(1)))
    assert behind["verdict"] == "waits"
    assert (behind["diagnosis"]["reason"], behind["diagnosis"]["waitable"]) == (
        "WAITING_FOR_QUOTA",
        True,
    )
    assert [h["job_id"] for h in behind["held_by"]] == [holder_id]

    larger = agrees(dry_server, project, training_job("larger", project, resources=gpus(2)))
    assert larger["verdict"] == "never-fits"
    assert larger["diagnosis"]["reason"] == "WAITING_FOR_QUOTA"
    nothing_left(dry_server, kube, project, real=3)
    cancel(dry_server, project, holder_id, behind["job_id"], larger["job_id"])


@pytest.mark.parametrize(
    ("case", "spec", "reason"),
    [
        # A gang of 3 x 8 GPUs on two 8-GPU nodes: two ranks placed, one never.
        ("gang", {"workers": 3, "resources": gpus(8)}, "INSUFFICIENT_GPU"),
        (
            "selector",
            {"resources": {**gpus(1), "gpuType": "nvidia-a100"}},
            "NODE_SELECTOR_MISMATCH",
        ),
        # Too big for the CPU nodes; the GPU nodes are big enough but tainted.
        ("taint", {"resources": {"requests": {"cpu": "64", "memory": "8Gi"}}}, "UNTOLERATED_TAINT"),
        (
            "volume",
            {"dataset": {"name": "d", "version": "v1", "claim": "no-such"}},
            "PVC_NOT_FOUND",
        ),
    ],
)
def test_what_never_fits_is_forecast_as_the_job_then_meets_it(
    dry_server: Server, kube: Client, project: str, case: str, spec: dict[str, Any], reason: str
) -> None:
    forecast = agrees(dry_server, project, hanging(case, project, **spec))
    assert (forecast["verdict"], forecast["diagnosis"]["reason"]) == ("never-fits", reason)
    nothing_left(dry_server, kube, project, real=1)
    cancel(dry_server, project, forecast["job_id"])


def test_the_cli_prints_the_same_forecast(dry_server: Server, project: str, tmp_path: Path) -> None:
    import yaml

    body = training_job("cli", project, resources=gpus(16))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(body))
    done = dry_server.cli("submit", "-f", str(path), "--dry-run", "-o", "json")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)["forecast"]
    answered = dry_run(dry_server, project, body)["forecast"]
    assert printed["verdict"] == answered["verdict"] == "never-fits"
    assert printed["diagnosis"]["reason"] == answered["diagnosis"]["reason"]
    text = dry_server.cli("submit", "-f", str(path), "--dry-run")
    assert "never-fits" in text.stdout
    assert "INSUFFICIENT_GPU" in text.stdout
