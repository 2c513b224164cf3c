"""Business changes: one history row per real change, the state machine enforced, terminal final."""

from __future__ import annotations

import itertools

import pytest

from kubetrain.domain.states import BusinessState, ReasonCode, can_move
from kubetrain.store import (
    Database,
    IllegalTransition,
    JobNotFound,
    Source,
    TerminalStateError,
    TransitionKind,
    apply_business_change,
    get_job,
    job_history,
)
from tests.store.builders import FITTING_REASON, T0, at, new_job, observe

pytestmark = pytest.mark.db

S, R = BusinessState, ReasonCode


def steps(db: Database, job_id: str) -> list[tuple[str | None, str | None, str | None]]:
    with db.read_only() as session:
        return [
            (row.from_state, row.to_state, row.to_reason)
            for row in job_history(session, "ai-training", job_id, kind=TransitionKind.BUSINESS)
        ]


def test_one_row_per_real_change_and_none_for_replays(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
    observations = [
        (S.QUEUED, R.SCHEDULING, None),
        (S.QUEUED, R.SCHEDULING, None),  # replay
        (S.QUEUED, R.INSUFFICIENT_GPU, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
        (S.QUEUED, R.INSUFFICIENT_GPU, "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
        (S.RUNNING, R.TRAINING, None),
        (S.RUNNING, R.TRAINING, None),
        (S.SUCCEEDED, R.COMPLETED, None),
        (S.SUCCEEDED, R.COMPLETED, None),
    ]
    written = []
    for i, (state, reason, message) in enumerate(observations):
        with db.transaction() as session:
            row = apply_business_change(
                session, job.id, state, reason, "FailedScheduling" if message else None, message,
                source=Source.SYNCER, attempt=1, detail={"seq": i}, now=at(i + 1),
            )  # fmt: skip
            written.append(row is not None)
    assert written == [True, False, True, False, True, False, True, False]
    assert steps(db, job.id) == [
        (None, S.CREATED, R.JOB_NOT_CREATED),
        (S.CREATED, S.QUEUED, R.SCHEDULING),
        (S.QUEUED, S.QUEUED, R.INSUFFICIENT_GPU),
        (S.QUEUED, S.RUNNING, R.TRAINING),
        (S.RUNNING, S.SUCCEEDED, R.COMPLETED),
    ]
    with db.read_only() as session:
        rows = job_history(session, "ai-training", job.id)
        gpu = rows[2]
        assert (gpu.from_reason, gpu.raw_reason, gpu.source, gpu.attempt, gpu.detail) == (
            R.SCHEDULING,
            "FailedScheduling",
            Source.SYNCER,
            1,
            {"seq": 2},
        )
        assert gpu.raw_message is not None
        assert gpu.raw_message.startswith("0/3 nodes")
        assert gpu.at == at(3)
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.business_state, stored.reason) == (S.SUCCEEDED, R.COMPLETED)
        assert stored.finished_at == at(7)  # when it finished, not when the replay came


def test_a_replay_refreshes_the_raw_message_without_history(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=S.QUEUED)
        apply_business_change(
            session, job.id, S.QUEUED, R.INSUFFICIENT_GPU, "FailedScheduling", "0/3 nodes",
            source=Source.SYNCER, now=at(1),
        )  # fmt: skip
    before = len(steps(db, job.id))
    with db.transaction() as session:
        row = apply_business_change(
            session, job.id, S.QUEUED, R.INSUFFICIENT_GPU, "FailedScheduling", "0/4 nodes",
            source=Source.SYNCER, message="needs 8 GPUs; the largest node has 4", now=at(2),
        )  # fmt: skip
        assert row is None
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.raw_message, stored.reason_message) == (
            "0/4 nodes",
            "needs 8 GPUs; the largest node has 4",
        )
        assert stored.updated_at == at(2)
    assert len(steps(db, job.id)) == before


def test_every_move_between_states_follows_the_state_machine(db: Database) -> None:
    """All 30 ordered pairs of distinct states: allowed exactly when `can_move` says so."""
    for n, (current, target) in enumerate(itertools.permutations(BusinessState, 2)):
        with db.transaction() as session:
            job = new_job(session, name=f"pair-{n}", state=current)
        before = steps(db, job.id)
        reason = FITTING_REASON[target]
        if can_move(current, target):
            with db.transaction() as session:
                row = apply_business_change(
                    session, job.id, target, reason, source=Source.SYNCER, now=at(1)
                )
                assert row is not None
            assert steps(db, job.id) == [*before, (current, target, reason)]
        else:
            expected = TerminalStateError if current.terminal else IllegalTransition
            with pytest.raises(expected, match=f"{current}.*{target}"), db.transaction() as s:
                apply_business_change(s, job.id, target, reason, source=Source.SYNCER, now=at(1))
            assert steps(db, job.id) == before
            with db.read_only() as session:
                stored = get_job(session, "ai-training", job.id)
                assert stored is not None
                assert stored.business_state == current


def test_a_running_job_can_queue_again_for_its_next_attempt(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session, state=S.RUNNING)
        assert apply_business_change(
            session, job.id, S.QUEUED, R.NODE_LOST, "DisruptionTarget", source=Source.SYNCER,
            attempt=2, now=at(1),
        ) is not None  # fmt: skip


@pytest.mark.parametrize("terminal", [S.SUCCEEDED, S.FAILED, S.CANCELLED])
def test_a_terminal_state_is_never_left(db: Database, terminal: BusinessState) -> None:
    with db.transaction() as session:
        job = new_job(session, state=terminal)
    final = FITTING_REASON[terminal]
    # Not even for another reason within the same state.
    other = R.JOB_DELETED if final != R.JOB_DELETED else R.COMPLETED
    for state, reason in [(terminal, other), *((s, FITTING_REASON[s]) for s in S if s != terminal)]:
        with pytest.raises(TerminalStateError), db.transaction() as session:
            apply_business_change(session, job.id, state, reason, source=Source.SYNCER, now=at(1))
    with db.transaction() as session:  # its own final word, replayed, is no error
        assert apply_business_change(session, job.id, terminal, final, source=Source.API) is None
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.business_state, stored.reason, stored.finished_at) == (terminal, final, T0)


def test_an_unknown_job_is_not_found(db: Database) -> None:
    with pytest.raises(JobNotFound), db.transaction() as session:
        apply_business_change(session, "nope", S.QUEUED, R.SCHEDULING, source=Source.SYNCER)


def test_the_latest_diagnosis_is_kept_with_the_job(db: Database) -> None:
    diagnosis = {"primary": "INSUFFICIENT_GPU", "blockers": [{"nodes": 2}]}
    with db.transaction() as session:
        job = new_job(session)
        observe(session, job.id, diagnosis=diagnosis, now=at(1))
        observe(session, job.id, diagnosis=dict(diagnosis), now=at(2))  # the same: no write
    with db.read_only() as session:
        stored = get_job(session, "ai-training", job.id)
        assert stored is not None
        assert (stored.diagnosis, stored.updated_at) == (diagnosis, at(1))


def test_history_rows_cannot_be_changed_or_deleted(db: Database) -> None:
    with db.transaction() as session:
        job = new_job(session)
    with db.transaction() as session:
        [row] = job_history(session, "ai-training", job.id)
        row.raw_message = "rewritten"
        with pytest.raises(TypeError, match="append-only"):
            session.flush()
        session.rollback()
    with db.transaction() as session:
        [row] = job_history(session, "ai-training", job.id)
        session.delete(row)
        with pytest.raises(TypeError, match="append-only"):
            session.flush()
        session.rollback()
    with db.read_only() as session:
        [row] = job_history(session, "ai-training", job.id)
        assert row.raw_message is None
