"""GET /metrics: Prometheus' text format. Without a token, like the probes, it shows
counts and timings that name no tenant: never a job's name or spec, nor a project
(GPU-seconds only as totals by GPU type and phase). With an API token (a scraper
configured with one, `authorization: {credentials_file: …}` in Prometheus) it adds the
GPU-seconds of each project the token covers (any role: a viewer of `*` sees every
project), as kube-rbac-proxy and controller-runtime's secure metrics (Kueue's) put
metrics behind the platform's own authentication and authorization. An unknown or
revoked token is a 401, not the anonymous answer: a scraper whose token stopped working
must see it fail.

Most of it is read from the database (the same on every replica); the jobs pending per
ClusterQueue come from the control loops' caches, so only the replica that runs them
(the leader) reports that family's series."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from kubetrain.api.auth import bearer, principal
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.problems import problem_responses
from kubetrain.api.queues import QueuePending, pending_counts
from kubetrain.store import ALL_PROJECTS, Database
from kubetrain.store.metrics import JobCounts
from kubetrain.store.usage import GpuSecondsTotal


class _ProcessWide(Collector):
    """The process-wide registry, seen through an app's own registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def app_registry(db: Database) -> CollectorRegistry:
    """What one app's /metrics shows to anyone: the process' metrics, `db`'s job counts
    (GPU-seconds are added per scrape, by who asks)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProcessWide())
    registry.register(JobCounts(db))
    return registry


def add_metrics(
    app: FastAPI, db: Database, cluster: Callable[[], dict[str, Any] | None] | None = None
) -> None:
    """`cluster`: the control loops' caches (ApiContext.cluster), where this process
    runs them."""
    registry = app_registry(db)
    gpu_seconds = GpuSecondsTotal(db)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Metrics in Prometheus' text format",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus exposition format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            },
            **problem_responses(401),
        },
    )
    async def metrics(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        context: Annotated[ApiContext, Depends(get_context)],
    ) -> Response:
        projects: set[str] | None = set()  # none by project: the open answer
        if request.headers.get("authorization") is not None:
            caller = await principal(request, credentials, context)
            if caller.project == ALL_PROJECTS:
                projects = None
            elif context.settings.project_open(caller.project):
                projects = {caller.project}
        # The caches are read here, on the event loop's thread where they change; the
        # database's families in a worker thread.
        listing = cluster() if cluster is not None else None
        body = await run_in_threadpool(generate_latest, registry)
        usage = CollectorRegistry(auto_describe=False)
        usage.register(_Families(await run_in_threadpool(list, gpu_seconds.families(projects))))
        body += generate_latest(usage)
        if listing is not None:
            queues = CollectorRegistry(auto_describe=False)
            queues.register(QueuePending(pending_counts(listing, datetime.now(UTC))))
            body += generate_latest(queues)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
