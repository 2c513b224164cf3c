"""What an operator graphs and alerts on, in Prometheus' text format at /metrics.

The loops count into process-wide metrics as things happen (dispatches, watch
restarts, sync lag, time spent per state, request latency); the job counts by
state and reason are read from the database at each scrape, so every API
replica reports the same numbers whichever of them leads. The list, with the
meaning of each metric, is in docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubetrain.store import Database, Job
from kubetrain.store.jobs import STATE_DURATIONS_KEY

# From a second (a job dispatched at once) to days (a job queued for GPUs).
_STATE_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400)
# The syncer aims at seconds; the long tail shows a backlog.
_LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

DISPATCHER_CREATED = Counter(
    "kubetrain_dispatcher_jobs_created", "Kubernetes Jobs the dispatcher created"
)
DISPATCHER_FAILURES = Counter(
    "kubetrain_dispatcher_create_failures",
    "Job creations that failed (each is retried with backoff), by raw reason",
    ["reason"],
)
DISPATCHER_RETRIES = Counter(
    "kubetrain_dispatcher_retries",
    "Job creations attempted again after an earlier attempt for the same job failed",
)
WATCH_EVENTS = Counter("kubetrain_watch_events", "Watch events received", ["resource"])
WATCH_RESTARTS = Counter(
    "kubetrain_watch_restarts",
    "Watches (or lists) that failed and were reconnected after a backoff",
    ["resource"],
)
WATCH_RELISTS = Counter(
    "kubetrain_watch_relists",
    "Full lists of a resource: at start, and after 410 Gone (events were lost)",
    ["resource", "cause"],
)
WATCH_CONNECTED = Gauge(
    "kubetrain_watch_connected",
    "1 while the watch stream of a resource is open and its cache is synced",
    ["resource"],
)
LEADER = Gauge(
    "kubetrain_leader", "1 while this process holds the Lease and runs the control loops"
)
SYNC_LAG = Histogram(
    "kubetrain_sync_lag_seconds",
    "From the watch event that marked a job to the commit of its business change",
    buckets=_LAG_BUCKETS,
)
SYNC_ROUND = Histogram(
    "kubetrain_sync_round_seconds",
    "Where each syncer round's time goes: wait (from its oldest mark to its start), "
    "load (the records), snapshot, diagnose, write (one transaction)",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
JOB_STATE_SECONDS = Histogram(
    "kubetrain_job_state_seconds",
    "Time jobs spent in a business state, observed when they leave it",
    ["state"],
    buckets=_STATE_BUCKETS,
)
HTTP_DURATION = Histogram(
    "kubetrain_http_request_duration_seconds",
    "API request latency, by route template (not the raw path: ids would explode the series)",
    ["method", "route", "status"],
)


@event.listens_for(Session, "after_commit")
def _report_state_durations(session: Session) -> None:
    # The store notes each finished stay; it counts only once its transaction holds.
    for state, seconds in session.info.pop(STATE_DURATIONS_KEY, ()):
        JOB_STATE_SECONDS.labels(state).observe(seconds)


@event.listens_for(Session, "after_rollback")
def _drop_state_durations(session: Session) -> None:
    session.info.pop(STATE_DURATIONS_KEY, None)


class JobCounts(Collector):
    """kubetrain_jobs{state,reason}, counted in the database at scrape time."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "kubetrain_jobs", "Jobs by business state and reason", labels=["state", "reason"]
        )
        query = select(Job.business_state, Job.reason, func.count()).group_by(
            Job.business_state, Job.reason
        )
        with self.db.read_only() as session:
            for state, reason, count in session.execute(query):
                family.add_metric([str(state), str(reason)], count)
        yield family


class _ProcessWide(Collector):
    """The process-wide registry, seen through an app's own registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def app_registry(db: Database) -> CollectorRegistry:
    """What one app's /metrics shows: the process' metrics and `db`'s job counts."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProcessWide())
    registry.register(JobCounts(db))
    return registry


# Label values must come from bounded sets, or any client can grow the series (and
# the process) without end: a method outside the standard ones is "other", a path
# no route matches is "unmatched", and a status is the code the app itself chose.
HTTP_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)


def method_label(method: str) -> str:
    return method if method in HTTP_METHODS else "other"


class RequestTimer:
    """ASGI middleware: each HTTP request's latency into HTTP_DURATION."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # unless a response starts
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            route: Any = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            HTTP_DURATION.labels(
                method_label(scope.get("method", "")), template, str(status)
            ).observe(time.perf_counter() - started)
