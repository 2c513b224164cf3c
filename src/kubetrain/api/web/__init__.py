"""The web dashboard: server-rendered pages (Jinja2) on the API's own app, under /ui.

`install(app)` mounts the pages, their static files (served from the package:
no CDN) and the handlers that turn a refusal into a page; pages.py has the
routes, sessions.py the sign-in cookie and CSRF, views.py the pure arithmetic.
"""

from __future__ import annotations

import secrets
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from kubetrain.api.context import ApiContext
from kubetrain.api.web.pages import PageRefusal, SignInRequired, render, router
from kubetrain.api.web.sessions import SessionSigner

__all__ = ["install"]


def install(app: FastAPI) -> None:
    context: ApiContext = app.state.kubetrain
    secret = context.settings.session_secret
    # Without a configured secret, sessions last as long as this process.
    key = secret.get_secret_value().encode() if secret else secrets.token_bytes(32)
    app.state.web_signer = SessionSigner(key)
    app.include_router(router)
    app.mount(
        "/ui/static", StaticFiles(packages=[("kubetrain.api.web", "static")]), name="ui-static"
    )

    @app.get("/", include_in_schema=False)
    def root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

    async def on_signin_required(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SignInRequired)
        return RedirectResponse(f"/ui/signin?next={quote(exc.back_to, safe='')}", 303)

    async def on_refusal(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, PageRefusal)
        return render(request, "error.html", status=exc.status, message=exc.message)

    app.add_exception_handler(SignInRequired, on_signin_required)
    app.add_exception_handler(PageRefusal, on_refusal)
