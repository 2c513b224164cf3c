"""GET /metrics: Prometheus' text format, unauthenticated like the probes (a scraper
holds no API token); it shows counts and timings, never a job's name or spec."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from starlette.responses import Response

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


def add_metrics(app: FastAPI, db: Database) -> None:
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
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
