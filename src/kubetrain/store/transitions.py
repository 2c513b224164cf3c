"""The rules of every change to a job's recorded state, written once.

Both writers apply them: the one-job path (jobs.py: the API's cancel, the
dispatcher's outcomes through outbox.py) on ORM objects, and the syncer's
batches (sync.py) on plain rows. The rules work on plain values and return the
columns to set and the history rows to add; the callers only read and write.

* Nothing leaves a terminal state; a move the state machine forbids is refused.
* A business history row only when (state, reason) changes; otherwise the latest
  word from Kubernetes (raw reason and message, the plain message) is refreshed
  without one, so a replayed observation writes nothing.
* A single Pod's attempts are numbered 1, 2, ... in the order their Pods are
  first seen; a gang's Pods take their Job's attempt number, one row per rank.
  A runtime history row only for a new Pod or a material change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from kubetrain.domain.diagnosis.result import GangRestart
from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode, can_move
from kubetrain.store.errors import IllegalTransition, TerminalStateError
from kubetrain.store.models import Source, TransitionKind


@dataclass(frozen=True, slots=True)
class PodObservation:
    """What Kubernetes says about one Pod of a job, as the syncer read it.

    The observation is the whole current truth (level-triggered): every field
    overwrites the stored one, including with None.
    """

    pod_name: str
    pod_uid: str
    node: str | None = None
    pod_phase: str | None = None
    container_state: str | None = None
    scheduling_reason: str | None = None
    raw_reason: str | None = None
    raw_message: str | None = None
    exit_code: int | None = None
    termination_message: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    bound_at: datetime | None = None  # bound to its node: GPUs held from then
    rank: int | None = None  # a gang worker's index
    # A gang's attempt, which its Job carries; None: a single Pod, numbered as first seen.
    attempt: int | None = None


# The attempt columns an observation sets (the number is set once, when first seen).
OBSERVED = tuple(f.name for f in fields(PodObservation) if f.name != "attempt")

# A change in any of these is worth a history row; the rest (messages, times)
# are refreshed silently, so a scheduler retrying every few seconds with a new
# node count in its message does not flood the history.
MATERIAL_FIELDS = ("pod_phase", "node", "container_state", "raw_reason", "exit_code")

State = tuple[BusinessState, ReasonCode]


# -- business state ------------------------------------------------------------


def refusal(job_id: str, current: State, target: State) -> IllegalTransition | None:
    """Why the job may not move from `current` to `target`, or None if it may (staying
    put always may: a replay of a finished job's final (state, reason) is a no-op)."""
    if current == target:
        return None
    if current[0] in TERMINAL:
        return TerminalStateError(job_id, current, target)
    if target[0] != current[0] and not can_move(current[0], target[0]):
        return IllegalTransition(job_id, current, target)
    return None


def passage(current: State, target: State) -> State | None:
    """The step a syncer's move from `current` to `target` passes through first, if any.

    The syncer moves a job only once its Kubernetes Job is seen, so a job still
    `CREATED` (the dispatcher had not yet recorded its create when the watch told
    of a running Pod) was queued: it goes through `QUEUED` and the history says so.
    """
    if current[0] == BusinessState.CREATED and target[0] not in (
        BusinessState.CREATED,
        BusinessState.QUEUED,
    ):
        return (BusinessState.QUEUED, ReasonCode.SCHEDULING)
    return None


def moved(
    target: State,
    *,
    message: str | None,
    raw_reason: str | None,
    raw_message: str | None,
    cancel_requested: bool,
    k8s_job_name: str | None,
    now: datetime,
) -> dict[str, Any]:
    """The job's columns a (permitted) move to `target` sets, but `updated_at`."""
    state, reason = target
    values: dict[str, Any] = {
        "business_state": state,
        "reason": reason,
        "reason_message": message,
        "raw_reason": raw_reason,
        "raw_message": raw_message,
    }
    if state in TERMINAL:
        values["finished_at"] = now
        if not (cancel_requested and k8s_job_name is not None):
            # Nothing left to dispatch; a cancelled job's Job still is to be deleted.
            values["next_dispatch_at"] = None
    return values


def latest_word(
    stored: Mapping[str, Any],
    *,
    message: str | None,
    raw_reason: str | None,
    raw_message: str | None,
) -> dict[str, Any]:
    """Of the latest word from Kubernetes, what differs from the `stored` job's columns:
    what a job that stays in its (state, reason) still refreshes."""
    observed = {"reason_message": message, "raw_reason": raw_reason, "raw_message": raw_message}
    return {key: value for key, value in observed.items() if stored[key] != value}


def business_row(
    job_id: str,
    current: State,
    target: State,
    *,
    source: Source,
    raw_reason: str | None,
    raw_message: str | None,
    attempt: int | None,
    detail: Mapping[str, Any] | None,
    now: datetime,
) -> dict[str, Any]:
    """The history row of a move from `current` to `target`."""
    return {
        "job_id": job_id,
        "at": now,
        "source": source,
        "kind": TransitionKind.BUSINESS,
        "from_state": current[0],
        "to_state": target[0],
        "from_reason": current[1],
        "to_reason": target[1],
        "raw_reason": raw_reason,
        "raw_message": raw_message,
        "attempt": attempt,
        "detail": dict(detail) if detail is not None else None,
    }


def restart_due(restart: GangRestart, *, now: datetime) -> dict[str, Any]:
    """The job's columns that put a gang's next attempt in the dispatcher's outbox: it
    deletes the ended attempt's Job and creates attempt `restart.attempt`, due now."""
    return {
        "current_attempt": restart.attempt,
        "retries_used": restart.retries_used,
        "restart_job_uid": restart.job_uid,
        "next_dispatch_at": now,
        "dispatch_attempts": 0,
        "last_dispatch_error": None,
    }


# -- runtime state -------------------------------------------------------------


def known_attempt(
    stored: Mapping[str, Mapping[str, Any]], pod: PodObservation
) -> Mapping[str, Any] | None:
    """The stored attempt (of `stored`, by Pod uid) that `pod` is, if any. A Pod already
    gone is rebuilt from its events, which may not carry its uid: one known only by
    name is the stored attempt of that name (a Job's Pod names are never reused), not
    a new attempt."""
    if pod.pod_uid:
        return stored.get(pod.pod_uid)
    return next((a for a in stored.values() if a["pod_name"] == pod.pod_name), None)


def next_attempt(highest: int, current_attempt: int, pod: PodObservation) -> int:
    """The number of the attempt a Pod not seen before is on: its gang's, else the next."""
    if pod.attempt is not None:
        return pod.attempt
    return max(highest, current_attempt) + 1


def runtime_row(
    job_id: str,
    pod: PodObservation,
    stored: Mapping[str, Any] | None,
    *,
    number: int,
    source: Source,
    now: datetime,
) -> dict[str, Any] | None:
    """The history row of observing `pod` on attempt `number`, whose columns were
    `stored` (None: a Pod not seen before); None if nothing material changed."""
    before: Mapping[str, Any] = stored if stored is not None else dict.fromkeys(OBSERVED)
    changes = {
        key: [before[key], getattr(pod, key)]
        for key in MATERIAL_FIELDS
        if before[key] != getattr(pod, key)
    }
    if stored is not None and not changes:
        return None
    return {
        "job_id": job_id,
        "at": now,
        "source": source,
        "kind": TransitionKind.RUNTIME,
        "from_state": before["pod_phase"],
        "to_state": pod.pod_phase,
        "from_reason": None,
        "to_reason": None,
        "raw_reason": pod.raw_reason,
        "raw_message": pod.raw_message,
        "attempt": number,
        "detail": {"pod_name": pod.pod_name, "pod_uid": pod.pod_uid, "changed": changes}
        | ({"rank": pod.rank} if pod.rank is not None else {}),
    }
