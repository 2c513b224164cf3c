"""`POST …/jobs?dryRun=All`: the same checks as a submission, a forecast against the
cluster the control loops see (here a recorded dump of the testbed), nothing written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.domain.snapshot import Snapshot
from kubetrain.settings import ServerSettings
from kubetrain.store import Database, Role
from tests.api.builders import JOBS, OTHER, SNAPSHOTS, Tokens, training_job

pytestmark = pytest.mark.db

DRY = f"{JOBS}?dryRun=All"


def _idle_pool() -> Snapshot:
    """The testbed's gpu pool with nothing running: a recorded dump's Nodes alone."""
    data = json.loads((SNAPSHOTS / "insufficient-gpu.json").read_text())
    nodes = [i for i in data["items"] if i.get("kind") == "Node"]
    return Snapshot.from_list({"apiVersion": "v1", "kind": "List", "items": nodes})


@pytest.fixture
def watching(settings: ServerSettings, db: Database) -> Iterator[TestClient]:
    app = create_app(settings, db, cluster_snapshot=_idle_pool)
    with TestClient(app) as client:
        yield client


def _gpus(n: int) -> dict[str, Any]:
    return training_job(resources={"requests": {"cpu": "2", "memory": "8Gi"}, "gpus": n})


def _nothing_written(client: TestClient, tokens: Tokens) -> None:
    page = client.get(JOBS, headers=tokens(Role.VIEWER)).json()
    assert page["items"] == []


def test_a_one_gpu_job_on_an_idle_pool_starts_now_on_a_named_node(
    watching: TestClient, tokens: Tokens
) -> None:
    response = watching.post(DRY, json=_gpus(1), headers=tokens(Role.SUBMITTER))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dry_run"] is True
    assert body["job"]["id"] is None
    assert body["job"]["business_status"] == "CREATED"
    assert body["manifest"]["kind"] == "Job"
    forecast = body["forecast"]
    assert forecast["verdict"] == "starts-now"
    assert [p["rank"] for p in forecast["placements"]] == [0]
    assert forecast["placements"][0]["node"].startswith("gpu-")
    assert "Location" not in response.headers
    _nothing_written(watching, tokens)


def test_sixteen_gpus_on_one_worker_never_fit(watching: TestClient, tokens: Tokens) -> None:
    response = watching.post(DRY, json=_gpus(16), headers=tokens(Role.SUBMITTER))
    forecast = response.json()["forecast"]
    assert forecast["verdict"] == "never-fits"
    assert forecast["diagnosis"]["reason"] == "INSUFFICIENT_GPU"
    assert forecast["diagnosis"]["waitable"] is False
    assert "2 workers of 8 GPUs" in forecast["diagnosis"]["action"]
    _nothing_written(watching, tokens)


def test_an_idempotency_key_is_not_recorded_by_a_dry_run(
    watching: TestClient, tokens: Tokens
) -> None:
    headers = {**tokens(Role.SUBMITTER), "Idempotency-Key": "k-1"}
    assert watching.post(DRY, json=_gpus(1), headers=headers).status_code == 200
    real = watching.post(JOBS, json=_gpus(2), headers=headers)
    assert real.status_code == 201  # the key was free: the dry run kept nothing


def test_an_invalid_spec_is_the_same_422_as_a_real_submission(
    client: TestClient, tokens: Tokens
) -> None:
    # `client` runs no control loops: the checks still come first, then the 503.
    bad = training_job(resources={"gpus": -1}, image="")
    real = client.post(JOBS, json=bad, headers=tokens(Role.SUBMITTER))
    dry = client.post(DRY, json=bad, headers=tokens(Role.SUBMITTER))
    assert real.status_code == dry.status_code == 422
    assert dry.json()["errors"] == real.json()["errors"]
    good = client.post(DRY, json=_gpus(1), headers=tokens(Role.SUBMITTER))
    assert good.status_code == 503
    assert good.json()["type"] == "urn:kubetrain:problem:no-cluster"


def test_a_dry_run_needs_the_submitters_role_and_project(
    watching: TestClient, tokens: Tokens
) -> None:
    viewer = watching.post(DRY, json=_gpus(1), headers=tokens(Role.VIEWER))
    assert viewer.status_code == 403
    elsewhere = watching.post(DRY, json=_gpus(1), headers=tokens(Role.SUBMITTER, OTHER))
    assert elsewhere.status_code == 403


def test_an_unknown_dry_run_value_is_refused_naming_it(
    watching: TestClient, tokens: Tokens
) -> None:
    response = watching.post(f"{JOBS}?dryRun=Client", json=_gpus(1), headers=tokens("submitter"))
    assert response.status_code == 422
    assert any("dryRun" in e["field"] for e in response.json()["errors"])
    _nothing_written(watching, tokens)
