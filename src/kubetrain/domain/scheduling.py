"""The scheduler's `FailedScheduling` verdict, read into tokens and fields.

kube-scheduler writes one message per failed attempt (FitError.Error in
pkg/scheduler/framework):

    0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated
    taint {nvidia.com/gpu: present}. preemption: 0/4 nodes are available: 2 No
    preemption victims found for incoming pod, 2 Preemption is not helpful for scheduling.

i.e. `0/N nodes are available:` then either one PreFilter verdict without a
count (`persistentvolumeclaim "x" not found`) or the histogram of Filter
reasons, "COUNT REASON" sorted as strings and joined by ", ", then the
PostFilter (preemption) verdict, each closed by "." (releases before 1.27 wrote
a second "." after the preemption tail). One node may give several reasons
(NodeResourcesFit reports every short resource), so counts can add up to more
than N.

Decisions are made on `Filter` tokens and fields (resource, taint key and
value, claim name), never on message text elsewhere in kubetrain: wordings
change between releases. Known wordings per token, oldest first:

* untolerated taint: `had taints that the pod didn't tolerate` (to 1.17, no
  key), `had taint {k: v}, that the pod didn't tolerate` (1.18-1.24),
  `had untolerated taint {k: v}` (1.25+), `had untolerated taint(s)` (late
  2025: the key is no longer shown; the diagnosis finds it from the nodes);
* node selector: `didn't match node selector` (to 1.20), `didn't match Pod's
  node affinity` (1.20), `didn't match Pod's node affinity/selector` (1.21+);
* pod affinity: `didn't match pod affinity/anti-affinity` (to 1.20), then
  `didn't match pod affinity rules` / `pod anti-affinity rules` and `didn't
  satisfy existing pods anti-affinity rules`;
* unbound claims: with a count (to 1.22) and without (PreFilter, 1.23+).

A part kubetrain does not know is kept verbatim as `Filter.UNKNOWN` with its
count; the parser never drops text and never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from kubetrain.domain.nodes import CONDITION_TAINTS, is_gpu_resource
from kubetrain.domain.states import ReasonCode

__all__ = [
    "Filter",
    "SchedulingPart",
    "SchedulingVerdict",
    "parse_scheduling_message",
    "reason_of",
]

R = ReasonCode
_MAX_MESSAGE = 64 * 1024  # an Event message is at most 1 KiB; a condition far less than this


class Filter(StrEnum):
    """What one part of a verdict says, independent of its wording."""

    INSUFFICIENT = "insufficient"  # resource
    TOO_MANY_PODS = "too-many-pods"
    HOST_PORTS = "host-ports"
    UNTOLERATED_TAINT = "untolerated-taint"  # taint_key / taint_value when the message names them
    NODE_AFFINITY = "node-affinity"  # nodeSelector or required node affinity
    NODE_NAME = "node-name"
    UNSCHEDULABLE = "unschedulable"  # cordoned
    NOT_READY = "not-ready"  # old wordings: not ready, pressure, out of disk
    POD_AFFINITY = "pod-affinity"
    POD_ANTI_AFFINITY = "pod-anti-affinity"
    EXISTING_ANTI_AFFINITY = "existing-anti-affinity"
    TOPOLOGY_SPREAD = "topology-spread"
    VOLUME_NODE_AFFINITY = "volume-node-affinity"
    VOLUME_ZONE = "volume-zone"
    VOLUME_BIND = "volume-bind"  # no PersistentVolume available to bind (WaitForFirstConsumer)
    VOLUME_LIMIT = "volume-limit"
    VOLUME_IN_USE = "volume-in-use"  # disk or ReadWriteOncePod conflict
    PVC_NOT_FOUND = "pvc-not-found"  # claim
    PVC_DELETING = "pvc-deleting"  # claim
    PVC_UNBOUND = "pvc-unbound"
    STORAGE_CLASS_NOT_FOUND = "storage-class-not-found"  # claim holds the class name
    RESOURCE_CLAIM = "resource-claim"  # dynamic resource allocation
    NO_NODES = "no-nodes"
    PREEMPTION_NO_VICTIMS = "preemption-no-victims"
    PREEMPTION_NOT_HELPFUL = "preemption-not-helpful"
    PREEMPTION_NOT_ELIGIBLE = "preemption-not-eligible"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SchedulingPart:
    filter: Filter
    count: int | None  # nodes this part names; None for a verdict not per node (PreFilter)
    text: str  # the part verbatim, count included
    resource: str | None = None
    taint_key: str | None = None
    taint_value: str | None = None
    claim: str | None = None


@dataclass(frozen=True)
class SchedulingVerdict:
    message: str
    total_nodes: int | None  # N of "0/N nodes are available"; None when the message has none
    parts: tuple[SchedulingPart, ...]
    preemption: tuple[SchedulingPart, ...] = ()  # the PostFilter tail's parts
    preemption_text: str | None = None

    def count(self, *filters: Filter) -> int:
        return sum(p.count or 0 for p in self.parts if p.filter in filters)

    @property
    def unknown(self) -> tuple[SchedulingPart, ...]:
        return tuple(p for p in self.parts if p.filter is Filter.UNKNOWN)


_N = r"node\(s\) "
_TAINT_BODY = r"\{(?P<key>[^:{}]*)(?::[ ]?(?P<value>[^{}]*))?\}"
# (token, pattern) tried in order on a part without its count.
_PATTERNS: tuple[tuple[Filter, re.Pattern[str]], ...] = tuple(
    (token, re.compile(pattern + r"$", re.IGNORECASE | re.DOTALL))
    for token, pattern in (
        (Filter.INSUFFICIENT, r"Insufficient (?P<resource>\S+)"),
        (Filter.TOO_MANY_PODS, r"Too many pods"),
        (Filter.UNTOLERATED_TAINT, _N + r"had untolerated taint " + _TAINT_BODY),
        (Filter.UNTOLERATED_TAINT, _N + r"had untolerated taints?(?:\(s\))?"),
        (Filter.UNTOLERATED_TAINT, _N + r"had taints? " + _TAINT_BODY + r",? that the pod "
                                                                        r"didn't tolerate"),
        (Filter.UNTOLERATED_TAINT, _N + r"had taints? that the pod didn't tolerate"),
        (Filter.NODE_AFFINITY, _N + r"didn't match (?:Pod's )?node "
                                    r"(?:affinity/selector|affinity|selector)"),
        (Filter.NODE_NAME, _N + r"didn't match the requested (?:node name|hostname)"),
        (Filter.UNSCHEDULABLE, _N + r"were unschedulable"),
        (Filter.NOT_READY, _N + r"(?:were not ready|had (?:memory|disk|pid) pressure|were out "
                                r"of disk space|had network unavailable)"),
        (Filter.HOST_PORTS, _N + r"didn't have free ports for the requested pod ports"),
        (Filter.POD_AFFINITY, _N + r"didn't match pod affinity(?:/anti-affinity)?(?: rules)?"),
        (Filter.POD_ANTI_AFFINITY, _N + r"didn't match pod anti-affinity rules"),
        (Filter.EXISTING_ANTI_AFFINITY, _N + r"didn't satisfy existing pods anti-affinity rules"),
        (Filter.TOPOLOGY_SPREAD, _N + r"didn't match pod topology spread constraints(?: "
                                      r"\(missing required label\))?"),
        (Filter.VOLUME_NODE_AFFINITY, _N + r"had volume node affinity conflict"),
        # The wording of 1.3x (recorded: volume-node-conflict.json).
        (Filter.VOLUME_NODE_AFFINITY, _N + r"didn't match PersistentVolume's node affinity"),
        (Filter.VOLUME_ZONE, _N + r"had no available volume zone"),
        (Filter.VOLUME_BIND, _N + r"didn't find available persistent volumes to bind"),
        (Filter.VOLUME_LIMIT, _N + r"exceed max volume count"),
        (Filter.VOLUME_IN_USE, _N + r"had no available disk"),
        (Filter.VOLUME_IN_USE, r"node has pod using PersistentVolumeClaim with the same name "
                               r"and ReadWriteOncePod access mode"),
        (Filter.PVC_NOT_FOUND, r"persistentvolumeclaim \"(?P<claim>[^\"]*)\" not found"),
        (Filter.PVC_DELETING, r"persistentvolumeclaim \"(?P<claim>[^\"]*)\" is being deleted"),
        (Filter.PVC_UNBOUND, r"pod has unbound (?:immediate )?PersistentVolumeClaims"),
        (Filter.STORAGE_CLASS_NOT_FOUND, r"storageclass(?:\.storage\.k8s\.io)? "
                                         r"\"(?P<claim>[^\"]*)\" not found"),
        (Filter.RESOURCE_CLAIM, r"(?:cannot allocate all claims|resourceclaim \"[^\"]*\" not "
                                r"found|waiting for (?:the )?dynamic resource controller .*)"),
        (Filter.NO_NODES, r"no nodes available to schedule pods"),
        (Filter.PREEMPTION_NO_VICTIMS, r"No preemption victims found for incoming pod"),
        (Filter.PREEMPTION_NOT_HELPFUL, r"Preemption is not helpful for scheduling"),
        (Filter.PREEMPTION_NOT_ELIGIBLE, r"not eligible due to .*"),
    )
)  # fmt: skip
_HEADER = re.compile(r"^\s*0/(?P<total>\d{1,9}) nodes are available(?::\s*|\s*$)")
_TAIL = re.compile(r"\.?\s*preemption:\s*", re.IGNORECASE)
# Parts are split only before a count: a part's own text may hold ", " (the
# 1.18-1.24 taint wording: "had taint {k: v}, that the pod didn't tolerate").
_SPLIT = re.compile(r",\s*(?=\d{1,9} )")
_COUNTED = re.compile(r"^(?P<count>\d{1,9}) (?P<rest>.*)$", re.DOTALL)


def _part(raw: str) -> SchedulingPart:
    text = raw.strip()
    counted = _COUNTED.match(text)
    count = int(counted["count"]) if counted else None
    rest = counted["rest"] if counted else text
    for token, pattern in _PATTERNS:
        match = pattern.match(rest)
        if match is None:
            continue
        found = match.groupdict()
        key = found.get("key")
        return SchedulingPart(
            filter=token,
            count=count,
            text=text,
            resource=found.get("resource"),
            taint_key=key.strip() if key is not None else None,
            taint_value=(found.get("value") or "").strip() if key is not None else None,
            claim=found.get("claim"),
        )
    return SchedulingPart(Filter.UNKNOWN, count, text)


def _parts(body: str) -> tuple[SchedulingPart, ...]:
    body = body.strip()
    while body.endswith("."):
        body = body[:-1].rstrip()
    if not body:
        return ()
    return tuple(_part(piece) for piece in _SPLIT.split(body) if piece.strip())


def parse_scheduling_message(message: str) -> SchedulingVerdict:
    """Read a FailedScheduling message (any release's wording); never raises."""
    if not isinstance(message, str):
        return SchedulingVerdict(message="", total_nodes=None, parts=())
    message = message[:_MAX_MESSAGE]
    header = _HEADER.match(message)
    total = int(header["total"]) if header else None
    rest = message[header.end() :] if header else message
    tail = _TAIL.search(rest)
    preemption: tuple[SchedulingPart, ...] = ()
    preemption_text = None
    if tail is not None:
        preemption_text = rest[tail.end() :].strip()
        rest = rest[: tail.start()]
        inner = _HEADER.match(preemption_text)
        preemption = _parts(preemption_text[inner.end() :] if inner else preemption_text)
    return SchedulingVerdict(
        message=message,
        total_nodes=total,
        parts=_parts(rest),
        preemption=preemption,
        preemption_text=preemption_text,
    )


_REASONS: dict[Filter, ReasonCode] = {
    Filter.TOO_MANY_PODS: R.INSUFFICIENT_RESOURCE,
    Filter.HOST_PORTS: R.INSUFFICIENT_RESOURCE,
    Filter.NODE_AFFINITY: R.NODE_SELECTOR_MISMATCH,
    Filter.NODE_NAME: R.NODE_SELECTOR_MISMATCH,
    Filter.UNSCHEDULABLE: R.NODE_NOT_READY,
    Filter.NOT_READY: R.NODE_NOT_READY,
    Filter.POD_AFFINITY: R.PLACEMENT_RULES,
    Filter.POD_ANTI_AFFINITY: R.PLACEMENT_RULES,
    Filter.EXISTING_ANTI_AFFINITY: R.PLACEMENT_RULES,
    Filter.TOPOLOGY_SPREAD: R.PLACEMENT_RULES,
    Filter.VOLUME_NODE_AFFINITY: R.VOLUME_NODE_CONFLICT,
    Filter.VOLUME_ZONE: R.VOLUME_NODE_CONFLICT,
    Filter.VOLUME_IN_USE: R.VOLUME_NODE_CONFLICT,
    Filter.VOLUME_BIND: R.PVC_UNBOUND,
    Filter.VOLUME_LIMIT: R.INSUFFICIENT_RESOURCE,
    Filter.PVC_NOT_FOUND: R.PVC_NOT_FOUND,
    Filter.PVC_DELETING: R.PVC_NOT_FOUND,
    Filter.PVC_UNBOUND: R.PVC_UNBOUND,
    Filter.STORAGE_CLASS_NOT_FOUND: R.PVC_UNBOUND,
    Filter.RESOURCE_CLAIM: R.INSUFFICIENT_RESOURCE,
    Filter.NO_NODES: R.NODE_NOT_READY,
}


def reason_of(part: SchedulingPart, *, gpu_advertised: bool | None = None) -> ReasonCode | None:
    """The catalog code a part maps to; None for preemption notes and unknown parts.

    `gpu_advertised` says whether any node advertises the GPU resource a
    shortage names: False turns `Insufficient nvidia.com/gpu` into NO_GPU_NODES.
    """
    if part.filter is Filter.INSUFFICIENT:
        resource = part.resource or ""
        if is_gpu_resource(resource):
            return R.NO_GPU_NODES if gpu_advertised is False else R.INSUFFICIENT_GPU
        if resource == "cpu":
            return R.INSUFFICIENT_CPU
        if resource == "memory":
            return R.INSUFFICIENT_MEMORY
        return R.INSUFFICIENT_RESOURCE
    if part.filter is Filter.UNTOLERATED_TAINT:
        return R.NODE_NOT_READY if part.taint_key in CONDITION_TAINTS else R.UNTOLERATED_TAINT
    return _REASONS.get(part.filter)
