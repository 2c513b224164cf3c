"""Why a training job is or is not running: one pure function over a snapshot.

`diagnose(job, snapshot, now)` walks the chain of DESIGN.md (control plane ->
quota -> scheduler -> GPU node -> device plugin -> runtime -> volume ->
preflight -> training -> job) over plain Kubernetes objects and returns a
`Diagnosis`: the business state, the primary reason code with its link,
explanation, action and actor, whether waiting can help, since when, the raw
Kubernetes reason and message it was derived from, every blocker with its
numbers, a mark per link, the per-node fit table when scheduling is the
problem, and every attempt (Pod) of the job.

The decision, in order (docs/diagnosis.md has the whole table):

1. A Job that finished (Complete / Failed) is SUCCEEDED or FAILED, even if a
   cancel was requested after it finished: the record tells what happened.
   A failed Job's primary reason is the root cause on its last attempt
   (PREFLIGHT_FAILED, OOM_KILLED, EVICTED, NODE_LOST, PREEMPTED,
   GPU_ALLOCATION_FAILED, EXIT_NONZERO) with the Job-level reason
   (BACKOFF_LIMIT_EXCEEDED) beside it as a blocker; DEADLINE_EXCEEDED is
   primary, because the deadline, not the attempt, ended the job.
2. A cancel requested: CANCELLED. No Job: CREATED/JOB_NOT_CREATED before the
   first dispatch, FAILED/JOB_DELETED after it.
3. A suspended Job (Kueue) is QUEUED/WAITING_FOR_QUOTA (or PREEMPTED, QUEUE_INACTIVE;
   SCHEDULING once admitted, until Kueue resumes it), never failed.
4. An active Job: a running container is RUNNING/TRAINING (NO_PROGRESS once
   a Pod that reported TRAINING has reported no step for longer than the
   job's stall threshold); otherwise QUEUED
   with what blocks the newest Pod (or, with no Pod, the quota refusal), and
   the previous attempt's failure beside it while a retry is pending.

Pure: no I/O, no clock (`now` is passed in), deterministic, and it reads the
objects through objects.py so that odd input gives a diagnosis that names what
it could not read, never an exception.

Which module decides what (each imports only those above it in this table;
what a reason code means, who acts, whether waiting helps by default and where
on the chain it holds the job are the reason catalog's, domain/reasons.py):

| module             | decides                                                          |
|--------------------|------------------------------------------------------------------|
| `result.py`        | the answer: Diagnosis, Blocker, ChainMark, AttemptView, JobFacts |
|                    | and their documented JSON                                        |
| `reading.py`       | what one diagnosis reads (the Job, its Pods, events, the notes); |
|                    | a finding before it becomes a Blocker; small shared readers      |
| `unschedulable.py` | why the scheduler refuses a Pod: its verdict, the fit table, the |
|                    | closest nodes (the primary), agreement with the scheduler counts |
| `mounts.py`        | why a volume cannot be mounted, by cause, from the kubelet's and |
|                    | the attach/detach controller's words                             |
| `pending.py`       | what holds a Pod that has not started: scheduling gates, no      |
|                    | verdict yet, the scheduler (above), a waiting container, a       |
|                    | mount (above); a native sidecar that keeps restarting            |
| `quota.py`         | the API server's refusals of the Pod (quota, LimitRange) and a   |
|                    | Job suspended by Kueue                                           |
| `attempts.py`      | the attempts rebuilt from Pods and events; why one ended; the    |
|                    | furthest link the last one reached                               |
| `outcome.py`       | the job's state and stage (finished, cancelled, deleted,         |
|                    | suspended, running, queued) and the mark per link of the chain   |
| `evidence.py`      | which passed links something showed passed; not observed, not    |
|                    | needed                                                           |
| `stall.py`         | a training job whose steps stopped: NO_PROGRESS (the one use of  |
|                    | `now` in the decision)                                           |
| `__init__.py`      | `diagnose()`: the primary reason's words, waiting, the node table|
"""

from __future__ import annotations

from datetime import datetime

from kubetrain.domain.diagnosis.attempts import _attempts
from kubetrain.domain.diagnosis.evidence import evidenced
from kubetrain.domain.diagnosis.outcome import _HEALTHY, _chain, _outcome
from kubetrain.domain.diagnosis.quota import _preempted_for
from kubetrain.domain.diagnosis.reading import _Reader
from kubetrain.domain.diagnosis.result import (
    AttemptView,
    Blocker,
    ChainMark,
    ChainState,
    Diagnosis,
    GangRestart,
    JobFacts,
    PodReport,
)
from kubetrain.domain.diagnosis.stall import (
    _diverged,
    _stalled,
    cancel_for_no_progress,
    cancel_for_non_finite_loss,
)
from kubetrain.domain.fit import ConstraintCount, FitAnalysis, NodeFit
from kubetrain.domain.reasons import CATALOG
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState, Link, ReasonCode

__all__ = [
    "AttemptView",
    "Blocker",
    "ChainMark",
    "ChainState",
    "ConstraintCount",
    "Diagnosis",
    "GangRestart",
    "JobFacts",
    "NodeFit",
    "PodReport",
    "cancel_for_no_progress",
    "cancel_for_non_finite_loss",
    "diagnose",
]

S = BusinessState


def diagnose(job: JobFacts, snapshot: Snapshot, now: datetime) -> Diagnosis:
    """Why `job` is or is not running, from `snapshot` as of `now` (see the module docstring)."""
    reader = _Reader(job, snapshot, now)
    reader.attempts = _attempts(reader)
    outcome = _diverged(reader, _stalled(reader, _outcome(reader), now))
    primary = outcome.findings[0]
    blockers = tuple(f.blocker() for f in outcome.findings)
    entry = CATALOG[primary.reason]
    explanation = entry.explanation
    # Strip: a real kubelet's eviction message ends in a space, a log tail in a newline.
    detail = primary.detail.strip()
    if detail:
        explanation += f" {detail[0].upper()}{detail[1:]}"
        if not explanation.endswith((".", "?", "!")):
            explanation += "."
    waitable: bool | None = blockers[0].waitable
    # Not waiting, so no verdict on waiting; but a diverged loss is said not to pass by itself.
    if outcome.state in (S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED) and (
        primary.reason is not ReasonCode.LOSS_NOT_FINITE
    ):
        waitable = None
    fit: FitAnalysis | None = reader.fit
    # The node table answers "where could it go", which matters only while the
    # scheduler, a node or the device plugin is what holds the job.
    show_nodes = (
        fit is not None
        and outcome.stage is Link.SCHEDULER
        and entry.link in (Link.SCHEDULER, Link.GPU_NODE, Link.DEVICE_PLUGIN)
    )
    return Diagnosis(
        state=outcome.state,
        reason=primary.reason,
        link=entry.link,
        waitable=waitable,
        actor=entry.actor,
        explanation=explanation,
        action=primary.action or entry.action,
        since=primary.since,
        raw_reason=primary.raw_reason,
        raw_message=primary.raw_message,
        # A running job lists what troubles it (a restarting sidecar, no progress).
        blockers=tuple(b for b in blockers if b.reason not in _HEALTHY)
        if outcome.state is S.RUNNING
        else blockers
        if outcome.state is not S.SUCCEEDED
        else (),
        chain=evidenced(_chain(outcome), reader),
        nodes=fit.nodes if show_nodes and fit is not None else (),
        attempts=reader.attempts,
        constraints=fit.constraints if show_nodes and fit is not None else (),
        notes=tuple(reader.notes),
        restart=outcome.restart,
        preempted=_preempted_for(reader),
    )
