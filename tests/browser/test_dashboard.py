"""The dashboard in real headless Chromium against `kubetrain serve` on the testbed:
sign in, a job waiting for GPUs with its chip, its blocking link, cancel from the
page, the nodes' bars, and hostile text that shows as text and never runs."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Dialog, Page, expect

from kubetrain.local_server import LocalServer

pytestmark = [pytest.mark.browser, pytest.mark.testbed]

FATE = "testbed.kubetrain.io"
HOSTILE = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


def _submit(
    server: LocalServer, project: str, name: str, gpus: int, annotations: dict[str, str]
) -> str:
    body = {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project, "annotations": annotations},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": gpus},
        },
    }
    with server.client() as http:
        resp = http.post(f"/api/v1/projects/{project}/jobs", json=body)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def _job(server: LocalServer, project: str, job_id: str) -> dict[str, Any]:
    with server.client() as http:
        resp = http.get(f"/api/v1/projects/{project}/jobs/{job_id}")
    resp.raise_for_status()
    result: dict[str, Any] = resp.json()
    return result


def _wait(server: LocalServer, project: str, job_id: str, state: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _job(server, project, job_id)["business_status"] == state:
            return
        time.sleep(0.5)
    pytest.fail(f"job {job_id} never reached {state}: {_job(server, project, job_id)}")


def _sign_in(page: Page, server: LocalServer, token: str) -> None:
    page.goto(f"{server.url}/ui/")
    expect(page.locator("h1")).to_have_text("Sign in")
    page.fill("#token", token)
    page.click("form button[type=submit]")
    page.wait_for_url("**/jobs")


def _shot(page: Page, artifacts: Path, name: str) -> None:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def _nothing_ran(page: Page) -> None:
    assert page.evaluate("window.__xss") is None


@pytest.fixture
def project() -> str:
    return f"web-{uuid.uuid4().hex[:8]}"


def test_a_waiting_job_its_blocking_link_and_cancel(
    page: Page, server: LocalServer, project: str, artifacts: Path
) -> None:
    token = server.create_token(project, "submitter", "web-submitter")
    _sign_in(page, server, token)
    # Submitted after the page is open: the row and its chip arrive by live refresh.
    page.evaluate("window.__loaded_once = true")
    job_id = _submit(server, project, "llm-pretrain-16gpu", 16, {})
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    chip = row.locator(".chip", has_text="INSUFFICIENT_GPU")
    expect(chip).to_be_visible(timeout=60_000)
    expect(chip).to_have_class("chip chip-user")  # the user must act: ask for fewer GPUs
    expect(row.locator(".chip", has_text="QUEUED")).to_have_class("chip state-queued")
    expect(page.locator("#counts")).to_contain_text("1 waiting for GPU")
    assert page.evaluate("window.__loaded_once") is True  # no reload happened
    _shot(page, artifacts, "jobs")

    row.locator("a.job-name").click()
    blocking = page.locator('#chain li[data-link="scheduler"]')
    expect(blocking).to_have_attribute("data-state", "blocking")
    expect(page.locator('#chain li[data-link="control-plane"]')).to_have_attribute(
        "data-state", "passed"
    )
    expect(page.locator('#chain li[data-link="training"]')).to_have_attribute(
        "data-state", "not-reached"
    )
    expect(page.locator("#raw-message")).to_contain_text("Insufficient nvidia.com/gpu")
    expect(page.locator("#fit")).to_contain_text("gpu-h100")
    expect(page.locator("#blockers")).to_contain_text("INSUFFICIENT_GPU")
    _shot(page, artifacts, "job-waiting")

    # After a live refresh has replaced the form, the confirmation still guards it.
    # The page refreshes every 5 s: a busy machine answers the first one later than that.
    expect(page.locator("[data-live]")).to_have_attribute(
        "data-refreshed", re.compile(r"\d+"), timeout=30_000
    )
    asked: list[str] = []

    def confirm(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", confirm)
    page.click("#cancel")
    expect(page.locator("#state")).to_have_text("CANCELLED")
    expect(page.locator("#cancel")).to_have_count(0)
    assert asked == ["Cancel job llm-pretrain-16gpu?"]
    assert _job(server, project, job_id)["business_status"] == "CANCELLED"
    _shot(page, artifacts, "job-cancelled")


def test_hostile_text_shows_as_text_and_the_nodes_have_bars(
    page: Page, server: LocalServer, project: str, artifacts: Path
) -> None:
    annotations = {
        f"{FATE}/run": "1s",
        f"{FATE}/exit-code": "1",
        f"{FATE}/termination-message": HOSTILE,
        "note": HOSTILE,
    }
    job_id = _submit(server, project, "hostile", 1, annotations)
    _wait(server, project, job_id, "FAILED")
    _sign_in(page, server, server.create_token(project, "viewer", "web-viewer"))
    _nothing_ran(page)
    page.click("a.job-name")
    expect(page.locator("#state")).to_have_text("FAILED")
    expect(page.locator("body")).to_contain_text(HOSTILE)  # shown, as text
    page.click("summary")
    expect(page.locator("#manifest")).to_contain_text(HOSTILE)
    assert page.locator("img[src=x]").count() == 0
    _nothing_ran(page)
    _shot(page, artifacts, "job-failed-hostile")

    page.goto(f"{server.url}/ui/nodes")
    h100 = page.locator('section[data-accelerator="nvidia-h100"]')
    expect(h100.locator('tr[data-node] [data-resource="nvidia.com/gpu"]')).to_have_count(2)
    expect(h100.locator('[data-resource="nvidia.com/gpu"][data-total="8"]')).to_have_count(2)
    expect(h100).to_contain_text("GPUs in use")
    expect(page.locator('section[data-accelerator="no accelerator"] svg.bar')).not_to_have_count(0)
    _nothing_ran(page)
    _shot(page, artifacts, "nodes")
    page.goto(f"{server.url}/ui/quotas")
    _shot(page, artifacts, "quotas")
