"""Reports from inside a Pod: the job's own token only, stored once per seq, folded into
the job's progress (phase, step, checkpoint, resume lineage), refused whole when bad."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select

from kubetrain.api import create_app
from kubetrain.domain.manifest import job_name
from kubetrain.settings import ServerSettings
from kubetrain.store import (
    MAX_DROPPED,
    MAX_REPORTS,
    MAX_STEP_REPORTS,
    Database,
    PodObservation,
    Report,
    phase_reports,
    set_status_token,
)
from tests.api.builders import JOBS, Tokens, submitted
from tests.store.builders import observe

pytestmark = pytest.mark.db

TOKEN = "kts_the-jobs-own-token"
T = "2026-12-02T16:00:0{}Z"


@pytest.fixture
def job_id(client: TestClient, tokens: Tokens, db: Database) -> str:
    job_id = submitted(client, tokens)
    with db.transaction() as session:
        set_status_token(session, job_id, TOKEN)
    return job_id


def pod(job_id: str, suffix: str = "abcde") -> str:
    return f"{job_name(job_id)}-{suffix}"


def post(client: TestClient, job_id: str, body: Any, token: str | None = TOKEN) -> Any:
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
    assert progress["phase_since"].startswith("2026-12-02T16:00:01")
    assert (progress["step"], progress["metrics"]) == (20, {"loss": 0.25})
    assert progress["checkpoint"]["step"] == 10
    assert progress["checkpoint"]["sizeBytes"] == 1024
    assert progress["pod"] == pod(job_id)
    assert progress["dropped"] == 0
    series = client.get(f"{JOBS}/{job_id}/progress", headers=tokens("viewer")).json()
    assert [(p["step"], p["metrics"]["loss"]) for p in series["steps"]] == [(10, 0.5), (20, 0.25)]


def test_a_new_phase_wakes_the_syncer_and_a_step_does_not(
    settings: ServerSettings, db: Database, tokens: Tokens
) -> None:
    woken: list[str] = []
    with TestClient(create_app(settings, db, on_report=woken.append)) as client:
        job_id = submitted(client, tokens)
        with db.transaction() as session:
            set_status_token(session, job_id, TOKEN)
        post(
            client,
            job_id,
            batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 1}),
        )
        assert woken == []
        post(
            client,
            job_id,
            batch(job_id, {"seq": 1, "time": T.format(0), "type": "phase", "phase": "TRAINING"}),
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


def test_only_the_jobs_own_token_is_accepted(
    client: TestClient, tokens: Tokens, job_id: str, db: Database
) -> None:
    body = batch(job_id, {"seq": 0, "time": T.format(0), "type": "phase", "phase": "TRAINING"})
    other = submitted(client, tokens, name="other")
    with db.transaction() as session:
        set_status_token(session, other, "kts_another-jobs-token")
    for token in (
        None,
        "kts_wrong",
        "kts_another-jobs-token",
        tokens("admin")["Authorization"][7:],
    ):
        answer = post(client, job_id, body, token=token)
        assert answer.status_code == 401, token
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    # An unknown job answers exactly as a wrong token does.
    assert post(client, "no-such-job", body).status_code == 401
    assert reports(db, job_id) == 0


def test_a_job_without_a_token_takes_no_reports(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    job_id = submitted(client, tokens, name="untokened")
    body = batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 1})
    assert post(client, job_id, body, token="").status_code == 401
    assert post(client, job_id, body, token="anything").status_code == 401


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pod": "kt-someone-elses-pod"}, "pod"),
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
    client: TestClient, tokens: Tokens, job_id: str, db: Database
) -> None:
    first, second = pod(job_id, "aaaaa"), pod(job_id, "bbbbb")
    with db.transaction() as session:
        for name, node in ((first, "node-1"), (second, "node-2")):
            observe(
                session, job_id, PodObservation(pod_name=name, pod_uid=f"uid-{name}", node=node)
            )
    post(
        client,
        job_id,
        batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 40}, suffix="aaaaa"),
    )
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
    )
    progress = detail(client, tokens, job_id)["progress"]
    # The new Pod starts its own phase; the step carries on from the checkpoint.
    assert (progress["pod"], progress["phase"], progress["step"]) == (second, "PREFLIGHT", 40)
    assert [
        (r["attempt"], r["from_step"], r["from_attempt"], r["from_pod"])
        for r in progress["resumes"]
    ] == [(2, 40, 1, first)]
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
    client: TestClient, tokens: Tokens, job_id: str, db: Database
) -> None:
    def step(seq: int, number: int) -> dict[str, Any]:
        return {"seq": seq, "time": T.format(seq), "type": "step", "step": number}

    lead = post(client, job_id, batch(job_id, step(0, 10), suffix="0-aaaaa", rank=0))
    assert lead.status_code == 202, lead.text
    other = post(client, job_id, batch(job_id, step(0, 99), suffix="1-bbbbb", rank=1))
    assert other.status_code == 202, other.text
    assert reports(db, job_id) == 2
    progress = detail(client, tokens, job_id)["progress"]
    assert (progress["step"], progress["pod"]) == (10, pod(job_id, "0-aaaaa"))
    refused = post(client, job_id, batch(job_id, step(1, 11), suffix="0-aaaaa", rank=-1))
    assert refused.status_code == 422


def test_each_ranks_last_phase_and_check_outlive_the_cap(
    client: TestClient, job_id: str, db: Database
) -> None:
    # Rank 0 said TRAINING early; rank 1 then reports a check after another, past the
    # cap on a job's phases: rank 0's word must not be pruned (its rank would read as
    # silent, and the gang as not training).
    def phase(seq: int, name: str, check: str | None = None) -> dict[str, Any]:
        event = {"seq": seq, "time": T.format(0), "type": "phase", "phase": name}
        return event | ({"check": check} if check else {})

    lead = batch(job_id, phase(0, "PREFLIGHT"), phase(1, "TRAINING"), suffix="0-aaaaa", rank=0)
    assert post(client, job_id, lead).status_code == 202
    total = MAX_REPORTS["phase"] + 50
    for start in range(0, total, 100):
        checks = [
            phase(i, "PREFLIGHT", f"check-{i}") for i in range(start, min(start + 100, total))
        ]
        assert (
            post(client, job_id, batch(job_id, *checks, suffix="1-bbbbb", rank=1)).status_code
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


@pytest.mark.parametrize(
    "when", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z"]
)
def test_a_time_past_utcs_range_is_a_422_not_a_500(
    client: TestClient, job_id: str, db: Database, when: str
) -> None:
    answer = post(
        client, job_id, batch(job_id, {"seq": 0, "time": when, "type": "step", "step": 1})
    )
    if when.endswith("Z"):  # the very first instant is a time like any other
        assert answer.status_code == 202, answer.text
        return
    assert answer.status_code == 422, answer.text
    assert any("time" in error["field"] for error in answer.json()["errors"])
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


def test_the_token_is_checked_before_the_job_is_looked_up(
    client: TestClient, job_id: str, db: Database
) -> None:
    statements: list[tuple[str, Any]] = []

    def seen(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    body = batch(job_id, {"seq": 0, "time": T.format(0), "type": "step", "step": 1})
    event.listen(db.engine, "before_cursor_execute", seen)
    try:
        assert post(client, job_id, body, token="kts_wrong").status_code == 401
        existing, statements[:] = list(statements), []
        assert post(client, "no-such-job", body, token="kts_wrong").status_code == 401
        unknown = list(statements)
    finally:
        event.remove(db.engine, "before_cursor_execute", seen)
    # The same queries with the same parameters: nothing depends on the job id.
    assert existing == unknown
    assert not any(job_id in str(parameters) for _, parameters in existing)
