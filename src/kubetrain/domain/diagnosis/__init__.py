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
3. A suspended Job (Kueue) is QUEUED/WAITING_FOR_QUOTA, never failed.
4. An active Job: a running container is RUNNING/TRAINING; otherwise QUEUED
   with what blocks the newest Pod (or, with no Pod, the quota refusal), and
   the previous attempt's failure beside it while a retry is pending.

Pure: no I/O, no clock (`now` is passed in), deterministic, and it reads the
objects through objects.py so that odd input gives a diagnosis that names what
it could not read, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubetrain.domain.diagnosis.pending import _MOUNT_EVENTS, _pending
from kubetrain.domain.diagnosis.quota import _quota, _suspended
from kubetrain.domain.diagnosis.reading import (
    _conditions,
    _event_first_time,
    _event_time,
    _Finding,
    _main_status,
    _Reader,
    _state,
    _true,
)
from kubetrain.domain.diagnosis.result import (
    AttemptView,
    Blocker,
    ChainMark,
    ChainState,
    Diagnosis,
    JobFacts,
)
from kubetrain.domain.fit import ConstraintCount, FitAnalysis, NodeFit, resource_reason
from kubetrain.domain.manifest import CONTAINER_NAME, PREFLIGHT_EXIT_CODE
from kubetrain.domain.nodes import is_gpu_resource
from kubetrain.domain.objects import as_list, get, integer, meta_name, text, timestamp
from kubetrain.domain.reasons import CATALOG, rank
from kubetrain.domain.scheduling import parse_scheduling_message, reason_of
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState, Link, ReasonCode

__all__ = [
    "AttemptView",
    "Blocker",
    "ChainMark",
    "ChainState",
    "ConstraintCount",
    "Diagnosis",
    "JobFacts",
    "NodeFit",
    "diagnose",
]

R = ReasonCode
S = BusinessState


_PREEMPTION = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler"})
_NODE_GONE = frozenset({"NodeLost", "Shutdown", "Terminated", "NodeShutdown", "Unknown"})
# Events that say why a Pod that is gone now ended.
_GONE_EVENTS = {
    "Preempted": R.PREEMPTED,  # kube-scheduler, on the victim
    "TaintManagerEviction": R.NODE_LOST,  # taint-eviction controller (node unreachable)
    "Evicted": R.EVICTED,  # kubelet, under node pressure
}


def _attempts(reader: _Reader) -> tuple[AttemptView, ...]:
    """Every Pod of the Job as an attempt, oldest first, numbered 1..n."""
    views = [_attempt_view(pod) for pod in reader.pods]
    known = {v.pod_name for v in views}
    # Pods already gone (deadline, garbage collection) that the Job controller's
    # events still name are attempts too; their state is what their events said.
    gone = [
        name
        for name in reader.index.created_pods.get((reader.job.namespace, reader.job.k8s_name), [])
        if name not in known
    ]
    for name in dict.fromkeys(gone):
        events = reader.events("Pod", name)
        # Warnings, and what says why it went (the scheduler's Preempted is Normal).
        telling = [
            e for e in events if text(e, "type") == "Warning" or text(e, "reason") in _GONE_EVENTS
        ]
        last = telling[-1] if telling else None
        node = _scheduled_node(events)
        raw_reason = text(last, "reason") if last else None
        raw_message = text(last, "message") if last else None
        explained = any(text(e, "reason") in _GONE_EVENTS for e in events)
        if not explained and reader.node_gone(node):
            # Pod garbage collection writes no event: the vanished Node says it.
            raw_reason, raw_message = _node_not_found(node or "")
        uid = next(
            (text(e, "involvedObject", "uid") for e in events if text(e, "involvedObject", "uid")),
            "",
        )
        views.append(
            AttemptView(
                number=0,
                pod_name=name,
                pod_uid=uid or "",
                node=node,
                phase=None,
                container_state=None,
                raw_reason=raw_reason,
                raw_message=raw_message,
                exit_code=None,
                termination_message=None,
                started_at=next(
                    (_event_time(e) for e in events if text(e, "reason") == "Started"), None
                ),
                finished_at=None,
            )
        )
    created = {v.pod_name: _created_at_from_events(reader, v.pod_name) for v in views}
    pods_created = {
        meta_name(p): timestamp(p, "metadata", "creationTimestamp") for p in reader.pods
    }
    epoch = datetime.min.replace(tzinfo=UTC)

    def order(view: AttemptView) -> tuple[datetime, str]:
        when = pods_created.get(view.pod_name) or created.get(view.pod_name) or epoch
        return when, view.pod_name

    views.sort(key=order)
    return tuple(
        AttemptView(**{**view.__dict__, "number": number}) for number, view in enumerate(views, 1)
    )


def _created_at_from_events(reader: _Reader, pod_name: str) -> datetime | None:
    for event in reader.events("Job", reader.job.k8s_name):
        if (
            text(event, "reason") == "SuccessfulCreate"
            and text(event, "message") == f"Created pod: {pod_name}"
        ):
            return _event_first_time(event)
    return None


def _node_not_found(node: str) -> tuple[str, str]:
    # What the API server answers for the Node now: the raw evidence of a lost node.
    return "NotFound", f'nodes "{node}" not found'


def _scheduled_node(events: Sequence[object]) -> str | None:
    for event in events:
        message = text(event, "message") or ""
        if text(event, "reason") == "Scheduled" and " to " in message:
            return message.rsplit(" to ", 1)[1].strip() or None
    return None


def _attempt_view(pod: Mapping[str, Any]) -> AttemptView:
    status = _main_status(pod)
    state, detail = _state(status)
    raw_reason = text(pod, "status", "reason") or text(detail, "reason")
    raw_message = text(pod, "status", "message") or text(detail, "message")
    disruption = _true(_conditions(pod), "DisruptionTarget")
    # An eviction's own words (reason Evicted) say more than its condition's.
    if disruption is not None and text(pod, "status", "reason") != "Evicted":
        raw_reason, raw_message = text(disruption, "reason"), text(disruption, "message")
    if state is None:
        scheduled = _conditions(pod).get("PodScheduled")
        if scheduled is not None and text(scheduled, "status") == "False":
            raw_reason, raw_message = text(scheduled, "reason"), text(scheduled, "message")
    return AttemptView(
        number=0,
        pod_name=meta_name(pod) or "",
        pod_uid=text(pod, "metadata", "uid") or "",
        node=text(pod, "spec", "nodeName"),
        phase=text(pod, "status", "phase"),
        container_state=state,
        raw_reason=raw_reason,
        raw_message=raw_message,
        exit_code=integer(detail, "exitCode") if state == "terminated" else None,
        termination_message=text(detail, "message") if state == "terminated" else None,
        started_at=timestamp(detail, "startedAt"),
        finished_at=timestamp(detail, "finishedAt"),
    )


def _attempt_cause(pod: Mapping[str, Any]) -> _Finding | None:
    """Why one Pod ended (or is ending); None when it did not fail."""
    conditions = _conditions(pod)
    pod_reason = text(pod, "status", "reason")
    pod_message = text(pod, "status", "message")
    disruption = _true(conditions, "DisruptionTarget")
    if disruption is not None:
        reason = text(disruption, "reason") or ""
        message = text(disruption, "message")
        if reason in _PREEMPTION:
            return _Finding(
                R.PREEMPTED,
                message or "",
                raw_reason=reason,
                raw_message=message,
                since=timestamp(disruption, "lastTransitionTime"),
            )
        if pod_reason == "Evicted":
            # The Pod's own reason is what `kubectl get pods` shows; the condition
            # (TerminationByKubelet) says the same with less.
            return _Finding(
                R.EVICTED,
                pod_message or message or "",
                raw_reason=pod_reason,
                raw_message=pod_message or message,
                since=timestamp(disruption, "lastTransitionTime"),
            )
        return _Finding(
            R.NODE_LOST,
            message or "",
            raw_reason=reason,
            raw_message=message,
            since=timestamp(disruption, "lastTransitionTime"),
        )
    if pod_reason == "Evicted":
        return _Finding(
            R.EVICTED, pod_message or "", raw_reason=pod_reason, raw_message=pod_message
        )
    if pod_reason == "UnexpectedAdmissionError":
        return _Finding(
            R.GPU_ALLOCATION_FAILED,
            pod_message or "",
            raw_reason=pod_reason,
            raw_message=pod_message,
        )
    if pod_reason and pod_reason.startswith("OutOf"):
        resource = pod_reason[len("OutOf") :]
        code = R.GPU_ALLOCATION_FAILED if is_gpu_resource(resource) else resource_reason(resource)
        return _Finding(code, pod_message or "", raw_reason=pod_reason, raw_message=pod_message)
    if pod_reason in _NODE_GONE:
        return _Finding(
            R.NODE_LOST, pod_message or "", raw_reason=pod_reason, raw_message=pod_message
        )
    if pod_reason == "NodeAffinity":
        return _Finding(
            R.NODE_SELECTOR_MISMATCH,
            pod_message or "",
            raw_reason=pod_reason,
            raw_message=pod_message,
        )
    statuses = [s for s in as_list(pod, "status", "containerStatuses") if isinstance(s, Mapping)]
    statuses.sort(key=lambda s: text(s, "name") != CONTAINER_NAME)
    statuses += [
        s for s in as_list(pod, "status", "initContainerStatuses") if isinstance(s, Mapping)
    ]
    for status in statuses:
        state, detail = _state(status)
        if state != "terminated":
            continue
        code_number = integer(detail, "exitCode")
        ended = text(detail, "reason")
        message = text(detail, "message")
        since = timestamp(detail, "finishedAt")
        name = text(status, "name") or "?"
        if ended == "OOMKilled":
            return _Finding(
                R.OOM_KILLED,
                f"container {name} was OOM-killed (exit code {code_number})",
                raw_reason=ended,
                raw_message=message,
                since=since,
            )
        if code_number == PREFLIGHT_EXIT_CODE:
            return _Finding(
                R.PREFLIGHT_FAILED,
                message or f"exit code {PREFLIGHT_EXIT_CODE}",
                raw_reason=ended,
                raw_message=message,
                since=since,
            )
        if ended == "ContainerStatusUnknown":
            return _Finding(
                R.NODE_LOST, message or "", raw_reason=ended, raw_message=message, since=since
            )
        if code_number not in (0, None):
            said = f": {message}" if message else ""
            return _Finding(
                R.EXIT_NONZERO,
                f"container {name} exited with code {code_number}{said}",
                raw_reason=ended,
                raw_message=message,
                since=since,
            )
    return None


def _lost_node(reader: _Reader, pod: Mapping[str, Any], node: str) -> _Finding:
    number = next((a.number for a in reader.attempts if a.pod_name == meta_name(pod)), None)
    raw_reason, raw_message = _node_not_found(node)
    return _Finding(
        R.NODE_LOST,
        f"attempt {number}: its node {node} no longer exists; the Pod will be failed and replaced",
        raw_reason=raw_reason,
        raw_message=raw_message,
        # A deleted Node leaves no time behind in the snapshot.
        since=None,
    )


def _gone_cause(reader: _Reader, attempt: AttemptView) -> _Finding | None:
    if attempt.raw_reason == "NotFound" and reader.node_gone(attempt.node):
        # No event says why it went, and its node is gone too: Pod garbage
        # collection removed it with the node (it writes no event).
        return _Finding(
            R.NODE_LOST,
            f"attempt {attempt.number}: its node {attempt.node} no longer exists",
            raw_reason=attempt.raw_reason,
            raw_message=attempt.raw_message,
            current=False,
        )
    for event in reversed(reader.events("Pod", attempt.pod_name)):
        code = _GONE_EVENTS.get(text(event, "reason") or "")
        if code is not None:
            message = text(event, "message")
            return _Finding(
                code,
                f"attempt {attempt.number}: {message or text(event, 'reason')}",
                raw_reason=text(event, "reason"),
                raw_message=message,
                since=_event_time(event),
                current=False,
            )
    return None


def _reached(reader: _Reader) -> Link:
    """The furthest link the last attempt got to, from its Pod or its events."""
    if not reader.attempts:
        return Link.QUOTA
    last = reader.attempts[-1]
    if last.started_at or last.container_state in ("running", "terminated"):
        return Link.TRAINING
    if last.node:
        return Link.RUNTIME
    return Link.SCHEDULER


def _left_by_gone_pods(reader: _Reader) -> list[_Finding]:
    """What the last attempt's events said, when its Pod is gone (the deadline deleted it)."""
    if not reader.attempts or reader.attempts[-1].phase is not None:
        return []
    last = reader.attempts[-1]
    events = [e for e in reader.events("Pod", last.pod_name) if text(e, "type") == "Warning"]
    if not events:
        return []
    event = events[-1]
    reason, message = text(event, "reason"), text(event, "message") or ""
    if reason == "FailedScheduling":
        verdict = parse_scheduling_message(message)
        codes = [reason_of(p) for p in verdict.parts]
        code = min((c for c in codes if c is not None), key=rank, default=None)
    elif reason in _MOUNT_EVENTS:
        code = R.VOLUME_MOUNT_FAILED
    elif reason == "Failed" and "pull" in message.lower():
        code = R.IMAGE_PULL_FAILED
    else:
        code = None
    if code is None:
        return []
    return [
        _Finding(
            code,
            f"attempt {last.number} was held: {message}",
            raw_reason=reason,
            raw_message=message,
            since=_event_first_time(event),
        )
    ]


CHAIN: tuple[Link, ...] = tuple(Link)
_FAILED_WITH_EXIT = re.compile(r"failed with exit code (\d{1,3})")


@dataclass
class _Outcome:
    state: BusinessState
    findings: list[_Finding]
    stage: Link


def _running(pod: Mapping[str, Any]) -> bool:
    if text(pod, "status", "phase") in ("Succeeded", "Failed"):
        return False
    status = _main_status(pod)
    state, _ = _state(status)
    return state == "running"


def _gone(pod: Mapping[str, Any]) -> bool:
    return text(pod, "status", "phase") in ("Succeeded", "Failed") or bool(
        text(pod, "metadata", "deletionTimestamp")
    )


def _active(reader: _Reader) -> _Outcome:
    pods = reader.pods
    running = [p for p in pods if _running(p) and not text(p, "metadata", "deletionTimestamp")]
    if running:
        pod = running[-1]
        _, detail = _state(_main_status(pod))
        since = timestamp(detail, "startedAt") or timestamp(pod, "status", "startTime")
        node = text(pod, "spec", "nodeName")
        if reader.node_gone(node):
            # Its status says Running, but nothing can run on a deleted node: Pod
            # garbage collection fails the Pod within a minute (DisruptionTarget
            # DeletionByPodGC) and the Job makes a new one. Until then the job waits.
            return _Outcome(S.QUEUED, [_lost_node(reader, pod, node or "")], _reached(reader))
        reported = reader.job.reported_phase
        if reported and reported[0] == text(pod, "metadata", "name") and reported[1] == "PREFLIGHT":
            return _Outcome(
                S.RUNNING,
                [_Finding(R.PREFLIGHT, f"preflight checks on node {node}", since=reported[2])],
                Link.PREFLIGHT,
            )
        return _Outcome(
            S.RUNNING, [_Finding(R.TRAINING, f"on node {node}", since=since)], Link.TRAINING
        )
    live = [p for p in pods if not _gone(p)]
    if not live and pods and text(pods[-1], "status", "phase") == "Succeeded":
        # The last Pod succeeded and the Job controller has not written Complete
        # yet (a moment, usually): still running, never back to the queue.
        return _Outcome(
            S.RUNNING,
            [
                _Finding(
                    R.TRAINING,
                    "the training process exited 0; the Job is completing",
                    since=timestamp(pods[-1], "status", "startTime"),
                )
            ],
            Link.TRAINING,
        )
    previous = [p for p in pods if _gone(p)]
    earlier: list[_Finding] = []
    if previous:
        cause = _attempt_cause(previous[-1])
        if cause is not None:
            number = next(
                (a.number for a in reader.attempts if a.pod_name == meta_name(previous[-1])), None
            )
            cause.detail = f"attempt {number}: {cause.detail}" if number else cause.detail
            if cause.reason not in (R.NODE_LOST, R.PREEMPTED):
                cause.waitable = None  # the next attempt may fail the same way
            cause.current = False
            earlier.append(cause)
    if not earlier:
        # The previous Pod may be gone already (a preempted or evicted Pod is
        # deleted); its events still say why it ended.
        gone = [a for a in reader.attempts if a.phase is None]
        newest = meta_name(live[-1]) if live else None
        numbers = {a.pod_name: a.number for a in reader.attempts}
        if gone and (newest is None or gone[-1].number < numbers.get(newest, 0)):
            cause = _gone_cause(reader, gone[-1])
            if cause is not None:
                earlier.append(cause)
    if live:
        findings, stage = _pending(reader, live[-1])
        return _Outcome(S.QUEUED, _ordered(findings, earlier), stage)
    if earlier:
        # The last attempt ended and the Job controller has not made the next Pod yet.
        return _Outcome(S.QUEUED, earlier, CATALOG[earlier[0].reason].stage)
    quota = _quota(reader)
    if quota:
        return _Outcome(S.QUEUED, quota, Link.QUOTA)
    return _Outcome(
        S.QUEUED,
        [
            _Finding(
                R.SCHEDULING,
                "the Job controller has not created the Pod yet",
                since=timestamp(reader.k8s_job, "metadata", "creationTimestamp"),
            )
        ],
        Link.QUOTA,
    )


def _ordered(current: list[_Finding], earlier: list[_Finding]) -> list[_Finding]:
    """The current attempt's primary stays primary unless the previous attempt's end
    ranks before it (precedence): "node lost" explains a new Pod waiting for a node."""
    if current and earlier and rank(earlier[0].reason) < rank(current[0].reason):
        return [*earlier, *current]
    return [*current, *earlier]


_JOB_REASONS = {
    "BackoffLimitExceeded": R.BACKOFF_LIMIT_EXCEEDED,
    "MaxFailedIndexesExceeded": R.BACKOFF_LIMIT_EXCEEDED,
    "FailedIndexes": R.BACKOFF_LIMIT_EXCEEDED,
    "DeadlineExceeded": R.DEADLINE_EXCEEDED,
}


def _failed(reader: _Reader, condition: Mapping[str, Any]) -> _Outcome:
    job_reason = text(condition, "reason")
    job_message = text(condition, "message")
    since = timestamp(condition, "lastTransitionTime")
    job_code = _JOB_REASONS.get(job_reason or "")
    job_finding = (
        _Finding(
            job_code, job_message or "", raw_reason=job_reason, raw_message=job_message, since=since
        )
        if job_code
        else None
    )
    cause: _Finding | None = None
    for pod in reversed(reader.pods):
        cause = _attempt_cause(pod)
        if cause is not None:
            break
    if cause is None and job_reason == "PodFailurePolicy" and job_message:
        match = _FAILED_WITH_EXIT.search(job_message)
        if match:
            code = R.PREFLIGHT_FAILED if int(match[1]) == PREFLIGHT_EXIT_CODE else R.EXIT_NONZERO
            cause = _Finding(
                code, job_message, raw_reason=job_reason, raw_message=job_message, since=since
            )
    if job_code is R.DEADLINE_EXCEEDED and job_finding is not None:
        findings = [job_finding]
        if cause is not None:
            findings.append(cause)
        findings += _left_by_gone_pods(reader)
        return _Outcome(S.FAILED, findings, _reached(reader))
    if cause is not None:
        cause.since = cause.since or since
        findings = [cause] + ([job_finding] if job_finding else [])
        stage = CATALOG[cause.reason].stage
        if cause.reason in (R.EVICTED, R.NODE_LOST, R.PREEMPTED):
            stage = _reached(reader)
        return _Outcome(S.FAILED, findings, stage)
    if job_finding is not None:
        return _Outcome(S.FAILED, [job_finding, *_left_by_gone_pods(reader)], _reached(reader))
    reader.note(f"the Job failed with reason {job_reason!r}, which kubetrain does not know")
    return _Outcome(
        S.FAILED,
        [
            _Finding(
                R.BACKOFF_LIMIT_EXCEEDED,
                job_message or "",
                raw_reason=job_reason,
                raw_message=job_message,
                since=since,
            )
        ],
        _reached(reader),
    )


def _outcome(reader: _Reader) -> _Outcome:
    job = reader.job
    if reader.k8s_job is None:
        if job.cancel_requested:
            return _Outcome(S.CANCELLED, [_Finding(R.CANCELLED)], Link.CONTROL_PLANE)
        if not job.dispatched:
            finding = _Finding(
                R.JOB_NOT_CREATED,
                f"the last attempt to create it failed: {job.dispatch_error}"
                if job.dispatch_error
                else "",
                waitable=None if job.dispatch_error else True,
                raw_message=job.dispatch_error,
            )
            return _Outcome(S.CREATED, [finding], Link.CONTROL_PLANE)
        return _Outcome(
            S.FAILED,
            [_Finding(R.JOB_DELETED, f"Job {job.k8s_name} is gone from namespace {job.namespace}")],
            Link.CONTROL_PLANE,
        )
    conditions = _conditions(reader.k8s_job)
    complete = _true(conditions, "Complete")
    if complete is not None:
        since = timestamp(complete, "lastTransitionTime") or timestamp(
            reader.k8s_job, "status", "completionTime"
        )
        finding = _Finding(
            R.COMPLETED,
            raw_reason=text(complete, "reason"),
            raw_message=text(complete, "message"),
            since=since,
        )
        return _Outcome(S.SUCCEEDED, [finding], Link.JOB)
    failed = _true(conditions, "Failed") or _true(conditions, "FailureTarget")
    if failed is not None:
        return _failed(reader, failed)
    if job.cancel_requested:
        since = timestamp(reader.k8s_job, "metadata", "deletionTimestamp")
        return _Outcome(S.CANCELLED, [_Finding(R.CANCELLED, since=since)], Link.CONTROL_PLANE)
    if get(reader.k8s_job, "spec", "suspend") is True:
        return _Outcome(S.QUEUED, _suspended(reader), Link.QUOTA)
    return _active(reader)


_HEALTHY = frozenset({R.TRAINING, R.PREFLIGHT, R.SCHEDULING, R.CONTAINER_CREATING, R.COMPLETED})


def _chain(outcome: _Outcome) -> tuple[ChainMark, ...]:
    """A mark per link: passed before the job's stage, its stage active or blocking
    (failed), the links of its current blockers blocking too, the rest not reached."""
    state = outcome.state
    if state is S.SUCCEEDED:
        return tuple(ChainMark(link, ChainState.PASSED) for link in CHAIN)
    stage = CHAIN.index(outcome.stage)
    primary = outcome.findings[0].reason
    healthy = primary in _HEALTHY or state is S.CANCELLED
    bad = ChainState.FAILED if state is S.FAILED else ChainState.BLOCKING
    problems = {
        CATALOG[f.reason].link
        for f in outcome.findings
        if f.current and f.reason not in _HEALTHY and state is not S.CANCELLED
    }
    if state is S.FAILED:
        problems.add(Link.JOB)
    marks = []
    for number, link in enumerate(CHAIN):
        if link in problems:
            mark = bad
        elif number < stage:
            mark = ChainState.PASSED
        elif number == stage and state is not S.CANCELLED:
            mark = ChainState.ACTIVE if healthy else bad
        else:
            mark = ChainState.NOT_REACHED
        marks.append(ChainMark(link, mark))
    return tuple(marks)


def diagnose(job: JobFacts, snapshot: Snapshot, now: datetime) -> Diagnosis:
    """Why `job` is or is not running, from `snapshot` as of `now` (see the module docstring)."""
    reader = _Reader(job, snapshot)
    reader.attempts = _attempts(reader)
    outcome = _outcome(reader)
    primary = outcome.findings[0]
    blockers = tuple(f.blocker() for f in outcome.findings)
    entry = CATALOG[primary.reason]
    explanation = entry.explanation
    if primary.detail:
        explanation += f" {primary.detail[0].upper()}{primary.detail[1:]}"
        if not explanation.endswith((".", "?", "!")):
            explanation += "."
    waitable: bool | None = blockers[0].waitable
    if outcome.state in (S.RUNNING, S.SUCCEEDED, S.FAILED, S.CANCELLED):
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
        blockers=blockers if outcome.state not in (S.RUNNING, S.SUCCEEDED) else (),
        chain=_chain(outcome),
        nodes=fit.nodes if show_nodes and fit is not None else (),
        attempts=reader.attempts,
        constraints=fit.constraints if show_nodes and fit is not None else (),
        notes=tuple(reader.notes),
    )
