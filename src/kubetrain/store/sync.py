"""The syncer's writes for a whole batch of jobs: one transaction, a few statements.

`apply_runtime_change`, `apply_business_change` and `record_diagnosis` (jobs.py)
do the same for one job through the ORM: a locked read per call and a flush per
row, ~15 ms a job on SQLite with 520 nodes' worth of jobs, all on the single
writer the API needs for submissions. Here the rows of a batch are read at once
(locked, on PostgreSQL, in id order so that two batches cannot deadlock), what
changed is worked out in Python with the same rules, and only the changes are
written with executemany: a replayed observation writes nothing at all.

The rules are those of jobs.py, which stays the reference: attempts numbered
in the order their Pods are first seen, a runtime history row only for a
material change, a business history row only when (state, reason) changes,
legal moves only, nothing leaves a terminal state.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode, can_move
from kubetrain.store.errors import IllegalTransition, TerminalStateError
from kubetrain.store.jobs import (
    MATERIAL_FIELDS,
    PodObservation,
    in_chunks,
    state_entered,
)
from kubetrain.store.metrics import note_state_durations
from kubetrain.store.models import Attempt, Job, Source, Transition, TransitionKind

_OBSERVED = tuple(f.name for f in fields(PodObservation))


@dataclass(frozen=True, slots=True)
class SyncedJob:
    """Everything the syncer concluded about one job in one pass (the whole truth)."""

    job_id: str
    pods: Sequence[PodObservation]  # oldest first: new Pods get the next attempt numbers
    state: BusinessState
    reason: ReasonCode
    raw_reason: str | None
    raw_message: str | None
    message: str | None
    attempt: int | None
    detail: Mapping[str, Any] | None
    diagnosis: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SyncResult:
    """What `record_synced` did for one job."""

    changed: bool  # a business history row was written
    refused: IllegalTransition | None = None  # the move the state machine refused, if any
    missing: bool = False  # no such job: nothing written


@dataclass
class SyncPlan:
    """The rows a batch of syncs would write, worked out from what the database holds."""

    results: dict[str, SyncResult]
    new_attempts: list[dict[str, Any]]
    changed_attempts: list[dict[str, Any]]
    history: list[dict[str, Any]]
    job_updates: list[dict[str, Any]]
    leaving: list[tuple[str, BusinessState, datetime]]  # (job id, state it leaves, created)
    now: datetime

    @property
    def empty(self) -> bool:
        """Nothing to write: every job of the batch is recorded as observed already."""
        return not (self.new_attempts or self.changed_attempts or self.history or self.job_updates)

    def write(self, session: Session) -> None:
        """Write the plan in the caller's transaction (one made with `lock=True`)."""
        if self.leaving:
            entered = state_entered(session, [job_id for job_id, _, _ in self.leaving])
            note_state_durations(session, self.leaving, self.now, entered)
        if self.new_attempts:
            session.execute(insert(Attempt), self.new_attempts)
        for group in _same_keys(self.changed_attempts):
            session.execute(update(Attempt), group)
        if self.history:
            # In list order, so each job's rows keep their order in the history.
            session.execute(insert(Transition), self.history)
        for group in _same_keys(self.job_updates):
            session.execute(update(Job), group)


def record_synced(
    session: Session, batch: Collection[SyncedJob], *, now: datetime
) -> dict[str, SyncResult]:
    """Record a batch of syncs in the caller's transaction; one result per job id."""
    plan = plan_synced(session, batch, now=now)
    plan.write(session)
    return plan.results


def plan_synced(
    session: Session, batch: Collection[SyncedJob], *, now: datetime, lock: bool = True
) -> SyncPlan:
    """What recording a batch of syncs would write. With `lock`, the jobs' rows are held
    (PostgreSQL) until the caller's transaction ends, so the plan stays true until
    written; without, it is a read (a read-only transaction may take no lock) that
    tells whether a write transaction is needed at all: a replay needs none.

    A refused move (`IllegalTransition`, or `TerminalStateError` for a job
    that finished meanwhile) writes no business change but still records the
    Pods and the diagnosis, as the one-job path did; runtime state is kept even
    after a job finished, since a Pod's last details can trail the verdict.
    """
    by_id = {synced.job_id: synced for synced in batch}
    ids = sorted(by_id)
    jobs = _jobs(session, ids, lock=lock)
    attempts = _attempts(session, ids)
    results: dict[str, SyncResult] = {}
    new_attempts: list[dict[str, Any]] = []
    changed_attempts: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    job_updates: list[dict[str, Any]] = []
    leaving: list[tuple[str, BusinessState, datetime]] = []
    for job_id in ids:
        synced, job = by_id[job_id], jobs.get(job_id)
        if job is None:
            results[job_id] = SyncResult(changed=False, missing=True)
            continue
        current = (job["business_state"], job["reason"])
        target = (synced.state, synced.reason)
        refused: IllegalTransition | None = None
        if current != target and current[0] in TERMINAL:
            refused = TerminalStateError(job_id, current, target)
        elif (
            current != target and synced.state != current[0] and not can_move(current[0], target[0])
        ):
            refused = IllegalTransition(job_id, current, target)
        values: dict[str, Any] = {}
        rows: list[dict[str, Any]] = []

        # Runtime state, attempt by attempt (apply_runtime_change's rules).
        own = attempts.get(job_id, {})
        highest = max((a["number"] for a in own.values()), default=0)
        current_attempt = job["current_attempt"]
        for pod in synced.pods:
            observed = {name: getattr(pod, name) for name in _OBSERVED}
            stored = own.get(pod.pod_uid)
            if stored is None:
                number = max(highest, current_attempt) + 1
                highest = current_attempt = number
                values["current_attempt"] = number
                new_attempts.append(
                    {"job_id": job_id, "number": number, **observed}
                    | {"created_at": now, "updated_at": now}
                )
                before: Mapping[str, Any] = dict.fromkeys(_OBSERVED)
            else:
                number, before = stored["number"], stored
                if any(before[name] != observed[name] for name in _OBSERVED):
                    changed_attempts.append({"id": stored["id"], **observed, "updated_at": now})
            changes = {
                k: [before[k], observed[k]] for k in MATERIAL_FIELDS if before[k] != observed[k]
            }
            if stored is None or changes:
                rows.append(
                    _row(
                        job_id,
                        now,
                        kind=TransitionKind.RUNTIME,
                        from_state=before["pod_phase"],
                        to_state=pod.pod_phase,
                        raw_reason=pod.raw_reason,
                        raw_message=pod.raw_message,
                        attempt=number,
                        detail={
                            "pod_name": pod.pod_name,
                            "pod_uid": pod.pod_uid,
                            "changed": changes,
                        },
                    )
                )

        # Business state (apply_business_change's rules).
        changed = current != target and refused is None
        if changed:
            if synced.state != current[0]:
                leaving.append((job_id, current[0], job["created_at"]))
            values |= {
                "business_state": synced.state,
                "reason": synced.reason,
                "reason_message": synced.message,
                "raw_reason": synced.raw_reason,
                "raw_message": synced.raw_message,
            }
            if synced.state in TERMINAL:
                values["finished_at"] = now
                if not (job["cancel_requested"] and job["k8s_job_name"] is not None):
                    values["next_dispatch_at"] = None  # nothing left to dispatch
            rows.append(
                _row(
                    job_id,
                    now,
                    kind=TransitionKind.BUSINESS,
                    from_state=current[0],
                    to_state=synced.state,
                    from_reason=current[1],
                    to_reason=synced.reason,
                    raw_reason=synced.raw_reason,
                    raw_message=synced.raw_message,
                    attempt=synced.attempt,
                    detail=dict(synced.detail) if synced.detail is not None else None,
                )
            )
        elif refused is None:
            # The latest word from Kubernetes, refreshed without a history row.
            for key, value in (
                ("reason_message", synced.message),
                ("raw_reason", synced.raw_reason),
                ("raw_message", synced.raw_message),
            ):
                if job[key] != value:
                    values[key] = value

        diagnosis = json.loads(json.dumps(synced.diagnosis))  # as the JSON column returns it
        if job["diagnosis"] != diagnosis:
            values["diagnosis"] = diagnosis
        if values:
            job_updates.append({"id": job_id, **values, "updated_at": now})
        history.extend(rows)
        results[job_id] = SyncResult(changed=changed, refused=refused)
    return SyncPlan(results, new_attempts, changed_attempts, history, job_updates, leaving, now)


def _row(job_id: str, now: datetime, **values: Any) -> dict[str, Any]:
    row = dict.fromkeys(("from_reason", "to_reason"))
    return row | {"job_id": job_id, "at": now, "source": Source.SYNCER, **values}


def _same_keys(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    # A bulk UPDATE sets the same columns on every row of one executemany.
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(sorted(row)), []).append(row)
    return list(groups.values())


_JOB_COLUMNS = (
    Job.id,
    Job.business_state,
    Job.reason,
    Job.reason_message,
    Job.raw_reason,
    Job.raw_message,
    Job.current_attempt,
    Job.cancel_requested,
    Job.k8s_job_name,
    Job.diagnosis,
    Job.created_at,
)


def _jobs(session: Session, ids: Sequence[str], *, lock: bool) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for chunk in in_chunks(ids):
        query = select(*_JOB_COLUMNS).where(Job.id.in_(chunk)).order_by(Job.id)
        if lock:
            query = query.with_for_update()
        for row in session.execute(query).mappings():
            out[row["id"]] = dict(row)
    return out


def _attempts(session: Session, ids: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    columns = [
        Attempt.id,
        Attempt.job_id,
        Attempt.number,
        *(getattr(Attempt, n) for n in _OBSERVED),
    ]
    for chunk in in_chunks(ids):
        for row in session.execute(select(*columns).where(Attempt.job_id.in_(chunk))).mappings():
            out.setdefault(row["job_id"], {})[row["pod_uid"]] = dict(row)
    return out


@dataclass(frozen=True, slots=True)
class SyncFacts:
    """What the syncer reads of a job's record before diagnosing it."""

    id: str
    name: str
    namespace: str
    k8s_job_name: str | None
    business_state: BusinessState
    cancel_requested: bool
    last_dispatch_error: str | None


def sync_facts(session: Session, ids: Sequence[str]) -> dict[str, SyncFacts]:
    """The records of `ids` that exist, in one query per 500 (not one per job)."""
    columns = [getattr(Job, f.name) for f in fields(SyncFacts)]
    out: dict[str, SyncFacts] = {}
    for chunk in in_chunks(ids):
        for row in session.execute(select(*columns).where(Job.id.in_(chunk))):
            out[row[0]] = SyncFacts(*row)
    return out


def unfinished_job_ids(session: Session) -> list[str]:
    """Every job not yet terminal, oldest first (`list_unfinished_jobs`' ids, without
    loading each spec and diagnosis): what the syncer's resync marks."""
    query = (
        select(Job.id)
        .where(Job.business_state.not_in(list(TERMINAL)))
        .order_by(Job.created_at, Job.id)
    )
    return list(session.scalars(query))
