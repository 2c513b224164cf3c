"""What `kubetrain nodes` shows: each node's accelerators, resources and health,
and where each pending kubetrain Pod could go.

Pure: it reads a `Snapshot` (Nodes and the Pods bound to them) and computes
the table. Requested is the sum of the requests of the Pods bound to the node
that are not Succeeded/Failed, the way kube-scheduler counts it (the same
usage the diagnosis' fit table reads); free is allocatable minus requested.
For a pending Pod, the per-node verdict is `analyze_fit`'s, so `nodes` and
`why` never disagree about a node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubetrain.domain.fit import FitAnalysis, analyze_fit
from kubetrain.domain.manifest import LABEL_JOB_ID, LABEL_NAME
from kubetrain.domain.nodes import NodeInfo, is_gpu_resource, pod_requests
from kubetrain.domain.objects import as_list, as_map, get, labels, meta_name, meta_namespace, text
from kubetrain.domain.quantity import QuantityError, format_quantity, parse_quantity
from kubetrain.domain.snapshot import Snapshot

__all__ = [
    "ACCELERATOR_LABELS",
    "Amounts",
    "Inventory",
    "NodeRow",
    "PendingRow",
    "inventory",
]

# Where a node says which accelerator it has, most specific first: our own
# pools' label, NVIDIA GPU feature discovery, GKE, Karpenter on AWS.
ACCELERATOR_LABELS = (
    "accelerator",
    "nvidia.com/gpu.product",
    "cloud.google.com/gke-accelerator",
    "karpenter.k8s.aws/instance-gpu-name",
)
CONDITIONS = ("Ready", "DiskPressure", "MemoryPressure")
_TERMINAL = frozenset({"Succeeded", "Failed"})
_ZERO = Decimal(0)
# Node names listed in a pending Pod's line before "and N more".
_NAMES_SHOWN = 4


def _q(value: Decimal) -> str:
    return format_quantity(value)


@dataclass(frozen=True)
class Amounts:
    """One resource of one node."""

    capacity: Decimal
    allocatable: Decimal
    requested: Decimal

    @property
    def free(self) -> Decimal:
        return max(self.allocatable - self.requested, _ZERO)

    def to_json(self) -> dict[str, str]:
        return {
            "capacity": _q(self.capacity),
            "allocatable": _q(self.allocatable),
            "requested": _q(self.requested),
            "free": _q(self.free),
        }


@dataclass(frozen=True)
class NodeRow:
    name: str
    accelerator: str | None  # the accelerator label's value
    gpu_resource: str | None  # "nvidia.com/gpu" (None: the node advertises no accelerator)
    gpu: Amounts
    cpu: Amounts
    memory: Amounts
    taints: tuple[str, ...]
    conditions: Mapping[str, str | None]  # Ready, DiskPressure, MemoryPressure -> status
    cordoned: bool
    pods: int  # Pods bound to it that are not finished

    @property
    def ready(self) -> bool:
        return self.conditions.get("Ready") == "True"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "accelerator": self.accelerator,
            "gpu_resource": self.gpu_resource,
            "gpu": self.gpu.to_json(),
            "cpu": self.cpu.to_json(),
            "memory": self.memory.to_json(),
            "taints": list(self.taints),
            "conditions": dict(self.conditions),
            "cordoned": self.cordoned,
            "pods": self.pods,
        }


@dataclass(frozen=True)
class PendingRow:
    """A kubetrain Pod the scheduler has not placed, and where it could go."""

    namespace: str
    pod: str
    job: str  # the kubetrain job's name, else its Kubernetes Job
    job_id: str
    requests: str  # "8 nvidia.com/gpu, 2 cpu, 8Gi memory"
    fits_now: tuple[str, ...]  # nodes it fits on right now
    fits_later: tuple[str, ...]  # nodes it fits on once other Pods finish
    verdict: str  # one sentence, in plain words

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "job": self.job,
            "job_id": self.job_id,
            "requests": self.requests,
            "fits_now": list(self.fits_now),
            "fits_later": list(self.fits_later),
            "verdict": self.verdict,
        }


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[NodeRow, ...]
    pending: tuple[PendingRow, ...]
    problems: tuple[str, ...] = ()  # what could not be read

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [n.to_json() for n in self.nodes],
            "pending": [p.to_json() for p in self.pending],
            "problems": list(self.problems),
        }


def _capacity(node: object, problems: list[str]) -> dict[str, Decimal]:
    found: dict[str, Decimal] = {}
    for key, raw in as_map(node, "status", "capacity").items():
        if not isinstance(key, str):
            continue
        try:
            found[key] = parse_quantity(raw)
        except QuantityError:
            problems.append(f"node {meta_name(node)}: capacity {key}: {raw!r} is not a quantity")
    return found


def _gpu_resource(resources: Sequence[str]) -> str | None:
    gpus = sorted(r for r in resources if is_gpu_resource(r))
    if not gpus:
        return None
    return "nvidia.com/gpu" if "nvidia.com/gpu" in gpus else gpus[0]


def _node_row(
    info: NodeInfo, capacity: Mapping[str, Decimal], used: Mapping[str, Decimal], pods: int
) -> NodeRow:
    gpu = _gpu_resource([*capacity, *info.allocatable])

    def amounts(resource: str | None) -> Amounts:
        if resource is None:
            return Amounts(_ZERO, _ZERO, _ZERO)
        alloc = info.allocatable.get(resource, _ZERO)
        return Amounts(capacity.get(resource, alloc), alloc, used.get(resource, _ZERO))

    accelerator = next((info.labels[k] for k in ACCELERATOR_LABELS if info.labels.get(k)), None)
    return NodeRow(
        name=info.name,
        accelerator=accelerator,
        gpu_resource=gpu,
        gpu=amounts(gpu),
        cpu=amounts("cpu"),
        memory=amounts("memory"),
        taints=tuple(str(t) for t in info.taints),
        conditions={c: info.conditions.get(c) for c in CONDITIONS},
        cordoned=info.unschedulable,
        pods=pods,
    )


def _pending(pod: Mapping[str, Any]) -> bool:
    if text(pod, "spec", "nodeName") or text(pod, "status", "phase") not in (None, "Pending"):
        return False
    return any(
        text(c, "type") == "PodScheduled" and text(c, "status") == "False"
        for c in as_list(pod, "status", "conditions")
    )


def _requests_text(requests: Mapping[str, Decimal]) -> str:
    order = sorted(
        (r for r in requests if r != "pods"),
        key=lambda r: (not is_gpu_resource(r), r not in ("cpu", "memory"), r),
    )
    return ", ".join(f"{_q(requests[r])} {r}" for r in order) or "nothing"


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_NAMES_SHOWN])
    more = len(names) - _NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _verdict(fit: FitAnalysis, now: Sequence[str], later: Sequence[str]) -> str:
    if not fit.nodes:
        return "the cluster has no nodes to place it on"
    if now:
        return (
            f"fits now on {_names(now)}; the scheduler has not placed it yet "
            "(it retries on its own)"
        )
    if later:
        short = next(n for n in fit.nodes if n.name == later[0])
        return f"fits on {_names(later)} once running work there finishes ({'; '.join(short.why)})"
    closest = fit.closest
    if closest is not None and closest.detail:
        return f"fits on no node as it is: {closest.detail}"
    nearest = fit.nodes[0]
    return f"fits on no node as it is; the closest, {nearest.name}: {'; '.join(nearest.why)}"


def _pending_row(pod: Mapping[str, Any], nodes: Sequence[NodeInfo], usage: Any) -> PendingRow:
    spec = get(pod, "spec")
    problems: list[str] = []
    requests = pod_requests(spec, problems)
    fit = analyze_fit(spec, requests, nodes, usage)
    now = tuple(n.name for n in fit.nodes if n.fits)
    later = tuple(n.name for n in fit.nodes if not n.fits and n.waitable)
    pod_labels = labels(pod)
    return PendingRow(
        namespace=meta_namespace(pod),
        pod=meta_name(pod) or "",
        job=pod_labels.get(LABEL_NAME) or pod_labels.get("job-name") or meta_name(pod) or "",
        job_id=pod_labels.get(LABEL_JOB_ID) or "",
        requests=_requests_text(requests),
        fits_now=now,
        fits_later=later,
        verdict=_verdict(fit, now, later),
    )


def inventory(snapshot: Snapshot) -> Inventory:
    """The node table and the pending kubetrain Pods of a snapshot (Nodes and Pods)."""
    index = snapshot.index
    problems = list(index.problems)
    capacities = {meta_name(n) or "": _capacity(n, problems) for n in snapshot.nodes}
    bound: dict[str, int] = {}
    for pod in snapshot.pods:
        node = text(pod, "spec", "nodeName")
        if node and text(pod, "status", "phase") not in _TERMINAL:
            bound[node] = bound.get(node, 0) + 1
    empty: Mapping[str, Decimal] = {}
    rows = tuple(
        _node_row(info, capacities.get(info.name, empty), index.usage.get(info.name, empty), n)
        for info in index.nodes
        for n in [bound.get(info.name, 0)]
    )
    pending = [
        _pending_row(pod, index.nodes, index.usage)
        for pod in snapshot.pods
        if LABEL_JOB_ID in labels(pod) and _pending(pod)
    ]
    pending.sort(key=lambda p: (p.namespace, p.job, p.pod))
    return Inventory(nodes=rows, pending=tuple(pending), problems=tuple(problems))
