"""Kueue's queues read from its own objects: which ClusterQueue a Workload waits in, its
place among the others, and a ClusterQueue's quota and use per flavor.

The order is Kueue's (pkg/queue, BestEffortFIFO and StrictFIFO alike): higher
priority first, then the earlier queue-ordering timestamp (Kueue's
`Ordering.GetQueueOrderTimestamp`) — the Workload's creation; for one evicted because
its Pods were not ready in time, the eviction (Kueue's default
`requeuingStrategy.timestamp: Eviction`); for one evicted by an AdmissionCheck, that
eviction; for one preempted to reclaim what its queue borrowed, just after the
preemption — then the name, for a stable answer. A Workload whose
`status.requeueState.requeueAt` is still to come waits out Kueue's backoff outside the
line (Kueue keeps it off its heap until then): it is ahead of no one, and has no place.
A dump or the caches hold every Workload, so the position computed here is the one
Kueue's visibility API would give, as of the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from kubetrain.domain.objects import as_list, as_map, meta_name, meta_namespace, text, timestamp
from kubetrain.domain.quantity import QuantityError, parse_quantity

__all__ = [
    "FlavorQuota",
    "QueuedWorkload",
    "backing_off",
    "flavor_quota",
    "pending_in_order",
    "queued",
    "workload_condition",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def workload_condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The Workload's condition of this type, if any."""
    for condition in as_list(workload, "status", "conditions"):
        if isinstance(condition, Mapping) and text(condition, "type") == kind:
            return condition
    return None


def _true(workload: Mapping[str, Any], kind: str) -> bool:
    condition = workload_condition(workload, kind)
    return condition is not None and text(condition, "status") == "True"


def _quantity(value: object) -> Decimal | None:
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str):
        return None
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


@dataclass(frozen=True)
class QueuedWorkload:
    """One Workload as a queue sees it."""

    namespace: str
    name: str
    job: str | None  # the Job that owns it (Kueue makes one Workload per Job)
    job_uid: str | None
    uid: str
    cluster_queue: str | None  # admitted into, or behind its LocalQueue
    local_queue: str | None
    priority: int
    ordered_at: datetime | None
    requeue_at: datetime | None  # in Kueue's backoff until then, out of the line
    reserved: bool  # QuotaReserved=True: it holds quota
    finished: bool
    active: bool  # spec.active is not false (a deactivated one leaves the queue)
    requests: Mapping[str, Decimal]  # summed over its pod sets (Kueue's, else the specs')
    # What its admission reserves, by (flavor, resource): Kueue's own cache counts a
    # ClusterQueue's use from these; the ClusterQueue's status follows them a moment later.
    reserves: Mapping[tuple[str, str], Decimal]

    @property
    def pending(self) -> bool:
        return not self.reserved and not self.finished and self.active

    @property
    def who(self) -> str:
        """The job it stands for, as a person names it: its Job, else the Workload."""
        return self.job or f"Workload {self.name}"


def queued(
    workload: Mapping[str, Any], local_queues: Mapping[tuple[str, str], Mapping[str, Any]]
) -> QueuedWorkload:
    namespace = meta_namespace(workload)
    local = text(workload, "spec", "queueName")
    cluster = text(workload, "status", "admission", "clusterQueue")
    if not cluster and local:
        cluster = text(local_queues.get((namespace, local)) or {}, "spec", "clusterQueue")
    job = next(
        (
            ref
            for ref in as_list(workload, "metadata", "ownerReferences")
            if text(ref, "kind") == "Job"
        ),
        None,
    )
    priority = as_map(workload, "spec").get("priority")
    evicted = workload_condition(workload, "Evicted")
    ordered_at = timestamp(workload, "metadata", "creationTimestamp")
    preempted = workload_condition(workload, "Preempted")
    if (
        evicted is not None
        and text(evicted, "status") == "True"
        and text(evicted, "reason") in ("PodsReadyTimeout", "AdmissionCheck")
    ):
        ordered_at = timestamp(evicted, "lastTransitionTime") or ordered_at
    elif (
        preempted is not None
        and text(preempted, "status") == "True"
        and text(preempted, "reason") == "InCohortReclaimWhileBorrowing"
    ):
        # Kueue's epsilon: strictly after the preemptor that reclaimed the quota.
        moment = timestamp(preempted, "lastTransitionTime")
        ordered_at = moment + timedelta(milliseconds=1) if moment else ordered_at
    requests: dict[str, Decimal] = {}
    for pod_set in as_list(workload, "status", "resourceRequests"):
        for resource, value in as_map(pod_set, "resources").items():
            amount = _quantity(value)
            if amount is not None:
                requests[resource] = requests.get(resource, Decimal(0)) + amount
    if not requests:
        # Kueue writes them only once its scheduler has considered the Workload: one
        # just evicted (preempted) has none until then.
        requests = _pod_set_requests(workload)
    reserves: dict[tuple[str, str], Decimal] = {}
    for assignment in as_list(workload, "status", "admission", "podSetAssignments"):
        flavors = as_map(assignment, "flavors")
        for resource, value in as_map(assignment, "resourceUsage").items():
            amount, flavor = _quantity(value), flavors.get(resource)
            if amount is not None and isinstance(flavor, str):
                reserves[(flavor, resource)] = reserves.get((flavor, resource), Decimal(0)) + amount
    labels = as_map(workload, "metadata", "labels")
    return QueuedWorkload(
        namespace=namespace,
        name=meta_name(workload) or "",
        job=text(job, "name") if job else None,
        job_uid=(text(job, "uid") if job else None) or labels.get("kueue.x-k8s.io/job-uid"),
        uid=text(workload, "metadata", "uid") or "",
        cluster_queue=cluster or None,
        local_queue=local or None,
        priority=priority if isinstance(priority, int) else 0,
        ordered_at=ordered_at,
        requeue_at=timestamp(workload, "status", "requeueState", "requeueAt"),
        reserved=_true(workload, "QuotaReserved"),
        finished=_true(workload, "Finished"),
        active=as_map(workload, "spec").get("active") is not False,
        requests=requests,
        reserves=reserves,
    )


def _pod_set_requests(workload: Mapping[str, Any]) -> dict[str, Decimal]:
    """What the Workload's pod sets ask for: per Pod, its containers' requests (a limit
    where there is no request, as Kubernetes defaults it), times the pod set's count."""
    total: dict[str, Decimal] = {}
    for pod_set in as_list(workload, "spec", "podSets"):
        count = as_map(pod_set).get("count")
        pods = Decimal(count) if isinstance(count, int) else Decimal(1)
        for container in as_list(pod_set, "template", "spec", "containers"):
            resources = as_map(container, "resources")
            asked = {**as_map(resources, "limits"), **as_map(resources, "requests")}
            for resource, value in asked.items():
                amount = _quantity(value)
                if amount is not None:
                    total[resource] = total.get(resource, Decimal(0)) + amount * pods
    return total


def pending_in_order(
    workloads: Iterable[QueuedWorkload], cluster_queue: str, now: datetime | None = None
) -> list[QueuedWorkload]:
    """The ClusterQueue's pending Workloads, first in line first (the module's order);
    as of `now`, those still in Kueue's backoff (requeueAt to come) are left out."""
    waiting = [
        w
        for w in workloads
        if w.cluster_queue == cluster_queue and w.pending and not backing_off(w, now)
    ]
    return sorted(waiting, key=lambda w: (-w.priority, w.ordered_at or _EPOCH, w.name))


def backing_off(workload: QueuedWorkload, now: datetime | None) -> bool:
    """Still in Kueue's backoff after an eviction at `now` (requeueAt to come)."""
    return now is not None and workload.requeue_at is not None and workload.requeue_at > now


@dataclass(frozen=True)
class FlavorQuota:
    """One resource of one flavor of a ClusterQueue: its quota and what is reserved."""

    nominal: Decimal | None
    borrowing_limit: Decimal | None  # None: unlimited within its cohort, or no cohort
    reserved: Decimal | None  # status.flavorsReservation: what admitted Workloads hold
    borrowed: Decimal | None  # of it, borrowed from the cohort
    cohort: str | None

    @property
    def most(self) -> Decimal | None:
        """The most the ClusterQueue may ever admit of it: nominal, plus what it may
        borrow where it is in a cohort with a limit; None when unknown or unbounded."""
        if self.nominal is None:
            return None
        if self.cohort is None:
            return self.nominal
        if self.borrowing_limit is None:
            return None
        return self.nominal + self.borrowing_limit


def flavor_quota(
    cluster_queue: Mapping[str, Any], flavor: str, resource: str
) -> FlavorQuota | None:
    """The ClusterQueue's quota of `resource` in `flavor`; None where it names none."""
    cohort = text(cluster_queue, "spec", "cohort") or text(cluster_queue, "spec", "cohortName")
    for group in as_list(cluster_queue, "spec", "resourceGroups"):
        for entry in as_list(group, "flavors"):
            if text(entry, "name") != flavor:
                continue
            for quota in as_list(entry, "resources"):
                if text(quota, "name") != resource:
                    continue
                reserved = borrowed = None
                for used in as_list(cluster_queue, "status", "flavorsReservation"):
                    if text(used, "name") != flavor:
                        continue
                    for amount in as_list(used, "resources"):
                        if text(amount, "name") == resource:
                            reserved = _quantity(amount.get("total"))
                            borrowed = _quantity(amount.get("borrowed"))
                return FlavorQuota(
                    nominal=_quantity(quota.get("nominalQuota")),
                    borrowing_limit=_quantity(quota.get("borrowingLimit")),
                    reserved=reserved,
                    borrowed=borrowed,
                    cohort=cohort or None,
                )
    return None
