"""What holds a Pod that has not started: scheduling gates, the scheduler (see
unschedulable.py), or, on its node, a waiting container (image, configuration,
crash loop, volume mount, creation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubetrain.domain.diagnosis.mounts import MOUNT_EVENTS, mount_findings
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
from kubetrain.domain.manifest import CONTAINER_NAME
from kubetrain.domain.objects import as_list, as_map, get, integer, text, timestamp
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


def _since(*moments: datetime | None) -> datetime | None:
    return next((m for m in moments if m is not None), None)


# Waiting reasons that say a container cannot start as things are (see _waiting).
_FAILING = _IMAGE_PULL | _CONFIG | {"CrashLoopBackOff"}


@dataclass(frozen=True)
class _Container:
    """The container that holds a Pod: its status, its spec, and what it is."""

    name: str
    role: str  # "init container", "sidecar" (an init container that keeps running), "container"
    status: Mapping[str, Any] | None
    spec: Mapping[str, Any] | None
    named: bool  # the Pod has several containers: say which


def _blocking_container(pod: Mapping[str, Any]) -> _Container:
    """The container a Pod that has not started waits on, as the kubelet starts them:
    the init containers in order (a sidecar, restartPolicy Always, keeps running and
    need only start), then the main containers, the trainer first.

    A container whose waiting reason is a failure (image, configuration, crash loop)
    holds the Pod wherever it stands; otherwise the first init container that has not
    finished (a sidecar not yet started); otherwise the trainer. While an init
    container runs the kubelet reports every main container as waiting
    "PodInitializing", which says nothing about them (kubelet_pods.go,
    convertToAPIContainerStatuses, Kubernetes 1.32).
    """
    specs = [
        (c, "sidecar" if text(c, "restartPolicy") == "Always" else "init container")
        for c in as_list(pod, "spec", "initContainers")
        if isinstance(c, Mapping)
    ]
    mains = [c for c in as_list(pod, "spec", "containers") if isinstance(c, Mapping)]
    mains.sort(key=lambda c: text(c, "name") != CONTAINER_NAME)
    specs += [(c, "container") for c in mains]
    statuses = {
        text(s, "name"): s
        for key in ("initContainerStatuses", "containerStatuses")
        for s in as_list(pod, "status", key)
        if isinstance(s, Mapping)
    }
    named = len(specs) > 1
    ordered = [
        _Container(text(c, "name") or "?", role, statuses.get(text(c, "name")), c, named)
        for c, role in specs
    ]
    for container in ordered:
        state, detail = _state(container.status)
        if state == "waiting" and text(detail, "reason") in _FAILING:
            return container
    for container in ordered:
        if container.role == "container":
            break
        state, detail = _state(container.status)
        if container.role == "sidecar":
            if not get(container.status, "started"):
                return container
        elif not (state == "terminated" and integer(detail, "exitCode") == 0):
            return container
    main = _main_status(pod)
    name = text(main, "name")
    spec = next((c for c in mains if text(c, "name") == name), mains[0] if mains else None)
    return _Container(name or CONTAINER_NAME, "container", main, spec, named)


def _about(event: object, container: str) -> bool:
    """Whether a Pod's event is about `container` (or about no container in particular)."""
    path = text(event, "involvedObject", "fieldPath")
    return not path or path.endswith(f"{{{container}}}")


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
    container = _blocking_container(pod)
    status = container.status
    state, detail = _state(status)
    reason, message = text(detail, "reason"), text(detail, "message")
    # "init container setup: ..." when the Pod has more than one container to blame.
    who = f"{container.role} {container.name}: " if container.named else ""
    ready_since = timestamp(_conditions(pod).get("Ready"), "lastTransitionTime") or timestamp(
        pod, "status", "startTime"
    )
    if state == "waiting" and reason in _IMAGE_PULL:
        # The kubelet's events name the container (fieldPath spec.initContainers{setup}).
        failed = [e for e in reader.pod_events(pod, "Failed") if _about(e, container.name)]
        # A real kubelet follows each "Failed to pull image …: <the runtime's words>"
        # with "Error: ErrImagePull" / "Error: ImagePullBackOff", which only repeat
        # the waiting reason: the last event that says more is the cause.
        telling = [e for e in failed if not _REASON_ECHO.fullmatch(text(e, "message") or "")]
        said = text((telling or failed)[-1], "message") if failed else None
        since = _since(_event_first_time(failed[0]) if failed else None, ready_since)
        image = text(container.spec, "image")
        detail_text = who + (f"image {image}" if image else "the image")
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
                who + (message or reason or ""),
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
                f"{who}last exit code {exit_code}" + (f": {last_words}" if last_words else ""),
                raw_reason=reason,
                raw_message=message,
                since=ready_since,
            ),
        )
        return findings
    mounts = mount_findings(
        reader.pod_events(pod, *MOUNT_EVENTS), text(pod, "metadata", "namespace")
    )
    if mounts:
        return [*mounts, *findings]
    where = f"on node {node_name}" if node_name else ""
    raw_reason: str | None = reason or "ContainerCreating"
    raw_message = message
    if container.role != "container":
        # The kubelet's own words: Initialized False, ContainersNotInitialized,
        # "containers with incomplete status: [setup]".
        initialized = _conditions(pod).get("Initialized")
        if text(initialized, "status") == "False":
            raw_reason, raw_message = text(initialized, "reason"), text(initialized, "message")
        # An init container or sidecar still starting (or running, for an init
        # container): nothing has failed, and the main container waits for it.
        where = f"{container.role} {container.name} has not finished" + (
            f" {where}" if where else ""
        )
        if container.role == "sidecar":
            where = where.replace("has not finished", "has not started")
    findings.append(
        _Finding(
            R.CONTAINER_CREATING,
            where,
            raw_reason=raw_reason,
            raw_message=raw_message,
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


def restarting_sidecars(reader: _Reader, pod: Mapping[str, Any]) -> list[_Finding]:
    """The native sidecars (init containers with restartPolicy Always) of a Pod whose
    trainer runs that keep failing: restarted at least once and not running now, or
    restarted more than once after a failure, even while it runs again a moment.

    Kubelet 1.33 shows a sidecar in its back-off as `terminated` (exit code, reason
    Error) with a growing restartCount and `BackOff` events, never as waiting
    CrashLoopBackOff (recorded: real-sidecar-restarting.json); a waiting one is read
    the same way."""
    if not reader.glance(pod).spec.get("initContainers"):
        return []  # most Pods: no init containers at all
    sidecars = [
        spec
        for spec in as_list(pod, "spec", "initContainers")
        if text(spec, "restartPolicy") == "Always"
    ]
    if not sidecars:
        return []
    statuses = {
        text(s, "name"): s
        for s in as_list(pod, "status", "initContainerStatuses")
        if isinstance(s, Mapping)
    }
    found: list[_Finding] = []
    for spec in sidecars:
        name = text(spec, "name") or "?"
        status = statuses.get(name)
        restarts = integer(status, "restartCount") or 0
        state, detail = _state(status)
        last = detail if state == "terminated" else as_map(status, "lastState", "terminated")
        # Between two failures a sidecar runs a moment: one that failed more than once
        # stays named then, so the job does not flip back to TRAINING at each restart.
        looping = restarts >= 2 and integer(last, "exitCode") not in (0, None)
        if restarts < 1 or state is None or (state == "running" and not looping):
            continue
        code = integer(last, "exitCode")
        ended = text(last, "reason")
        words = _without_preflight_lines(text(last, "message"))
        backoff = [e for e in reader.pod_events(pod, "BackOff") if _about(e, name)]
        said = f"sidecar {name} restarted {restarts} time{'s' * (restarts != 1)}"
        said += f"; last exit code {code}" + (f" ({ended})" if ended else "")
        said += f": {words}" if words else ""
        said += "; the trainer runs meanwhile"
        found.append(
            _Finding(
                R.SIDECAR_RESTARTING,
                said,
                raw_reason=text(backoff[-1], "reason") if backoff else ended,
                raw_message=text(backoff[-1], "message") if backoff else text(last, "message"),
                since=_event_first_time(backoff[0]) if backoff else timestamp(last, "finishedAt"),
            )
        )
    return found
