"""Nodes and Pod requests as the scheduler weighs them, read once per snapshot.

`NodeInfo` is a Node reduced to what placement depends on: labels, taints,
readiness, cordon and allocatable resources as exact Decimals. `pod_requests`
is the Pod's effective request the way kube-scheduler's NodeResourcesFit
computes it (containers and sidecars summed, the largest init container,
overhead). Both are pure readers of plain objects: a field that cannot be read
is left out and named in `problems`, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple

from kubetrain.domain.objects import as_list, as_map, get, labels, meta_name, text
from kubetrain.domain.quantity import QuantityError, parse_quantity

__all__ = [
    "CONDITION_TAINTS",
    "NodeInfo",
    "Taint",
    "Toleration",
    "is_gpu_resource",
    "parse_node",
    "pod_requests",
    "pod_tolerations",
    "resource_label",
    "tolerated",
]

# Taints the node lifecycle controller and TaintNodesByCondition put on nodes
# for their health: a Pod kept out by one of these waits for the node, not for
# a toleration.
CONDITION_TAINTS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/out-of-service",
        "node.cloudprovider.kubernetes.io/uninitialized",
        "node.cloudprovider.kubernetes.io/shutdown",
    }
)
# Effects the scheduler's TaintToleration filter honours (PreferNoSchedule only scores).
_FILTER_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# Accelerator extended resources by vendor convention: nvidia.com/gpu and MIG
# slices (nvidia.com/mig-1g.10gb), amd.com/gpu, gpu.intel.com/i915 and xe,
# habana.ai/gaudi, aws.amazon.com/neuron(core), google.com/tpu.
_GPU_NAME = re.compile(r"gpu|mig-|tpu|neuron|gaudi|npu|xpu|i915|(^|/)xe$|accelerator", re.I)


def is_gpu_resource(name: str) -> bool:
    """True for an accelerator extended resource (any vendor), false for cpu, memory, …."""
    if "/" not in name or name.startswith(("kubernetes.io/", "requests.", "limits.")):
        return False
    return bool(_GPU_NAME.search(name.split("/", 1)[1])) or name.split("/", 1)[0] in {
        "gpu.intel.com",
        "habana.ai",
    }


def resource_label(name: str, amount: Decimal | None = None) -> str:
    """How a resource reads in a sentence: 'GPUs', 'cpu', 'memory'."""
    if name in ("nvidia.com/gpu", "amd.com/gpu"):
        return "GPU" if amount == 1 else "GPUs"
    return name


class Taint(NamedTuple):
    """A node taint (a NamedTuple: hashed often, as a key of shared evaluations)."""

    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return (
            f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"
        )

    @property
    def condition(self) -> bool:
        """A health taint (not-ready, unreachable, pressure, cordon), not a policy one."""
        return self.key in CONDITION_TAINTS


@dataclass(frozen=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        # k8s.io/api/core/v1 Toleration.ToleratesTaint
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        # An empty key with Equal is invalid in the API; it tolerates nothing.
        return bool(self.key) and self.value == taint.value


def pod_tolerations(pod_spec: object) -> tuple[Toleration, ...]:
    found = []
    for entry in as_list(pod_spec, "tolerations"):
        operator = text(entry, "operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            continue
        found.append(
            Toleration(
                key=text(entry, "key") or "",
                operator=operator,
                value=text(entry, "value") or "",
                effect=text(entry, "effect") or "",
            )
        )
    return tuple(found)


def tolerated(taint: Taint, tolerations: Iterable[Toleration]) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


@dataclass(frozen=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool
    ready: str | None  # the Ready condition's status: "True", "False", "Unknown"; None: absent
    allocatable: Mapping[str, Decimal]
    conditions: Mapping[str, str] = field(default_factory=dict)  # type -> status
    problems: tuple[str, ...] = ()

    @property
    def filter_taints(self) -> tuple[Taint, ...]:
        return tuple(t for t in self.taints if t.effect in _FILTER_EFFECTS)


def _quantities(values: Mapping[str, Any], where: str, problems: list[str]) -> dict[str, Decimal]:
    parsed: dict[str, Decimal] = {}
    for key, raw in values.items():
        if not isinstance(key, str):
            continue
        try:
            parsed[key] = parse_quantity(raw)
        except QuantityError:
            problems.append(f"{where} {key}: {raw!r} is not a quantity")
    return parsed


def parse_node(node: object) -> NodeInfo | None:
    """A Node object as a NodeInfo; None when it has no name."""
    name = meta_name(node)
    if not name:
        return None
    problems: list[str] = []
    taints = []
    for entry in as_list(node, "spec", "taints"):
        key, effect = text(entry, "key"), text(entry, "effect")
        if key and effect:
            taints.append(Taint(key, text(entry, "value") or "", effect))
    conditions: dict[str, str] = {}
    for cond in as_list(node, "status", "conditions"):
        ctype, status = text(cond, "type"), text(cond, "status")
        if ctype and status:
            conditions[ctype] = status
    alloc = as_map(node, "status", "allocatable") or as_map(node, "status", "capacity")
    return NodeInfo(
        name=name,
        labels=labels(node),
        taints=tuple(taints),
        unschedulable=get(node, "spec", "unschedulable") is True,
        ready=conditions.get("Ready"),
        allocatable=_quantities(alloc, f"node {name}: allocatable", problems),
        conditions=conditions,
        problems=tuple(problems),
    )


def _add(total: dict[str, Decimal], more: Mapping[str, Decimal]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, Decimal(0)) + value


def _container_requests(container: object, problems: list[str]) -> dict[str, Decimal]:
    name = text(container, "name") or "?"
    requests = as_map(container, "resources", "requests")
    # A limit without a request defaults the request (API defaulting); dumps of
    # objects that were never stored may lack the defaulted request.
    limits = as_map(container, "resources", "limits")
    merged = {**limits, **requests}
    return _quantities(merged, f"container {name}: request", problems)


def pod_requests(pod_spec: object, problems: list[str] | None = None) -> dict[str, Decimal]:
    """The Pod's effective request per resource, plus `pods: 1`.

    max(sum of containers and sidecars, each init container with the sidecars
    started before it) + overhead: what NodeResourcesFit compares with free.
    """
    sink: list[str] = problems if problems is not None else []
    total: dict[str, Decimal] = {}
    for container in as_list(pod_spec, "containers"):
        _add(total, _container_requests(container, sink))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for container in as_list(pod_spec, "initContainers"):
        own = _container_requests(container, sink)
        if text(container, "restartPolicy") == "Always":
            _add(sidecars, own)
            continue
        for key, value in own.items():
            peak = value + sidecars.get(key, Decimal(0))
            if peak > init_peak.get(key, Decimal(0)):
                init_peak[key] = peak
    _add(total, sidecars)
    for key, value in init_peak.items():
        if value > total.get(key, Decimal(0)):
            total[key] = value
    _add(total, _quantities(as_map(pod_spec, "overhead"), "overhead", sink))
    total["pods"] = Decimal(1)
    return {k: v for k, v in total.items() if v > 0}
