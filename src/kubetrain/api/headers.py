"""Headers every answer carries, API and dashboard alike, errors included.

X-Content-Type-Options: nosniff    a body is its declared type, never sniffed
                                   (a 404 problem quoting a path stays JSON)
X-Frame-Options: DENY              no page of ours in another site's frame
                                   (older browsers; CSP frame-ancestors for the rest)
Strict-Transport-Security          over TLS only (the request's scheme, which
                                   `serve --forwarded-allow-ips` lets an ingress set)
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A year, OWASP's advice; not includeSubDomains: sibling hosts are not ours to bind.
HSTS = "max-age=31536000"


class SecurityHeaders:
    """ASGI middleware: the headers above on every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tls = scope.get("scheme") == "https"

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("X-Frame-Options", "DENY")
                if tls:
                    headers.setdefault("Strict-Transport-Security", HSTS)
            await send(message)

        await self.app(scope, receive, with_headers)
