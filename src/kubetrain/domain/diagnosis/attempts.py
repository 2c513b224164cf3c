"""The job's attempts: rebuilt from its Pods and events, and why one ended.

An attempt is a Pod of the Job; one already gone (deadline, garbage collection,
preemption) is rebuilt from the events that still name it. The cause of a
finished attempt is read from its Pod (DisruptionTarget, eviction, a terminated
container) or, when the Pod is gone, from its events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from kubetrain.domain.diagnosis.mounts import MOUNT_EVENTS, mount_code
from kubetrain.domain.diagnosis.reading import (
    PodGlance,
    _conditions,
    _conditions_in,
    _event_first_time,
    _event_time,
    _Finding,
    _Reader,
    _state,
    _str,
    _true,
    _without_preflight_lines,
)
from kubetrain.domain.diagnosis.result import AttemptView
from kubetrain.domain.fit import resource_reason
from kubetrain.domain.manifest import CONTAINER_NAME, PREFLIGHT_EXIT_CODE
from kubetrain.domain.nodes import is_gpu_resource
from kubetrain.domain.objects import as_list, as_time, get, integer, meta_name, text, timestamp
from kubetrain.domain.reasons import rank
from kubetrain.domain.scheduling import parse_scheduling_message, reason_of
from kubetrain.domain.states import Link, ReasonCode

R = ReasonCode


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
    seen = reader.seen
    # A Pod's row is made from its glance (kept with it); a gone Pod's from its events.
    rows: list[tuple[PodGlance | None, dict[str, Any] | None]] = [(g, None) for g in seen]
    known = {g.name or "" for g in seen}
    # Pods already gone (deadline, garbage collection) that the Job controller's
    # events still name are attempts too; their state is what their events said.
    # Only this Job's: an earlier Job of the name (a gang's earlier attempt) had its own.
    made = reader.index.created_pods.get((reader.job.namespace, reader.job.k8s_name), [])
    gone = [name for name in made if name not in known]
    if gone:
        uid = text(reader.k8s_job, "metadata", "uid")
        earlier = {
            (text(e, "message") or "").removeprefix("Created pod: ")
            for e in reader.events("Job", reader.job.k8s_name)
            if uid and text(e, "involvedObject", "uid") not in (uid, None)
        }
        gone = [name for name in gone if name not in earlier]
    for name in dict.fromkeys(gone):
        rows.append((None, _gone_fields(reader, name)))
    # Read only for a Pod without its own creation time (one that is gone).
    created: dict[str, datetime | None] | None = None
    epoch = datetime.min.replace(tzinfo=UTC)

    def order(row: tuple[PodGlance | None, dict[str, Any] | None]) -> tuple[datetime, str]:
        nonlocal created
        glance, gone_row = row
        if glance is not None:
            name, when = glance.name or "", glance.created_at
        else:
            name, when = (gone_row or {}).get("pod_name", ""), None
        if not when:
            if created is None:
                created = _created_at_from_events(reader)
            when = created.get(name)
        return when or epoch, name

    if gone or not seen or seen[0].created_at is None:
        rows.sort(key=order)
    # else in the reader's order already: by creation time, then name (a Pod without a
    # creation time would come first).
    # A gang's attempt is its Job: every rank's Pod is on the Job's attempt.
    gang = reader.gang_attempt.number if reader.gang_attempt else 1
    single = reader.workers == 1
    out = []
    for number, (read, gone_row) in enumerate(rows, 1):
        if not single:
            number = gang
        if read is None:
            assert gone_row is not None
            name = gone_row["pod_name"]
            rank = None if single else reader.rank_of({"metadata": {"name": name}})
            out.append(AttemptView(**gone_row, number=number, rank=rank))
            continue
        rank = None if single else read.rank
        if rank is None and not single:
            rank = reader.rank_of_glance(read)
        kept = read.view  # this Pod version's row, as the diagnosis before made it
        if kept is None:
            kept = read.view = AttemptView(**_attempt_fields(read), number=number, rank=rank)
        elif kept.number != number or kept.rank != rank:
            kept = read.view = replace(kept, number=number, rank=rank)
        out.append(kept)
    return tuple(out)


def _gone_fields(reader: _Reader, name: str) -> dict[str, Any]:
    """An attempt whose Pod is gone, from the events that still name it."""
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
    return {
        "pod_name": name,
        "pod_uid": uid or "",
        "node": node,
        "phase": None,
        "container_state": None,
        "raw_reason": raw_reason,
        "raw_message": raw_message,
        "exit_code": None,
        "termination_message": None,
        "started_at": next(
            (_event_time(e) for e in events if text(e, "reason") == "Started"), None
        ),
        "finished_at": None,
        "bound_at": next(
            (_event_first_time(e) for e in events if text(e, "reason") == "Scheduled"),
            None,
        ),
    }


def _created_at_from_events(reader: _Reader) -> dict[str, datetime | None]:
    """When the Job controller created each Pod, by its first SuccessfulCreate event:
    one pass over the Job's events (a gang's Job has one per rank)."""
    created: dict[str, datetime | None] = {}
    for event in reader.events("Job", reader.job.k8s_name):
        message = text(event, "message") or ""
        if text(event, "reason") == "SuccessfulCreate" and message.startswith("Created pod: "):
            created.setdefault(message.removeprefix("Created pod: "), _event_first_time(event))
    return created


def _node_not_found(node: str) -> tuple[str, str]:
    # What the API server answers for the Node now: the raw evidence of a lost node.
    return "NotFound", f'nodes "{node}" not found'


def _scheduled_node(events: Sequence[object]) -> str | None:
    for event in events:
        message = text(event, "message") or ""
        if text(event, "reason") == "Scheduled" and " to " in message:
            return message.rsplit(" to ", 1)[1].strip() or None
    return None


def _attempt_fields(pod: PodGlance) -> dict[str, Any]:
    """One Pod's AttemptView fields, less its number and rank."""
    state, detail = pod.state, pod.detail
    raw_reason = pod.reason or _str(detail.get("reason"))
    raw_message = pod.message or _str(detail.get("message"))
    conditions = _conditions_in(pod.status.get("conditions"))
    disruption = _true(conditions, "DisruptionTarget")
    # An eviction's own words (reason Evicted) say more than its condition's.
    if disruption is not None and pod.reason != "Evicted":
        raw_reason, raw_message = text(disruption, "reason"), text(disruption, "message")
    scheduled = conditions.get("PodScheduled")
    if state is None and scheduled is not None and text(scheduled, "status") == "False":
        raw_reason, raw_message = text(scheduled, "reason"), text(scheduled, "message")
    ended = state == "terminated"
    return {
        "pod_name": pod.name or "",
        "pod_uid": pod.uid or "",
        "node": pod.node,
        "phase": pod.phase,
        "container_state": state,
        "raw_reason": raw_reason,
        "raw_message": raw_message,
        "exit_code": integer(detail, "exitCode") if ended else None,
        "termination_message": _str(detail.get("message")) if ended else None,
        "started_at": pod.started_at,
        "finished_at": as_time(detail.get("finishedAt")),
        # When the scheduler bound the Pod: its PodScheduled condition, once on a node.
        "bound_at": as_time(scheduled.get("lastTransitionTime"))
        if scheduled is not None and scheduled.get("status") == "True" and pod.node
        else None,
    }


# -- why an attempt ended ------------------------------------------------------------


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
    mains = [s for s in as_list(pod, "status", "containerStatuses") if isinstance(s, Mapping)]
    mains.sort(key=lambda s: text(s, "name") != CONTAINER_NAME)
    statuses = [("container", s) for s in mains]
    sidecars = {
        text(c, "name") for c in as_list(pod, "spec", "initContainers") if text(c, "restartPolicy")
    }
    # An init container that failed is named as one ("init container fetch-dataset …").
    statuses += [
        ("sidecar" if text(s, "name") in sidecars else "init container", s)
        for s in as_list(pod, "status", "initContainerStatuses")
        if isinstance(s, Mapping)
    ]
    for role, status in statuses:
        state, detail = _state(status)
        if state != "terminated":
            continue
        code_number = integer(detail, "exitCode")
        ended = text(detail, "reason")
        message = text(detail, "message")
        since = timestamp(detail, "finishedAt")
        name = f"{role} {text(status, 'name') or '?'}"
        if ended == "OOMKilled":
            return _Finding(
                R.OOM_KILLED,
                f"{name} was OOM-killed (exit code {code_number})",
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
            last_words = _without_preflight_lines(message)
            said = f": {last_words}" if last_words else ""
            return _Finding(
                R.EXIT_NONZERO,
                f"{name} exited with code {code_number}{said}",
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
    elif reason in MOUNT_EVENTS:
        code = mount_code(message)
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


# -- whether the Job controller will try again ---------------------------------------

# The Job's default when spec.backoffLimit is unset (batch/v1).
_DEFAULT_BACKOFF_LIMIT = 6


def _next_after_failure(reader: _Reader) -> str | None:
    """What the Job controller does after the failed Pods, by its own rules
    (pkg/controller/job: podFailurePolicy's first matching rule, then
    `failed > backoffLimit`): "retry", or the reason it will fail the Job with
    ("PodFailurePolicy", "BackoffLimitExceeded"); None when kubetrain cannot tell
    (a limit per index)."""
    job = reader.k8s_job
    if job is None or get(job, "spec", "backoffLimitPerIndex") is not None:
        return None
    rules = [r for r in as_list(job, "spec", "podFailurePolicy", "rules") if isinstance(r, Mapping)]
    counted = 0
    for pod in reader.pods:
        if text(pod, "status", "phase") != "Failed":
            continue
        action = next((text(r, "action") for r in rules if _rule_matches(r, pod)), "Count")
        if action == "FailJob":
            return "PodFailurePolicy"
        if action == "Count":
            counted += 1
    failed = max(counted, integer(job, "status", "failed") or 0)
    limit = integer(job, "spec", "backoffLimit")
    if failed > (_DEFAULT_BACKOFF_LIMIT if limit is None else limit):
        return "BackoffLimitExceeded"
    return "retry"


def _rule_matches(rule: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """A podFailurePolicy rule against a failed Pod, as the Job controller matches it:
    onExitCodes by any non-zero terminated container, onPodConditions by a condition."""
    exit_codes = get(rule, "onExitCodes")
    if isinstance(exit_codes, Mapping):
        values = {v for v in as_list(exit_codes, "values") if isinstance(v, int)}
        name = text(exit_codes, "containerName")
        inside = text(exit_codes, "operator") != "NotIn"
        for key in ("initContainerStatuses", "containerStatuses"):
            for status in as_list(pod, "status", key):
                code = integer(status, "state", "terminated", "exitCode")
                if code in (None, 0) or (name and text(status, "name") != name):
                    continue
                if (code in values) == inside:
                    return True
        return False
    conditions = _conditions(pod)
    wanted = [c for c in as_list(rule, "onPodConditions") if isinstance(c, Mapping)]
    return any(
        text(conditions.get(text(c, "type") or ""), "status") == (text(c, "status") or "True")
        for c in wanted
    )
