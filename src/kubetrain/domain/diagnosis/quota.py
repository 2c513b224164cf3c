"""Whether quota holds the job: the API server's admission refusals (ResourceQuota,
LimitRange) of the job's Pod, and a Job suspended until a queue (Kueue) admits it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from kubetrain.domain.admission import (
    AdmissionRefusal,
    parse_admission_refusal,
    parse_kueue_message,
)
from kubetrain.domain.diagnosis.reading import (
    _conditions,
    _event_first_time,
    _Finding,
    _Reader,
    _true,
)
from kubetrain.domain.objects import text, timestamp
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.states import ReasonCode

R = ReasonCode

# Kueue's flavor assigner when no resource group of the ClusterQueue covers a resource
# the Pods request (pkg/scheduler/flavorassigner/flavorassigner.go,
# findFlavorForPodSetResource, Kueue v0.9-v0.17): the queue has no quota for it at all.
_KUEUE_UNCOVERED = re.compile(r"resource (?P<resource>\S+) unavailable in ClusterQueue")


def _quota(reader: _Reader) -> list[_Finding]:
    refusals = [
        e for e in reader.events("Job", reader.job.k8s_name) if text(e, "reason") == "FailedCreate"
    ]
    if not refusals:
        return []
    last = refusals[-1]
    message = text(last, "message") or ""
    since = _event_first_time(refusals[0])
    refusal = parse_admission_refusal(message)
    finding = _refusal_finding(refusal)
    finding.raw_reason, finding.raw_message, finding.since = "FailedCreate", message, since
    return [finding]


def _refusal_finding(refusal: AdmissionRefusal) -> _Finding:
    if not refusal.is_quota:
        # "pods \"kt-…\" is forbidden: violates PodSecurity …": the rule is after it.
        rule = refusal.message.partition("forbidden: ")[2] or refusal.message
        return _Finding(R.POLICY_REFUSED, f"the rule: {rule[:300]}", waitable=False)
    numbers: dict[str, str] = {}
    details = []
    for res in refusal.resources:
        if res.requested is None:
            continue
        if not numbers:
            numbers = {"resource": res.resource, "requested": format_quantity(res.requested)}
            if res.limit is not None:
                numbers["limit"] = format_quantity(res.limit)
            if res.used is not None:
                numbers["used"] = format_quantity(res.used)
        if res.limit is not None:
            used = f", {format_quantity(res.used)} in use" if res.used is not None else ""
            details.append(
                f"needs {format_quantity(res.requested)} {res.resource}; the limit is "
                f"{format_quantity(res.limit)}{used}"
            )
    where = {
        "quota": f"ResourceQuota {refusal.name}",
        "kueue": f"the ClusterQueue's flavor {refusal.name} (Kueue)",
        "limit-range": "the namespace's LimitRange",
    }.get(refusal.kind, f"ResourceQuota {refusal.name}")
    if refusal.kind == "quota-unspecified":
        missing = ", ".join(r.resource for r in refusal.resources)
        return _Finding(
            R.WAITING_FOR_QUOTA,
            f"ResourceQuota {refusal.name} requires the Pod to declare {missing}",
            waitable=False,
            action="Declare the requests and limits the quota tracks (kubetrain sets cpu, "
            "memory and GPUs).",
        )
    detail = f"{where}: " + "; ".join(details) if details else f"{where} refuses the Pod"
    never = [r for r in refusal.resources if r.never]
    action = None
    if never:
        res = never[0]
        action = (
            f"Ask for at most {format_quantity(res.limit or Decimal(0))} {res.resource}, "
            f"or ask the platform to raise {where}; waiting will not help."
        )
    return _Finding(
        R.WAITING_FOR_QUOTA, detail, waitable=refusal.waitable, action=action, numbers=numbers
    )


def _suspended(reader: _Reader) -> list[_Finding]:
    workloads = reader.index.workloads_by_job.get((reader.job.namespace, reader.job.k8s_name), [])
    job_conditions = _conditions(reader.k8s_job)
    suspended = job_conditions.get("Suspended")
    since = timestamp(suspended, "lastTransitionTime") if suspended else None
    for workload in workloads:
        conditions = _conditions(workload)
        reserved = conditions.get("QuotaReserved")
        evicted = _true(conditions, "Evicted")
        if evicted is not None and text(evicted, "reason") == "Preempted":
            # Kueue took the quota back for another workload and requeued this one: that
            # is why it waits, whatever its new place in the queue says.
            preempted = _true(conditions, "Preempted")
            said = text(preempted, "message") if preempted else text(evicted, "message")
            how = f" ({text(preempted, 'reason')})" if preempted else ""
            return [
                _Finding(
                    R.WAITING_FOR_QUOTA,
                    f"the queue preempted the job{how}: {said}; it waits for quota again",
                    raw_reason=text(evicted, "reason"),
                    raw_message=said,
                    since=timestamp(evicted, "lastTransitionTime") or since,
                )
            ]
        if reserved is not None and text(reserved, "status") == "False":
            message = text(reserved, "message") or ""
            refusal = parse_kueue_message(message)
            uncovered = _KUEUE_UNCOVERED.search(message)
            if uncovered:
                finding = _uncovered(workload, uncovered["resource"])
            elif refusal:
                finding = _refusal_finding(refusal)
            else:
                finding = _Finding(R.WAITING_FOR_QUOTA, message)
            inadmissible = text(reserved, "reason") == "Inadmissible"
            if inadmissible:
                finding.waitable = False
            finding.raw_reason, finding.raw_message = text(reserved, "reason"), message
            finding.since = timestamp(reserved, "lastTransitionTime") or since
            return [finding]
        if evicted is not None:
            said = text(evicted, "message")
            return [
                _Finding(
                    R.WAITING_FOR_QUOTA,
                    f"the queue evicted the job: {said or text(evicted, 'reason')}",
                    raw_reason=text(evicted, "reason"),
                    raw_message=said,
                    since=timestamp(evicted, "lastTransitionTime"),
                )
            ]
    if not workloads:
        reader.note("the Job is suspended and the snapshot holds no Kueue Workload for it")
    return [
        _Finding(
            R.WAITING_FOR_QUOTA,
            "the Job is suspended: a queue (Kueue) has not admitted it yet",
            raw_reason=text(suspended, "reason") if suspended else "Suspended",
            raw_message=text(suspended, "message") if suspended else None,
            since=since,
        )
    ]


def _uncovered(workload: Mapping[str, Any], resource: str) -> _Finding:
    """The job's ClusterQueue has no quota at all for `resource`: waiting cannot help."""
    queue = text(workload, "status", "admission", "clusterQueue")
    local = text(workload, "spec", "queueName")
    where = (
        f"ClusterQueue {queue}"
        if queue
        else f"the ClusterQueue behind LocalQueue {local}"
        if local
        else "the job's ClusterQueue"
    )
    return _Finding(
        R.WAITING_FOR_QUOTA,
        f"{where} (Kueue) has no quota for {resource} at all",
        waitable=False,
        action=f"Ask the platform to give {where} quota for {resource}, or ask for no "
        f"{resource}; waiting will not help.",
        numbers={"resource": resource},
    )
