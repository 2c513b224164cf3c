"""Which links of the chain the objects show were passed, and which nobody saw.

The stage logic (outcome.py) marks every link before the job's stage as
passed; this module keeps a `passed` only where something says so, and
otherwise marks the link `not-observed` (it may have passed; nothing told us)
or `not-needed` (the job does not use it). The evidence each link needs:

| link          | passed when                                                        |
|---------------|--------------------------------------------------------------------|
| control-plane | the Job exists (or existed: a Pod of it does)                      |
| quota         | a Pod of the job was admitted (exists), or the Job counts Pods     |
| scheduler     | a Pod was bound to a node                                          |
| gpu-node      | the node's kubelet admitted the Pod (it reports its containers)    |
| device-plugin | not needed without GPUs; passed when the kubelet admitted the Pod  |
|               | (the device manager allocates at admission)                        |
| runtime       | a container started                                                |
| volume        | not needed without volumes from storage; passed once the kubelet   |
|               | went past mounting: a container started, or its image or config    |
|               | failed (the kubelet mounts volumes before it pulls and creates)    |
| preflight     | the runtime reported its phase, or a container's last words (the   |
|               | log's tail) hold the preflight's lines and it did not exit with    |
|               | the preflight's code                                               |
| training      | the runtime reported TRAINING, or the Job completed                |
| job           | the Job completed                                                  |
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Any

from kubetrain.domain.diagnosis.reading import _PREFLIGHT_LINE, _Reader
from kubetrain.domain.diagnosis.result import ChainMark, ChainState
from kubetrain.domain.manifest import PREFLIGHT_EXIT_CODE
from kubetrain.domain.objects import as_list, as_map, get, text
from kubetrain.domain.states import Link

# Waiting reasons the kubelet gives only after the Pod's volumes are mounted.
_AFTER_MOUNT = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
# Volume sources that come from storage a link of the chain can fail on; a Secret,
# ConfigMap, emptyDir, downward API or projected token is the kubelet's own work.
_LOCAL_VOLUMES = frozenset({"secret", "configMap", "emptyDir", "downwardAPI", "projected"})
_LOCAL_VOLUMES_AND_NAME = _LOCAL_VOLUMES | {"name"}


def evidenced(marks: tuple[ChainMark, ...], reader: _Reader) -> tuple[ChainMark, ...]:
    """`marks` with each `passed` that no object shows made `not-observed`, and the
    links the job does not use made `not-needed` (where they were passed or not reached)."""
    seen = _Seen.of(reader)
    out = []
    for mark in marks:
        state = mark.state
        if state in (ChainState.PASSED, ChainState.NOT_REACHED):
            if not seen.needed(mark.link):
                state = ChainState.NOT_NEEDED
            elif state is ChainState.PASSED and not seen.passed(mark.link):
                state = ChainState.NOT_OBSERVED
        out.append(ChainMark(mark.link, state))
    return tuple(out)


class _Seen:
    """What the objects show, each read only when a mark asks (a running gang's marks
    ask few questions, and most are answered by its first Pod)."""

    def __init__(self, reader: _Reader) -> None:
        self.reader = reader
        job = reader.k8s_job
        self.pods = reader.pods
        self.status = as_map(job, "status") if job is not None else {}
        self.job = job is not None or bool(self.pods)
        phase = reader.job.reported_phase
        self.reported = phase[1] if phase is not None else None

    @classmethod
    def of(cls, reader: _Reader) -> _Seen:
        return cls(reader)

    @cached_property
    def counted(self) -> bool:
        return any(_count(self.status, key) for key in ("active", "succeeded", "failed"))

    @cached_property
    def counted_done(self) -> bool:
        return _count(self.status, "succeeded") > 0

    @cached_property
    def specs(self) -> list[Mapping[str, Any]]:
        job = self.reader.k8s_job
        template = as_map(job, "spec", "template", "spec") if job is not None else {}
        return [g.spec for g in self.reader.seen] or [template]

    @cached_property
    def admitted(self) -> bool:
        return bool(self.pods) or self.counted

    @cached_property
    def bound(self) -> bool:
        return any(text(p, "spec", "nodeName") for p in self.pods) or self.counted

    @cached_property
    def admitted_on_node(self) -> bool:
        return any(_kubelet_answered(p) for p in self.pods) or self.counted_done

    @cached_property
    def mounted(self) -> bool:
        return any(_past_mounting(p) for p in self.pods) or self.counted_done

    @cached_property
    def started(self) -> bool:
        return any(_started(p) for p in self.pods) or self.counted_done

    @cached_property
    def gpus(self) -> bool:
        # Pod by Pod, not `specs`: the first of a gang's ranks answers.
        specs = (g.spec for g in self.reader.seen) if self.pods else self.specs
        return any(_requests_gpu(s) for s in specs) or bool(self.reader.job.gpus)

    @cached_property
    def volumes(self) -> bool:
        if not self.pods:
            return any(_storage_volume(v) for s in self.specs for v in as_list(s, "volumes"))
        for seen in self.reader.seen:
            if seen.storage is None:  # kept with the glance: read once per Pod version
                seen.storage = any(_storage_volume(v) for v in as_list(seen.spec, "volumes"))
            if seen.storage:
                return True
        return False

    @cached_property
    def preflight_ran(self) -> bool:
        for seen in self.reader.seen:
            if seen.preflight is None:  # kept with the glance: read once per Pod version
                seen.preflight = any(_preflight_passed(s) for s in _statuses_in(seen.status))
            if seen.preflight:
                return True
        return False

    @cached_property
    def completed(self) -> bool:
        return _completed(self.status)

    def needed(self, link: Link) -> bool:
        if link is Link.DEVICE_PLUGIN:
            return self.gpus
        if link is Link.VOLUME:
            return self.volumes
        return True

    def passed(self, link: Link) -> bool:
        match link:
            case Link.CONTROL_PLANE:
                return self.job
            case Link.QUOTA:
                return self.admitted
            case Link.SCHEDULER:
                return self.bound
            case Link.GPU_NODE | Link.DEVICE_PLUGIN:
                return self.admitted_on_node
            case Link.VOLUME:
                return self.mounted
            case Link.RUNTIME:
                return self.started
            case Link.PREFLIGHT:
                return self.reported is not None or self.preflight_ran
            case Link.TRAINING:
                return self.reported == "TRAINING" or self.completed
            case Link.JOB:
                return self.completed
        return False


def _count(status: Mapping[str, Any], key: str) -> int:
    value = get(status, key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _completed(status: Mapping[str, Any]) -> bool:
    return any(
        text(c, "type") == "Complete" and text(c, "status") == "True"
        for c in as_list(status, "conditions")
    )


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return _statuses_in(as_map(pod, "status"))


def _statuses_in(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A Pod's container statuses, init containers' first, from its `status`."""
    found = []
    for key in ("initContainerStatuses", "containerStatuses"):
        listed = status.get(key)
        if type(listed) is list:
            found += [s for s in listed if type(s) is dict or isinstance(s, Mapping)]
    return found


def _kubelet_answered(pod: Mapping[str, Any]) -> bool:
    """The node's kubelet took the Pod up: it reports containers, or it failed the Pod
    itself (an admission error names the device plugin, not the node)."""
    return bool(_statuses(pod)) or (
        bool(text(pod, "spec", "nodeName")) and text(pod, "status", "phase") == "Failed"
    )


def _preflight_passed(status: Mapping[str, Any]) -> bool:
    for key in ("state", "lastState"):
        state = status.get(key)
        if not isinstance(state, Mapping) or state.get("terminated") is None:
            continue  # a running or waiting container has said nothing yet
        code = get(state, "terminated", "exitCode")
        message = text(state, "terminated", "message") or ""
        if (
            isinstance(code, int)
            and code != PREFLIGHT_EXIT_CODE
            and any(line.startswith(_PREFLIGHT_LINE) for line in message.splitlines())
        ):
            return True
    return False


def _past_mounting(pod: Mapping[str, Any]) -> bool:
    return _started(pod) or any(
        text(s, "state", "waiting", "reason") in _AFTER_MOUNT for s in _statuses(pod)
    )


def _started(pod: Mapping[str, Any]) -> bool:
    """Some container of the Pod ran: running, or terminated after it started."""
    for key in ("containerStatuses", "initContainerStatuses"):
        for status in as_list(pod, "status", key):
            state = as_map(status, "state")
            last = as_map(status, "lastState")
            if "running" in state or any(
                text(s, "terminated", "startedAt")
                or isinstance(get(s, "terminated", "exitCode"), int)
                for s in (state, last)
                if "terminated" in s
            ):
                return True
    return False


def _requests_gpu(spec: Mapping[str, Any]) -> bool:
    for container in as_list(spec, "containers"):
        for section in ("requests", "limits"):
            for name in as_map(container, "resources", section):
                if isinstance(name, str) and name.endswith("/gpu"):
                    return True
    return False


def _storage_volume(volume: object) -> bool:
    if not isinstance(volume, Mapping):
        return False
    return not volume.keys() <= _LOCAL_VOLUMES_AND_NAME
