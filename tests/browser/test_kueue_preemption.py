"""Kueue preemption through `kubetrain serve`, end to end, and the Queues page in real
headless Chromium: on the Kueue testbed (a ClusterQueue of the test's own of 8 GPUs,
LocalQueue `team`), a low-priority 8-GPU job runs; a high-priority one takes the quota from it.
Both jobs' histories, as the API keeps them, say so; while the low one waits preempted,
the Queues page draws the quota full and lists it first in line; once the high one
succeeds, Kueue admits the low one again and it runs its second attempt to the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.batch_v1 import Job
from playwright.sync_api import Page, expect

from kubetrain.local_server import LocalServer
from kubetrain.testbed.cluster import Testbed
from tests.kube import eventually, get
from tests.testbed.test_kueue import queue_namespace

pytestmark = [pytest.mark.browser, pytest.mark.testbed]

FATE = "testbed.kubetrain.io"


@pytest.fixture(scope="module")
def kueue_kube(kueue_testbed: Testbed) -> Client:
    return Client(config=KubeConfig.from_file(kueue_testbed.kubeconfig), field_manager="tests")


@pytest.fixture(scope="module")
def kueue_server(
    kueue_testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalServer]:
    tmp = tmp_path_factory.mktemp("kueue-serve")
    srv = LocalServer(
        database_url=f"sqlite:///{tmp / 'kubetrain.db'}",
        log=tmp / "serve.log",
        kubeconfig=kueue_testbed.kubeconfig,
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def project(kueue_kube: Client) -> Iterator[str]:
    """A project whose namespace holds the LocalQueue `team`, of a ClusterQueue of its own
    of the same name, before any job is submitted."""
    with queue_namespace(kueue_kube, "kq") as name:
        yield name


def _submit(server: LocalServer, project: str, name: str, priority: str, run: str) -> str:
    body = {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project, "annotations": {f"{FATE}/run": run}},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": 8},
            "queue": "team",
            "priorityClass": priority,
        },
    }
    with server.client() as http:
        resp = http.post(f"/api/v1/projects/{project}/jobs", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _get(server: LocalServer, project: str, job_id: str, path: str = "") -> Any:
    with server.client() as http:
        resp = http.get(f"/api/v1/projects/{project}/jobs/{job_id}{path}")
    resp.raise_for_status()
    return resp.json()


def _wait(
    server: LocalServer, project: str, job_id: str, state: str, reason: str, timeout: float = 90
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = _get(server, project, job_id)
        if (job["business_status"], job["reason"]) == (state, reason):
            return job
        time.sleep(0.3)
    seen = {k: job.get(k) for k in ("business_status", "reason", "raw_reason", "message")}
    pytest.fail(f"job {job_id} never reached {state}/{reason}; last seen {seen}")


def _business(server: LocalServer, project: str, job_id: str) -> list[dict[str, Any]]:
    rows = _get(server, project, job_id, "/history")["items"]
    return [r for r in rows if r["kind"] == "business"]


def _path(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(r["to_state"], r["to_reason"]) for r in rows]


def _sign_in(page: Page, server: LocalServer, token: str) -> None:
    page.goto(f"{server.url}/ui/")
    expect(page.locator("h1")).to_have_text("Sign in")
    page.fill("#token", token)
    page.click("form button[type=submit]")
    page.wait_for_url("**/jobs")


def test_a_high_priority_job_preempts_a_low_one_and_the_queues_page_shows_it(
    kueue_server: LocalServer, kueue_kube: Client, project: str, page: Page, artifacts: Path
) -> None:
    server = kueue_server
    # Long enough to be preempted while it runs, short enough to finish once re-admitted.
    low = _submit(server, project, "low-priority", "fixture-low", "40s")
    _wait(server, project, low, "RUNNING", "TRAINING", timeout=120)
    # The page is signed in before the preemption, so that the wait it shows is caught.
    _sign_in(page, server, server.create_token(project, "viewer", "queues-viewer"))

    high = _submit(server, project, "high-priority", "fixture-high", "30s")
    high_job = eventually(
        lambda: get(kueue_kube, Job, f"kt-{high.lower()}", project), 30, what="the high Job"
    )
    assert high_job.metadata is not None
    waiting = _wait(server, project, low, "QUEUED", "PREEMPTED")
    # Kueue's own reason, and the preemptor named: by its Job's UID in Kueue's words,
    # by its Job's name in kubetrain's.
    assert waiting["raw_reason"] == "Preempted"
    assert f"JobUID: {high_job.metadata.uid}" in waiting["raw_message"]
    assert f"preempted the job for kt-{high.lower()}" in waiting["message"]

    # The Queues page once the high job holds the quota (Kueue admits it when the low
    # one's Pod is gone) and the low one waits.
    _wait(server, project, high, "RUNNING", "TRAINING")
    page.goto(f"{server.url}/ui/queues")
    expect(page.locator("h1")).to_have_text("Queues")
    gpus = page.locator(f'section[data-cluster-queue="{project}"]')
    bar = gpus.locator('.bar-row[data-resource="default-flavor · nvidia.com/gpu"]')
    expect(bar).to_have_attribute("data-used", "8")
    expect(bar).to_have_attribute("data-total", "8")
    expect(bar.locator(".bar-text")).to_have_text("8 of 8 nominal admitted")
    first = gpus.locator("table.pending-workloads tbody tr")
    expect(first).to_have_count(1)
    expect(first).to_have_attribute("data-position", "1")
    expect(first.locator("td").nth(1)).to_have_text("low-priority")
    expect(first.locator("td").nth(2)).to_have_text(project)
    expect(first.locator("td").nth(3)).to_have_text("100")
    expect(first.locator("td").nth(4)).to_contain_text("nvidia.com/gpu 8")
    path = artifacts / "queues-page.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")

    _wait(server, project, high, "SUCCEEDED", "COMPLETED", timeout=120)
    done = _wait(server, project, low, "SUCCEEDED", "COMPLETED", timeout=150)
    assert done["attempt"] == 2

    low_rows = _business(server, project, low)
    low_path = _path(low_rows)
    ran = low_path.index(("RUNNING", "TRAINING"))
    assert {state for state, _ in low_path[:ran]} == {"CREATED", "QUEUED"}, low_path
    again = low_path.index(("RUNNING", "TRAINING"), ran + 1)
    # Preempted until Kueue admits it again, then starting: never back to waiting for
    # quota (what the Job's Suspended condition alone would have said).
    assert low_path[ran + 1] == ("QUEUED", "PREEMPTED"), low_path
    assert {reason for _, reason in low_path[ran + 2 : again]} <= {
        "SCHEDULING",
        "CONTAINER_CREATING",
    }, low_path
    assert low_path[again:] == [("RUNNING", "TRAINING"), ("SUCCEEDED", "COMPLETED")], low_path
    preempted = low_rows[ran + 1]
    assert preempted["raw_reason"] == "Preempted"
    assert f"JobUID: {high_job.metadata.uid}" in preempted["raw_message"]
    attempts = _get(server, project, low, "/attempts")["items"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[-1]["phase"] == "Succeeded"

    # The high job waited for the quota the low one held, then ran to the end; once
    # admitted, its history names the job Kueue preempted for it.
    high_rows = _business(server, project, high)
    high_path = _path(high_rows)
    ran_high = high_rows[high_path.index(("RUNNING", "TRAINING"))]
    assert (ran_high["detail"] or {}).get("preempted") == [f"kt-{low.lower()}"], high_rows
    assert ("QUEUED", "WAITING_FOR_QUOTA") in high_path, high_path
    assert high_path.index(("QUEUED", "WAITING_FOR_QUOTA")) < high_path.index(
        ("RUNNING", "TRAINING")
    )
    assert high_path[-2:] == [("RUNNING", "TRAINING"), ("SUCCEEDED", "COMPLETED")], high_path
