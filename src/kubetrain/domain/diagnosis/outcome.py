"""The job's state and where on the chain it stands: finished (succeeded, failed and
why), cancelled, deleted, suspended, or active (running, or queued behind what
holds its newest Pod), and the mark per link of the chain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubetrain.domain.diagnosis.attempts import (
    _attempt_cause,
    _gone_cause,
    _left_by_gone_pods,
    _lost_node,
    _next_after_failure,
    _reached,
)
from kubetrain.domain.diagnosis.gang import (
    ended_in_place,
    first_failed_rank,
    gang_active,
    gang_restart,
)
from kubetrain.domain.diagnosis.pending import _pending, restarting_sidecars
from kubetrain.domain.diagnosis.quota import _pods_ready_wait, _quota, _suspended
from kubetrain.domain.diagnosis.reading import (
    _conditions,
    _Finding,
    _gone,
    _main_status,
    _Reader,
    _running,
    _state,
    _true,
)
from kubetrain.domain.diagnosis.result import ChainMark, ChainState, GangRestart
from kubetrain.domain.manifest import PREFLIGHT_EXIT_CODE
from kubetrain.domain.objects import get, meta_name, text, timestamp
from kubetrain.domain.reasons import CATALOG, rank
from kubetrain.domain.states import BusinessState, Link, ReasonCode

R = ReasonCode
S = BusinessState


CHAIN: tuple[Link, ...] = tuple(Link)
_FAILED_WITH_EXIT = re.compile(r"failed with exit code (\d{1,3})")


@dataclass
class _Outcome:
    state: BusinessState
    findings: list[_Finding]
    stage: Link
    restart: GangRestart | None = None  # a gang's next attempt, due now


def _active(reader: _Reader) -> _Outcome:
    if reader.workers > 1:
        gang = gang_active(reader)
        return _Outcome(gang.state, gang.findings, gang.stage)
    pods = reader.pods
    running = [p for p in pods if _running(p) and not text(p, "metadata", "deletionTimestamp")]
    if running:
        pod = running[-1]
        state, detail = _state(_main_status(pod))
        since = timestamp(detail, "startedAt") or timestamp(pod, "status", "startTime")
        node = text(pod, "spec", "nodeName")
        if reader.node_gone(node):
            # Its status says Running, but nothing can run on a deleted node: Pod
            # garbage collection fails the Pod within a minute (DisruptionTarget
            # DeletionByPodGC) and the Job makes a new one. Until then the job waits.
            return _Outcome(S.QUEUED, [_lost_node(reader, pod, node or "")], _reached(reader))
        reported = reader.job.reported_phase
        # A native sidecar that keeps failing while the trainer runs comes first.
        sidecars = restarting_sidecars(reader, pod)
        if reported and reported[0] == text(pod, "metadata", "name") and reported[1] == "PREFLIGHT":
            return _Outcome(
                S.RUNNING,
                [
                    *sidecars,
                    _Finding(R.PREFLIGHT, _preflight_words(reader, pod, node), since=reported[2]),
                ],
                Link.PREFLIGHT,
            )
        where = f"on node {node}"
        if not reported or reported[0] != text(pod, "metadata", "name"):
            # Counted as training (an image without kubetrain's runtime never reports),
            # but not claimed: nothing in the container has said it trains.
            where += "; no report from kubetrain's runtime in the container yet"
        if state == "terminated":
            code = detail.get("exitCode")
            where = f"the training process exited {code}; the kubelet is finishing the Pod {where}"
        return _Outcome(
            S.RUNNING, [*sidecars, _Finding(R.TRAINING, where, since=since)], Link.TRAINING
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
            following = None if live else _next_after_failure(reader)
            if following not in (None, "retry"):
                # No retry will follow: the Job controller is about to fail the Job.
                # Failed already, never back to the queue for that moment.
                return _failing(reader, cause, following or "")
            cause.detail = f"attempt {number}: {cause.detail}" if number else cause.detail
            if following == "retry":
                cause.detail = f"retrying: {cause.detail}"
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
        # The last attempt ended and the Job controller has not made the next Pod yet:
        # the retry comes by itself (a finished Job was decided above).
        earlier[0].waitable = True
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


def _preflight_words(reader: _Reader, pod: Mapping[str, Any], node: str | None) -> str:
    own = reader.reports.get(meta_name(pod) or "")
    check = f" (now: {own.check})" if own is not None and own.check else ""
    return f"preflight checks on node {node}{check}"


def _ordered(current: list[_Finding], earlier: list[_Finding]) -> list[_Finding]:
    """The current attempt's primary stays primary unless the previous attempt's end
    ranks before it (precedence): "node lost" explains a new Pod waiting for a node."""
    if current and earlier and rank(earlier[0].reason) < rank(current[0].reason):
        return [*earlier, *current]
    return [*current, *earlier]


def _failing(reader: _Reader, cause: _Finding, job_reason: str) -> _Outcome:
    """The last attempt failed and the Job controller will not retry: what _failed
    will say once the Job's condition is written, without the condition's words."""
    findings = [cause]
    if job_reason == "BackoffLimitExceeded":
        findings.append(
            _Finding(R.BACKOFF_LIMIT_EXCEEDED, "the Job has no retries left", raw_reason=None)
        )
    stage = CATALOG[cause.reason].stage
    if cause.reason in (R.EVICTED, R.NODE_LOST, R.PREEMPTED):
        stage = _reached(reader)
    return _Outcome(S.FAILED, findings, stage)


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
    first = first_failed_rank(reader, job_message) if reader.workers > 1 else None
    if first is not None:
        rank, pod, cause = first
        cause.detail = f"rank {rank} (Pod {meta_name(pod)}) failed first: {cause.detail}"
    else:
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
    if reader.workers > 1 and job_code is not R.DEADLINE_EXCEEDED:
        # The attempt ended, not the job: the whole gang starts again while it may.
        restarting = gang_restart(reader, cause, job_finding, job_message)
        if restarting is not None:
            finding, restart = restarting
            return _Outcome(S.QUEUED, [finding], CATALOG[finding.reason].stage, restart)
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
    ended = ended_in_place(reader)
    if ended is not None:
        state, findings, restart = ended
        stage = CATALOG[findings[0].reason].stage
        if state is S.FAILED and findings[0].reason in (R.EVICTED, R.NODE_LOST, R.PREEMPTED):
            stage = _reached(reader)
        return _Outcome(state, findings, stage, restart)
    if get(reader.k8s_job, "spec", "suspend") is True:
        return _Outcome(S.QUEUED, _suspended(reader), Link.QUOTA)
    outcome = _active(reader)
    if outcome.state is S.QUEUED:
        # Admitted by Kueue, not placed yet: its waitForPodsReady may take the job back.
        _pods_ready_wait(reader, outcome.findings)
    return outcome


_HEALTHY = frozenset(
    {R.TRAINING, R.RENDEZVOUS, R.PREFLIGHT, R.SCHEDULING, R.CONTAINER_CREATING, R.COMPLETED}
)


def _chain(outcome: _Outcome) -> tuple[ChainMark, ...]:
    """A mark per link: passed before where the job is held, that link active or
    blocking, the rest not reached.

    One link blocks per primary reason: the earlier of the reason's own link and the
    stage where the job stands. A Kueue-preempted job blocks at the quota (its stage),
    the scheduler not reached; a lost node at the GPU node, which the next attempt
    must get past again; a failed mount at the runtime, where the Pod stands. Other
    blockers are listed, not marked. A running job whose primary troubles it beside
    the training (a restarting sidecar) marks that reason's link blocking and its
    stage active. A failed job marks its stage, the links of its causes and the job
    failed."""
    state = outcome.state
    if state is S.SUCCEEDED:
        return tuple(ChainMark(link, ChainState.PASSED) for link in CHAIN)
    stage = CHAIN.index(outcome.stage)
    primary = outcome.findings[0].reason
    healthy = primary in _HEALTHY or state is S.CANCELLED
    bad = ChainState.FAILED if state is S.FAILED else ChainState.BLOCKING
    problems: set[Link] = set()
    if state is S.FAILED:
        problems = {CATALOG[f.reason].link for f in outcome.findings if f.current}
        problems.add(Link.JOB)
    elif state is S.RUNNING and not healthy:
        problems = {CATALOG[primary].link}
        healthy = CATALOG[primary].link is not outcome.stage
    elif not healthy:
        stage = min(stage, CHAIN.index(CATALOG[primary].link))
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
