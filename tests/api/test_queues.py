"""GET /api/v1/queues on a real database, with the control loops' caches made of dumps
recorded from the real Kueue: quota and reservations per flavor, the pending jobs in
Kueue's order with kubetrain's names, a project's scope, 503 without the caches, and
kubetrain_queue_pending_jobs in /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import (
    NEVER_FITS_NAMESPACE,
    OTHER,
    PROJECT,
    WAITING_NAMESPACE,
    Tokens,
    kueue_cluster,
    own,
    submitted,
)
from tests.api.test_metrics import samples, value

pytestmark = pytest.mark.db


@pytest.fixture
def listing() -> dict[str, Any]:
    return kueue_cluster()


@pytest.fixture
def client(db: Database, listing: dict[str, Any]) -> Iterator[TestClient]:
    settings = ServerSettings(
        database_url=db.url.render_as_string(hide_password=False),
        namespaces={PROJECT: WAITING_NAMESPACE, OTHER: NEVER_FITS_NAMESPACE},
    )
    with TestClient(create_app(settings, db, cluster=lambda: listing)) as test_client:
        yield test_client


@pytest.fixture
def queued_job(client: TestClient, tokens: Tokens, listing: dict[str, Any]) -> str:
    """PROJECT's job `queued-one`, whose Kubernetes Job is the recorded pending one."""
    job_id = submitted(client, tokens, "queued-one")
    own(listing, WAITING_NAMESPACE, "kt-kueue-waiting", job_id)
    return job_id


def test_each_cluster_queue_with_its_quota_and_who_waits_in_what_order(
    client: TestClient, tokens: Tokens, queued_job: str
) -> None:
    answer = client.get("/api/v1/queues", headers=tokens("viewer", "*"))
    assert answer.status_code == 200, answer.text
    gpus, stopped = answer.json()["cluster_queues"]
    assert (gpus["name"], gpus["active"], gpus["admitted"], gpus["pending_total"]) == (
        "gpus",
        True,
        1,
        2,
    )
    quota = {r["resource"]: r for r in gpus["resources"]}
    # What the admitted job's admission reserves: 8 of the nominal 8, nothing borrowed.
    assert quota["nvidia.com/gpu"] == {
        "flavor": "default-flavor",
        "resource": "nvidia.com/gpu",
        "nominal": "8",
        "borrowing_limit": None,
        "reserved": "8",
        "borrowed": "0",
    }
    assert (quota["cpu"]["reserved"], quota["memory"]["nominal"]) == ("2", "1Ti")
    first, second = gpus["pending"]
    assert first["position"] == 1
    assert (first["project"], first["job_name"], first["job_id"]) == (
        PROJECT,
        "queued-one",
        queued_job,
    )
    assert (first["kubernetes_job"], first["local_queue"]) == ("kt-kueue-waiting", "team")
    assert first["requests"]["nvidia.com/gpu"] == "8"
    assert "insufficient unused quota for nvidia.com/gpu" in first["message"]
    # Created later, so behind it; its Job is no kubetrain job known to the database.
    assert (second["position"], second["namespace"]) == (2, NEVER_FITS_NAMESPACE)
    assert (second["kubernetes_job"], second["job_id"], second["project"]) == (
        "kt-kueue-never-fits",
        None,
        None,
    )
    assert second["requests"]["nvidia.com/gpu"] == "16"
    assert stopped["name"] == "stopped"
    assert stopped["active"] is False
    assert stopped["inactive_reason"] == "Can't admit new workloads: is stopped."
    assert [p["position"] for p in stopped["pending"]] == [1]


def test_a_project_token_sees_only_its_namespaces_pending_jobs(
    client: TestClient, tokens: Tokens, queued_job: str
) -> None:
    theirs = client.get("/api/v1/queues", headers=tokens("viewer", OTHER))
    assert theirs.status_code == 200, theirs.text
    gpus, stopped = theirs.json()["cluster_queues"]
    # Its own job keeps its place in the whole queue; the job ahead is only counted.
    assert [(p["position"], p["kubernetes_job"]) for p in gpus["pending"]] == [
        (2, "kt-kueue-never-fits")
    ]
    assert gpus["pending_total"] == 2
    assert (stopped["pending"], stopped["pending_total"]) == ([], 1)
    for secret in ("queued-one", queued_job, WAITING_NAMESPACE, "kt-kueue-waiting"):
        assert secret not in theirs.text
    mine = client.get("/api/v1/queues", headers=tokens("viewer")).json()
    assert [p["job_name"] for p in mine["cluster_queues"][0]["pending"]] == ["queued-one"]


def test_without_the_control_loops_caches_the_answer_is_503(
    db: Database, settings: ServerSettings, tokens: Tokens
) -> None:
    with TestClient(create_app(settings, db)) as plain:
        answer = plain.get("/api/v1/queues", headers=tokens("viewer"))
        assert answer.status_code == 503
        assert answer.json()["type"] == "urn:kubetrain:problem:no-cluster"
        assert "runs no control loops" in answer.json()["detail"]
        assert plain.get("/api/v1/queues").status_code == 401
        # Nor does its /metrics hold the family: the leader's does.
        assert "kubetrain_queue_pending_jobs" not in plain.get("/metrics").text


def test_metrics_count_the_pending_jobs_of_each_cluster_queue(client: TestClient) -> None:
    found = samples(client)
    series = {labels for name, labels in found if name == "kubetrain_queue_pending_jobs"}
    assert series == {
        frozenset({("cluster_queue", "gpus")}),
        frozenset({("cluster_queue", "stopped")}),
    }
    assert value(found, "kubetrain_queue_pending_jobs", cluster_queue="gpus") == 2
    assert value(found, "kubetrain_queue_pending_jobs", cluster_queue="stopped") == 1
    assert value(found, "kubetrain_jobs", state="CREATED", reason="JOB_NOT_CREATED") == 0
