"""Reading jobs: filters and cursor pages, one job with its runtime state, history, attempts,
the rendered manifest and the stored diagnosis."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from lightkube.resources.batch_v1 import Job as KubernetesJob

from kubetrain.domain.manifest import LABEL_JOB_ID, job_name
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    PodObservation,
    Source,
    apply_business_change,
)
from tests.api.builders import JOBS, Tokens, submitted
from tests.store.builders import mark_dispatched, observe

pytestmark = pytest.mark.db

POD = PodObservation(
    pod_name="kt-job-x7k2p",
    pod_uid="7f8e0c4a-1111-4d5e-9a0b-000000000001",
    node="gpu-node-1",
    pod_phase="Failed",
    container_state="terminated",
    raw_reason="Error",
    raw_message="exit status 3",
    exit_code=3,
    termination_message="loss is NaN at step 1200",
    started_at=datetime(2026, 3, 1, 12, 0, tzinfo=UTC),
    finished_at=datetime(2026, 3, 1, 12, 5, tzinfo=UTC),
)


def fail_with_exit_code(db: Database, job_id: str) -> None:
    """What the dispatcher and syncer would record for a job whose trainer exits 3."""
    with db.transaction() as session:
        mark_dispatched(session, job_id, k8s_job_name=job_name(job_id))
        observe(session, job_id, POD)
        apply_business_change(
            session,
            job_id,
            BusinessState.FAILED,
            ReasonCode.EXIT_NONZERO,
            "Error",
            "exit status 3",
            source=Source.SYNCER,
            attempt=1,
        )


def test_one_job_shows_both_states_and_the_reasons_words(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens)
    fail_with_exit_code(db, job_id)
    response = client.get(f"{JOBS}/{job_id}", headers=tokens("viewer"))
    assert response.status_code == 200
    job = response.json()
    assert (job["business_status"], job["reason"]) == ("FAILED", "EXIT_NONZERO")
    assert (job["raw_reason"], job["raw_message"]) == ("Error", "exit status 3")
    assert job["reason_detail"]["link"] == "training"
    assert job["reason_detail"]["actor"] == "user"
    assert job["reason_detail"]["explanation"]
    assert job["reason_detail"]["action"]
    assert (job["attempt"], job["node"], job["exit_code"]) == (1, "gpu-node-1", 3)
    runtime = job["runtime"]
    assert runtime["pod"] == POD.pod_name
    assert runtime["phase"] == "Failed"  # the Pod's phase, never the business state
    assert runtime["container_state"] == "terminated"
    assert runtime["termination_message"] == "loss is NaN at step 1200"
    assert job["kubernetes_job"] == job_name(job_id)
    assert job["finished_at"] is not None
    assert job["cancel_requested"] is False
    assert job["diagnosis"] is None
    assert job["spec"]["kind"] == "TrainingJob"


def test_history_and_attempts_in_order(client: TestClient, tokens: Tokens, db: Database) -> None:
    job_id = submitted(client, tokens)
    fail_with_exit_code(db, job_id)
    history = client.get(f"{JOBS}/{job_id}/history", headers=tokens("viewer")).json()
    assert history["job_id"] == job_id
    steps = [
        (row["kind"], row["source"], row["to_state"], row["to_reason"]) for row in history["items"]
    ]
    assert steps == [
        ("business", "api", "CREATED", "JOB_NOT_CREATED"),
        ("business", "dispatcher", "QUEUED", "SCHEDULING"),
        ("runtime", "syncer", "Failed", None),
        ("business", "syncer", "FAILED", "EXIT_NONZERO"),
    ]
    assert history["items"][-1]["raw_message"] == "exit status 3"
    assert history["items"][-1]["from_state"] == "QUEUED"
    attempts = client.get(f"{JOBS}/{job_id}/attempts", headers=tokens("viewer")).json()
    assert [(a["attempt"], a["exit_code"], a["node"]) for a in attempts["items"]] == [
        (1, 3, "gpu-node-1")
    ]


def test_lists_filter_by_state_reason_and_name(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    waiting = submitted(client, tokens, "waiting")
    failed = submitted(client, tokens, "failed")
    fail_with_exit_code(db, failed)
    submitted(client, tokens, "waiting")  # names may repeat
    viewer = tokens("viewer")

    def names(query: str) -> list[str]:
        response = client.get(f"{JOBS}?{query}", headers=viewer)
        assert response.status_code == 200, response.text
        return [job["name"] for job in response.json()["items"]]

    assert names("") == ["waiting", "failed", "waiting"]  # newest first
    assert names("state=FAILED") == ["failed"]
    assert names("state=CREATED&state=FAILED") == ["waiting", "failed", "waiting"]
    assert names("reason=EXIT_NONZERO") == ["failed"]
    assert names("reason=JOB_NOT_CREATED&reason=CANCELLED") == ["waiting", "waiting"]
    assert names("name=waiting") == ["waiting", "waiting"]
    assert names("name=waiting&limit=1") == ["waiting"]
    listed = client.get(f"{JOBS}?state=FAILED", headers=viewer).json()["items"][0]
    assert (listed["node"], listed["exit_code"], listed["attempt"]) == ("gpu-node-1", 3, 1)
    oldest = client.get(f"{JOBS}?name=waiting", headers=viewer).json()["items"][-1]
    assert oldest["id"] == waiting

    refused = client.get(f"{JOBS}?state=SLEEPING&limit=9999", headers=viewer)
    assert refused.status_code == 422
    assert {e["field"] for e in refused.json()["errors"]} == {"query.state[0]", "query.limit"}


def test_cursor_pages_cover_every_job_once(client: TestClient, tokens: Tokens) -> None:
    ids = [submitted(client, tokens, f"job-{n}") for n in range(7)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = "limit=3" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(f"{JOBS}?{query}", headers=tokens("viewer")).json()
        seen += [job["id"] for job in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == list(reversed(ids))

    bad = client.get(f"{JOBS}?cursor=bm90LWEtY3Vyc29y", headers=tokens("viewer"))
    assert bad.status_code == 400
    assert bad.json()["type"] == "urn:kubetrain:problem:invalid-cursor"


@pytest.mark.parametrize(
    "when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "2026-01-01T00:00:00"]
)
def test_a_crafted_cursor_is_refused_not_a_500(
    client: TestClient, tokens: Tokens, when: str
) -> None:
    # Any viewer can send a cursor; one naming a time past UTC's range once overflowed.
    raw = json.dumps([when, "an-id"]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    bad = client.get(f"{JOBS}?cursor={cursor}", headers=tokens("viewer"))
    assert bad.status_code == 400, bad.text
    assert bad.json()["type"] == "urn:kubetrain:problem:invalid-cursor"


def test_the_manifest_is_the_job_the_dispatcher_creates(client: TestClient, tokens: Tokens) -> None:
    registered = client.post(
        "/api/v1/datasets",
        json={"name": "imagenet", "version": "v3", "claim": "dataset-imagenet", "subPath": "v3"},
        headers=tokens.admin,
    )
    assert registered.status_code == 201
    job_id = submitted(
        client, tokens, dataset={"name": "imagenet", "version": "v3"}, maxRuntime="2h"
    )
    response = client.get(f"{JOBS}/{job_id}/manifest", headers=tokens("viewer"))
    assert response.status_code == 200
    manifest = response.json()
    assert (manifest["apiVersion"], manifest["kind"]) == ("batch/v1", "Job")
    assert manifest["metadata"]["name"] == job_name(job_id)
    assert manifest["metadata"]["namespace"] == "ai-training"
    assert manifest["metadata"]["labels"][LABEL_JOB_ID] == job_id
    assert manifest["spec"]["activeDeadlineSeconds"] == 7200
    pod = manifest["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "dataset"]
    assert volume["persistentVolumeClaim"] == {"claimName": "dataset-imagenet", "readOnly": True}
    [container] = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    typed = KubernetesJob.from_dict(manifest)  # the client's model of batch/v1 Job takes it
    assert isinstance(typed, KubernetesJob)
    assert typed.spec is not None
    assert typed.spec.template.spec is not None
    assert typed.spec.template.spec.restartPolicy == "Never"


def test_the_diagnosis_is_served_once_stored(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens)
    none_yet = client.get(f"{JOBS}/{job_id}/diagnosis", headers=tokens("viewer"))
    assert none_yet.status_code == 404
    assert none_yet.json()["type"] == "urn:kubetrain:problem:no-diagnosis"
    diagnosis = {"primary": {"code": "INSUFFICIENT_GPU"}, "blockers": [{"nodes": 2}]}
    with db.transaction() as session:
        observe(session, job_id, diagnosis=diagnosis)
    served = client.get(f"{JOBS}/{job_id}/diagnosis", headers=tokens("viewer"))
    assert (served.status_code, served.json()) == (200, diagnosis)
    assert client.get(f"{JOBS}/{job_id}", headers=tokens("viewer")).json()["diagnosis"] == diagnosis


def test_unknown_jobs_are_404_problems(client: TestClient, tokens: Tokens) -> None:
    for suffix in ("", "/history", "/attempts", "/manifest", "/diagnosis"):
        response = client.get(f"{JOBS}/no-such-job{suffix}", headers=tokens("viewer"))
        assert response.status_code == 404
        assert response.headers["content-type"] == "application/problem+json"
        assert "no-such-job" in response.json()["detail"]


@pytest.mark.parametrize("last_id", ["\u0000", "a\u0000b", "x" * 300, 7])
def test_a_cursor_naming_no_id_of_ours_is_refused_not_a_500(
    client: TestClient, tokens: Tokens, last_id: object
) -> None:
    # Found by the OpenAPI fuzz on PostgreSQL, which refuses a NUL in a string.
    raw = json.dumps(["2026-01-01T00:00:00Z", last_id]).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    bad = client.get(f"{JOBS}?cursor={cursor}", headers=tokens("viewer"))
    assert bad.status_code == 400, bad.text
    assert bad.json()["type"] == "urn:kubetrain:problem:invalid-cursor"
