"""`GET /api/v1/queues`: Kueue's ClusterQueues as the control loops' caches hold them:
per flavor and resource the quota and what admitted jobs reserve of it, and the pending
jobs in the order Kueue will consider them.

The order and each Workload's reading are domain/queues.py's, the ones the diagnosis
gives a job's position with, so the page, the CLI and `why` agree. What admitted jobs
reserve is summed from their Workloads' admissions, as Kueue's own cache counts it (a
ClusterQueue's status follows a moment later), and borrowed is what is reserved above
the nominal quota. A Workload that Kueue evicted and holds off until
`status.requeueState.requeueAt` (its backoff after a `waitForPodsReady` or admission
check eviction) is out of the line until then, as in Kueue's own queue: listed apart
(`requeuing`), with the moment, and ahead of no one.

Only the process that runs the control loops (the leader) holds the caches; any other
answers 503. A project token sees every ClusterQueue's numbers but only its own
namespace's pending jobs (the positions stay those of the whole queue); `*` sees all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from kubetrain.api.auth import Caller, role_may, visible_namespaces
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import ProblemError, problem_responses
from kubetrain.domain.manifest import LABEL_JOB_ID
from kubetrain.domain.objects import as_list, as_map, meta_name, meta_namespace, text
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.queues import (
    QueuedWorkload,
    backing_off,
    flavor_quota,
    pending_in_order,
    queued,
    workload_condition,
)
from kubetrain.store import ALL_PROJECTS, get_job_any_project

_NEVER = datetime.max.replace(tzinfo=UTC)  # a sort key; never an answer

router = APIRouter(
    prefix="/api/v1/queues", tags=["queues"], responses=problem_responses(401, 403, 500, 503)
)

Context = Annotated[ApiContext, Depends(get_context)]
NO_CLUSTER = "urn:kubetrain:problem:no-cluster"
NOT_WATCHING = (
    "this kubetrain server does not watch the cluster (it runs no control loops, or they "
    "have not finished their first list yet); ask the replica that runs them"
)


# -- what the caches say, read purely ------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuotaLine:
    """One resource of one flavor of a ClusterQueue."""

    flavor: str
    resource: str
    nominal: Decimal | None
    borrowing_limit: Decimal | None  # None: no limit within its cohort, or no cohort
    reserved: Decimal  # held by the admitted (quota-reserved, unfinished) Workloads
    borrowed: Decimal  # of it, above the nominal quota: lent by the cohort


@dataclass(frozen=True, slots=True)
class PendingLine:
    position: int  # 1: considered next
    workload: QueuedWorkload
    job_id: str | None  # kubetrain's job, when the Workload's Job is one of ours
    message: str | None  # Kueue's words on why it holds no quota yet


@dataclass(frozen=True, slots=True)
class RequeuingLine:
    workload: QueuedWorkload  # its requeue_at still to come
    job_id: str | None


@dataclass(frozen=True, slots=True)
class QueueBoard:
    """One ClusterQueue: its quota lines, and the pending jobs the caller may see."""

    name: str
    cohort: str | None
    active: bool | None  # its Active condition; None: not said yet
    inactive_reason: str | None
    quotas: tuple[QuotaLine, ...]
    admitted: int  # Workloads holding quota in it
    pending_total: int  # every pending Workload, seen or not
    pending: tuple[PendingLine, ...]  # those the caller may see, first in line first
    requeuing: tuple[RequeuingLine, ...] = ()  # in Kueue's backoff, out of the line


def _items(listing: Mapping[str, Any], kind: str) -> Iterator[Mapping[str, Any]]:
    for item in listing.get("items") or []:
        if isinstance(item, Mapping) and item.get("kind") == kind:
            yield item


def read_workloads(listing: Mapping[str, Any]) -> list[QueuedWorkload]:
    """Every Workload of the listing as its queue sees it (domain/queues.py)."""
    local_queues = {
        (meta_namespace(q), meta_name(q) or ""): q for q in _items(listing, "LocalQueue")
    }
    return [queued(w, local_queues) for w in _items(listing, "Workload")]


def _quota_lines(
    cluster_queue: Mapping[str, Any], holders: list[QueuedWorkload]
) -> list[QuotaLine]:
    lines = []
    for group in as_list(cluster_queue, "spec", "resourceGroups"):
        for entry in as_list(group, "flavors"):
            flavor = text(entry, "name")
            for resource_quota in as_list(entry, "resources"):
                resource = text(resource_quota, "name")
                if not flavor or not resource:
                    continue
                quota = flavor_quota(cluster_queue, flavor, resource)
                if quota is None:
                    continue
                reserved = sum(
                    (w.reserves.get((flavor, resource), Decimal(0)) for w in holders), Decimal(0)
                )
                over = reserved - quota.nominal if quota.nominal is not None else Decimal(0)
                lines.append(
                    QuotaLine(
                        flavor=flavor,
                        resource=resource,
                        nominal=quota.nominal,
                        borrowing_limit=quota.borrowing_limit,
                        reserved=reserved,
                        borrowed=max(over, Decimal(0)),
                    )
                )
    return lines


def _waiting_words(workload: Mapping[str, Any]) -> str | None:
    condition = workload_condition(workload, "QuotaReserved")
    if condition is None or text(condition, "status") == "True":
        return None
    return text(condition, "message") or None


def queue_boards(
    listing: Mapping[str, Any], namespaces: set[str] | None, now: datetime | None = None
) -> list[QueueBoard]:
    """Every ClusterQueue of the listing, by name; the pending Workloads listed are those
    in `namespaces` (None: all), numbered by their place among every pending one. As of
    `now`, those in Kueue's backoff (requeueAt to come) are out of the line: `requeuing`."""
    workloads = read_workloads(listing)
    raw = {(meta_namespace(w), meta_name(w) or ""): w for w in _items(listing, "Workload")}
    ours = {
        (meta_namespace(j), meta_name(j) or ""): str(as_map(j, "metadata", "labels")[LABEL_JOB_ID])
        for j in _items(listing, "Job")
        if isinstance(as_map(j, "metadata", "labels").get(LABEL_JOB_ID), str)
    }
    boards = []
    for cluster_queue in sorted(_items(listing, "ClusterQueue"), key=lambda q: meta_name(q) or ""):
        name = meta_name(cluster_queue) or ""
        holders = [
            w for w in workloads if w.cluster_queue == name and w.reserved and not w.finished
        ]
        line = pending_in_order(workloads, name, now)
        requeuing = tuple(
            RequeuingLine(w, ours.get((w.namespace, w.job)) if w.job else None)
            for w in sorted(workloads, key=lambda w: (w.requeue_at or _NEVER, w.name))
            if w.cluster_queue == name
            and w.pending
            and backing_off(w, now)
            and (namespaces is None or w.namespace in namespaces)
        )
        pending = tuple(
            PendingLine(
                position=at + 1,
                workload=w,
                job_id=ours.get((w.namespace, w.job)) if w.job else None,
                message=_waiting_words(raw.get((w.namespace, w.name)) or {}),
            )
            for at, w in enumerate(line)
            if namespaces is None or w.namespace in namespaces
        )
        active = next(
            (
                c
                for c in as_list(cluster_queue, "status", "conditions")
                if text(c, "type") == "Active"
            ),
            None,
        )
        cohort = text(cluster_queue, "spec", "cohort") or text(cluster_queue, "spec", "cohortName")
        boards.append(
            QueueBoard(
                name=name,
                cohort=cohort or None,
                active=None if active is None else text(active, "status") == "True",
                inactive_reason=(
                    text(active, "message") or text(active, "reason") or None
                    if active is not None and text(active, "status") != "True"
                    else None
                ),
                quotas=tuple(_quota_lines(cluster_queue, holders)),
                admitted=len(holders),
                pending_total=len(line),
                pending=pending,
                requeuing=requeuing,
            )
        )
    return boards


def pending_counts(listing: Mapping[str, Any], now: datetime | None = None) -> dict[str, int]:
    """Pending Workloads in line per ClusterQueue that exists (the metric's label values);
    as of `now`, not those in Kueue's backoff."""
    workloads = read_workloads(listing)
    return {
        meta_name(q) or "": len(pending_in_order(workloads, meta_name(q) or "", now))
        for q in _items(listing, "ClusterQueue")
    }


# -- the answer ----------------------------------------------------------------------


class QuotaView(BaseModel):
    flavor: str
    resource: str
    nominal: str | None = Field(description="the nominal quota, a Kubernetes quantity")
    borrowing_limit: str | None = Field(
        description="the most it may borrow from its cohort; null: no limit, or no cohort"
    )
    reserved: str = Field(description="what admitted jobs hold, summed from their admissions")
    borrowed: str = Field(description="of the reserved, what is above the nominal quota")


class _WaitingView(BaseModel):
    """A Workload that holds no quota, and kubetrain's job for it."""

    namespace: str
    workload: str
    kubernetes_job: str | None = Field(description="the Job that owns the Workload")
    project: str | None = Field(description="the kubetrain project, for a kubetrain job")
    job_id: str | None
    job_name: str | None
    local_queue: str | None


class PendingView(_WaitingView):
    position: int = Field(description="1: the job Kueue considers next")
    priority: int
    queued_at: datetime | None = Field(description="what Kueue orders by, after priority")
    requests: dict[str, str]
    message: str | None = Field(description="Kueue's words on why it holds no quota yet")


class RequeuingView(_WaitingView):
    requeue_at: datetime = Field(
        description="Kueue's status.requeueState.requeueAt: back in line then, not before"
    )


class ClusterQueueView(BaseModel):
    name: str
    cohort: str | None
    active: bool | None = Field(description="its Active condition; null: not reported yet")
    inactive_reason: str | None
    admitted: int = Field(description="Workloads holding quota in it")
    pending_total: int = Field(description="every pending Workload, yours or not")
    resources: list[QuotaView]
    pending: list[PendingView] = Field(description="the pending jobs you may see, in order")
    requeuing: list[RequeuingView] = Field(
        default_factory=list,
        description="evicted jobs you may see in Kueue's backoff: out of the line until "
        "requeue_at, soonest first",
    )


class Queues(BaseModel):
    cluster_queues: list[ClusterQueueView]


def _q(value: Decimal | None) -> str | None:
    return None if value is None else format_quantity(value)


def _names(context: ApiContext, job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """job id -> (project, name), for the ids that are kubetrain's jobs."""
    wanted = sorted(set(job_ids))
    found: dict[str, tuple[str, str]] = {}
    if not wanted:
        return found
    with context.db.read_only() as session:
        for job_id in wanted:
            job = get_job_any_project(session, job_id)
            if job is not None:
                found[job_id] = (job.project, job.name)
    return found


def queues_view(
    context: ApiContext, boards: list[QueueBoard], caller: Principal | None = None
) -> Queues:
    """The boards as the API answers them, kubetrain's jobs named (a DB read: call it in
    a worker thread). A project token's view names only its own projects' jobs."""
    names = _names(
        context,
        [
            job_id
            for b in boards
            for job_id in [*(p.job_id for p in b.pending), *(r.job_id for r in b.requeuing)]
            if job_id
        ],
    )
    if caller is not None and caller.project != ALL_PROJECTS:
        names = {k: v for k, v in names.items() if v[0] == caller.project}
    return Queues(
        cluster_queues=[
            ClusterQueueView(
                name=b.name,
                cohort=b.cohort,
                active=b.active,
                inactive_reason=b.inactive_reason,
                admitted=b.admitted,
                pending_total=b.pending_total,
                resources=[
                    QuotaView(
                        flavor=q.flavor,
                        resource=q.resource,
                        nominal=_q(q.nominal),
                        borrowing_limit=_q(q.borrowing_limit),
                        reserved=format_quantity(q.reserved),
                        borrowed=format_quantity(q.borrowed),
                    )
                    for q in b.quotas
                ],
                pending=[
                    PendingView(
                        position=p.position,
                        namespace=p.workload.namespace,
                        workload=p.workload.name,
                        kubernetes_job=p.workload.job,
                        project=names.get(p.job_id or "", (None, None))[0],
                        job_id=p.job_id if (p.job_id or "") in names else None,
                        job_name=names.get(p.job_id or "", (None, None))[1],
                        local_queue=p.workload.local_queue,
                        priority=p.workload.priority,
                        queued_at=p.workload.ordered_at,
                        requests={k: format_quantity(v) for k, v in p.workload.requests.items()},
                        message=p.message,
                    )
                    for p in b.pending
                ],
                requeuing=[
                    RequeuingView(
                        namespace=r.workload.namespace,
                        workload=r.workload.name,
                        kubernetes_job=r.workload.job,
                        project=names.get(r.job_id or "", (None, None))[0],
                        job_id=r.job_id if (r.job_id or "") in names else None,
                        job_name=names.get(r.job_id or "", (None, None))[1],
                        local_queue=r.workload.local_queue,
                        requeue_at=r.workload.requeue_at or _NEVER,
                    )
                    for r in b.requeuing
                ],
            )
            for b in boards
        ]
    )


def cluster_listing(context: ApiContext) -> dict[str, Any]:
    """The control loops' caches (on the event loop's thread), or the 503 that says why not."""
    listing = context.cluster() if context.cluster is not None else None
    if listing is None:
        raise ProblemError(503, NOT_WATCHING, type=NO_CLUSTER, title="Not watching the cluster")
    return listing


# async: the watch caches change on the event loop's thread, so they are read there.
@router.get(
    "",
    summary="Kueue's ClusterQueues: quota per flavor, what is reserved, who waits in what order",
    response_model=Queues,
)
async def get_queues(caller: Caller, context: Context) -> Queues:
    role_may(caller, Action.READ)
    listing = cluster_listing(context)
    boards = queue_boards(listing, visible_namespaces(caller, context.settings), datetime.now(UTC))
    return await run_in_threadpool(queues_view, context, boards, caller)


# -- /metrics ------------------------------------------------------------------------


class QueuePending(Collector):
    """kubetrain_queue_pending_jobs{cluster_queue}, counted from the caches' Workloads
    when /metrics is asked (api/metrics.py reads the caches on the event loop and hands
    the counts in). One series per ClusterQueue that exists; none on a replica that
    does not run the control loops."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kubetrain_queue_pending_jobs",
            "Jobs (Kueue Workloads, anyone's) pending in each ClusterQueue",
            labels=["cluster_queue"],
        )
        for name, count in sorted(self.counts.items()):
            family.add_metric([name], count)
        yield family
