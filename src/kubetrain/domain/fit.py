"""Where a Pod could go: the per-node fit table, counted per constraint.

For every node: could the job's Pod go there now, and if not, why, in words
(`nvidia.com/gpu 8/8 used, needs 4`, `taint nvidia.com/gpu=present:NoSchedule
not tolerated`, `selector accelerator=nvidia-a100 ≠ nvidia-h100`, `NotReady`,
`cordoned`), computed from the node's allocatable minus the requests of the
Pods bound there, the way kube-scheduler's filters decide.

Each node also gets a *closeness*, because the primary reason of an
unschedulable job is what keeps the closest nodes out (DESIGN.md):

    0  fits now
    1  meets every rule and is big enough; only free resources lack (waitable)
    2  big enough, but a rule keeps the Pod out (taint, selector, readiness,
       cordon, the volume's node affinity)
    3  too small: its allocatable could never hold the request

The constraint counts are HTCondor's `-better-analyze` way: each constraint
alone, how many nodes it rules out. `first_failures` is the scheduler's way
(filters run in order and a node reports the first that fails) so the table
can be checked against the scheduler's own counts.

Pod affinity, anti-affinity, topology spread and host ports depend on other
Pods' placement and are not evaluated; `not_evaluated` says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property
from itertools import repeat
from operator import add, itemgetter
from typing import Any, NamedTuple

from kubetrain.domain.nodes import (
    NodeInfo,
    Taint,
    Toleration,
    is_gpu_resource,
    pod_tolerations,
    tolerated,
)
from kubetrain.domain.objects import as_list, as_map, text
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.scheduling import Filter
from kubetrain.domain.states import ReasonCode

__all__ = [
    "ConstraintCount",
    "FitAnalysis",
    "NodeFit",
    "ResourceNumbers",
    "analyze_fit",
    "resource_reason",
]

R = ReasonCode
_UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
# Resources NodeResourcesFit does not check against allocatable.
_UNCHECKED = frozenset({"pods"})


def resource_reason(resource: str, *, advertised: bool = True) -> ReasonCode:
    if is_gpu_resource(resource):
        return R.INSUFFICIENT_GPU if advertised else R.NO_GPU_NODES
    return {"cpu": R.INSUFFICIENT_CPU, "memory": R.INSUFFICIENT_MEMORY}.get(
        resource, R.INSUFFICIENT_RESOURCE
    )


class NodeFit(NamedTuple):
    """One row of the fit table (a NamedTuple: a thousand are made per diagnosis)."""

    name: str
    fits: bool
    why: tuple[str, ...]  # every reason the Pod cannot go there, in the scheduler's order
    reasons: tuple[ReasonCode, ...] = ()  # the code of each `why`
    waitable: bool | None = None  # None when it fits; True when only free resources lack
    closeness: int = 0  # see the module docstring

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fits": self.fits,
            "why": list(self.why),
            "reasons": [str(r) for r in self.reasons],
            "waitable": self.waitable,
        }


@dataclass(frozen=True)
class ConstraintCount:
    constraint: (
        str  # "tolerates taint nvidia.com/gpu=present:NoSchedule", "nvidia.com/gpu >= 4 free"
    )
    reason: ReasonCode
    matched: int
    ruled_out: int
    never: int | None = None  # for a resource: nodes whose allocatable is below the request

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "constraint": self.constraint,
            "reason": str(self.reason),
            "matched": self.matched,
            "ruled_out": self.ruled_out,
        }
        if self.never is not None:
            data["never"] = self.never
        return data


@dataclass(frozen=True)
class ResourceNumbers:
    """The numbers of one requested resource across the nodes."""

    resource: str
    requested: Decimal
    advertised: int  # nodes with allocatable > 0
    largest: Decimal  # the largest allocatable of any node
    largest_matching: Decimal | None  # … of a node every rule admits (None: no such node)
    most_free_matching: Decimal | None  # the most free on a node every rule admits


@dataclass(frozen=True)
class Closest:
    """The primary reason the fit table gives, from the closest nodes."""

    reason: ReasonCode
    waitable: bool
    nodes: int  # how many of the closest nodes it keeps out
    detail: str
    resource: str | None = None


# The last few node tables by the row groups they spell out (FitAnalysis.nodes).
_TABLES: dict[tuple[tuple[int, tuple[str, ...], NodeFit], ...], tuple[NodeFit, ...]] = {}


@dataclass(frozen=True)
class FitAnalysis:
    # (closeness, nodes sorted by name, the row's other fields) per group of alike
    # nodes; `nodes` spells them out on demand (most diagnoses never show them).
    row_groups: tuple[tuple[int, tuple[str, ...], NodeFit], ...]
    constraints: tuple[ConstraintCount, ...]
    resources: Mapping[str, ResourceNumbers]
    # (token, resource or taint key) -> nodes whose first failing filter it is
    first_failures: Mapping[tuple[Filter, str | None], int]
    # Per code, how many nodes it keeps out (a node counts once per code).
    ruled_out: Mapping[ReasonCode, int]
    closest: Closest | None
    not_evaluated: tuple[str, ...] = ()
    untolerated: Mapping[Taint, int] = field(default_factory=dict)
    fitting: int = 0

    @cached_property
    def nodes(self) -> tuple[NodeFit, ...]:
        """One row per node: closest first, then by name. Kept by the rows it is made of:
        a job waiting on an unchanged cluster gets the same table at every diagnosis."""
        table = _TABLES.get(self.row_groups)
        if table is None:
            table = _TABLES[self.row_groups] = self._table()
            while len(_TABLES) > 8:
                try:
                    del _TABLES[next(iter(_TABLES))]  # the oldest
                except (KeyError, RuntimeError, StopIteration):
                    break  # another thread's diagnosis let it go first
        return table

    def _table(self) -> tuple[NodeFit, ...]:
        by_closeness: dict[int, list[tuple[str, tuple[Any, ...]]]] = {}
        for closeness, names, row in self.row_groups:
            by_closeness.setdefault(closeness, []).extend(zip(names, repeat(row[1:])))
        out: list[NodeFit] = []
        make = tuple.__new__  # NamedTuple's own constructor, without its keyword parsing
        for closeness in sorted(by_closeness):
            rows = by_closeness[closeness]
            rows.sort()  # runs already in name order (each group keeps the nodes' order)
            # Each row is (name,) + the group's other fields, made in C: a thousand nodes.
            ones = zip(map(itemgetter(0), rows))
            out += map(make, repeat(NodeFit), map(add, ones, map(itemgetter(1), rows)))
        return tuple(out)


@dataclass(frozen=True)
class _Check:
    why: str
    reason: ReasonCode
    token: Filter
    key: str | None = None  # the resource, or the taint's key
    never: bool = False  # a resource the node's allocatable could never hold
    taint: Taint | None = None
    label: str | None = None  # the selector "key=value" not met


def _q(value: Decimal) -> str:
    return format_quantity(value)


def _selector_terms_match(terms: Sequence[Any], node: NodeInfo) -> bool:
    for term in terms:
        expressions = as_list(term, "matchExpressions")
        fields = as_list(term, "matchFields")
        if not expressions and not fields:
            continue  # an empty term matches nothing
        if all(_expression(e, node.labels) for e in expressions) and all(
            _expression(f, {"metadata.name": node.name}) for f in fields
        ):
            return True
    return False


def _expression(expr: object, values: Mapping[str, str]) -> bool:
    key, operator = text(expr, "key") or "", text(expr, "operator") or ""
    wanted = [v for v in as_list(expr, "values") if isinstance(v, str)]
    present = key in values
    actual = values.get(key, "")
    if operator == "In":
        return present and actual in wanted
    if operator == "NotIn":
        return not present or actual not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(actual), int(wanted[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


class _PodPlacement:
    """The parts of a Pod spec that placement reads, parsed once per diagnosis."""

    def __init__(self, pod_spec: object, volume_terms: Sequence[tuple[str, Sequence[Any]]]) -> None:
        self.tolerations: tuple[Toleration, ...] = pod_tolerations(pod_spec)
        self.node_name = text(pod_spec, "nodeName")
        raw_selector = as_map(pod_spec, "nodeSelector")
        self.selector = {k: v for k, v in raw_selector.items() if isinstance(v, str)}
        required = as_map(
            pod_spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
        )
        self.affinity_terms = as_list(required, "nodeSelectorTerms") if required else None
        self.volume_terms = volume_terms
        self.tolerates_cordon = tolerated(_UNSCHEDULABLE_TAINT, self.tolerations)
        affinity = as_map(pod_spec, "affinity")
        not_evaluated = []
        if as_map(affinity, "podAffinity") or as_map(affinity, "podAntiAffinity"):
            not_evaluated.append("pod affinity/anti-affinity")
        if as_list(pod_spec, "topologySpreadConstraints"):
            not_evaluated.append("topology spread constraints")
        if any(
            isinstance(port, dict) and port.get("hostPort")
            for container in as_list(pod_spec, "containers")
            for port in as_list(container, "ports")
        ):
            not_evaluated.append("host ports")
        self.not_evaluated = tuple(not_evaluated)
        keys = set(self.selector)
        by_name = bool(self.node_name)
        for terms in [self.affinity_terms or [], *(t for _, t in volume_terms)]:
            for term in terms:
                keys.update(text(e, "key") or "" for e in as_list(term, "matchExpressions"))
                by_name = by_name or bool(as_list(term, "matchFields"))
        self.label_keys = tuple(sorted(keys))
        self.by_name = by_name
        self._taint_cache: dict[tuple[Taint, ...], tuple[Taint, ...]] = {}

    def rule_key(self, node: NodeInfo) -> tuple[Any, ...]:
        """What the rules look at on `node`: nodes with equal keys get equal checks."""
        return (
            node.ready,
            node.unschedulable,
            node.taints,
            tuple(node.labels.get(k) for k in self.label_keys),
            node.name if self.by_name else None,
        )

    def untolerated(self, node: NodeInfo) -> tuple[Taint, ...]:
        found = self._taint_cache.get(node.taints)
        if found is None:
            found = tuple(t for t in node.filter_taints if not tolerated(t, self.tolerations))
            self._taint_cache[node.taints] = found
        return found


def _rule_checks(node: NodeInfo, pod: _PodPlacement) -> list[_Check]:
    """Every non-resource rule the node fails, in the scheduler's filter order."""
    checks: list[_Check] = []
    if node.ready != "True":
        state = "NotReady" if node.ready in ("False", None) else f"Ready={node.ready}"
        checks.append(_Check(state, R.NODE_NOT_READY, Filter.NOT_READY))
    if node.unschedulable and not pod.tolerates_cordon:
        checks.append(_Check("cordoned", R.NODE_NOT_READY, Filter.UNSCHEDULABLE))
    if pod.node_name and pod.node_name != node.name:
        checks.append(
            _Check(
                f"the Pod asks for node {pod.node_name}", R.NODE_SELECTOR_MISMATCH, Filter.NODE_NAME
            )
        )
    for taint in pod.untolerated(node):
        condition = taint.condition
        checks.append(
            _Check(
                f"taint {taint} not tolerated" + (" (node unhealthy)" if condition else ""),
                R.NODE_NOT_READY if condition else R.UNTOLERATED_TAINT,
                Filter.UNTOLERATED_TAINT,
                taint.key,
                taint=taint,
            )
        )
    for key, want in pod.selector.items():
        have = node.labels.get(key)
        if have != want:
            shown = f"≠ {have}" if have is not None else "(no such label)"
            checks.append(
                _Check(
                    f"selector {key}={want} {shown}", R.NODE_SELECTOR_MISMATCH, Filter.NODE_AFFINITY
                )
            )
    if pod.affinity_terms is not None and not _selector_terms_match(pod.affinity_terms, node):
        checks.append(
            _Check("node affinity not matched", R.NODE_SELECTOR_MISMATCH, Filter.NODE_AFFINITY)
        )
    for volume, terms in pod.volume_terms:
        if not _selector_terms_match(terms, node):
            checks.append(
                _Check(
                    f"volume {volume} is bound to storage this node cannot reach",
                    R.VOLUME_NODE_CONFLICT,
                    Filter.VOLUME_NODE_AFFINITY,
                )
            )
    return checks


def _resource_checks(
    node: NodeInfo,
    requests: Mapping[str, Decimal],
    used: Mapping[str, Decimal],
    advertised: Mapping[str, bool],
) -> list[_Check]:
    checks: list[_Check] = []
    for resource, need in requests.items():
        alloc = node.allocatable.get(resource, Decimal(0))
        in_use = used.get(resource, Decimal(0))
        if resource == "pods":
            if alloc and in_use + need > alloc:
                checks.append(
                    _Check(
                        f"pods {_q(in_use)}/{_q(alloc)} used",
                        R.INSUFFICIENT_RESOURCE,
                        Filter.TOO_MANY_PODS,
                    )
                )
            continue
        reason = resource_reason(resource, advertised=advertised.get(resource, True))
        if alloc < need:
            why = (
                f"no {resource}" if alloc == 0 else f"{resource}: has {_q(alloc)}, needs {_q(need)}"
            )
            checks.append(_Check(why, reason, Filter.INSUFFICIENT, resource, never=True))
        elif in_use + need > alloc:
            checks.append(
                _Check(
                    f"{resource} {_q(in_use)}/{_q(alloc)} used, needs {_q(need)}",
                    reason,
                    Filter.INSUFFICIENT,
                    resource,
                )
            )
    return checks


@dataclass(frozen=True)
class _Verdict:
    """What the checks say about one kind of node; shared by nodes alike in every
    way the Pod's rules and requests look at (a pool's nodes, mostly)."""

    checks: tuple[_Check, ...]
    rules: bool  # some non-resource rule fails
    closeness: int
    deciding: tuple[_Check, ...]
    first: tuple[tuple[Filter, str | None], ...]
    codes: tuple[ReasonCode, ...]  # distinct, in order


def _verdict(rules: list[_Check], resources: list[_Check]) -> _Verdict:
    checks = tuple(rules + resources)
    never = tuple(c for c in resources if c.never)
    deciding: tuple[_Check, ...]
    if not checks:
        closeness, deciding = 0, ()
    elif never:
        closeness, deciding = 3, never
    elif rules:
        closeness, deciding = 2, (rules[0],)
    else:
        closeness, deciding = 1, tuple(resources)
    # The scheduler stops at the first failing filter (our own readiness check is
    # not one: it filters on the not-ready taint); NodeResourcesFit reports every
    # short resource at once, and runs before the volume filters.
    scheduler_rules = [c for c in rules if c.token is not Filter.NOT_READY]
    before_resources = [c for c in scheduler_rules if c.token is not Filter.VOLUME_NODE_AFFINITY]
    first: tuple[tuple[Filter, str | None], ...]
    if before_resources or (scheduler_rules and not resources):
        head = (before_resources or scheduler_rules)[0]
        first = ((head.token, head.key if head.token is Filter.UNTOLERATED_TAINT else None),)
    else:
        first = tuple(
            (c.token, c.key if c.token is Filter.INSUFFICIENT else None) for c in resources
        )
    return _Verdict(
        checks=checks,
        rules=bool(rules),
        closeness=closeness,
        deciding=deciding,
        first=first,
        codes=tuple(dict.fromkeys(c.reason for c in checks)),
    )


# The last few node lists grouped by `_alike` (a snapshot's index or a live cache's
# node state, shared by every diagnosis of it); held here, so their ids stay theirs.
_ALIKE: list[
    tuple[
        Sequence[NodeInfo],
        Mapping[str, Any],
        list[list[NodeInfo]],
        dict[int, tuple[str, ...]],
    ]
] = []


def _alike(
    nodes: Sequence[NodeInfo], usage: Mapping[str, Mapping[str, Decimal]]
) -> tuple[list[list[NodeInfo]], dict[int, tuple[str, ...]]]:
    """`nodes` grouped by what every Pod's checks read besides labels and names:
    the same allocatable, usage and taints objects (the index shares equal ones, so
    identity is cheap to hash), readiness and cordon. Each group keeps the nodes'
    order. With each group's node names, by the group's id (the fit table's rows)."""
    for seen_nodes, seen_usage, groups, names in _ALIKE:
        if seen_nodes is nodes and seen_usage is usage:
            return groups, names
    empty: Mapping[str, Decimal] = {}
    by_identity: dict[tuple[Any, ...], list[NodeInfo]] = {}
    for node in nodes:
        ident = (
            id(node.allocatable),
            id(usage.get(node.name, empty)),
            id(node.taints),
            node.ready,
            node.unschedulable,
        )
        same = by_identity.get(ident)
        if same is None:
            by_identity[ident] = [node]
        else:
            same.append(node)
    found = list(by_identity.values())
    names = {id(group): tuple(n.name for n in group) for group in found}
    _ALIKE.insert(0, (nodes, usage, found, names))
    del _ALIKE[4:]
    return found, names


def analyze_fit(
    pod_spec: object,
    requests: Mapping[str, Decimal],
    nodes: Sequence[NodeInfo],
    usage: Mapping[str, Mapping[str, Decimal]],
    volume_terms: Sequence[tuple[str, Sequence[Any]]] = (),
) -> FitAnalysis:
    """The fit table of one Pod over `nodes`, with counts and the closest-nodes reason.

    `volume_terms` holds, per bound volume with node affinity, the PV's
    required nodeSelectorTerms. Nodes alike in what the Pod looks at share one
    evaluation, so a pool of a thousand nodes costs little more than a few.
    """
    pod = _PodPlacement(pod_spec, volume_terms)
    checked = dict(requests)
    resources_only = [r for r in checked if r != "pods"]
    zero = Decimal(0)
    empty: Mapping[str, Decimal] = {}
    # Group the nodes by what the Pod looks at; each group is evaluated once. The
    # nodes alike whatever the Pod (`_alike`, kept per node list) are split further
    # only by the labels or names this Pod looks at.
    by_identity: list[list[NodeInfo]] = []
    labels_looked_at = pod.label_keys
    alike_groups, alike_names = _alike(nodes, usage)
    for alike in alike_groups:
        if not labels_looked_at and not pod.by_name:
            by_identity.append(alike)
            continue
        split: dict[tuple[Any, ...], list[NodeInfo]] = {}
        for node in alike:
            ident = (
                tuple([node.labels.get(k) for k in labels_looked_at]),
                node.name if pod.by_name else None,
            )
            split.setdefault(ident, []).append(node)
        by_identity += split.values()
    groups: dict[tuple[Any, ...], list[NodeInfo]] = {}
    # Each group's node names: an unsplit group's are kept with the node list.
    group_names: dict[tuple[Any, ...], list[tuple[str, ...]]] = {}
    for members in by_identity:
        sample = members[0]
        used = usage.get(sample.name, empty)
        amounts = tuple([(sample.allocatable.get(r, zero), used.get(r, zero)) for r in checked])
        key = (pod.rule_key(sample), amounts)
        named = alike_names.get(id(members))
        if named is None:
            named = tuple(n.name for n in members)
        group = groups.get(key)
        if group is None:
            groups[key] = list(members)
            group_names[key] = [named]
        else:
            group.extend(members)
            group_names[key].append(named)
    positions = {r: i for i, r in enumerate(checked)}
    advertised = {
        r: any(amounts[positions[r]][0] > 0 for _, amounts in groups) for r in resources_only
    }
    rows: list[tuple[int, tuple[str, ...], NodeFit]] = []
    ruled_out: dict[ReasonCode, int] = {}
    first: dict[tuple[Filter, str | None], int] = {}
    untolerated: dict[Taint, int] = {}
    selector_out: dict[str, int] = {}
    resource_never: dict[str, int] = dict.fromkeys(checked, 0)
    resource_short: dict[str, int] = dict.fromkeys(checked, 0)
    largest: dict[str, Decimal] = dict.fromkeys(resources_only, zero)
    largest_matching: dict[str, Decimal] = {}
    most_free: dict[str, Decimal] = {}
    closest_codes: dict[int, dict[ReasonCode, int]] = {1: {}, 2: {}, 3: {}}
    closest_resource: dict[ReasonCode, str] = {}
    advertising = dict.fromkeys(resources_only, 0)
    fitting = 0
    rule_cache: dict[tuple[Any, ...], list[_Check]] = {}
    for (rule_key, amounts), members in groups.items():
        count = len(members)
        sample = members[0]
        rules = rule_cache.get(rule_key)
        if rules is None:
            rules = rule_cache[rule_key] = _rule_checks(sample, pod)
        used = usage.get(sample.name, empty)
        verdict = _verdict(rules, _resource_checks(sample, checked, used, advertised))
        for resource, (alloc, in_use) in zip(checked, amounts, strict=True):
            if resource == "pods":
                continue
            if alloc > 0:
                advertising[resource] += count
            if alloc > largest[resource]:
                largest[resource] = alloc
            if not verdict.rules:
                free = alloc - in_use
                if resource not in largest_matching or alloc > largest_matching[resource]:
                    largest_matching[resource] = alloc
                if resource not in most_free or free > most_free[resource]:
                    most_free[resource] = free
        if not verdict.checks:
            fitting += count
            rows.append((0, tuple(n.name for n in members), NodeFit("", True, ())))
            continue
        for check in verdict.checks:
            if check.token is Filter.INSUFFICIENT or check.token is Filter.TOO_MANY_PODS:
                resource = check.key or "pods"
                resource_short[resource] += count
                if check.never:
                    resource_never[resource] += count
            elif check.token is Filter.UNTOLERATED_TAINT and check.taint is not None:
                untolerated[check.taint] = untolerated.get(check.taint, 0) + count
            elif check.token is Filter.NODE_AFFINITY and check.label is not None:
                selector_out[check.label] = selector_out.get(check.label, 0) + count
        for code in verdict.codes:
            ruled_out[code] = ruled_out.get(code, 0) + count
        for tag in verdict.first:
            first[tag] = first.get(tag, 0) + count
        bucket = closest_codes[verdict.closeness]
        for check in verdict.deciding:
            bucket[check.reason] = bucket.get(check.reason, 0) + count
            if check.key and check.token is Filter.INSUFFICIENT:
                closest_resource.setdefault(check.reason, check.key)
        why = tuple(c.why for c in verdict.checks)
        reasons = tuple(c.reason for c in verdict.checks)
        closeness, waitable = verdict.closeness, verdict.closeness == 1
        names = sum(group_names[(rule_key, amounts)], ())
        rows.append((closeness, names, NodeFit("", False, why, reasons, waitable, closeness)))
    numbers = {
        r: ResourceNumbers(
            resource=r,
            requested=checked[r],
            advertised=advertising[r],
            largest=largest[r],
            largest_matching=largest_matching.get(r),
            most_free_matching=most_free.get(r),
        )
        for r in resources_only
    }
    constraints = _constraints(
        len(nodes),
        pod,
        nodes,
        by_identity,
        untolerated,
        selector_out,
        checked,
        resource_short,
        resource_never,
        advertised,
    )
    return FitAnalysis(
        row_groups=tuple(rows),
        constraints=constraints,
        resources=numbers,
        first_failures=first,
        ruled_out=ruled_out,
        closest=_closest(closest_codes, closest_resource, numbers, len(nodes) - fitting)
        if nodes and not fitting
        else None,
        not_evaluated=pod.not_evaluated,
        untolerated=untolerated,
        fitting=fitting,
    )


def _constraints(
    total: int,
    pod: _PodPlacement,
    nodes: Sequence[NodeInfo],
    alike: Sequence[Sequence[NodeInfo]],
    untolerated: Mapping[Taint, int],
    selector_out: Mapping[str, int],
    requests: Mapping[str, Decimal],
    short: Mapping[str, int],
    never: Mapping[str, int],
    advertised: Mapping[str, bool],
) -> tuple[ConstraintCount, ...]:
    out: list[ConstraintCount] = []
    # Readiness and cordons are alike within each group of `alike`.
    not_ready = sum(len(group) for group in alike if group[0].ready != "True")
    out.append(ConstraintCount("node is Ready", R.NODE_NOT_READY, total - not_ready, not_ready))
    if not pod.tolerates_cordon:
        cordoned = sum(len(group) for group in alike if group[0].unschedulable)
        out.append(
            ConstraintCount("node is not cordoned", R.NODE_NOT_READY, total - cordoned, cordoned)
        )
    for taint, count in sorted(untolerated.items(), key=lambda item: str(item[0])):
        code = R.NODE_NOT_READY if taint.condition else R.UNTOLERATED_TAINT
        out.append(ConstraintCount(f"tolerates taint {taint}", code, total - count, count))
    for key, want in pod.selector.items():
        count = selector_out.get(f"{key}={want}", 0)
        out.append(
            ConstraintCount(f"label {key}={want}", R.NODE_SELECTOR_MISMATCH, total - count, count)
        )
    if pod.affinity_terms is not None:
        count = sum(1 for n in nodes if not _selector_terms_match(pod.affinity_terms, n))
        out.append(ConstraintCount("node affinity", R.NODE_SELECTOR_MISMATCH, total - count, count))
    for volume, terms in pod.volume_terms:
        count = sum(1 for n in nodes if not _selector_terms_match(terms, n))
        out.append(
            ConstraintCount(
                f"volume {volume} reachable", R.VOLUME_NODE_CONFLICT, total - count, count
            )
        )
    for resource, need in requests.items():
        if resource == "pods":
            if short.get("pods"):
                out.append(
                    ConstraintCount(
                        "room for one more pod",
                        R.INSUFFICIENT_RESOURCE,
                        total - short["pods"],
                        short["pods"],
                    )
                )
            continue
        code = resource_reason(resource, advertised=advertised.get(resource, True))
        out.append(
            ConstraintCount(
                f"{resource} >= {_q(need)} free",
                code,
                total - short.get(resource, 0),
                short.get(resource, 0),
                never=never.get(resource, 0),
            )
        )
    return tuple(out)


_FIRST_RESOURCE_ORDER = (
    R.NO_GPU_NODES,
    R.INSUFFICIENT_GPU,
    R.INSUFFICIENT_CPU,
    R.INSUFFICIENT_MEMORY,
)
_RULE_ORDER = (
    R.NODE_NOT_READY,
    R.UNTOLERATED_TAINT,
    R.NODE_SELECTOR_MISMATCH,
    R.VOLUME_NODE_CONFLICT,
)


def _pick(counts: Mapping[ReasonCode, int], order: Sequence[ReasonCode]) -> ReasonCode:
    def key(code: ReasonCode) -> tuple[int, int]:
        return (-counts[code], order.index(code) if code in order else len(order))

    return min(counts, key=key)


def _closest(
    buckets: Mapping[int, Mapping[ReasonCode, int]],
    resource_of: Mapping[ReasonCode, str],
    numbers: Mapping[str, ResourceNumbers],
    blocked: int,
) -> Closest | None:
    if buckets[1]:
        code = _pick(buckets[1], _FIRST_RESOURCE_ORDER)
        resource = resource_of.get(code)
        n = numbers.get(resource) if resource else None
        detail = (
            f"needs {_q(n.requested)} {resource}; the most free on a suitable node is "
            f"{_q(n.most_free_matching or Decimal(0))} of {_q(n.largest_matching or Decimal(0))}"
            if n is not None
            else "suitable nodes are full"
        )
        return Closest(code, True, buckets[1][code], detail, resource)
    if buckets[2]:
        code = _pick(buckets[2], _RULE_ORDER)
        return Closest(code, code is R.NODE_NOT_READY, buckets[2][code], "", None)
    if buckets[3]:
        # Prefer the resource no node at all could hold: that is the request to change.
        hopeless = [
            r for r, n in numbers.items() if n.requested > n.largest and r in resource_of.values()
        ]
        if hopeless:
            resource = sorted(
                hopeless,
                key=lambda r: (
                    _FIRST_RESOURCE_ORDER.index(
                        resource_reason(r, advertised=numbers[r].advertised > 0)
                    )
                    if resource_reason(r, advertised=numbers[r].advertised > 0)
                    in _FIRST_RESOURCE_ORDER
                    else len(_FIRST_RESOURCE_ORDER)
                ),
            )[0]
            code = resource_reason(resource, advertised=numbers[resource].advertised > 0)
        else:
            code = _pick(buckets[3], _FIRST_RESOURCE_ORDER)
            resource = resource_of.get(code, "")
        n = numbers.get(resource)
        if n is None:
            detail = "no node is big enough"
        elif n.advertised == 0:
            detail = f"needs {_q(n.requested)} {resource}; no node advertises {resource}"
        else:
            detail = (
                f"needs {_q(n.requested)} {resource} on one node; the largest node has "
                f"{_q(n.largest)}"
            )
            if n.largest_matching is not None and n.largest_matching < n.largest:
                detail += f" (the largest the job may use has {_q(n.largest_matching)})"
        return Closest(code, False, blocked, detail, resource or None)
    return None
