"""`kubetrain serve`: the API, the dispatcher and the syncer in one process.

By default one process does everything (the embedded setup). In production
several API replicas (`--no-control`) share one database, and the control
loops run under a Lease so that only one replica acts at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import exc as sa_exc

from kubetrain.cli import _allocator
from kubetrain.cli._errors import settings_error
from kubetrain.cluster.client import load_config
from kubetrain.cluster.errors import ClusterConfigError
from kubetrain.cluster.logs import PodLogs
from kubetrain.cluster.tokenreview import TokenReviewer
from kubetrain.control.runner import ControlLoops
from kubetrain.logs import setup_logging
from kubetrain.settings import ServerSettings
from kubetrain.store import Database

log = logging.getLogger("kubetrain.serve")


def _serve(args: argparse.Namespace) -> int:
    _allocator.limit_arenas()  # before any thread is made
    overrides = {
        key: value
        for key, value in (
            ("host", args.host),
            ("port", args.port),
            ("forwarded_allow_ips", args.forwarded_allow_ips),
            ("database_url", args.database_url),
            ("kubeconfig", args.kubeconfig),
        )
        if value is not None
    }
    try:
        settings = ServerSettings.load(**overrides)
    except ValidationError as exc:
        # One line naming the field (a KUBETRAIN_PORT=tcp://... from a Service link said
        # "internal error: ValidationError" here).
        raise settings_error(exc, "server") from None
    setup_logging(settings.log_level, settings.log_format)
    db = open_database(settings.database_url)
    try:
        db.upgrade()
    except sa_exc.SQLAlchemyError as exc:
        # One line, not a traceback; the driver's words without the statement
        # SQLAlchemy appends, and the URL without its password.
        cause = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        log.error(
            "cannot use the database %s: %s", db.url.render_as_string(hide_password=True), cause
        )
        db.dispose()
        return 1
    control, config = None, None
    try:
        config = load_config(settings.kubeconfig)
    except ClusterConfigError as exc:
        if not args.no_control:
            print(f"kubetrain: error: {exc}", file=sys.stderr)
            return 1
        # An API replica without a cluster serves all but Pods' reports, which it
        # cannot check: those are answered 503, and the Pods retry.
        log.warning("no cluster connection, so Pods' reports are refused: %s", exc)
    if not args.no_control and config is not None:
        control = ControlLoops(
            db,
            config,
            render_options=settings.render_options(),
            leader_elect=not args.no_leader_elect,
            lease_namespace=args.lease_namespace,
            resync_interval=args.resync,
            stall_after=settings.stall_after_seconds or None,
            webhook_allowed_networks=settings.webhook_networks(),
            webhook_timeout=settings.webhook_timeout_seconds,
            webhook_max_in_flight=settings.webhook_max_in_flight,
        )
    reviewer = TokenReviewer(config, settings.status_token_audience) if config else None
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_run(settings, db, control, reviewer, api=not args.no_api))
    finally:
        db.dispose()
    return 0


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (a dependency on Linux and macOS), else
    asyncio's own. One interpreter runs the API, the watches, the syncer and the
    dispatcher's calls; uvloop's loop and transports, in C, leave it more time for them
    (docs/benchmarks.md: the dispatcher through a backlog)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def open_database(url: str) -> Database:
    if url.startswith("sqlite"):
        return Database(url)
    # Sized for the API's worker threads plus the control loops; a bounded connect
    # keeps /readyz answering 503 instead of hanging when the server is gone.
    return Database(url, pool_size=20, max_overflow=30, connect_args={"connect_timeout": 5})


async def _run(
    settings: ServerSettings,
    db: Database,
    control: ControlLoops | None,
    reviewer: TokenReviewer | None,
    *,
    api: bool,
) -> None:
    tasks = [asyncio.create_task(control.run(), name="control")] if control else []
    try:
        import uvicorn

        from kubetrain.api import create_app, create_probe_app

        if api:
            app = create_app(
                settings,
                db,
                on_change=control.notify if control else None,
                on_report=control.reported if control else None,
                cluster=control.cluster_listing if control else None,
                watch_problems=control.watch_problems if control else None,
                pod_logs=PodLogs(control.config) if control else None,
                cluster_snapshot=control.cluster_snapshot if control else None,
                pod_tokens=reviewer,
            )
        else:  # the control loops only: their probes and metrics, on the same address
            assert control is not None  # --no-api and --no-control exclude each other
            app = create_probe_app(
                settings,
                db,
                watch_problems=control.watch_problems,
                cluster=control.cluster_listing,
            )
        server = uvicorn.Server(http_config(settings, app))
        serving = asyncio.create_task(server.serve(), name="http")
        done, _ = await asyncio.wait([serving, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a control loop that crashed takes the process down
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def http_config(settings: ServerSettings, app: Any) -> Any:
    """uvicorn's configuration: our address, our log handler, the trusted proxies."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        log_config=None,  # uvicorn's lines go through our handler too
        proxy_headers=True,
        forwarded_allow_ips=settings.forwarded_allow_ips,
    )
