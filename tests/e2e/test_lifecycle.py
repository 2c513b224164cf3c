"""Training jobs through kubetrain's HTTP API only, on the testbed: the business
state and the runtime state as Kubernetes really reports them."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job

from kubetrain.domain.states import BusinessState, can_move
from tests.e2e.conftest import Server, training_job
from tests.kube import create, eventually

pytestmark = pytest.mark.testbed

FATE = "testbed.kubetrain.io"


def submit(
    server: Server,
    project: str,
    body: dict[str, Any],
    key: str | None = None,
    token: str | None = None,
) -> Any:
    headers = {"Idempotency-Key": key} if key else {}
    with server.client(token) as http:
        return http.post(f"/api/v1/projects/{project}/jobs", json=body, headers=headers)


def get(server: Server, project: str, job_id: str, path: str = "") -> Any:
    with server.client() as http:
        resp = http.get(f"/api/v1/projects/{project}/jobs/{job_id}{path}")
        resp.raise_for_status()
        return resp.json()


def wait_for(
    server: Server, project: str, job_id: str, state: str, reason: str, timeout: float = 60
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        last.update(get(server, project, job_id))
        return last if (last["business_status"], last["reason"]) == (state, reason) else None

    try:
        return eventually(probe, timeout, what=f"{state}/{reason}")
    except pytest.fail.Exception:
        seen = {k: last.get(k) for k in ("business_status", "reason", "raw_reason", "raw_message")}
        pytest.fail(f"job {job_id} never reached {state}/{reason}; last seen {seen}")


def business_path(server: Server, project: str, job_id: str) -> list[tuple[str, str]]:
    rows = get(server, project, job_id, "/history")
    rows = rows["items"] if isinstance(rows, dict) else rows
    return [
        (r["to_state"], r["to_reason"]) for r in rows if r.get("kind", "business") == "business"
    ]


def assert_valid_path(path: list[tuple[str, str]]) -> None:
    assert path[0] == ("CREATED", "JOB_NOT_CREATED")
    for (a, ra), (b, rb) in itertools.pairwise(path):
        assert (a, ra) != (b, rb), f"duplicate history row {a}/{ra}"
        assert a == b or can_move(BusinessState(a), BusinessState(b)), f"illegal {a} -> {b}"


def test_a_fitting_job_goes_created_queued_running_succeeded(server: Server, project: str):
    resp = submit(
        server,
        project,
        training_job(
            "fits", project, resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 1}
        ),
    )
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    job = wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED")
    assert job["node"].startswith("gpu-h100-")
    assert job["exit_code"] == 0
    path = business_path(server, project, job_id)
    assert_valid_path(path)
    states = [s for s, _ in path]
    assert states.index("QUEUED") < states.index("RUNNING") < states.index("SUCCEEDED")


def test_exit_code_one_fails_with_code_and_message(server: Server, project: str):
    body = training_job("crash", project)
    body["metadata"]["annotations"] = {
        f"{FATE}/run": "1s",
        f"{FATE}/exit-code": "1",
        f"{FATE}/termination-message": "loss is NaN at step 120",
    }
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "FAILED", "EXIT_NONZERO")
    assert job["exit_code"] == 1
    assert job["runtime"]["termination_message"] == "loss is NaN at step 120"
    assert_valid_path(business_path(server, project, job_id))


def test_too_many_gpus_waits_with_the_schedulers_message(server: Server, project: str):
    body = training_job(
        "big", project, resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 16}
    )
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "QUEUED", "INSUFFICIENT_GPU")
    # The scheduler says it twice: the FailedScheduling event and the PodScheduled
    # condition (reason Unschedulable); whichever the syncer saw first is kept.
    assert job["raw_reason"] in ("Unschedulable", "FailedScheduling")
    assert "Insufficient nvidia.com/gpu" in job["raw_message"]
    diagnosis = get(server, project, job_id, "/diagnosis")
    assert diagnosis["waitable"] is False
    assert diagnosis["link"] == "scheduler"


def test_a_gpu_quota_keeps_the_job_waiting_for_quota(server: Server, project: str, kube: Client):
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace, ResourceQuota

    kube.create(Namespace(metadata=ObjectMeta(name=project)))
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
    body = training_job(
        "over", project, resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 2}
    )
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "QUEUED", "WAITING_FOR_QUOTA")
    assert "exceeded quota: gpus" in job["raw_message"]


def test_a_missing_dataset_claim(server: Server, project: str):
    body = training_job(
        "data", project, dataset={"name": "imagenet", "version": "v3", "claim": "no-such-claim"}
    )
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "QUEUED", "PVC_NOT_FOUND")
    assert 'persistentvolumeclaim "no-such-claim" not found' in job["raw_message"]


def test_cancel_deletes_the_kubernetes_job(server: Server, project: str, kube: Client):
    body = training_job("long", project)
    body["metadata"]["annotations"] = {f"{FATE}/fate": "hang"}
    job_id = submit(server, project, body).json()["id"]
    job = wait_for(server, project, job_id, "RUNNING", "TRAINING")
    with server.client() as http:
        first = http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel")
        again = http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel")
    assert first.status_code == 200, first.text
    assert again.status_code == 200
    assert first.json()["business_status"] == again.json()["business_status"] == "CANCELLED"
    name = job["runtime"]["pod"].rsplit("-", 1)[0]

    def gone() -> bool:
        from kubetrain.cluster.errors import JobConflictError  # noqa: F401 - same package

        try:
            kube.get(Job, name, namespace=project)
        except Exception:
            return True
        return False

    eventually(gone, 30, what="the Kubernetes Job deleted")
    path = business_path(server, project, job_id)
    assert path[-1] == ("CANCELLED", "CANCELLED")
    assert_valid_path(path)


def test_one_idempotency_key_from_twenty_clients_makes_one_job(
    server: Server, project: str, kube: Client
):
    body = training_job("once", project)
    results: list[Any] = []

    def post() -> None:
        results.append(submit(server, project, body, key="same-key-123"))

    threads = [threading.Thread(target=post) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.status_code for r in results) == [200] * 19 + [201]
    assert len({r.json()["id"] for r in results}) == 1
    job_id = results[0].json()["id"]
    wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED")
    jobs = list(kube.list(Job, namespace=project))
    assert [j.metadata.name for j in jobs] == [f"kt-{job_id}"]


def test_tokens_and_projects(server: Server, project: str):
    viewer = server.make_token(project, "viewer")
    stranger = server.make_token("someone-else", "admin")
    body = training_job("guarded", project)
    assert submit(server, project, body, token=viewer).status_code == 403
    created = submit(server, project, body)
    job_id = created.json()["id"]
    with server.client(stranger) as http:
        assert http.get(f"/api/v1/projects/{project}/jobs/{job_id}").status_code == 404
    with server.client(viewer) as http:
        assert http.get(f"/api/v1/projects/{project}/jobs/{job_id}").status_code == 200
        assert http.post(f"/api/v1/projects/{project}/jobs/{job_id}/cancel").status_code == 403
    with server.client("kt_not-a-token") as http:
        denied = http.get(f"/api/v1/projects/{project}/jobs")
    assert denied.status_code == 401
    assert denied.headers["content-type"].startswith("application/problem+json")


def test_sigkill_mid_run_loses_no_transition_and_duplicates_none(server: Server, project: str):
    ids = []
    for index in range(6):
        body = training_job(f"k{index}", project)
        body["metadata"]["annotations"] = {f"{FATE}/run": "3s"}
        ids.append(submit(server, project, body).json()["id"])

    def mid_run() -> list[str] | None:
        states = [get(server, project, job_id)["business_status"] for job_id in ids]
        # Mid-run: one trains while another has not finished (a job runs 3 s).
        running = "RUNNING" in states and states.count("SUCCEEDED") < len(states) - 1
        return states if running else None

    killed_while = eventually(mid_run, 60, interval=0.1, what="a job RUNNING, others not done")
    server.kill()
    server.start()
    assert "RUNNING" in killed_while
    for job_id in ids:
        wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED", timeout=90)
        path = business_path(server, project, job_id)
        assert_valid_path(path)
        assert path[-1] == ("SUCCEEDED", "COMPLETED")
        assert ("RUNNING", "TRAINING") in path


def test_submissions_while_the_api_server_is_down_become_jobs_once_it_is_back(
    server: Server, project: str, testbed: Any, kube: Client
):
    # First make sure this replica leads (a restarted one waits out the old Lease).
    warm = submit(server, project, training_job("warm", project)).json()["id"]
    wait_for(server, project, warm, "SUCCEEDED", "COMPLETED", timeout=90)
    # Killed, not drained: a graceful stop takes the API server ~10 s, long enough
    # for the leader to lose its Lease before anything is submitted.
    testbed.stop_component("kube-apiserver", timeout=0)
    try:
        ids = [
            submit(server, project, training_job(f"d{i}", project)).json()["id"] for i in range(3)
        ]

        def failed_creates() -> list[dict[str, Any]] | None:
            jobs = [get(server, project, job_id) for job_id in ids]
            return jobs if all(j["raw_message"] for j in jobs) else None

        # The dispatcher tries at once and keeps the raw error (until the Lease it
        # can no longer renew makes it stand down).
        for job in eventually(failed_creates, 8, what="the raw errors of the failed creates"):
            assert (job["business_status"], job["reason"]) == ("CREATED", "JOB_NOT_CREATED")
    finally:
        testbed.start_component("kube-apiserver")
    for job_id in ids:
        wait_for(server, project, job_id, "SUCCEEDED", "COMPLETED", timeout=120)
    names = sorted(str(j.metadata.name) for j in kube.list(Job, namespace=project))
    assert names == sorted(f"kt-{job_id}" for job_id in [warm, *ids])
