"""Whether quota holds the job: the API server's admission refusals (ResourceQuota,
LimitRange) of the job's Pod, and a Job suspended until a queue (Kueue) admits it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
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
from kubetrain.domain.objects import as_list, meta_namespace, text, timestamp
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.queues import (
    QueuedWorkload,
    backing_off,
    flavor_quota,
    pending_in_order,
    queued,
)
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
    workloads = reader.workloads
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
            return [_preempted(reader, workload, conditions, evicted, since)]
        if reserved is not None and text(reserved, "status") == "False":
            message = text(reserved, "message") or ""
            refusal = parse_kueue_message(message)
            uncovered = _KUEUE_UNCOVERED.search(message)
            if text(reserved, "reason") == "Inadmissible":
                finding = _inactive(reader, workload, message)
            elif uncovered:
                finding = _uncovered(workload, uncovered["resource"])
            elif refusal:
                finding = _pending(reader, workload, refusal)
            else:
                # Just evicted, not tried again yet: QuotaReserved repeats the eviction's
                # message ("Exceeded the PodsReady timeout <workload>", "At least one
                # admission check is false"); say what Kueue did in words.
                finding = _Finding(R.WAITING_FOR_QUOTA, _eviction(workload, evicted) or message)
                _place(reader, workload, finding)
            finding.raw_reason, finding.raw_message = text(reserved, "reason"), message
            finding.since = timestamp(reserved, "lastTransitionTime") or since
            return [finding]
        if evicted is not None:
            said = text(evicted, "message")
            finding = _Finding(
                R.WAITING_FOR_QUOTA,
                f"the queue evicted the job: {said or text(evicted, 'reason')}",
                raw_reason=text(evicted, "reason"),
                raw_message=said,
                since=timestamp(evicted, "lastTransitionTime"),
            )
            _place(reader, workload, finding)
            return [finding]
        admitted = _true(conditions, "Admitted")
        if admitted is not None:
            # Kueue admitted it (a preempted one again: Evicted is False by now) and is
            # about to resume the Job: a moment of starting, no longer a wait for quota.
            me = _queued(reader, workload)
            queue = f"ClusterQueue {me.cluster_queue}" if me.cluster_queue else "the queue"
            return [
                _Finding(
                    R.SCHEDULING,
                    f"{queue} admitted the job; Kueue is resuming its Job",
                    raw_reason=text(admitted, "reason"),
                    raw_message=text(admitted, "message"),
                    since=timestamp(admitted, "lastTransitionTime") or since,
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


def _eviction(workload: Mapping[str, Any], evicted: Mapping[str, Any] | None) -> str | None:
    """What Kueue did, for the evictions that requeue a Workload at the eviction
    (Evicted=True, reasons as recorded from Kueue v0.17); None for any other."""
    reason = text(evicted, "reason") if evicted is not None else None
    if reason == "PodsReadyTimeout":
        return (
            "Kueue evicted the job: not all its Pods were ready within Kueue's "
            "waitForPodsReady timeout (PodsReadyTimeout)"
        )
    if reason == "AdmissionCheck":
        # Kueue resets each check to Pending on the eviction and counts its retries.
        retried = [
            name
            for check in as_list(workload, "status", "admissionChecks")
            if (name := text(check, "name")) and isinstance(check.get("retryCount"), int)
        ]
        which = f"AdmissionCheck {', '.join(retried)}" if retried else "an AdmissionCheck"
        return f"Kueue evicted the job: {which} of its ClusterQueue asked for a retry"
    return None


def _pods_ready_wait(reader: _Reader, findings: list[_Finding]) -> None:
    """An admitted job whose Pods are not all ready while Kueue's waitForPodsReady counts
    (its Workload's PodsReady condition is False; Kueue writes that condition only with
    waitForPodsReady on): the primary finding says that Kueue will evict the whole job
    and requeue it (PodsReadyTimeout) unless every Pod is ready in time, and since when
    the time counts. The timeout itself is Kueue's configuration, not in any object."""
    if not findings:
        return
    for workload in reader.workloads:
        conditions = _conditions(workload)
        admitted, ready = _true(conditions, "Admitted"), conditions.get("PodsReady")
        if admitted is None or ready is None or text(ready, "status") != "False":
            continue
        # Kueue counts a start from the admission, a recovery (a Pod failed after all were
        # ready) from the PodsReady condition's change (workload_controller.go,
        # admittedNotReadyWorkload, Kueue v0.17).
        recovering = text(ready, "reason") == "WaitForRecovery"
        start = timestamp(ready if recovering else admitted, "lastTransitionTime")
        counted = f", counted from {'its Pods failing' if recovering else 'its admission'}" + (
            f" at {start.strftime('%Y-%m-%d %H:%M:%SZ')}" if start else ""
        )
        whole = "the whole gang" if reader.workers > 1 else "the job"
        primary = findings[0]
        said = (
            f"Kueue's waitForPodsReady will evict {whole} and requeue it (PodsReadyTimeout) "
            f"unless all its Pods are ready within Kueue's timeout{counted}"
        )
        primary.detail = f"{primary.detail}; {said}" if primary.detail else said
        me = _queued(reader, workload)
        if me.cluster_queue:
            primary.numbers.setdefault("queue", me.cluster_queue)
        flavors = {flavor for flavor, _ in me.reserves}
        if len(flavors) == 1:
            primary.numbers.setdefault("flavor", flavors.pop())
        return


def _queued(reader: _Reader, workload: Mapping[str, Any]) -> QueuedWorkload:
    return queued(workload, reader.index.local_queues)


def _named(workloads: list[QueuedWorkload], namespace: str, most: int = 5) -> str:
    """Jobs by name (with their namespace where it is not the job's own), at most `most`."""
    names = [_who(w, namespace) for w in workloads]
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _who(workload: QueuedWorkload, namespace: str) -> str:
    return (
        workload.who if workload.namespace == namespace else f"{workload.namespace}/{workload.who}"
    )


def _place(reader: _Reader, workload: Mapping[str, Any], finding: _Finding) -> None:
    """The job's position among its ClusterQueue's pending Workloads and the jobs ahead
    of it, in the finding's numbers and words, where the snapshot says its queue."""
    me = _queued(reader, workload)
    if me.cluster_queue is None or not me.pending:
        return
    if backing_off(me, reader.now) and me.requeue_at is not None:
        # Kueue keeps it out of the line until then (its backoff after an eviction).
        finding.numbers["queue"] = me.cluster_queue
        finding.detail += (
            f"; out of the queue until {me.requeue_at.strftime('%Y-%m-%d %H:%M:%SZ')} "
            "(Kueue's backoff after an eviction, status.requeueState.requeueAt)"
        )
        return
    everyone = [_queued(reader, w) for w in reader.index.all_workloads]
    line = pending_in_order(everyone, me.cluster_queue, reader.now)
    at = next((n for n, w in enumerate(line) if w.uid == me.uid and w.name == me.name), None)
    if at is None:
        return
    ahead = line[:at]
    ns = reader.job.namespace
    finding.position = at + 1
    finding.ahead = tuple(_who(w, ns) for w in ahead)
    finding.numbers["queue"] = me.cluster_queue
    behind = f", behind {_named(ahead, ns)}" if ahead else ", nothing pending ahead of it"
    finding.detail += f"; position {at + 1} in the queue{behind}"


def _pending(reader: _Reader, workload: Mapping[str, Any], refusal: AdmissionRefusal) -> _Finding:
    """Kueue's flavor assigner found no room: requested against the ClusterQueue's
    nominal quota (and what it may borrow), and what admitted jobs hold of it."""
    finding = _refusal_finding(refusal)
    me = _queued(reader, workload)
    queue_name, flavor = me.cluster_queue, refusal.name
    resource = refusal.resources[0].resource if refusal.resources else None
    cluster_queue = reader.index.cluster_queues.get(queue_name or "")
    if queue_name is None or resource is None or flavor is None:
        return finding
    quota = flavor_quota(cluster_queue, flavor, resource) if cluster_queue else None
    requested = me.requests.get(resource) or refusal.resources[0].requested
    numbers = {"resource": resource, "queue": queue_name, "flavor": flavor}
    if requested is not None:
        numbers["requested"] = format_quantity(requested)
    where = f"ClusterQueue {queue_name} (flavor {flavor})"
    needs = f"needs {format_quantity(requested)} {resource}" if requested is not None else ""
    holders = [
        w
        for w in (_queued(reader, w) for w in reader.index.all_workloads)
        if w.cluster_queue == queue_name and w.reserved and not w.finished and w.uid != me.uid
    ]
    quota_words = ""
    if quota is not None and quota.nominal is not None:
        numbers["nominal"] = format_quantity(quota.nominal)
        if quota.borrowing_limit is not None:
            numbers["borrowing_limit"] = format_quantity(quota.borrowing_limit)
        most = quota.most
        numbers["limit"] = format_quantity(most if most is not None else quota.nominal)
        borrow = (
            ""
            if quota.cohort is None
            else f", plus up to {format_quantity(quota.borrowing_limit)} borrowed from cohort "
            f"{quota.cohort}"
            if quota.borrowing_limit is not None
            else f", plus what cohort {quota.cohort} lends"
        )
        quota_words = f"its nominal quota is {format_quantity(quota.nominal)}{borrow}"
        # What admitted Workloads reserve, from the Workloads themselves where the
        # snapshot holds any (the ClusterQueue's status lags them); else its status.
        held = (
            sum((w.reserves.get((flavor, resource), Decimal(0)) for w in holders), Decimal(0))
            if holders
            else quota.reserved
        )
        if held is not None:
            numbers["used"] = format_quantity(held)
            borrowed = f" ({format_quantity(quota.borrowed)} borrowed)" if quota.borrowed else ""
            quota_words += f", {format_quantity(held)}{borrowed} reserved"
            if holders:
                quota_words += f" by {_named(holders, reader.job.namespace)}"
    else:
        limit = refusal.resources[0].limit if refusal.resources else None
        if limit is not None:
            numbers["limit"] = format_quantity(limit)
    finding.numbers = numbers
    if refusal.waitable is False:
        most_words = numbers.get("limit")
        finding.detail = (
            f"{where} can never admit the job: it {needs}, more than the "
            f"{most_words} the queue may ever hold" + (f" ({quota_words})" if quota_words else "")
        )
        if most_words is not None:
            finding.action = (
                f"Ask for at most {most_words} {resource}, or ask the platform to raise "
                f"ClusterQueue {queue_name}'s quota; waiting will not help."
            )
        return finding
    finding.detail = f"{where}: the job {needs}" + (f"; {quota_words}" if quota_words else "")
    _place(reader, workload, finding)
    return finding


# Kueue's preemption message names the preemptor by its Workload's and its Job's UIDs
# (pkg/scheduler/preemption, Kueue v0.9-v0.17).
_PREEMPTOR = re.compile(r"\(UID: (?P<uid>[^,)\s]+), JobUID: (?P<job_uid>[^,)\s]+)\)")
# Why Kueue preempted (the Preempted condition's reason).
_PREEMPTION_WHY = {
    "InClusterQueue": "a higher-priority job of the same ClusterQueue",
    "InCohortReclamation": "a job of another ClusterQueue of the cohort reclaiming its quota",
    "InCohortFairSharing": "fair sharing within the cohort",
    "InCohortReclaimWhileBorrowing": "a higher-priority job of the cohort, while borrowing",
}


def _preempted(
    reader: _Reader,
    workload: Mapping[str, Any],
    conditions: Mapping[str, Mapping[str, Any]],
    evicted: Mapping[str, Any],
    since: datetime | None,
) -> _Finding:
    preempted = _true(conditions, "Preempted")
    said = text(preempted, "message") if preempted else text(evicted, "message")
    why = text(preempted, "reason") if preempted else None
    found = _PREEMPTOR.search(said or "")
    preemptor = None
    if found:
        for other in (_queued(reader, w) for w in reader.index.all_workloads):
            if other.uid == found["uid"] or (other.job_uid and other.job_uid == found["job_uid"]):
                preemptor = _who(other, reader.job.namespace)
                break
    me = _queued(reader, workload)
    by = f" for {preemptor}" if preemptor else ""
    because = f" ({_PREEMPTION_WHY.get(why or '', why)})" if why else ""
    queue = f"ClusterQueue {me.cluster_queue}" if me.cluster_queue else "the queue"
    detail = f"{queue} preempted the job{by}{because}; it waits for quota again"
    requeue_at = timestamp(workload, "status", "requeueState", "requeueAt")
    if requeue_at is not None:
        detail += f", requeued at {requeue_at.strftime('%Y-%m-%d %H:%M:%SZ')}"
    # PREEMPTED, not a plain wait for quota: the history then says the job was
    # preempted, and its re-admission follows it there.
    finding = _Finding(
        R.PREEMPTED,
        detail,
        waitable=True,
        raw_reason=text(evicted, "reason"),
        raw_message=said,
        since=timestamp(evicted, "lastTransitionTime") or since,
    )
    if me.cluster_queue:
        finding.numbers["queue"] = me.cluster_queue
    _place(reader, workload, finding)
    return finding


def _preempted_for(reader: _Reader) -> tuple[str, ...]:
    """The jobs whose current Preempted condition names one of this job's Workloads that
    holds quota: Kueue preempted them to admit it. (Re-admitted, a job's condition turns
    False, "Previously: …", and it is no longer named.)"""
    mine = [_queued(reader, w) for w in reader.workloads]
    uids = {w.uid for w in mine if w.reserved and w.uid}
    if not uids:
        return ()
    victims = []
    for other in reader.index.all_workloads:
        preempted = _true(_conditions(other), "Preempted")
        found = _PREEMPTOR.search(text(preempted, "message") or "") if preempted else None
        if found and found["uid"] in uids:
            victims.append(_who(_queued(reader, other), reader.job.namespace))
    return tuple(sorted(victims))


def _inactive(reader: _Reader, workload: Mapping[str, Any], message: str) -> _Finding:
    """Kueue will not consider the job at all (Inadmissible): its LocalQueue or
    ClusterQueue is missing, stopped or closed to the namespace — the platform's to fix.
    Said from the queues' own objects where the snapshot holds them, else Kueue's words."""
    namespace = meta_namespace(workload)
    local_name = text(workload, "spec", "queueName")
    local = reader.index.local_queues.get((namespace, local_name or ""))
    queue_name = text(local, "spec", "clusterQueue") if local else None
    cluster = reader.index.cluster_queues.get(queue_name or "")
    detail = message
    if local is not None and _stopped(local):
        detail = f"LocalQueue {local_name} is stopped (stopPolicy {_stopped(local)})"
    elif local is not None and queue_name and cluster is None and reader.index.cluster_queues:
        detail = (
            f"LocalQueue {local_name} sends its jobs to ClusterQueue {queue_name}, "
            "which does not exist"
        )
    elif cluster is not None and _stopped(cluster):
        detail = f"ClusterQueue {queue_name} is stopped (stopPolicy {_stopped(cluster)})"
    elif (
        cluster is not None
        and (active := _conditions(cluster).get("Active")) is not None
        and text(active, "status") == "False"
    ):
        detail = f"ClusterQueue {queue_name} is inactive: {text(active, 'message') or message}"
    finding = _Finding(R.QUEUE_INACTIVE, detail, waitable=False)
    if queue_name:
        finding.numbers["queue"] = queue_name
    return finding


def _stopped(queue: Mapping[str, Any]) -> str | None:
    policy = text(queue, "spec", "stopPolicy")
    return policy if policy and policy != "None" else None


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
