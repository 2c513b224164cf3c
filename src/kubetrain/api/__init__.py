"""The HTTP API (FastAPI): jobs, datasets, health, auth by bearer token, RFC 9457 errors.

    app = create_app(ServerSettings(), Database(url), on_change=dispatcher.wake)
    uvicorn.run(app, host=settings.host, port=settings.port)

Modules: `app` (the factory, error answers, OpenAPI), `jobs` and `datasets`
(the routes), `principal` (the caller and what each role may), `auth` (tokens and
scopes: who the caller is, refusals), `body` (size limit, strict
JSON), `schemas` (response models), `problems` (the error format).
"""

from kubetrain.api.app import create_app, create_probe_app

__all__ = ["create_app", "create_probe_app"]
