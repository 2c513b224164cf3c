"""What holds a Pod that has not started: scheduling gates, the scheduler (see
unschedulable.py), or, on its node, a waiting container (image, configuration,
crash loop, volume mount, creation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubetrain.domain.diagnosis.reading import (
    _conditions,
    _event_first_time,
    _event_time,
    _Finding,
    _main_status,
    _Reader,
    _state,
    _without_preflight_lines,
)
from kubetrain.domain.diagnosis.unschedulable import _unschedulable
from kubetrain.domain.objects import as_list, as_map, integer, text, timestamp
from kubetrain.domain.states import Link, ReasonCode

R = ReasonCode


_IMAGE_PULL = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
# The kubelet's "Error: <waiting reason>" event, which names no cause.
_REASON_ECHO = re.compile(r"Error: [A-Za-z]+")
_CONFIG = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PreStartHookError",
    }
)
_MOUNT_EVENTS = frozenset({"FailedMount", "FailedAttachVolume", "FailedMapVolume"})


def _since(*moments: datetime | None) -> datetime | None:
    return next((m for m in moments if m is not None), None)


def _waiting(reader: _Reader, pod: Mapping[str, Any]) -> list[_Finding]:
    """A Pod bound to a node whose container has not started."""
    findings: list[_Finding] = []
    node_name = text(pod, "spec", "nodeName")
    node = reader.nodes_by_name.get(node_name or "")
    if node is not None and node.ready not in ("True", None):
        findings.append(
            _Finding(
                R.NODE_NOT_READY,
                f"the Pod's node {node_name} is NotReady",
                raw_reason="NodeNotReady",
                raw_message=f"node {node_name} Ready={node.ready}",
            )
        )
    status = _main_status(pod)
    state, detail = _state(status)
    reason, message = text(detail, "reason"), text(detail, "message")
    if state is None:
        for status in as_list(pod, "status", "initContainerStatuses"):
            init_state, init_detail = _state(status)
            if init_state == "waiting" and text(init_detail, "reason") not in (
                None,
                "PodInitializing",
            ):
                state, detail = init_state, init_detail
                reason, message = text(detail, "reason"), text(detail, "message")
                break
    ready_since = timestamp(_conditions(pod).get("Ready"), "lastTransitionTime") or timestamp(
        pod, "status", "startTime"
    )
    if state == "waiting" and reason in _IMAGE_PULL:
        failed = reader.pod_events(pod, "Failed")
        # A real kubelet follows each "Failed to pull image …: <the runtime's words>"
        # with "Error: ErrImagePull" / "Error: ImagePullBackOff", which only repeat
        # the waiting reason: the last event that says more is the cause.
        telling = [e for e in failed if not _REASON_ECHO.fullmatch(text(e, "message") or "")]
        said = text((telling or failed)[-1], "message") if failed else None
        since = _since(_event_first_time(failed[0]) if failed else None, ready_since)
        image = next(
            (
                text(c, "image")
                for c in as_list(pod, "spec", "containers")
                if text(c, "name") == text(status, "name")
            ),
            None,
        )
        detail_text = f"image {image}" if image else "the image"
        detail_text += f": {said}" if said else ""
        findings.insert(
            0,
            _Finding(
                R.IMAGE_PULL_FAILED,
                detail_text,
                raw_reason=reason,
                raw_message=message,
                since=since,
            ),
        )
        return findings
    if state == "waiting" and reason in _CONFIG:
        findings.insert(
            0,
            _Finding(
                R.CONTAINER_CONFIG_ERROR,
                message or reason or "",
                raw_reason=reason,
                raw_message=message,
                since=ready_since,
            ),
        )
        return findings
    if state == "waiting" and reason == "CrashLoopBackOff":
        last = as_map(status, "lastState", "terminated")
        exit_code = integer(last, "exitCode")
        last_words = _without_preflight_lines(text(last, "message"))
        findings.insert(
            0,
            _Finding(
                R.CRASH_LOOP,
                f"last exit code {exit_code}" + (f": {last_words}" if last_words else ""),
                raw_reason=reason,
                raw_message=message,
                since=ready_since,
            ),
        )
        return findings
    mounts = reader.pod_events(pod, *_MOUNT_EVENTS)
    if mounts:
        last = mounts[-1]
        findings.insert(
            0,
            _Finding(
                R.VOLUME_MOUNT_FAILED,
                text(last, "message") or "",
                raw_reason=text(last, "reason"),
                raw_message=text(last, "message"),
                since=_event_first_time(mounts[0]),
            ),
        )
        return findings
    findings.append(
        _Finding(
            R.CONTAINER_CREATING,
            f"on node {node_name}" if node_name else "",
            raw_reason=reason or "ContainerCreating",
            raw_message=message,
            since=ready_since,
        )
    )
    return findings


def _pending(reader: _Reader, pod: Mapping[str, Any]) -> tuple[list[_Finding], Link]:
    if text(pod, "spec", "nodeName"):
        findings = _waiting(reader, pod)
        # A container in CrashLoopBackOff was created and ran: the runtime passed.
        crashing = findings[0].reason is R.CRASH_LOOP
        return findings, Link.TRAINING if crashing else Link.RUNTIME
    scheduled = _conditions(pod).get("PodScheduled")
    gates = [g for g in (text(g, "name") for g in as_list(pod, "spec", "schedulingGates")) if g]
    created = timestamp(pod, "metadata", "creationTimestamp")
    if gates or text(scheduled, "reason") == "SchedulingGated":
        detail = f"gates: {', '.join(gates)}" if gates else ""
        return [
            _Finding(
                R.SCHEDULING_GATED,
                detail,
                raw_reason="SchedulingGated",
                raw_message=text(scheduled, "message"),
                since=_since(timestamp(scheduled, "lastTransitionTime"), created),
            )
        ], Link.SCHEDULER
    events = reader.pod_events(pod, "FailedScheduling")
    condition_message = text(scheduled, "message") if text(scheduled, "status") == "False" else None
    message = condition_message
    raw_reason = text(scheduled, "reason") if condition_message else None
    since = timestamp(scheduled, "lastTransitionTime")
    if events:
        latest = events[-1]
        event_time = _event_time(latest)
        # The condition holds the latest verdict; an event newer than it says more.
        if message is None or (since is not None and event_time is not None and event_time > since):
            message = text(latest, "message") or message
            raw_reason = raw_reason or "FailedScheduling"
        since = since or _event_first_time(events[0])
    if message:
        return _unschedulable(
            reader, pod, message, raw_reason or "Unschedulable", since
        ), Link.SCHEDULER
    return [
        _Finding(
            R.SCHEDULING,
            "the scheduler has not given its verdict yet",
            raw_reason=text(scheduled, "reason"),
            raw_message=text(scheduled, "message"),
            since=created,
        )
    ], Link.SCHEDULER
