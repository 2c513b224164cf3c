"""GET /metrics: Prometheus' text format, unauthenticated like the probes (a scraper
holds no API token); it shows counts and timings, never a job's name or spec."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from kubetrain.metrics import app_registry
from kubetrain.store import Database


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
