"""What a diagnosis answers: the result types and their documented JSON (docs/diagnosis.md)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kubetrain.domain.fit import ConstraintCount, NodeFit
from kubetrain.domain.reasons import Actor
from kubetrain.domain.states import BusinessState, Link, ReasonCode


@dataclass(frozen=True)
class PodReport:
    """What the runtime in one Pod last reported of its phase: PREFLIGHT (with the check
    it runs, when it said which) or TRAINING, and since when (the Pod's clock)."""

    pod: str
    phase: str
    since: datetime | None = None
    check: str | None = None


@dataclass(frozen=True)
class JobFacts:
    """What kubetrain's own record knows about the job."""

    name: str  # the user's job name (for messages)
    k8s_name: str  # the Kubernetes Job name
    namespace: str
    dispatched: bool  # the Kubernetes Job was created at least once
    cancel_requested: bool = False
    dispatch_error: str | None = None  # last raw error from creating the Job
    gpus: int | None = None  # hints when no Pod exists yet; else read from the Pod/Job template
    # What the runtime in a Pod last reported: (pod name, PREFLIGHT | TRAINING, since).
    # A running container is only known to train once it says so; before any report
    # it counts as training, since images without kubetrain's runtime never report.
    reported_phase: tuple[str, str, datetime | None] | None = None
    # The job's last reported step and when (any attempt's; a resume counts), and how
    # many seconds without one make a training job NO_PROGRESS (None: never).
    last_step: tuple[int, datetime] | None = None
    stall_after: int | None = None
    # The last step's loss when it is not a finite number: (step, metric, "NaN" |
    # "Infinity" | "-Infinity", when it came); None when finite or not reported.
    non_finite_loss: tuple[int, str, str, datetime | None] | None = None
    # What each Pod last reported (every rank of a gang reports its own): a gang trains
    # only once every rank said so. Empty: rank 0's `reported_phase` stands for the gang.
    pod_reports: tuple[PodReport, ...] = ()


@dataclass(frozen=True)
class AttemptView:
    """The runtime state of one Pod of the job."""

    number: int  # a single Pod's attempts 1..n; a gang's attempt (its Job's), per rank
    pod_name: str
    pod_uid: str
    node: str | None
    phase: str | None
    container_state: str | None  # "waiting" | "running" | "terminated" | None
    raw_reason: str | None
    raw_message: str | None
    exit_code: int | None
    termination_message: str | None
    started_at: datetime | None
    finished_at: datetime | None
    rank: int | None = None  # the worker's index in a gang (workers > 1); None for one Pod
    # When the scheduler bound the Pod to its node: its GPUs are held from then
    # (the PodScheduled condition, or the Scheduled event of a Pod that is gone).
    bound_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "rank": self.rank,
            "pod": self.pod_name,
            "pod_uid": self.pod_uid,
            "node": self.node,
            "phase": self.phase,
            "container_state": self.container_state,
            "raw_reason": self.raw_reason,
            "raw_message": self.raw_message,
            "exit_code": self.exit_code,
            "termination_message": self.termination_message,
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "bound_at": _iso(self.bound_at),
        }


@dataclass(frozen=True)
class GangRestart:
    """A gang's attempt ended and the whole gang starts again as the next attempt
    (JobSet's RestartJobSet): kubetrain deletes the ended attempt's Job and creates the
    next. A disrupted worker's restart is not counted against `retries`; a failed one is."""

    attempt: int  # the next attempt's number
    counted: bool  # counted against retries (a failure), or not (a disruption)
    retries_used: int  # the retries used with this restart counted
    job_uid: str  # the ended attempt's Job, to delete

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "counted": self.counted,
            "retries_used": self.retries_used,
        }


class ChainState(StrEnum):
    PASSED = "passed"
    ACTIVE = "active"  # the job is at this link and nothing is wrong (training, being scheduled)
    BLOCKING = "blocking"
    FAILED = "failed"  # where a finished job failed
    NOT_REACHED = "not-reached"
    # Before the job's stage, but nothing seen says the link was passed (an image
    # without kubetrain's runtime never reports its preflight).
    NOT_OBSERVED = "not-observed"
    NOT_NEEDED = "not-needed"  # the job does not use it (no GPUs, no volumes)


@dataclass(frozen=True)
class ChainMark:
    link: Link
    state: ChainState

    def to_json(self) -> dict[str, Any]:
        return {"link": str(self.link), "state": str(self.state)}


@dataclass(frozen=True)
class Blocker:
    """One reason that holds (or ended) the job, with its numbers."""

    reason: ReasonCode
    link: Link
    nodes: int | None  # nodes this reason keeps out (the scheduler's count); None: not per node
    detail: str
    waitable: bool | None = None
    resource: str | None = None  # the resource the numbers are about
    requested: str | None = None  # quantities in Kubernetes notation ("16", "8Gi", "500m")
    free: str | None = None  # the most free on a node every rule admits
    allocatable: str | None = None  # the largest allocatable such a node has
    limit: str | None = None  # a quota's hard limit (a ClusterQueue's: nominal + borrowing)
    used: str | None = None  # a quota's use
    # Kueue's: the ClusterQueue and flavor, its nominal quota and borrowing limit, the
    # job's position among the queue's pending jobs (1: next) and the jobs ahead of it.
    queue: str | None = None
    flavor: str | None = None
    nominal: str | None = None
    borrowing_limit: str | None = None
    position: int | None = None
    ahead: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "reason": str(self.reason),
            "link": str(self.link),
            "nodes": self.nodes,
            "detail": self.detail,
            "waitable": self.waitable,
        }
        for key in (
            "resource",
            "requested",
            "free",
            "allocatable",
            "limit",
            "used",
            "queue",
            "flavor",
            "nominal",
            "borrowing_limit",
            "position",
        ):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        if self.ahead is not None:
            data["ahead"] = list(self.ahead)
        return data


@dataclass(frozen=True)
class Diagnosis:
    state: BusinessState
    reason: ReasonCode
    link: Link
    waitable: bool | None  # None: not waiting (running, finished)
    actor: Actor
    explanation: str
    action: str
    since: datetime | None
    raw_reason: str | None
    raw_message: str | None
    blockers: tuple[Blocker, ...]
    chain: tuple[ChainMark, ...]
    nodes: tuple[NodeFit, ...]
    attempts: tuple[AttemptView, ...]  # every Pod of the Job, oldest first, numbered 1..n
    constraints: tuple[ConstraintCount, ...] = ()  # per constraint, nodes it rules out
    notes: tuple[str, ...] = ()  # what could not be read or checked, in words
    restart: GangRestart | None = None  # a gang's next attempt, due now
    # The jobs Kueue preempted to admit this one, while their Preempted condition says so.
    preempted: tuple[str, ...] = ()

    def to_json(self, job: str) -> dict[str, Any]:
        """The documented schema (docs/diagnosis.md)."""
        return {
            "job": job,
            "business_status": str(self.state),
            "reason": str(self.reason),
            "link": str(self.link),
            "waitable": self.waitable,
            "actor": str(self.actor),
            "explanation": self.explanation,
            "action": self.action,
            "since": _iso(self.since),
            "raw_reason": self.raw_reason,
            "raw_message": self.raw_message,
            "blockers": [b.to_json() for b in self.blockers],
            "chain": [m.to_json() for m in self.chain],
            "nodes": [n.to_json() for n in self.nodes],
            "constraints": [c.to_json() for c in self.constraints],
            "attempts": [a.to_json() for a in self.attempts],
            "notes": list(self.notes),
            "restart": self.restart.to_json() if self.restart else None,
            "preempted": list(self.preempted),
        }


def _iso(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
