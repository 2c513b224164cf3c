"""GPU-seconds through the API: per job in its detail, per project and GPU type in
/api/v1/usage, and in /metrics; every worker of a gang and every attempt counts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import ALL_PROJECTS, Database, PodObservation, ReportEvent, record_reports
from kubetrain.store.sync import SyncedJob, record_synced
from tests.api.builders import JOBS, OTHER, PROJECT, Tokens, submitted, training_job
from tests.api.test_metrics import samples, value

pytestmark = pytest.mark.db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def pod(name: str, bound: float, started: float, finished: float | None) -> PodObservation:
    return PodObservation(
        pod_name=name,
        pod_uid=f"uid-{name}",
        node="gpu-node-1",
        pod_phase="Running" if finished is None else "Succeeded",
        container_state="running" if finished is None else "terminated",
        bound_at=at(bound),
        started_at=at(started),
        finished_at=None if finished is None else at(finished),
    )


def record(db: Database, job_id: str, *pods: PodObservation) -> None:
    synced = SyncedJob(
        job_id=job_id,
        pods=pods,
        state=BusinessState.RUNNING,
        reason=ReasonCode.TRAINING,
        raw_reason=None,
        raw_message=None,
        message=None,
        attempt=len(pods),
        detail=None,
        diagnosis={},
    )
    with db.transaction() as session:
        record_synced(session, [synced], now=at(0))


def trained(db: Database, job_id: str, pod_name: str, minutes: float, seq: int = 1) -> None:
    event = ReportEvent(seq, at(minutes), "phase", {"phase": "TRAINING"})
    with db.transaction() as session:
        record_reports(session, job_id, pod_name, [event], now=at(minutes))


def gpus(count: int, gpu_type: str) -> dict[str, object]:
    return {"requests": {"cpu": "4", "memory": "16Gi"}, "gpus": count, "gpuType": gpu_type}


@pytest.fixture
def jobs(client: TestClient, tokens: Tokens, db: Database) -> dict[str, str]:
    """Two finished runs of 8 H100s and 4 A100s in PROJECT, one 1-GPU run in OTHER."""
    h100 = submitted(client, tokens, "h100", resources=gpus(8, "nvidia-h100"))
    # Attempt 1: bound at 0, trained from 5 (its report), lost at 30. Attempt 2: bound at
    # 31, its report at 33, done at 60.
    record(db, h100, pod("h100-a", 0, 2, 30), pod("h100-b", 31, 32, 60))
    trained(db, h100, "h100-a", 5)
    trained(db, h100, "h100-b", 33)
    # Two workers of a gang, 4 GPUs each; an image without kubetrain's runtime: each
    # trains from its container's start.
    gang = submitted(client, tokens, "gang", workers=2, resources=gpus(4, "nvidia-a100"))
    record(db, gang, pod("gang-0", 0, 1, 11), pod("gang-1", 0, 2, 11))
    answer = client.post(
        f"/api/v1/projects/{OTHER}/jobs",
        json=training_job("other"),
        headers=tokens("submitter", OTHER),
    )
    assert answer.status_code == 201, answer.text
    other = answer.json()["id"]
    record(db, other, pod("other-a", 0, 0, 10))
    return {"h100": h100, "gang": gang, "other": other}


H100 = {"before_training": 8 * (5 + 2) * 60.0, "training": 8 * (25 + 27) * 60.0}
A100 = {"before_training": 4 * (1 + 2) * 60.0, "training": 4 * (10 + 9) * 60.0}


def test_a_jobs_detail_has_its_gpu_seconds_per_attempt(
    client: TestClient, tokens: Tokens, jobs: dict[str, str]
) -> None:
    answer = client.get(f"{JOBS}/{jobs['h100']}", headers=tokens("viewer")).json()["gpu_seconds"]
    assert (answer["before_training"], answer["training"]) == tuple(H100.values())
    assert answer["gpu_type"] == "nvidia-h100"
    assert [(a["number"], a["pod"], a["gpus"]) for a in answer["attempts"]] == [
        (1, "h100-a", 8),
        (2, "h100-b", 8),
    ]
    assert answer["attempts"][0]["training"] == 8 * 25 * 60.0
    gang = client.get(f"{JOBS}/{jobs['gang']}", headers=tokens("viewer")).json()["gpu_seconds"]
    assert (gang["before_training"], gang["training"]) == tuple(A100.values())


def test_usage_adds_up_per_project_and_gpu_type(
    client: TestClient, tokens: Tokens, jobs: dict[str, str]
) -> None:
    answer = client.get("/api/v1/usage", headers=tokens.admin)
    assert answer.status_code == 200, answer.text
    rows = {(i["project"], i["gpu_type"]): i for i in answer.json()["items"]}
    assert set(rows) == {(PROJECT, "nvidia-a100"), (PROJECT, "nvidia-h100"), (OTHER, "any")}
    h100 = rows[(PROJECT, "nvidia-h100")]
    assert (h100["before_training"], h100["training"], h100["jobs"]) == (*H100.values(), 1)
    assert h100["gpu_hours"] == round(sum(H100.values()) / 3600, 3)
    assert rows[(OTHER, "any")]["total"] == 600.0
    assert answer.json()["total"]["total"] == sum(H100.values()) + sum(A100.values()) + 600.0
    # A window counts only what came after its start: the second H100 attempt from 40.
    since = at(40).isoformat()
    window = client.get(
        "/api/v1/usage", params={"project": PROJECT, "since": since}, headers=tokens("viewer")
    ).json()
    assert [(i["gpu_type"], i["training"]) for i in window["items"]] == [
        ("nvidia-h100", 8 * 20 * 60.0)
    ]


def test_usage_is_read_within_the_tokens_scope(
    client: TestClient, tokens: Tokens, jobs: dict[str, str]
) -> None:
    # A project's admin sees its own projects only; another project's reader gets 403.
    mine = client.get("/api/v1/usage", headers=tokens("admin", PROJECT)).json()
    assert {i["project"] for i in mine["items"]} == {PROJECT}
    refused = client.get(
        "/api/v1/usage", params={"project": PROJECT}, headers=tokens("viewer", OTHER)
    )
    assert refused.status_code == 403
    # Every project at once is for admins.
    assert client.get("/api/v1/usage", headers=tokens("viewer", PROJECT)).status_code == 403
    naive = client.get(
        "/api/v1/usage",
        params={"project": PROJECT, "since": "2026-03-01T12:00:00"},
        headers=tokens("viewer"),
    )
    assert naive.status_code == 422
    assert "since" in naive.json()["detail"]
    # Found by the OpenAPI fuzz: a time whose UTC is past year 9999 was a 500.
    for edge in ("9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"):
        out = client.get(
            "/api/v1/usage", params={"project": PROJECT, "since": edge}, headers=tokens("viewer")
        )
        assert out.status_code == 422, out.text
        assert "since" in out.json()["detail"]


def test_metrics_count_gpu_seconds_by_project_type_and_phase_for_a_token(
    client: TestClient, tokens: Tokens, jobs: dict[str, str]
) -> None:
    found = samples(client, tokens("viewer", ALL_PROJECTS))
    name = "kubetrain_project_gpu_seconds_total"
    for phase, seconds in H100.items():
        labels = {"project": PROJECT, "gpu_type": "nvidia-h100", "phase": phase}
        assert value(found, name, **labels) == seconds
    assert value(found, name, project=OTHER, gpu_type="any", phase="training") == 600.0
    # A token of one project: that project's series, no other's.
    mine = samples(client, tokens("viewer", PROJECT))
    assert value(mine, name, project=PROJECT, gpu_type="nvidia-h100", phase="training") > 0
    assert not [key for key in mine if ("project", OTHER) in key[1]]


def test_the_open_metrics_name_no_project_and_keep_the_totals(
    client: TestClient, tokens: Tokens, jobs: dict[str, str]
) -> None:
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert PROJECT not in answer.text
    assert OTHER not in answer.text
    assert "project=" not in answer.text
    found = samples(client)
    name = "kubetrain_gpu_seconds_total"
    for phase, seconds in H100.items():
        assert value(found, name, gpu_type="nvidia-h100", phase=phase) == seconds
    assert value(found, name, gpu_type="any", phase="training") == 600.0
    # A token that does not work is said, not answered as if there were none.
    refused = client.get("/metrics", headers={"Authorization": "Bearer kt_revoked"})
    assert refused.status_code == 401


def test_the_counter_never_steps_back_when_an_end_is_recorded_late(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens, "late", resources=gpus(1, "nvidia-l4"))
    now = datetime.now(UTC)
    running = PodObservation(
        pod_name="late-a",
        pod_uid="uid-late-a",
        pod_phase="Running",
        bound_at=now - timedelta(hours=1),
    )
    record(db, job_id, running)
    name, labels = (
        "kubetrain_project_gpu_seconds_total",
        {"project": PROJECT, "gpu_type": "nvidia-l4"},
    )
    first = value(samples(client, tokens.admin), name, phase="before_training", **labels)
    assert first >= 3600
    # The syncer now records that it ended ten minutes ago: the sum drops, the counter holds.
    ended = PodObservation(
        pod_name="late-a",
        pod_uid="uid-late-a",
        pod_phase="Failed",
        bound_at=running.bound_at,
        finished_at=now - timedelta(minutes=10),
    )
    record(db, job_id, ended)
    assert value(samples(client, tokens.admin), name, phase="before_training", **labels) == first
    total = value(
        samples(client),
        "kubetrain_gpu_seconds_total",
        gpu_type="nvidia-l4",
        phase="before_training",
    )
    assert total == first
