"""What one diagnosis reads from the snapshot, and the findings it makes of it.

Shared by every module of the package: the reader (the job's Kubernetes Job, its
Pods, events by object, the notes it makes), a finding before it becomes a
Blocker, and small readers of conditions, container states and event times.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from functools import cached_property
from operator import itemgetter
from typing import Any, Literal

from kubetrain.domain.diagnosis.result import AttemptView, Blocker, JobFacts, PodReport
from kubetrain.domain.fit import FitAnalysis
from kubetrain.domain.manifest import (
    ANNOTATION_RESTART,
    ANNOTATION_RETRIES,
    ANNOTATION_RETRIES_USED,
    COMPLETION_INDEX,
    CONTAINER_NAME,
    IN_PLACE,
    LABEL_ATTEMPT,
)
from kubetrain.domain.nodes import NodeInfo
from kubetrain.domain.objects import as_list, as_map, as_time, get, meta_name, text, timestamp
from kubetrain.domain.reasons import CATALOG
from kubetrain.domain.snapshot import Snapshot, SnapshotIndex
from kubetrain.domain.states import ReasonCode

# Most notes a diagnosis carries; a dump with thousands of bad nodes says so once.
_MAX_NOTES = 20
_EPOCH = datetime.min.replace(tzinfo=UTC)


@dataclass
class _Finding:
    """A reason found while reading, before it becomes a Blocker or the primary."""

    reason: ReasonCode
    detail: str = ""
    # "default": the code's usual answer (the catalog's); None: cannot tell.
    waitable: bool | Literal["default"] | None = "default"
    raw_reason: str | None = None
    raw_message: str | None = None
    since: datetime | None = None
    nodes: int | None = None
    action: str | None = None  # said instead of the catalog's when the numbers say more
    numbers: dict[str, str] = field(default_factory=dict)
    position: int | None = None  # in a Kueue queue (1: next), with the jobs ahead
    ahead: tuple[str, ...] | None = None
    current: bool = True  # False: about an earlier attempt (not marked on the chain)

    def blocker(self) -> Blocker:
        waitable = CATALOG[self.reason].waitable if self.waitable == "default" else self.waitable
        return Blocker(
            reason=self.reason,
            link=CATALOG[self.reason].link,
            nodes=self.nodes,
            detail=self.detail,
            waitable=waitable,
            position=self.position,
            ahead=self.ahead,
            **self.numbers,
        )


@dataclass(frozen=True)
class GangAttempt:
    """What a gang's Job says of its attempt (`render_job`'s label and annotations)."""

    number: int
    retries: int
    retries_used: int
    job_uid: str


class _Reader:
    """What one diagnosis reads from the snapshot, with the notes it makes."""

    def __init__(self, job: JobFacts, snapshot: Snapshot, now: datetime | None = None) -> None:
        self.job = job
        self.now = now  # the diagnosis' moment: a Workload's requeueAt is judged against it
        self.index: SnapshotIndex = snapshot.index
        self.notes: list[str] = list(snapshot.skipped)
        for problem in self.index.problems[:5]:
            self.notes.append(f"could not read {problem}")
        if len(self.index.problems) > 5:
            self.notes.append(f"… and {len(self.index.problems) - 5} more unreadable fields")
        key = (job.namespace, job.k8s_name)
        self.k8s_job = self.index.jobs.get(key)
        uid = text(self.k8s_job, "metadata", "uid") if self.k8s_job else None
        pods = self.index.pods_by_job.get(key, [])
        # Each Pod read once for what the steps ask of it again and again (a gang's
        # hundreds of ranks); by id, as the Pods are held for the reader's life.
        seen = list(map(glance_of, pods))
        self.glances = dict(zip(map(id, pods), seen, strict=True))
        attempt = text(self.k8s_job, "metadata", "labels", LABEL_ATTEMPT) if self.k8s_job else None
        if uid or attempt:
            # A Job deleted and created again under the same name owns new Pods only; a
            # gang restarted in place owns every attempt's Pods: the current one's only.
            kept = [
                (g.order, i)
                for i, g in enumerate(seen)
                if (not uid or g.owner_uid in (uid, None))
                and (not attempt or g.attempt in (attempt, None))
            ]
        else:
            kept = [(g.order, i) for i, g in enumerate(seen)]
        kept.sort()
        order = list(map(itemgetter(1), kept))
        self.pods: list[dict[str, Any]] = list(map(pods.__getitem__, order))
        # The glances of `pods`, in their order.
        self.seen: list[PodGlance] = list(map(seen.__getitem__, order))
        # Rebuilt by attempts.py right after, from the Pods and events this reader reads.
        self.attempts: tuple[AttemptView, ...] = ()
        self.fit: FitAnalysis | None = None  # set when scheduling is read
        self._events: dict[tuple[str, str], tuple[dict[str, Any], ...]] = {}

    @cached_property
    def workers(self) -> int:
        """The gang's size: an Indexed Job's completions; 1 for any other Job."""
        if text(self.k8s_job, "spec", "completionMode") != "Indexed":
            return 1
        completions = get(self.k8s_job, "spec", "completions")
        if isinstance(completions, bool) or not isinstance(completions, int):
            return 1
        return max(completions, 1)

    @cached_property
    def gang_attempt(self) -> GangAttempt | None:
        """The attempt a gang's Job is, with the retries it may use, as kubetrain rendered
        them; None for a single Pod, and for a gang Job kubetrain does not restart (one it
        rendered before gangs restarted, or anyone else's)."""
        if self.workers == 1:
            return None
        number = _index(text(self.k8s_job, "metadata", "labels", LABEL_ATTEMPT))
        retries = _index(text(self.k8s_job, "metadata", "annotations", ANNOTATION_RETRIES))
        used = _index(text(self.k8s_job, "metadata", "annotations", ANNOTATION_RETRIES_USED))
        uid = text(self.k8s_job, "metadata", "uid")
        if number is None or number < 1 or retries is None or used is None or not uid:
            return None
        return GangAttempt(number, retries, used, uid)

    @cached_property
    def in_place(self) -> bool:
        """A gang restarted in place (under Kueue): one Job for every attempt."""
        return text(self.k8s_job, "metadata", "annotations", ANNOTATION_RESTART) == IN_PLACE

    @cached_property
    def workloads(self) -> list[dict[str, Any]]:
        """The Job's Kueue Workloads: those its uid owns (an earlier attempt's Job of the
        same name owned the others); by name when the Job or the owner reference has no
        uid (a Job gone, a hand-made dump)."""
        named = self.index.workloads_by_job.get((self.job.namespace, self.job.k8s_name), [])
        uid = text(self.k8s_job, "metadata", "uid") if self.k8s_job else None
        if not uid:
            return list(named)
        owned = self.index.workloads_by_job_uid.get(uid, [])
        unowned = [w for w in named if not _owner_uids(w)]
        return [*owned, *(w for w in unowned if w not in owned)]

    def glance(self, pod: Mapping[str, Any]) -> PodGlance:
        """What the steps read of `pod` again and again, read once per reader."""
        try:
            return self.glances[id(pod)]
        except KeyError:  # not one of the job's Pods
            return glance_of(pod)

    def rank_of(self, pod: object) -> int | None:
        """A gang Pod's index (the Job controller's annotation, else its name
        `<job>-<index>-<suffix>`); None outside a gang."""
        if self.workers == 1:
            return None
        seen = self.glances.get(id(pod))
        if seen is None:
            found = _index(text(pod, "metadata", "annotations", COMPLETION_INDEX))
            return found if found is not None else self._rank_in_name(meta_name(pod))
        return self.rank_of_glance(seen)

    def rank_of_glance(self, seen: PodGlance) -> int | None:
        """As `rank_of`, for a Pod read already."""
        if self.workers == 1:
            return None
        return seen.rank if seen.rank is not None else self._rank_in_name(seen.name)

    def _rank_in_name(self, name: str | None) -> int | None:
        prefix = self.job.k8s_name + "-"
        if name and name.startswith(prefix):
            return _index(name[len(prefix) :].partition("-")[0])
        return None

    @cached_property
    def reports(self) -> dict[str, PodReport]:
        """What each Pod last reported of its phase, by Pod name (`reported_phase`, the
        job's, counts for its Pod where the Pod's own is not given)."""
        found = {r.pod: r for r in self.job.pod_reports}
        reported = self.job.reported_phase
        if reported is not None and reported[0] not in found:
            found[reported[0]] = PodReport(reported[0], reported[1], reported[2])
        return found

    @cached_property
    def nodes_by_name(self) -> dict[str, NodeInfo]:
        # Only a waiting container's node is looked up: not built for every job.
        return {n.name: n for n in self.index.nodes}

    def note(self, message: str) -> None:
        if message not in self.notes and len(self.notes) < _MAX_NOTES:
            self.notes.append(message)

    def events(self, kind: str, name: str | None) -> tuple[dict[str, Any], ...]:
        """The object's events, oldest first; sorted once per reader (a gang's Job has
        one event per rank, read by several steps)."""
        if not name:
            return ()
        key = (kind, name)
        found = self._events.get(key)
        if found is None:
            unsorted = self.index.events_by_object.get((kind, self.job.namespace, name), [])
            found = self._events[key] = tuple(sorted(unsorted, key=_event_time_key))
        return found

    def node_gone(self, node: str | None) -> bool:
        """True when the snapshot lists Nodes and `node` is not among them: deleted
        (scaled down, the instance gone). A snapshot without Nodes says nothing."""
        return bool(node) and bool(self.nodes_by_name) and node not in self.nodes_by_name

    def pod_events(self, pod: object, *reasons: str) -> list[dict[str, Any]]:
        uid = text(pod, "metadata", "uid")
        return [
            e
            for e in self.events("Pod", meta_name(pod))
            if (not reasons or text(e, "reason") in reasons)
            and text(e, "involvedObject", "uid") in (None, "", uid)
        ]


class PodGlance:
    """What the diagnosis reads of one Pod at several steps (its identity, where it is,
    its main container's state), read once per version of the Pod
    (`glance_of`); what is derived from it (its attempt row, whether its preflight
    passed) is made on first use and kept with it."""

    __slots__ = (
        "attempt",
        "created",
        "created_at",
        "deleting",
        "detail",
        "gone",
        "gpus",
        "index",
        "message",
        "meta",
        "name",
        "node",
        "order",
        "owner_uid",
        "phase",
        "preflight",
        "rank",
        "reason",
        "restart_policy",
        "running",
        "spec",
        "started_at",
        "state",
        "status",
        "storage",
        "uid",
        "view",
    )

    def __init__(self, pod: Mapping[str, Any]) -> None:
        meta, spec, status = pod.get("metadata"), pod.get("spec"), pod.get("status")
        # The objects as given: `glance_of` knows this version of the Pod by them.
        self.meta: object = meta
        # As `as_map` reads them (inline: this runs per rank of a gang).
        if type(meta) is not dict and not isinstance(meta, Mapping):
            meta = {}
        if type(spec) is not dict and not isinstance(spec, Mapping):
            spec = {}
        if type(status) is not dict and not isinstance(status, Mapping):
            status = {}
        # Each field as `text` reads it: a string, else None (inline: per rank of a gang).
        get = meta.get
        self.name: str | None = name if isinstance(name := get("name"), str) else None
        self.uid: str | None = uid if isinstance(uid := get("uid"), str) else None
        self.owner_uid = _owner_uid_in(get("ownerReferences"))
        self.created: object = get("creationTimestamp")
        self.created_at = as_time(self.created)
        # Oldest first, then by name; a Pod without a creation time first of all.
        self.order = (self.created_at or _EPOCH, self.name or "")
        self.deleting = isinstance(gone := get("deletionTimestamp"), str) and bool(gone)
        annotations = get("annotations")
        index = annotations.get(COMPLETION_INDEX) if isinstance(annotations, Mapping) else None
        self.index: str | None = index if isinstance(index, str) else None
        # A gang rank's index as the Job controller annotated it (the reader's `rank_of`
        # falls back to the Pod's name).
        self.rank: int | None = _index(self.index)
        labels = get("labels")
        attempt = labels.get(LABEL_ATTEMPT) if isinstance(labels, Mapping) else None
        self.attempt: str | None = attempt if isinstance(attempt, str) else None
        get = spec.get
        self.node: str | None = node if isinstance(node := get("nodeName"), str) else None
        self.restart_policy = policy if isinstance(policy := get("restartPolicy"), str) else None
        get = status.get
        self.phase: str | None = phase if isinstance(phase := get("phase"), str) else None
        self.reason: str | None = why if isinstance(why := get("reason"), str) else None
        self.message: str | None = said if isinstance(said := get("message"), str) else None
        main = _main_status_in(get("containerStatuses"))
        self.state: str | None = None
        self.detail: Mapping[str, Any] = {}
        if main is not None:  # as `_state` reads it
            state = main.get("state")
            if type(state) is dict or isinstance(state, Mapping):
                for key in ("terminated", "running", "waiting"):
                    found = state.get(key)
                    if type(found) is dict or isinstance(found, Mapping):
                        self.state, self.detail = key, found
                        break
        self.started_at = as_time(self.detail.get("startedAt"))  # the main container's
        ended = self.phase in ("Succeeded", "Failed")
        # As `_gone`: finished, or being deleted.
        self.gone = ended or self.deleting
        # As `_running`.
        self.running = not ended and (
            self.state == "running"
            or (self.state == "terminated" and self.restart_policy == "Never")
        )
        self.spec, self.status = spec, status
        # Made on first use (attempts.py, evidence.py), then kept with the glance.
        self.view: AttemptView | None = None  # its attempt row, as last made
        self.preflight: bool | None = None  # a container ended after its preflight passed
        self.storage: bool | None = None  # it mounts a volume that is not node-local
        self.gpus: Decimal | None = None  # the GPUs it requests (gang.py)


# The Pods read already, by uid, each as its last version read: a Pod's version is
# read once however often it is diagnosed (a running gang is diagnosed again at every
# event and report of any of its ranks; its other ranks have not changed). An entry
# holds the objects it read, so the cache lets a Pod's go when it lets the Pod go
# (`forget_pods`), and at most _KEPT_GLANCES are kept (the oldest quarter dropped).
_glances: dict[str, PodGlance] = {}
_glances_lock = threading.Lock()
_KEPT_GLANCES = 16384


def glance_of(pod: Mapping[str, Any]) -> PodGlance:
    """`pod` read, or the glance of this very version of it read before."""
    meta = pod.get("metadata")
    uid = meta.get("uid") if type(meta) is dict else None
    if type(uid) is not str or not uid:
        return PodGlance(pod)
    seen = _glances.get(uid)
    if (
        seen is not None
        and seen.meta is meta
        and seen.status is pod.get("status")
        and seen.spec is pod.get("spec")
    ):
        return seen
    seen = PodGlance(pod)
    with _glances_lock:
        if len(_glances) >= _KEPT_GLANCES:
            for old in list(_glances)[: _KEPT_GLANCES // 4]:
                del _glances[old]
        _glances.pop(uid, None)  # the newest read last: dropped last
        _glances[uid] = seen
    return seen


def forget_pods(uids: Iterable[str]) -> None:
    """Let go of what was read of these Pods (deleted, or their job finished)."""
    with _glances_lock:
        for uid in uids:
            _glances.pop(uid, None)


def kept_glances() -> int:
    """How many Pods' glances are kept (for tests and benches)."""
    return len(_glances)


def _str(value: object) -> str | None:
    return value if type(value) is str or isinstance(value, str) else None


def _index(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and len(value) < 7 else None


def _running(pod: Mapping[str, Any]) -> bool:
    """The main container runs, or has just ended: a real kubelet writes the container's
    terminated state about a second before the Pod's terminal phase, and with
    restartPolicy Never (kubetrain's Pods) it is not started again. That Pod is the
    attempt that ran, finishing; never one waiting for its container to be created."""
    if text(pod, "status", "phase") in ("Succeeded", "Failed"):
        return False
    state, _ = _state(_main_status(pod))
    return state == "running" or (
        state == "terminated" and text(pod, "spec", "restartPolicy") == "Never"
    )


def _gone(pod: Mapping[str, Any]) -> bool:
    return text(pod, "status", "phase") in ("Succeeded", "Failed") or bool(
        text(pod, "metadata", "deletionTimestamp")
    )


def _owner_uid_in(refs: object) -> str | None:
    if type(refs) is list:
        for ref in refs:
            if (type(ref) is dict or isinstance(ref, Mapping)) and ref.get("kind") == "Job":
                return _str(ref.get("uid"))
    return None


def _event_time(event: object) -> datetime | None:
    return (
        timestamp(event, "lastTimestamp")
        or timestamp(event, "eventTime")
        or timestamp(event, "firstTimestamp")
        or timestamp(event, "metadata", "creationTimestamp")
    )


def _event_first_time(event: object) -> datetime | None:
    return (
        timestamp(event, "firstTimestamp")
        or timestamp(event, "eventTime")
        or timestamp(event, "metadata", "creationTimestamp")
    )


def _event_time_key(event: object) -> tuple[datetime, str]:
    return (_event_time(event) or datetime.min.replace(tzinfo=UTC), meta_name(event) or "")


def _conditions(obj: object) -> dict[str, Mapping[str, Any]]:
    return _conditions_in(get(obj, "status", "conditions"))


def _conditions_in(listed: object) -> dict[str, Mapping[str, Any]]:
    """The conditions of a `status.conditions` value by type (the last of a type)."""
    found: dict[str, Mapping[str, Any]] = {}
    if type(listed) is list:
        for cond in listed:
            if type(cond) is dict or isinstance(cond, Mapping):
                ctype = cond.get("type")
                if ctype and isinstance(ctype, str):
                    found[ctype] = cond
    return found


def _true(conditions: Mapping[str, Mapping[str, Any]], ctype: str) -> Mapping[str, Any] | None:
    cond = conditions.get(ctype)
    return cond if cond is not None and text(cond, "status") == "True" else None


def _main_status(pod: object, key: str = "containerStatuses") -> Mapping[str, Any] | None:
    return _main_status_in(get(pod, "status", key))


def _main_status_in(listed: object) -> Mapping[str, Any] | None:
    """The trainer's status among a Pod's container statuses, else the first."""
    first = None
    if type(listed) is list:
        for status in listed:
            if type(status) is dict or isinstance(status, Mapping):
                if status.get("name") == CONTAINER_NAME:
                    return status
                if first is None:
                    first = status
    return first


def _state(status: object) -> tuple[str | None, Mapping[str, Any]]:
    state = as_map(status, "state")
    for name in ("terminated", "running", "waiting"):
        found = state.get(name)
        if type(found) is dict or isinstance(found, Mapping):
            return name, found
    return None, {}


# What `kubetrain run` prints before it execs the training (runtime/cli.py).
_PREFLIGHT_LINE = "kubetrain preflight: "


def _without_preflight_lines(message: str | None) -> str | None:
    """A termination message that is the log's tail (FallbackToLogsOnError) begins with
    the preflight's lines, which passed: the training's own last words are the rest."""
    if not message:
        return message
    lines = [line for line in message.splitlines() if not line.startswith(_PREFLIGHT_LINE)]
    return "\n".join(lines).strip() or message


def _owner_uids(workload: Mapping[str, Any]) -> list[str]:
    return [
        str(text(ref, "uid"))
        for ref in as_list(workload, "metadata", "ownerReferences")
        if text(ref, "kind") == "Job" and text(ref, "uid")
    ]
