"""Why the scheduler refuses a Pod: its verdict, the node fit, the closest nodes.

The scheduler's message is parsed into parts (domain/scheduling.py), each a
finding with the scheduler's node count; the fit table (domain/fit.py) adds the
numbers and names the primary reason (what keeps the closest nodes out), and is
checked against the scheduler's counts, a difference becoming a note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubetrain.domain.diagnosis.reading import _conditions, _Finding, _Reader, _true
from kubetrain.domain.fit import FitAnalysis, analyze_fit
from kubetrain.domain.nodes import NodeInfo, is_gpu_resource, pod_requests
from kubetrain.domain.objects import as_list, as_map, get, text
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.reasons import rank
from kubetrain.domain.scheduling import (
    Filter,
    SchedulingVerdict,
    parse_scheduling_message,
    reason_of,
)
from kubetrain.domain.states import ReasonCode

R = ReasonCode


def _q(value: Decimal | None) -> str | None:
    return None if value is None else format_quantity(value)


def _amount(resource: str, value: Decimal) -> str:
    shown = format_quantity(value)
    if resource in ("nvidia.com/gpu", "amd.com/gpu"):
        return f"{shown} GPU" + ("s" if value != 1 else "")
    return f"{shown} {resource}"


def _volume_terms(reader: _Reader, pod_spec: object) -> list[tuple[str, Sequence[Any]]]:
    terms: list[tuple[str, Sequence[Any]]] = []
    for volume in as_list(pod_spec, "volumes"):
        claim = text(volume, "persistentVolumeClaim", "claimName")
        if not claim:
            continue
        pvc = reader.index.pvcs.get((reader.job.namespace, claim))
        pv = reader.index.pvs.get(text(pvc, "spec", "volumeName") or "") if pvc else None
        required = as_list(pv, "spec", "nodeAffinity", "required", "nodeSelectorTerms")
        if required:
            terms.append((claim, required))
    return terms


def _requests(reader: _Reader, pod_spec: object) -> dict[str, Decimal]:
    problems: list[str] = []
    requests = pod_requests(pod_spec, problems)
    for problem in problems:
        reader.note(f"could not read the Pod's {problem}")
    if not any(is_gpu_resource(r) for r in requests) and reader.job.gpus and pod_spec is None:
        requests["nvidia.com/gpu"] = Decimal(reader.job.gpus)
    return requests


def _fit(reader: _Reader, pod_spec: object) -> FitAnalysis | None:
    if not reader.index.nodes:
        reader.note("the snapshot holds no Nodes: the node table and the GPU checks are left out")
        return None
    requests = _requests(reader, pod_spec)
    fit = analyze_fit(
        pod_spec, requests, reader.index.nodes, reader.index.usage, _volume_terms(reader, pod_spec)
    )
    for rule in fit.not_evaluated:
        reader.note(f"the node table does not evaluate the Pod's {rule}")
    return fit


def _taint_detail(
    reader: _Reader, fit: FitAnalysis | None, key: str | None, value: str | None, count: int | None
) -> str:
    if fit is not None and fit.untolerated:
        taints = [t for t in fit.untolerated if key is None or t.key == key]
        if taints:
            shown = ", ".join(
                f"{t} ({fit.untolerated[t]} node{'s' * (fit.untolerated[t] != 1)})"
                for t in sorted(taints, key=str)
            )
            return f"taint {shown} not tolerated by the Pod"
    if key:
        return f"taint {key}={value or ''} not tolerated by the Pod" + (
            f" ({count} nodes)" if count else ""
        )
    return (
        "a taint the Pod does not tolerate (the scheduler no longer names it; the "
        "snapshot's nodes do not show it)"
    )


def _selector_detail(pod_spec: object, nodes: Sequence[NodeInfo]) -> str:
    selector = {k: v for k, v in as_map(pod_spec, "nodeSelector").items() if isinstance(v, str)}
    if not selector:
        return "the Pod's required node affinity matches no node that could hold it"
    return "; ".join(
        f"selector {key}={want}; the nodes have {_labels_held(key, want, nodes) or 'it'}"
        for key, want in selector.items()
    )


def _labels_held(key: str, want: str, nodes: Sequence[NodeInfo]) -> str:
    """What the nodes carry under `key` other than `want`, with how many: "accelerator=
    nvidia-h100 (2), no such label (2)"."""
    have: dict[str, int] = {}
    for node in nodes:
        label = node.labels.get(key)
        shown = f"{key}={label}" if label is not None else "no such label"
        have[shown] = have.get(shown, 0) + 1
    return ", ".join(f"{k} ({n})" for k, n in sorted(have.items()) if k != f"{key}={want}")


def _flavor_mismatch(reader: _Reader, pod: Mapping[str, Any], finding: _Finding) -> None:
    """A selector mismatch that is the platform's, not the job's: Kueue admitted the job
    on a ResourceFlavor whose nodeLabels (which Kueue adds to the Pods' nodeSelector when
    it resumes the Job) no node of the snapshot carries. The finding becomes
    FLAVOR_NODE_MISMATCH, naming the flavor and its ClusterQueue."""
    nodes = reader.index.nodes
    selector = as_map(pod, "spec", "nodeSelector")
    if not nodes or not selector:
        return
    for workload in reader.workloads:
        if _true(_conditions(workload), "QuotaReserved") is None:
            continue
        queue = text(workload, "status", "admission", "clusterQueue") or "?"
        for assignment in as_list(workload, "status", "admission", "podSetAssignments"):
            flavors = (f for f in as_map(assignment, "flavors").values() if isinstance(f, str))
            for name in dict.fromkeys(flavors):
                flavor = reader.index.resource_flavors.get(name)
                labels = {
                    k: v
                    for k, v in as_map(flavor, "spec", "nodeLabels").items()
                    if isinstance(v, str)
                }
                if not labels or any(selector.get(k) != v for k, v in labels.items()):
                    continue
                if any(all(n.labels.get(k) == v for k, v in labels.items()) for n in nodes):
                    continue  # nodes of the flavor exist: the job's own selector keeps it out
                wanted = ", ".join(f"{k}={v}" for k, v in labels.items())
                held = "; ".join(
                    f"the nodes have {held}"
                    for k, v in labels.items()
                    if (held := _labels_held(k, v, nodes))
                )
                finding.reason = R.FLAVOR_NODE_MISMATCH
                finding.detail = (
                    f"ClusterQueue {queue} admitted the job on flavor {name}, whose node labels "
                    f"{wanted} match no node" + (f"; {held}" if held else "")
                )
                finding.waitable = False
                finding.action = (
                    f"The platform must fix ResourceFlavor {name}'s nodeLabels ({wanted}), add "
                    f"nodes that carry them, or give ClusterQueue {queue} a flavor the cluster "
                    "has; waiting will not help unless such nodes are coming."
                )
                finding.numbers = {"queue": queue, "flavor": name}
                return


def _split(need: Decimal, bound: Decimal) -> tuple[int, Decimal] | None:
    """The fewest workers of equal whole GPUs, each within `bound`, that make `need`."""
    if bound < 1 or need % 1 != 0:
        return None
    for workers in range(2, int(need) + 1):
        if need % workers == 0 and need / workers <= bound:
            return workers, need / workers
    return None


def _resource_finding(
    code: ReasonCode,
    resource: str,
    fit: FitAnalysis | None,
    count: int | None,
    *,
    workers: int = 1,
) -> _Finding:
    numbers = fit.resources.get(resource) if fit is not None else None
    if numbers is None:
        return _Finding(
            code,
            f"not enough {resource} free on the nodes",
            nodes=count,
            numbers={"resource": resource},
        )
    need, largest, matching = numbers.requested, numbers.largest, numbers.largest_matching
    shown = {
        "resource": resource,
        "requested": format_quantity(need),
        "free": _q(numbers.most_free_matching),
        "allocatable": _q(matching if matching is not None else largest),
    }
    values = {k: v for k, v in shown.items() if v is not None}
    if numbers.advertised == 0:
        return _Finding(
            R.NO_GPU_NODES if is_gpu_resource(resource) else code,
            f"needs {_amount(resource, need)}; no node advertises {resource}",
            waitable=False,
            nodes=count,
            numbers=values,
        )
    bound = matching if matching is not None else largest
    if bound == 0:
        return _Finding(
            code,
            f"needs {_amount(resource, need)}; the nodes the job may use have no {resource}, "
            f"and the nodes that have it (up to {format_quantity(largest)}) are kept out by "
            "other rules",
            waitable=False,
            nodes=count,
            numbers=values,
        )
    if need > bound:
        detail = f"needs {_amount(resource, need)} on one node; the largest node "
        if matching is not None and matching < largest:
            detail += (
                f"the job may use has {format_quantity(matching)} (the largest node "
                f"of all has {format_quantity(largest)})"
            )
        else:
            detail += f"has {format_quantity(largest)}"
        action = f"Ask for at most {_amount(resource, bound)} per node; waiting will not help."
        split = _split(need, bound) if workers == 1 and is_gpu_resource(resource) else None
        if split is not None:
            # One Pod cannot span nodes; a gang of workers can (spec.workers).
            many, each = split
            action = (
                f"Run it as {many} workers of {_amount(resource, each)}: `workers: {many}` "
                f"with `gpus: {format_quantity(each)}`; waiting will not help."
            )
        return _Finding(code, detail, waitable=False, nodes=count, numbers=values, action=action)
    free = numbers.most_free_matching if numbers.most_free_matching is not None else Decimal(0)
    detail = (
        f"needs {_amount(resource, need)}; the most free on a node the job may use is "
        f"{format_quantity(max(free, Decimal(0)))} of {format_quantity(bound)}"
    )
    return _Finding(code, detail, waitable=True, nodes=count, numbers=values)


def _verdict_findings(
    reader: _Reader, verdict: SchedulingVerdict, fit: FitAnalysis | None, pod: object
) -> list[_Finding]:
    pod_spec = get(pod, "spec")
    advertised = {r: n.advertised > 0 for r, n in fit.resources.items()} if fit is not None else {}
    grouped: dict[ReasonCode, list[_Finding]] = {}
    for part in verdict.parts:
        code = reason_of(
            part, gpu_advertised=advertised.get(part.resource or "") if part.resource else None
        )
        if code is None:
            if part.filter is Filter.UNKNOWN:
                reader.note(
                    f"a part of the scheduler's verdict kubetrain does not know: {part.text!r}"
                )
            continue
        count = part.count if part.count is not None else verdict.total_nodes
        if part.filter is Filter.INSUFFICIENT and part.resource:
            finding = _resource_finding(code, part.resource, fit, count, workers=reader.workers)
            code = finding.reason
        elif code is R.UNTOLERATED_TAINT:
            finding = _Finding(
                code,
                _taint_detail(reader, fit, part.taint_key, part.taint_value, count),
                nodes=count,
            )
        elif code is R.NODE_SELECTOR_MISMATCH:
            finding = _Finding(code, _selector_detail(pod_spec, reader.index.nodes), nodes=count)
        elif code is R.PVC_NOT_FOUND:
            claim = part.claim or "?"
            finding = _Finding(
                code,
                f'claim "{claim}" does not exist in namespace {reader.job.namespace}',
                nodes=count,
            )
        elif code is R.PVC_UNBOUND:
            finding = _pvc_unbound(reader, pod_spec, part.text, count)
        elif code is R.NODE_NOT_READY:
            finding = _Finding(
                code, _not_ready_detail(part.filter, part.taint_key, part.text), nodes=count
            )
        else:
            finding = _Finding(code, part.text, nodes=count)
        grouped.setdefault(code, []).append(finding)
    findings = []
    for code, same in grouped.items():
        first = same[0]
        if len(same) > 1:
            counts = [f.nodes for f in same if f.nodes is not None]
            # A node reports every short resource at once; other filters report one reason per node.
            overlap = code in (R.INSUFFICIENT_RESOURCE, R.INSUFFICIENT_GPU)
            first.nodes = (max(counts) if overlap else sum(counts)) if counts else None
            first.detail = "; ".join(dict.fromkeys(f.detail for f in same))
        findings.append(first)
    return findings


def _not_ready_detail(token: Filter, key: str | None, raw: str) -> str:
    if token is Filter.UNSCHEDULABLE:
        return "cordoned nodes (marked unschedulable for maintenance) take no new Pods"
    if key:
        return f"nodes with the health taint {key} take no new Pods"
    return raw


def _pvc_unbound(reader: _Reader, pod_spec: object, raw: str, count: int | None) -> _Finding:
    pending = []
    waitable: bool | None = True
    said = []
    for volume in as_list(pod_spec, "volumes"):
        claim = text(volume, "persistentVolumeClaim", "claimName")
        if not claim:
            continue
        pvc = reader.index.pvcs.get((reader.job.namespace, claim))
        if pvc is None or text(pvc, "status", "phase") == "Bound":
            continue
        pending.append(claim)
        storage_class = text(pvc, "spec", "storageClassName")
        events = reader.events("PersistentVolumeClaim", claim)
        binding = [
            e for e in events if text(e, "reason") in ("FailedBinding", "ProvisioningFailed")
        ]
        if binding:
            said.append(text(binding[-1], "message") or "")
        if storage_class == "" or (
            storage_class
            and reader.index.storage_classes
            and storage_class not in reader.index.storage_classes
        ):
            waitable = False
        if any("no storage class is set" in (text(e, "message") or "") for e in binding):
            waitable = False
    if not pending:
        return _Finding(R.PVC_UNBOUND, raw, nodes=count)
    names = ", ".join(f'"{c}"' for c in pending)
    detail = f"claim {names} is not bound to a volume"
    if said:
        detail += f" (the volume binder says: {said[-1]})"
    return _Finding(R.PVC_UNBOUND, detail, waitable=waitable, nodes=count)


def _closest_finding(reader: _Reader, fit: FitAnalysis, pod: object) -> _Finding | None:
    closest = fit.closest
    if closest is None:
        return None
    if closest.resource:
        return _resource_finding(
            closest.reason, closest.resource, fit, closest.nodes, workers=reader.workers
        )
    spec = get(pod, "spec")
    if closest.reason is R.UNTOLERATED_TAINT:
        detail = _taint_detail(reader, fit, None, None, closest.nodes)
    elif closest.reason is R.NODE_SELECTOR_MISMATCH:
        detail = _selector_detail(spec, reader.index.nodes)
    elif closest.reason is R.NODE_NOT_READY:
        detail = ""  # the verdict's part says whether cordoned or unhealthy
    else:
        detail = closest.detail
    return _Finding(closest.reason, detail, waitable=closest.waitable, nodes=closest.nodes)


_UNEVALUATED = frozenset({R.PLACEMENT_RULES, R.INSUFFICIENT_RESOURCE, R.VOLUME_NODE_CONFLICT})
_PREFILTER = frozenset({R.PVC_NOT_FOUND, R.PVC_UNBOUND})


def _unschedulable(
    reader: _Reader,
    pod: Mapping[str, Any],
    message: str,
    raw_reason: str | None,
    since: datetime | None,
) -> list[_Finding]:
    verdict = parse_scheduling_message(message)
    spec = get(pod, "spec")
    fit = _fit(reader, spec)
    findings = _verdict_findings(reader, verdict, fit, pod)
    by_code = {f.reason: f for f in findings}
    primary: _Finding | None = None
    prefilter = [f for f in findings if f.reason in _PREFILTER]
    if prefilter:
        primary = min(prefilter, key=lambda f: rank(f.reason))
    elif fit is not None and fit.closest is not None:
        closest = _closest_finding(reader, fit, pod)
        if closest is not None:
            primary = by_code.get(closest.reason) or closest
            if primary is not closest:
                # The scheduler's count with the table's numbers and verdict on waiting.
                primary.waitable = closest.waitable
                primary.detail = closest.detail or primary.detail
                primary.action = closest.action
                primary.numbers = closest.numbers or primary.numbers
    elif fit is not None and fit.fitting:
        unevaluated = [f for f in findings if f.reason in _UNEVALUATED]
        if unevaluated:
            primary = min(unevaluated, key=lambda f: rank(f.reason))
        else:
            reader.note(
                f"{fit.fitting} node{'s' * (fit.fitting != 1)} could take the Pod now by this "
                "snapshot; "
                "the scheduler's verdict is older and it will try again"
            )
    if primary is None and findings:
        primary = min(findings, key=lambda f: rank(f.reason))
    if primary is None:
        primary = _Finding(
            R.SCHEDULING,
            "the scheduler refused the Pod for a reason kubetrain does not know; see the raw "
            "message",
            # A QUEUED verdict says whether waiting helps; unknown, it does not promise so.
            waitable=False,
        )
    if primary.reason is R.NODE_SELECTOR_MISMATCH:
        _flavor_mismatch(reader, pod, primary)
    if fit is not None:
        _check_agreement(reader, verdict, fit)
    for finding in findings:
        finding.raw_reason, finding.raw_message, finding.since = raw_reason, message, since
    primary.raw_reason, primary.raw_message, primary.since = raw_reason, message, since
    rest = [f for f in findings if f is not primary]
    rest.sort(key=lambda f: rank(f.reason))
    reader.fit = fit
    return [primary, *rest]


def _check_agreement(reader: _Reader, verdict: SchedulingVerdict, fit: FitAnalysis) -> None:
    if verdict.total_nodes is not None and verdict.total_nodes != len(reader.index.nodes):
        reader.note(
            f"the scheduler weighed {verdict.total_nodes} nodes; the snapshot holds "
            f"{len(reader.index.nodes)}"
        )
    if any(p.count is None for p in verdict.parts):
        return  # a PreFilter verdict: no per-node counts to compare
    ours: dict[tuple[Filter, str | None], int] = dict(fit.first_failures)
    theirs: dict[tuple[Filter, str | None], int] = {}
    comparable = {
        Filter.INSUFFICIENT,
        Filter.TOO_MANY_PODS,
        Filter.UNTOLERATED_TAINT,
        Filter.NODE_AFFINITY,
        Filter.NODE_NAME,
        Filter.UNSCHEDULABLE,
        Filter.VOLUME_NODE_AFFINITY,
    }
    for part in verdict.parts:
        if part.filter not in comparable:
            continue
        detail = part.resource if part.filter is Filter.INSUFFICIENT else part.taint_key
        tag = (part.filter, detail)
        theirs[tag] = theirs.get(tag, 0) + (part.count or 0)
    # A taint the message does not name compares with every untolerated taint.
    if (Filter.UNTOLERATED_TAINT, None) in theirs:
        total = sum(n for (token, _), n in ours.items() if token is Filter.UNTOLERATED_TAINT)
        ours = {k: v for k, v in ours.items() if k[0] is not Filter.UNTOLERATED_TAINT}
        ours[(Filter.UNTOLERATED_TAINT, None)] = total
    differ = []
    for key in sorted(set(ours) | set(theirs), key=lambda k: (k[0].value, k[1] or "")):
        if key[0] not in comparable:
            continue
        if ours.get(key, 0) != theirs.get(key, 0):
            label = key[0].value + (f" {key[1]}" if key[1] else "")
            differ.append(f"{label}: scheduler {theirs.get(key, 0)}, nodes {ours.get(key, 0)}")
    if differ:
        reader.note(
            "the node table does not agree with the scheduler's counts ("
            + "; ".join(differ)
            + "): the cluster changed after the verdict, or a rule kubetrain does not evaluate "
            "decided"
        )
