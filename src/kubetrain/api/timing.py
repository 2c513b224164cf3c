"""Request timing: each HTTP request's latency into HTTP_DURATION."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubetrain.metrics import HTTP_DURATION

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
