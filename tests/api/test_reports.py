"""Reports from inside a Pod: only from a Pod of the job's current attempt (its token's
Pod, matched by uid against the recorded attempts; the token review itself is faked at
its boundary, FakeReviewer), stored once per seq, folded into the job's progress (phase,
step, checkpoint, resume lineage), refused whole when bad."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from kubetrain.api import create_app
from kubetrain.api.reports import MAX_CLOCK_SKEW, MAX_REPORT_AGE
from kubetrain.cluster.tokenreview import TokenReviewer
from kubetrain.domain.manifest import job_name
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.settings import ServerSettings
from kubetrain.store import (
    MAX_DROPPED,
    MAX_REPORTS,
    MAX_STEP_REPORTS,
    Database,
    PodObservation,
    Report,
    Source,
    apply_business_change,
    hash_token,
    phase_reports,
)
from tests.api.builders import JOBS, FakeReviewer, Tokens, enrol, submitted
from tests.store.builders import observe

pytestmark = pytest.mark.db

# Yesterday afternoon: within the window the server takes times in (MAX_REPORT_AGE).
T = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT16:00:0{}Z")


@pytest.fixture
def reviewer() -> FakeReviewer:
    return FakeReviewer()


@pytest.fixture
def client(settings: ServerSettings, db: Database, reviewer: FakeReviewer) -> Iterator[TestClient]:
    app = create_app(settings, db, pod_tokens=cast(TokenReviewer, reviewer))
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def job_id(client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer) -> str:
    job_id = submitted(client, tokens)
    enrol(db, reviewer, job_id)
    return job_id


def pod(job_id: str, suffix: str = "abcde") -> str:
    return f"{job_name(job_id)}-{suffix}"


def token_of(job_id: str, suffix: str = "abcde") -> str:
    """The token `enrol` gave the job's Pod `<job>-<suffix>`."""
    return f"token-of-{pod(job_id, suffix)}"


def post(client: TestClient, job_id: str, body: Any, token: str | None = "") -> Any:
    """POST the batch with `token`, by default that of the job's Pod (the job_id fixture's)."""
    token = token_of(job_id) if token == "" else token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.post(f"/api/v1/jobs/{job_id}/reports", json=body, headers=headers)


def batch(job_id: str, *events: dict[str, Any], suffix: str = "abcde", **extra: Any) -> Any:
    return {"pod": pod(job_id, suffix), "events": list(events), **extra}


def reports(db: Database, job_id: str) -> int:
    with db.read_only() as session:
        return session.scalar(select(func.count()).where(Report.job_id == job_id)) or 0


def detail(client: TestClient, tokens: Tokens, job_id: str) -> Any:
    response = client.get(f"{JOBS}/{job_id}", headers=tokens("viewer"))
    assert response.status_code == 200
    return response.json()


def test_phase_steps_and_checkpoints_become_the_jobs_progress(
    client: TestClient, tokens: Tokens, job_id: str
) -> None:
    answer = post(
        client,
        job_id,
        batch(
            job_id,
            {"seq": 0, "time": T.format(0), "type": "phase", "phase": "PREFLIGHT"},
            {"seq": 1, "time": T.format(1), "type": "phase", "phase": "TRAINING"},
            {"seq": 2, "time": T.format(2), "type": "step", "step": 10, "metrics": {"loss": 0.5}},
            {
                "seq": 3,
                "time": T.format(3),
                "type": "checkpoint",
                "step": 10,
                "sizeBytes": 1024,
                "durationSeconds": 0.25,
            },
            {"seq": 4, "time": T.format(4), "type": "step", "step": 20, "metrics": {"loss": 0.25}},
        ),
    )
    assert answer.status_code == 202, answer.text
    assert answer.json() == {"job_id": job_id, "stored": 5}
    progress = detail(client, tokens, job_id)["progress"]
    assert progress["phase"] == "TRAINING"
    assert progress["phase_since"].startswith(T.format(1).removesuffix("Z"))
    assert (progress["step"], progress["metrics"]) == (20, {"loss": 0.25})
    assert progress["checkpoint"]["step"] == 10
    assert progress["checkpoint"]["sizeBytes"] == 1024
    assert progress["pod"] == pod(job_id)
    assert progress["dropped"] == 0
    series = client.get(f"{JOBS}/{job_id}/progress", headers=tokens("viewer")).json()
    assert [(p["step"], p["metrics"]["loss"]) for p in series["steps"]] == [(10, 0.5), (20, 0.25)]


def test_a_new_phase_wakes_the_syncer_and_a_step_does_not(
    settings: ServerSettings, db: Database, tokens: Tokens, reviewer: FakeReviewer
) -> None:
    woken: list[str] = []
    pods = cast(TokenReviewer, reviewer)
    with TestClient(create_app(settings, db, on_report=woken.append, pod_tokens=pods)) as client:
        job_id = submitted(client, tokens)
        token = enrol(db, reviewer, job_id)
        post(
            client,
            job_id,
            batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 1}),
            token,
        )
        assert woken == []
        post(
            client,
            job_id,
            batch(job_id, {"seq": 1, "time": T.format(0), "type": "phase", "phase": "TRAINING"}),
            token,
        )
        assert woken == [job_id]


def test_a_retried_batch_is_stored_once(
    client: TestClient, tokens: Tokens, job_id: str, db: Database
) -> None:
    body = batch(job_id, {"seq": 7, "time": T.format(0), "type": "step", "step": 1})
    assert post(client, job_id, body).json()["stored"] == 1
    assert post(client, job_id, body).json()["stored"] == 0
    assert reports(db, job_id) == 1
    # Drops still count when every event was seen.
    assert post(client, job_id, {**body, "dropped": 3}).status_code == 202
    assert detail(client, tokens, job_id)["progress"]["dropped"] == 3


def test_only_a_pod_of_the_jobs_current_attempt_is_heard(
    client: TestClient, tokens: Tokens, job_id: str, db: Database, reviewer: FakeReviewer
) -> None:
    body = batch(job_id, {"seq": 0, "time": T.format(0), "type": "phase", "phase": "TRAINING"})
    other = submitted(client, tokens, name="other")
    others = enrol(db, reviewer, other)
    for token in (None, "not-a-pods-token", tokens("admin")["Authorization"][7:]):
        answer = post(client, job_id, body, token=token)
        assert answer.status_code == 401, token
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    # Another job's Pod, the right Pod name in another namespace, a Pod not named as
    # the job's: a valid token, not this job's. An unknown job answers the same.
    ours = reviewer.pods[token_of(job_id)]
    elsewhere, stranger = "token-of-a-namesake", "token-of-a-stranger"
    reviewer.pods[elsewhere] = replace(ours, namespace="someone-else")
    reviewer.pods[stranger] = replace(ours, pod_name="kt-stranger-xyz", pod_uid="uid-stranger")
    for token in (others, elsewhere, stranger):
        answer = post(client, job_id, body, token=token)
        assert answer.status_code == 403, answer.text
        assert "insufficient_scope" in answer.headers["WWW-Authenticate"]
    assert post(client, "no-such-job", body, token_of(job_id)).status_code == 403
    assert reports(db, job_id) == 0
    # The Pod of the job's current attempt is heard; once the next attempt's Pod is
    # seen, the earlier one is not.
    assert post(client, job_id, body).status_code == 202
    later = enrol(db, reviewer, job_id, "fghij")
    assert post(client, job_id, body).status_code == 403
    answer = post(client, job_id, batch(job_id, body["events"][0], suffix="fghij"), token=later)
    assert answer.status_code == 202, answer.text


def test_a_pod_not_recorded_yet_is_asked_to_come_back(
    client: TestClient, job_id: str, db: Database, reviewer: FakeReviewer
) -> None:
    # Its token is valid and it is named as the job's, but the syncer has not seen it:
    # a 503 the runtime retries, by when the attempt is recorded.
    name = f"{job_name(job_id)}-early"
    reviewer.pods["early"] = replace(
        reviewer.pods[token_of(job_id)], pod_name=name, pod_uid="uid-early"
    )
    body = {"pod": name, "events": [{"seq": 0, "time": T.format(0), "type": "step", "step": 1}]}
    answer = post(client, job_id, body, token="early")
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    with db.transaction() as session:
        observe(session, job_id, PodObservation(pod_name=name, pod_uid="uid-early"))
    assert post(client, job_id, body, token="early").status_code == 202


def test_a_reviewed_token_is_remembered_by_its_hash(
    client: TestClient, job_id: str, reviewer: FakeReviewer
) -> None:
    body = batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 1})
    for _ in range(3):
        assert post(client, job_id, body).status_code == 202
    assert reviewer.reviews == 1
    pods = client.app.state.kubetrain.pods  # type: ignore[attr-defined]
    # Under the token's hash, never the token itself.
    assert pods.get(hash_token(token_of(job_id))) is not None
    assert pods.get(token_of(job_id)) is None


def test_a_batch_speaks_for_its_tokens_pod_and_rank_only(
    client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer
) -> None:
    job_id = submitted(client, tokens, name="gang")
    token = enrol(db, reviewer, job_id, "1-bbbbb", rank=1, attempt=1)
    event = {"seq": 0, "time": T.format(0), "type": "step", "step": 1}
    for body, field in (
        (batch(job_id, event, suffix="0-aaaaa", rank=1), "pod"),
        (batch(job_id, event, suffix="1-bbbbb", rank=0), "rank"),
    ):
        answer = post(client, job_id, body, token=token)
        assert answer.status_code == 422, answer.text
        assert [e["field"] for e in answer.json()["errors"]] == [field]
    assert reports(db, job_id) == 0


def test_without_a_cluster_connection_reports_wait(settings: ServerSettings, db: Database) -> None:
    with TestClient(create_app(settings, db)) as client:
        answer = post(client, "some-job", {"pod": "p", "events": []}, token="anything")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == "1"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pod": "kt-someone-elses-pod"}, "pod"),
        ({"pod": "kt-not\u0007ours"}, "pod"),
        ({"events": [{"seq": 0, "time": T.format(0), "type": "phase", "phase": "DONE"}]}, "phase"),
        (
            {"events": [{"seq": 0, "time": "2026-12-02T16:00:00", "type": "step", "step": 1}]},
            "time",
        ),
        ({"events": [{"seq": -1, "time": T.format(0), "type": "step", "step": 1}]}, "seq"),
        (
            {
                "events": [
                    {
                        "seq": 0,
                        "time": T.format(0),
                        "type": "step",
                        "step": 1,
                        "metrics": {"bad name!": 1.0},
                    }
                ]
            },
            "metrics",
        ),
        (
            {
                "events": [
                    {
                        "seq": 0,
                        "time": T.format(0),
                        "type": "step",
                        "step": 1,
                        "metrics": {f"m{i}": 1.0 for i in range(17)},
                    }
                ]
            },
            "metrics",
        ),
        (
            {
                "events": [
                    {"seq": i, "time": T.format(0), "type": "step", "step": i} for i in range(101)
                ]
            },
            "events",
        ),
        (
            {"events": [{"seq": 0, "time": T.format(0), "type": "step", "step": 1, "extra": 1}]},
            "extra",
        ),
        ({"events": [{"seq": 0, "time": T.format(0), "type": "teleport"}]}, "events"),
        (
            {
                "events": [
                    {
                        "seq": 0,
                        "time": T.format(0),
                        "type": "phase",
                        "phase": "PREFLIGHT",
                        "check": "GPU visible!",
                    }
                ]
            },
            "check",
        ),
    ],
)
def test_a_bad_batch_is_refused_whole_naming_the_field(
    client: TestClient, job_id: str, db: Database, change: dict[str, Any], field: str
) -> None:
    good = {"seq": 50, "time": T.format(0), "type": "step", "step": 1}
    body = {**batch(job_id, good), **change}
    if "events" in change:
        body["events"] = [good, *change["events"]]
    answer = post(client, job_id, body)
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert any(field in error["field"] or field in error["message"] for error in problem["errors"])
    assert reports(db, job_id) == 0


def test_the_resume_lineage_names_attempts(
    client: TestClient, tokens: Tokens, job_id: str, db: Database, reviewer: FakeReviewer
) -> None:
    first, second = pod(job_id, "aaaaa"), pod(job_id, "bbbbb")
    # The job's first Pod was abcde (the fixture's); these are its attempts 2 and 3.
    early = enrol(db, reviewer, job_id, "aaaaa", node="node-1")
    post(
        client,
        job_id,
        batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 40}, suffix="aaaaa"),
        early,
    )
    late = enrol(db, reviewer, job_id, "bbbbb", node="node-2")
    post(
        client,
        job_id,
        batch(
            job_id,
            {"seq": 0, "time": T.format(5), "type": "phase", "phase": "PREFLIGHT"},
            {
                "seq": 1,
                "time": T.format(6),
                "type": "resumed",
                "fromStep": 40,
                "fromPod": first,
                "checkpointBinding": {"dataset_version": "v3", "code_version": "c1"},
                "binding": {"dataset_version": "v3", "code_version": "c2"},
                "allowedMismatch": ["code_version"],
            },
            suffix="bbbbb",
        ),
        late,
    )
    progress = detail(client, tokens, job_id)["progress"]
    # The new Pod starts its own phase; the step carries on from the checkpoint.
    assert (progress["pod"], progress["phase"], progress["step"]) == (second, "PREFLIGHT", 40)
    assert [
        (r["attempt"], r["from_step"], r["from_attempt"], r["from_pod"])
        for r in progress["resumes"]
    ] == [(3, 40, 2, first)]
    # What differed, from the attempts' nodes and the bindings the runtime reported.
    assert [c["says"] for c in progress["resumes"][0]["compared"]] == [
        "node: node-1 -> node-2 (allowed)",
        "dataset version: v3 (same)",
        "code version: c1 -> c2 (allowed by the run's allow_mismatch)",
        "params digest: not compared (unset in the checkpoint or the run)",
        "world size: 1 (same)",
    ]


def test_a_resume_without_a_binding_says_it_was_not_reported(
    client: TestClient, tokens: Tokens, job_id: str
) -> None:
    # What a runtime from before the binding was reported sends.
    event = {"seq": 0, "time": T.format(0), "type": "resumed", "fromStep": 4}
    assert post(client, job_id, batch(job_id, event)).status_code == 202
    (resume,) = detail(client, tokens, job_id)["progress"]["resumes"]
    assert [c["says"] for c in resume["compared"]] == [
        "node: not reported",
        "binding: not reported",
    ]


def test_an_allowed_mismatch_names_binding_fields_only(client: TestClient, job_id: str) -> None:
    event = {
        "seq": 0,
        "time": T.format(0),
        "type": "resumed",
        "fromStep": 4,
        "checkpointBinding": {},
        "binding": {},
        "allowedMismatch": ["node"],
    }
    answer = post(client, job_id, batch(job_id, event))
    assert answer.status_code == 422, answer.text
    assert "events.0.resumed.allowedMismatch.0" in answer.text


def test_step_history_is_capped(client: TestClient, job_id: str, db: Database) -> None:
    total = MAX_STEP_REPORTS + 150
    for start in range(0, total, 100):
        events = [
            {"seq": i, "time": T.format(0), "type": "step", "step": i}
            for i in range(start, min(start + 100, total))
        ]
        assert post(client, job_id, batch(job_id, *events)).status_code == 202
    assert reports(db, job_id) == MAX_STEP_REPORTS


def test_the_token_is_checked_before_the_body_is_read(client: TestClient, job_id: str) -> None:
    # Without the token even a body that is not JSON answers 401, not 415.
    answer = client.post(
        f"/api/v1/jobs/{job_id}/reports", content=b"<xml/>", headers={"Content-Type": "text/xml"}
    )
    assert answer.status_code == 401


def test_in_a_gang_every_rank_reports_and_the_jobs_progress_is_rank_0s(
    client: TestClient, tokens: Tokens, db: Database, reviewer: FakeReviewer
) -> None:
    def step(seq: int, number: int) -> dict[str, Any]:
        return {"seq": seq, "time": T.format(seq), "type": "step", "step": number}

    job_id = submitted(client, tokens, name="gang")
    rank0 = enrol(db, reviewer, job_id, "0-aaaaa", rank=0, attempt=1)
    rank1 = enrol(db, reviewer, job_id, "1-bbbbb", rank=1, attempt=1)
    lead = post(client, job_id, batch(job_id, step(0, 10), suffix="0-aaaaa", rank=0), rank0)
    assert lead.status_code == 202, lead.text
    other = post(client, job_id, batch(job_id, step(0, 99), suffix="1-bbbbb", rank=1), rank1)
    assert other.status_code == 202, other.text
    assert reports(db, job_id) == 2
    progress = detail(client, tokens, job_id)["progress"]
    assert (progress["step"], progress["pod"]) == (10, pod(job_id, "0-aaaaa"))
    refused = post(client, job_id, batch(job_id, step(1, 11), suffix="0-aaaaa", rank=-1), rank0)
    assert refused.status_code == 422


def test_each_ranks_last_phase_and_check_outlive_the_cap(
    client: TestClient, job_id: str, db: Database, reviewer: FakeReviewer
) -> None:
    # Rank 0 said TRAINING early; rank 1 then reports a check after another, past the
    # cap on a job's phases: rank 0's word must not be pruned (its rank would read as
    # silent, and the gang as not training).
    def phase(seq: int, name: str, check: str | None = None) -> dict[str, Any]:
        event = {"seq": seq, "time": T.format(0), "type": "phase", "phase": name}
        return event | ({"check": check} if check else {})

    rank0 = enrol(db, reviewer, job_id, "0-aaaaa", rank=0, attempt=1)
    rank1 = enrol(db, reviewer, job_id, "1-bbbbb", rank=1, attempt=1)
    lead = batch(job_id, phase(0, "PREFLIGHT"), phase(1, "TRAINING"), suffix="0-aaaaa", rank=0)
    assert post(client, job_id, lead, rank0).status_code == 202
    total = MAX_REPORTS["phase"] + 50
    for start in range(0, total, 100):
        checks = [
            phase(i, "PREFLIGHT", f"check-{i}") for i in range(start, min(start + 100, total))
        ]
        assert (
            post(
                client, job_id, batch(job_id, *checks, suffix="1-bbbbb", rank=1), rank1
            ).status_code
            == 202
        )
    with db.read_only() as session:
        last = {r.pod: r for r in phase_reports(session, [job_id])[job_id]}
    assert (last[pod(job_id, "0-aaaaa")].phase, last[pod(job_id, "0-aaaaa")].check) == (
        "TRAINING",
        None,
    )
    assert (last[pod(job_id, "1-bbbbb")].phase, last[pod(job_id, "1-bbbbb")].check) == (
        "PREFLIGHT",
        f"check-{total - 1}",
    )
    assert reports(db, job_id) == MAX_REPORTS["phase"] + 1


def test_one_seq_given_twice_in_a_batch_is_a_422_naming_it(
    client: TestClient, job_id: str, db: Database
) -> None:
    body = batch(
        job_id,
        {"seq": 7, "time": T.format(0), "type": "step", "step": 1},
        {"seq": 7, "time": T.format(1), "type": "step", "step": 2},
    )
    answer = post(client, job_id, body)
    assert answer.status_code == 422, answer.text
    assert any("seq 7" in error["message"] for error in answer.json()["errors"])
    assert reports(db, job_id) == 0


def test_dropped_counts_near_2_62_saturate_and_later_batches_still_store(
    client: TestClient, tokens: Tokens, job_id: str
) -> None:
    for seq in range(3):
        event = {"seq": seq, "time": T.format(seq), "type": "step", "step": seq}
        answer = post(client, job_id, batch(job_id, event, dropped=2**62))
        assert answer.status_code == 202, answer.text
        assert answer.json()["stored"] == 1
    assert detail(client, tokens, job_id)["progress"]["dropped"] == MAX_DROPPED


@pytest.mark.parametrize(
    "event",
    [
        {"type": "resumed", "fromStep": 1, "fromPod": "pod\x1b[31mred\x07\x00"},
        {"type": "step", "step": 1, "metrics": {"loss\x1b": 1.0}},
        {"type": "phase", "phase": "TRAINING\x9b"},
    ],
)
def test_control_characters_are_refused_in_every_report_string(
    client: TestClient, job_id: str, db: Database, event: dict[str, Any]
) -> None:
    answer = post(client, job_id, batch(job_id, {"seq": 0, "time": T.format(0), **event}))
    assert answer.status_code == 422, answer.text
    assert any("control character" in error["message"] for error in answer.json()["errors"])
    assert reports(db, job_id) == 0


@pytest.mark.parametrize("kind", ["phase", "checkpoint", "resumed"])
def test_every_kind_of_report_is_capped_per_job(
    client: TestClient, job_id: str, db: Database, kind: str
) -> None:
    by_kind: dict[str, dict[str, Any]] = {
        "phase": {"phase": "TRAINING"},
        "checkpoint": {"step": 1, "sizeBytes": 1, "durationSeconds": 0.1},
        "resumed": {"fromStep": 1},
    }
    fields = by_kind[kind]
    total = MAX_REPORTS[kind] + 150
    for start in range(0, total, 100):
        events = [
            {"seq": i, "time": T.format(0), "type": kind, **fields}
            for i in range(start, min(start + 100, total))
        ]
        assert post(client, job_id, batch(job_id, *events)).status_code == 202
    assert reports(db, job_id) == MAX_REPORTS[kind]


def test_a_token_the_api_server_refuses_reads_no_database(
    client: TestClient, job_id: str, db: Database
) -> None:
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    body = batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 1})
    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        assert post(client, job_id, body, token="not-a-pods-token").status_code == 401
        assert post(client, "no-such-job", body, token="not-a-pods-token").status_code == 401
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    # Nothing about the job is read before the token is known to be a Pod's.
    assert statements == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("rank", True), ("rank", "0"), ("dropped", "3"), ("dropped", True)],
)
def test_a_batchs_counts_are_integers(
    client: TestClient, job_id: str, db: Database, field: str, value: Any
) -> None:
    event = {"seq": 0, "time": T.format(0), "type": "step", "step": 1}
    answer = post(client, job_id, batch(job_id, event, **{field: value}))
    assert answer.status_code == 422, answer.text
    assert [error["field"] for error in answer.json()["errors"]] == [field]


@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED", "CANCELLED"])
def test_a_finished_jobs_token_is_refused_with_a_410_problem(
    client: TestClient, job_id: str, db: Database, state: str
) -> None:
    event = {"seq": 0, "time": T.format(0), "type": "step", "step": 1}
    assert post(client, job_id, batch(job_id, event)).status_code == 202
    path = {
        "SUCCEEDED": [
            (BusinessState.QUEUED, ReasonCode.SCHEDULING),
            (BusinessState.RUNNING, ReasonCode.TRAINING),
            (BusinessState.SUCCEEDED, ReasonCode.COMPLETED),
        ],
        "FAILED": [(BusinessState.FAILED, ReasonCode.OOM_KILLED)],
        "CANCELLED": [(BusinessState.CANCELLED, ReasonCode.CANCELLED)],
    }[state]
    for to_state, reason in path:
        with db.transaction() as session:
            apply_business_change(session, job_id, to_state, reason, source=Source.SYNCER)
    event = {"seq": 1, "time": T.format(1), "type": "step", "step": 2}
    answer = post(client, job_id, batch(job_id, event))
    assert answer.status_code == 410, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    problem = answer.json()
    assert problem["type"] == "urn:kubetrain:problem:job-finished"
    assert problem["status"] == 410
    assert state in problem["detail"]
    assert reports(db, job_id) == 1
    # Another job's token is still a 401, finished or not: nothing said about this one.
    assert post(client, job_id, batch(job_id, event), token="kts_other").status_code == 401


def test_a_nan_loss_is_stored_and_shown_as_such_and_wakes_the_syncer(
    settings: ServerSettings, db: Database, tokens: Tokens, reviewer: FakeReviewer
) -> None:
    woken: list[str] = []
    pods = cast(TokenReviewer, reviewer)
    with TestClient(create_app(settings, db, on_report=woken.append, pod_tokens=pods)) as client:
        job_id = submitted(client, tokens)
        token = enrol(db, reviewer, job_id)
        step = {"seq": 0, "time": T.format(0), "type": "step", "step": 2}
        metrics = {"loss": "NaN", "grad": "Infinity", "lr": 0.1}
        answer = post(client, job_id, batch(job_id, {**step, "metrics": metrics}), token)
        assert answer.status_code == 202, answer.text
        assert woken == [job_id]
        progress = detail(client, tokens, job_id)["progress"]
        assert progress["step"] == 2
        assert progress["metrics"] == metrics


@pytest.mark.parametrize(
    "when",
    [
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00Z",
        "1970-01-01T00:00:00Z",
        # Named, not shown: the parallel workers must collect the same test ids.
        pytest.param(
            (datetime.now(UTC) - MAX_REPORT_AGE - timedelta(hours=1)).isoformat(),
            id="an-hour-before-the-window",
        ),
        pytest.param(
            (datetime.now(UTC) + MAX_CLOCK_SKEW + timedelta(hours=1)).isoformat(),
            id="an-hour-after-the-window",
        ),
    ],
)
def test_a_time_far_from_the_servers_clock_is_a_422_not_a_500(
    client: TestClient, job_id: str, db: Database, when: str
) -> None:
    good = {"seq": 0, "time": T.format(0), "type": "step", "step": 1}
    answer = post(
        client, job_id, batch(job_id, good, {"seq": 1, "time": when, "type": "step", "step": 2})
    )
    assert answer.status_code == 422, answer.text
    # As pydantic names the fields of a tagged union: the event's type in the path.
    assert [error["field"] for error in answer.json()["errors"]] == ["events.1.step.time"]
    assert reports(db, job_id) == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("step", True),
        ("step", "1"),
        ("step", 1.0),
        ("seq", False),
        ("seq", "0"),
        ("metrics", {"loss": True}),
        ("metrics", {"loss": "0.5"}),
    ],
)
def test_numbers_are_as_strict_as_the_schema(
    client: TestClient, job_id: str, db: Database, field: str, value: Any
) -> None:
    event = {"seq": 0, "time": T.format(0), "type": "step", "step": 1, field: value}
    answer = post(client, job_id, batch(job_id, event))
    assert answer.status_code == 422, answer.text
    assert any(field in error["field"] for error in answer.json()["errors"])
    assert reports(db, job_id) == 0


def test_times_at_the_edges_of_the_window_are_taken(client: TestClient, job_id: str) -> None:
    now = datetime.now(UTC)
    early, late = now - MAX_REPORT_AGE + timedelta(hours=1), now + timedelta(minutes=1)
    events = [
        {"seq": seq, "time": when.isoformat(), "type": "step", "step": seq}
        for seq, when in enumerate((early, late))
    ]
    answer = post(client, job_id, batch(job_id, *events))
    assert answer.status_code == 202, answer.text
