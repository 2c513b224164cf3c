"""Cancel: CANCELLED at once with one history row, idempotent, 409 for a finished job."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import Database, Source, apply_business_change, job_history
from tests.api.builders import JOBS, PROJECT, Tokens, submitted

pytestmark = pytest.mark.db


def test_cancel_is_immediate_idempotent_and_written_once(
    client: TestClient, tokens: Tokens, db: Database, changes: list[str]
) -> None:
    job_id = submitted(client, tokens)
    changes.clear()
    first = client.post(f"{JOBS}/{job_id}/cancel", headers=tokens("submitter"))
    assert first.status_code == 200
    job = first.json()
    assert (job["business_status"], job["reason"], job["cancel_requested"]) == (
        "CANCELLED",
        "CANCELLED",
        True,
    )
    assert job["finished_at"] is not None
    assert job["message"] == f"cancelled through the API by 'submitter-{PROJECT}'"
    assert changes == ["changed"]  # the dispatcher deletes the Kubernetes Job

    again = client.post(f"{JOBS}/{job_id}/cancel", headers=tokens("admin"))
    assert again.status_code == 200
    assert again.json()["updated_at"] == job["updated_at"]  # nothing changed
    assert changes == ["changed"]

    with db.read_only() as session:
        rows = job_history(session, PROJECT, job_id)
    assert [(r.from_state, r.to_state, r.to_reason, r.source) for r in rows] == [
        (None, "CREATED", ReasonCode.JOB_NOT_CREATED, Source.API),
        ("CREATED", "CANCELLED", ReasonCode.CANCELLED, Source.API),
    ]
    history = client.get(f"{JOBS}/{job_id}/history", headers=tokens("viewer")).json()
    assert [row["to_state"] for row in history["items"]] == ["CREATED", "CANCELLED"]


def test_a_running_job_is_cancelled_from_where_it_is(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens)
    with db.transaction() as session:
        for state, reason in (
            (BusinessState.QUEUED, ReasonCode.SCHEDULING),
            (BusinessState.RUNNING, ReasonCode.TRAINING),
        ):
            apply_business_change(session, job_id, state, reason, source=Source.SYNCER)
    response = client.post(f"{JOBS}/{job_id}/cancel", headers=tokens("submitter"))
    assert response.json()["business_status"] == "CANCELLED"
    with db.read_only() as session:
        last = job_history(session, PROJECT, job_id)[-1]
    assert (last.from_state, last.from_reason) == ("RUNNING", ReasonCode.TRAINING)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (BusinessState.SUCCEEDED, ReasonCode.COMPLETED),
        (BusinessState.FAILED, ReasonCode.EXIT_NONZERO),
    ],
)
def test_a_finished_job_is_409_naming_its_state(
    client: TestClient,
    tokens: Tokens,
    db: Database,
    changes: list[str],
    state: BusinessState,
    reason: ReasonCode,
) -> None:
    job_id = submitted(client, tokens)
    with db.transaction() as session:
        if state == BusinessState.SUCCEEDED:  # a Job ran: the syncer saw it queued first
            apply_business_change(
                session, job_id, BusinessState.QUEUED, ReasonCode.SCHEDULING, source=Source.SYNCER
            )
        apply_business_change(session, job_id, state, reason, source=Source.SYNCER)
    changes.clear()
    response = client.post(f"{JOBS}/{job_id}/cancel", headers=tokens("submitter"))
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "urn:kubetrain:problem:job-finished"
    assert (problem["business_status"], problem["reason"]) == (str(state), str(reason))
    assert str(state) in problem["detail"]
    job = client.get(f"{JOBS}/{job_id}", headers=tokens("viewer")).json()
    assert (job["business_status"], job["cancel_requested"]) == (str(state), False)
    assert changes == []


def test_an_unknown_job_cannot_be_cancelled(client: TestClient, tokens: Tokens) -> None:
    response = client.post(f"{JOBS}/nope/cancel", headers=tokens("submitter"))
    assert response.status_code == 404
