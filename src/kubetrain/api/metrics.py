"""GET /metrics: Prometheus' text format, unauthenticated like the probes (a scraper
holds no API token); it shows counts and timings, never a job's name or spec.

Most of it is read from the database (the same on every replica); the jobs pending per
ClusterQueue come from the control loops' caches, so only the replica that runs them
(the leader) reports that family's series."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from kubetrain.api.queues import QueuePending, pending_counts
from kubetrain.store import Database
from kubetrain.store.metrics import JobCounts
from kubetrain.store.usage import GpuSecondsTotal


class _ProcessWide(Collector):
    """The process-wide registry, seen through an app's own registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


def app_registry(db: Database) -> CollectorRegistry:
    """What one app's /metrics shows: the process' metrics, `db`'s job counts and
    GPU-seconds."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProcessWide())
    registry.register(JobCounts(db))
    registry.register(GpuSecondsTotal(db))
    return registry


def add_metrics(
    app: FastAPI, db: Database, cluster: Callable[[], dict[str, Any] | None] | None = None
) -> None:
    """`cluster`: the control loops' caches (ApiContext.cluster), where this process
    runs them."""
    registry = app_registry(db)

    @app.get(
        "/metrics",
        tags=["health"],
        summary="Metrics in Prometheus' text format",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus exposition format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def metrics() -> Response:
        # The caches are read here, on the event loop's thread where they change; the
        # database's families in a worker thread.
        listing = cluster() if cluster is not None else None
        body = await run_in_threadpool(generate_latest, registry)
        if listing is not None:
            queues = CollectorRegistry(auto_describe=False)
            queues.register(QueuePending(pending_counts(listing)))
            body += generate_latest(queues)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
