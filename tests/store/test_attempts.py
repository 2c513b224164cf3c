"""Runtime state, as the syncer records it: one attempt per Pod uid, history only for
material changes."""

from __future__ import annotations

import dataclasses

import pytest

from kubetrain.domain.states import BusinessState
from kubetrain.store import (
    Database,
    PodObservation,
    TransitionKind,
    current_attempts,
    get_attempt,
    get_job,
    get_job_any_project,
    job_history,
    list_attempts,
)
from tests.store.builders import at, new_job, observe

pytestmark = pytest.mark.db

PENDING = PodObservation(
    pod_name="train-abc12-0-x7k2p",
    pod_uid="7f8e0c4a-1111-4d5e-9a0b-000000000001",
    pod_phase="Pending",
    scheduling_reason="Unschedulable",
    raw_reason="Unschedulable",
    raw_message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
)


def runtime_rows(db: Database, job_id: str) -> list[dict[str, object]]:
    with db.read_only() as session:
        rows = job_history(session, "ai-training", job_id, kind=TransitionKind.RUNTIME)
        return [
            {"attempt": r.attempt, "from": r.from_state, "to": r.to_state, **(r.detail or {})}
            for r in rows
        ]


def test_first_pod_is_attempt_one_and_replays_write_nothing(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=BusinessState.QUEUED)
        observe(session, job.id, PENDING, now=at(1))
    first = runtime_rows(db, job.id)
    assert [row["attempt"] for row in first] == [1]
    for i in range(3):
        with db.transaction() as session:
            observe(session, job.id, PENDING, now=at(2 + i))
        assert runtime_rows(db, job.id) == first  # no new attempt, no history row
    assert runtime_rows(db, job.id) == [
        {
            "attempt": 1,
            "from": None,
            "to": "Pending",
            "pod_name": PENDING.pod_name,
            "pod_uid": PENDING.pod_uid,
            "changed": {"pod_phase": [None, "Pending"], "raw_reason": [None, "Unschedulable"]},
        }
    ]
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert stored.current_attempt == 1
        attempt = get_attempt(session, job.id, 1)
        assert attempt is not None
        assert attempt.updated_at == at(1)  # replays changed nothing


def test_material_changes_write_history_and_the_rest_is_refreshed(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=BusinessState.QUEUED)
        observe(session, job.id, PENDING, now=at(1))
    # Only the scheduler's message changed: stored, but no history row.
    newer_message = dataclasses.replace(PENDING, raw_message="0/4 nodes are available: ...")
    running = dataclasses.replace(
        PENDING,
        pod_phase="Running",
        node="gpu-node-1",
        container_state="running",
        scheduling_reason=None,
        raw_reason=None,
        raw_message=None,
        started_at=at(3),
    )
    done = dataclasses.replace(
        running,
        pod_phase="Failed",
        container_state="terminated",
        raw_reason="Error",
        exit_code=1,
        termination_message="CUDA error: out of memory",
        finished_at=at(4),
    )
    written = []
    for i, observation in enumerate([newer_message, running, running, done, done]):
        before = len(runtime_rows(db, job.id))
        with db.transaction() as session:
            observe(session, job.id, observation, now=at(2 + i))
        written.append(len(runtime_rows(db, job.id)) > before)
    assert written == [False, True, False, True, False]
    rows = runtime_rows(db, job.id)
    assert [(r["from"], r["to"]) for r in rows] == [
        (None, "Pending"),
        ("Pending", "Running"),
        ("Running", "Failed"),
    ]
    assert rows[1]["changed"] == {
        "pod_phase": ["Pending", "Running"],
        "node": [None, "gpu-node-1"],
        "container_state": [None, "running"],
        "raw_reason": ["Unschedulable", None],
    }
    assert rows[2]["changed"] == {
        "pod_phase": ["Running", "Failed"],
        "container_state": ["running", "terminated"],
        "raw_reason": [None, "Error"],
        "exit_code": [None, 1],
    }
    with db.read_only() as session:
        attempt = get_attempt(session, job.id, 1)
        assert attempt is not None
        assert (attempt.node, attempt.exit_code, attempt.termination_message) == (
            "gpu-node-1",
            1,
            "CUDA error: out of memory",
        )
        assert (attempt.started_at, attempt.finished_at) == (at(3), at(4))


def test_a_new_pod_uid_is_the_next_attempt(db: Database) -> None:
    second_pod = dataclasses.replace(
        PENDING, pod_name="train-abc12-0-q9w8e", pod_uid="7f8e0c4a-2222-4d5e-9a0b-000000000002"
    )
    with db.transaction() as session:
        job = new_job(session, state=BusinessState.RUNNING)
        observe(session, job.id, PENDING, now=at(1))
        observe(session, job.id, second_pod, now=at(2))
    with db.read_only() as session:
        assert [a.number for a in list_attempts(session, job.id)] == [1, 2]
    # A late update of the lost first Pod changes its own attempt only.
    lost = dataclasses.replace(PENDING, pod_phase="Failed", raw_reason="DisruptionTarget")
    with db.transaction() as session:
        observe(session, job.id, lost, now=at(3))
    with db.read_only() as session:
        assert [a.number for a in list_attempts(session, job.id)] == [1, 2]  # no new attempt
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert stored.current_attempt == 2
        attempts = list_attempts(session, job.id)
        assert [(a.number, a.pod_uid, a.pod_phase) for a in attempts] == [
            (1, PENDING.pod_uid, "Failed"),
            (2, second_pod.pod_uid, "Pending"),
        ]
    assert [(r["attempt"], r["to"]) for r in runtime_rows(db, job.id)] == [
        (1, "Pending"),
        (2, "Pending"),
        (1, "Failed"),
    ]


def test_runtime_state_is_kept_after_the_job_finished(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=BusinessState.FAILED)
        observe(session, job.id, PENDING, now=at(1))
    assert [row["to"] for row in runtime_rows(db, job.id)] == ["Pending"]


def test_current_attempts_of_a_page_in_one_lookup(db: Database) -> None:
    with db.transaction() as session:
        first = new_job(session, name="first")
        second = new_job(session, name="second")
        waiting = new_job(session, name="waiting")
        observe(session, first.id, PENDING, now=at(1))
        observe(session, second.id, PENDING, now=at(1))
        retry = dataclasses.replace(PENDING, pod_uid="second-pod", node="gpu-1")
        observe(session, second.id, retry, now=at(2))
    with db.read_only() as session:
        jobs = [get_job_any_project(session, j.id) for j in (first, second, waiting)]
        found = current_attempts(session, [job for job in jobs if job is not None])
    assert set(found) == {first.id, second.id}
    assert found[first.id].number == 1
    assert (found[second.id].number, found[second.id].node) == (2, "gpu-1")
