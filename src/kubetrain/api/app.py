"""The FastAPI application: routes, the error answers, health, and the OpenAPI document.

`create_app` builds the app and nothing else: no background loop starts here
(`kubetrain serve` runs the dispatcher and syncer beside it). Every error
leaves as application/problem+json:

    ProblemError            its own status (the handlers' refusals)
    HTTPException           404 unknown path, 405 method, ... from routing
    RequestValidationError  422 with one entry per query/path/header field
    database unreachable    503 with Retry-After
    anything else           500, logged here; the client learns nothing of it
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubetrain import __version__
from kubetrain.api import datasets, jobs, logs, queues, reports, usage, web, webhooks
from kubetrain.api.body import BodyLimit
from kubetrain.api.context import ApiContext
from kubetrain.api.headers import SecurityHeaders
from kubetrain.api.metrics import add_metrics
from kubetrain.api.params import PlainParameters
from kubetrain.api.problems import (
    PROBLEM_MEDIA_TYPE,
    Problem,
    ProblemError,
    database_unavailable,
    problem_response,
    problem_responses,
    validation_error,
)
from kubetrain.api.schemas import Health
from kubetrain.api.timing import RequestTimer
from kubetrain.api.token_cache import VerifiedTokens
from kubetrain.cluster.logs import PodLogs
from kubetrain.cluster.tokenreview import TokenReviewer
from kubetrain.domain.datasets import DatasetVersion
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.spec import FieldProblem, TrainingJob
from kubetrain.settings import ServerSettings
from kubetrain.store import Database

log = logging.getLogger("kubetrain.api")

# A watch reconnects within seconds after a blip; failing for this long, the
# leader's view is stale (not ready), and for the longer one a restart may help.
READINESS_WATCH_FAILING = 30.0
LIVENESS_WATCH_FAILING = 300.0

DESCRIPTION = """\
Training jobs on Kubernetes, and why they are not running.

Authenticate with `Authorization: Bearer <token>` (`kubetrain token create`).
Errors are RFC 9457 problem details (`application/problem+json`).
"""


def create_app(
    settings: ServerSettings,
    db: Database,
    *,
    on_change: Callable[[], None] | None = None,
    on_report: Callable[[str], None] | None = None,
    cluster: Callable[[], dict[str, Any] | None] | None = None,
    watch_problems: Callable[..., list[str]] | None = None,
    pod_logs: PodLogs | None = None,
    cluster_snapshot: Callable[[], Snapshot | None] | None = None,
    pod_tokens: TokenReviewer | None = None,
) -> FastAPI:
    """The API on `db`. `on_change` is called after each commit the dispatcher should act
    on (a new job, a cancel), so it can wake at once instead of at its next poll;
    `on_report(job_id)` after a Pod reported a new phase, so the syncer looks again;
    `cluster` gives the web pages the control loops' cluster view (ApiContext);
    `watch_problems` (ControlLoops') lets the probes report the watches' health;
    `pod_logs` reads Pods' logs (api/logs.py) where the process has a kubeconfig;
    `cluster_snapshot` (ControlLoops') gives a dry run its snapshot to forecast on;
    `pod_tokens` reviews the tokens Pods report with (api/reports.py)."""
    app = _base_app(
        settings,
        db,
        title="kubetrain",
        description=DESCRIPTION,
        on_change=on_change,
        on_report=on_report,
        cluster=cluster,
        watch_problems=watch_problems,
        pod_logs=pod_logs,
        cluster_snapshot=cluster_snapshot,
        pod_tokens=pod_tokens,
    )
    # Ahead of the routers: plain submissions skip FastAPI's per-request solving.
    app.router.routes.append(jobs.PlainSubmitRoute())
    app.include_router(jobs.router)
    app.include_router(logs.router)
    app.include_router(datasets.router)
    app.include_router(reports.router)
    app.include_router(webhooks.router)
    app.include_router(usage.router)
    app.include_router(queues.router)
    web.install(app)
    app.add_middleware(PlainParameters)
    # Added last, so outermost: it also answers errors raised by the body limit.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(CatchAll)
    app.add_middleware(RequestTimer)
    app.add_middleware(SecurityHeaders)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def create_probe_app(
    settings: ServerSettings,
    db: Database,
    *,
    watch_problems: Callable[..., list[str]] | None = None,
    cluster: Callable[[], dict[str, Any] | None] | None = None,
) -> FastAPI:
    """What a replica that runs the control loops only (`serve --no-api`) serves:
    the probes and /metrics, for its Deployment's kubelet and Prometheus; no API.
    `cluster` (its caches) gives /metrics the jobs pending per ClusterQueue."""
    app = _base_app(
        settings,
        db,
        title="kubetrain control loops",
        watch_problems=watch_problems,
        cluster=cluster,
    )
    app.add_middleware(CatchAll)
    app.add_middleware(SecurityHeaders)
    return app


def _base_app(
    settings: ServerSettings,
    db: Database,
    *,
    title: str,
    description: str = "",
    openapi_url: str | None = "/openapi.json",
    on_change: Callable[[], None] | None = None,
    on_report: Callable[[str], None] | None = None,
    cluster: Callable[[], dict[str, Any] | None] | None = None,
    watch_problems: Callable[..., list[str]] | None = None,
    pod_logs: PodLogs | None = None,
    cluster_snapshot: Callable[[], Snapshot | None] | None = None,
    pod_tokens: TokenReviewer | None = None,
) -> FastAPI:
    """What every server answers: its context, the probes, /metrics, problem errors."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        # The submission writer's thread writes what is queued and stops with the app.
        await asyncio.to_thread(context.submissions.close)

    app = FastAPI(
        title=title,
        version=__version__,
        description=description,
        openapi_url=openapi_url,
        # The interactive pages load their scripts from a CDN; the document is enough.
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        # FastAPI's native OpenTelemetry off (its documented `telemetry` setting): kubetrain
        # configures no OpenTelemetry provider and has its own /metrics, and FastAPI asked
        # on every request whether a provider had been set (~3 % of a submission's CPU).
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    if cluster_snapshot is None and cluster is not None:
        # A cluster view without the control loops' node usage: Pods not kubetrain's
        # are not counted on their nodes (ControlLoops.cluster_snapshot counts them).
        cluster_snapshot = _snapshot_of(cluster)
    context = app.state.kubetrain = ApiContext(
        settings=settings,
        db=db,
        on_change=on_change,
        on_report=on_report,
        cluster=cluster,
        watch_problems=watch_problems,
        pod_logs=pod_logs,
        cluster_snapshot=cluster_snapshot,
        tokens=VerifiedTokens(settings.token_cache_seconds),
        pod_tokens=pod_tokens,
        pods=VerifiedTokens(settings.token_cache_seconds),
    )
    _add_health(app)
    add_metrics(app, db, cluster)
    _add_error_handlers(app)
    return app


def _snapshot_of(cluster: Callable[[], dict[str, Any] | None]) -> Callable[[], Snapshot | None]:
    def take() -> Snapshot | None:
        listing = cluster()
        return Snapshot.from_list(listing) if listing is not None else None

    return take


# -- health --------------------------------------------------------------------


def _add_health(app: FastAPI) -> None:
    @app.get("/healthz", tags=["health"], summary="The process answers", response_model=Health)
    def healthz() -> Health:
        return Health(status="ok")

    @app.get(
        "/livez",
        tags=["health"],
        summary="No watch of the control loops has been failing for minutes",
        response_model=Health,
        responses=problem_responses(503),
    )
    def livez(request: Request) -> Health:
        context: ApiContext = request.app.state.kubetrain
        if context.watch_problems is not None and (
            problems := context.watch_problems(LIVENESS_WATCH_FAILING, synced=False)
        ):
            raise unhealthy("; ".join(problems))
        return Health(status="ok")

    @app.get(
        "/readyz",
        tags=["health"],
        summary="The database answers, and the leader's watches are synced and connected",
        response_model=Health,
        responses=problem_responses(503),
    )
    def readyz(request: Request) -> Health:
        context: ApiContext = request.app.state.kubetrain
        try:
            with context.db.engine.connect() as connection:
                connection.exec_driver_sql("SELECT 1")
        except sa_exc.SQLAlchemyError as exc:
            log.warning("readiness: the database does not answer (%s)", type(exc).__name__)
            raise database_unavailable() from None
        if context.watch_problems is not None and (
            problems := context.watch_problems(READINESS_WATCH_FAILING, synced=True)
        ):
            raise unhealthy("; ".join(problems))
        return Health(status="ready")


def unhealthy(detail: str) -> ProblemError:
    return ProblemError(503, detail, title="Kubernetes watches unhealthy")


# -- errors --------------------------------------------------------------------


def _instance(request: Request) -> str:
    return request.url.path


def _add_error_handlers(app: FastAPI) -> None:
    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem_response(exc.problem(_instance(request)), exc.headers)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        status = exc.status_code
        phrase = HTTPStatus(status).phrase
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail != phrase else None
        if status == 404 and detail is None:
            # Not the path itself: it is the caller's text, decoded (it stays in `instance`).
            detail = "no such path"
        problem = Problem(title=phrase, status=status, detail=detail, instance=_instance(request))
        return problem_response(problem, exc.headers)

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = [
            FieldProblem(_location(error.get("loc", ())), str(error.get("msg", "is not valid")))
            for error in exc.errors()
        ]
        refusal = validation_error(problems, "the request's parameters are not valid")
        return problem_response(refusal.problem(_instance(request)))

    async def on_database(request: Request, exc: Exception) -> Response:
        if _database_unreachable(exc):
            # The class only: SQLAlchemy's message carries the statement and its parameters.
            log.warning(
                "database unreachable during %s %s: %s",
                request.method,
                request.url.path,
                type(exc).__name__,
            )
            refusal = database_unavailable()
            return problem_response(refusal.problem(_instance(request)), refusal.headers)
        log.error("database error during %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(_internal_error(_instance(request)))

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(sa_exc.SQLAlchemyError, on_database)


def _location(loc: Any) -> str:
    """("query", "state", 0) -> "query.state[0]"."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _database_unreachable(exc: BaseException) -> bool:
    # OperationalError: connection refused or lost, server shutting down, SQLite
    # locked past the busy timeout; TimeoutError: no pooled connection came free.
    # All of them pass; none is the request's fault.
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


def _internal_error(instance: str | None) -> Problem:
    return Problem(
        title="Internal Server Error",
        status=500,
        detail="the server failed to answer; the error is in its log",
        instance=instance,
    )


class CatchAll:
    """ASGI middleware: an exception no handler took becomes a logged 500 problem.

    Starlette's own last resort would answer in plain text, or with a
    traceback in debug mode; here nothing of the error reaches the client.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("unhandled error in %s %s", scope.get("method"), scope.get("path"))
            if not started:  # else the server ends the half-sent response
                await problem_response(_internal_error(scope.get("path")))(scope, receive, send)


# -- the OpenAPI document ------------------------------------------------------


def _openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    # The bodies are read strictly by hand (body.py), so FastAPI does not know
    # their models; their schemas join the components under their own names.
    for model in (TrainingJob, DatasetVersion, reports.ReportBatch):
        generated = model.model_json_schema(
            by_alias=True, ref_template="#/components/schemas/{model}", mode="validation"
        )
        for name, schema in {**generated.pop("$defs", {}), model.__name__: generated}.items():
            # A model that is also in a response (DatasetVersion) is there already,
            # the same but for the defaults, which only input schemas state.
            if name in schemas and _without_defaults(schemas[name]) != _without_defaults(schema):
                raise RuntimeError(f"two different schemas named {name} in the OpenAPI document")
            schemas[name] = schema
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status[0] in "45" and "application/json" in content:
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
    app.openapi_schema = document
    return document


def _without_defaults(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_defaults(v) for k, v in schema.items() if k != "default"}
    if isinstance(schema, list):
        return [_without_defaults(item) for item in schema]
    return schema
