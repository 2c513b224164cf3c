"""The client commands' side of the HTTP API: requests, and refusals as a few plain lines.

```
* CommandError        a command cannot do what was asked; main prints it, exits 1
  x ApiError          the server refused (a problem+json answer), status kept
```

(CommandError lives in _errors.py, so commands that make no request need not import
this module; kubetrain/errors.py draws the whole tree.)

No traceback and no token ever reaches the terminal: connection failures name
the URL tried, refusals print the problem's title, detail and field errors.

What this path imports is kept small (the standard library's HTTP in _http.py,
the settings of kubetrain/client_settings.py): `kubetrain get jobs` answers in a
few interpreter starts (bench/cli_start.py; tests/unit/test_cli_main.py checks
that no pydantic, httpx or PyYAML is loaded).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote

from kubetrain import __version__
from kubetrain.cli import _http
from kubetrain.cli._errors import CommandError, settings_error
from kubetrain.client_settings import ClientSettings

# Job ids are UUIDs; anything else given as NAME|ID is a name.
_JOB_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
PAGE_SIZE = 500  # the API's largest page

__all__ = ["ApiClient", "ApiError", "CommandError", "client_settings", "project_of"]


class Answer(Protocol):
    """An HTTP answer read whole (_http.Response; httpx's serves as well)."""

    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


class ApiError(CommandError):
    def __init__(self, status: int, message: str, problem: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem or {}

    @classmethod
    def of(cls, response: Answer) -> ApiError:
        try:
            problem = response.json()
        except ValueError:
            problem = None
        if not isinstance(problem, dict) or "title" not in problem:
            text = " ".join(response.text.split())[:200]
            return cls(response.status_code, f"HTTP {response.status_code} from the server: {text}")
        lines = [f"{problem['title']} (HTTP {response.status_code})"]
        if detail := problem.get("detail"):
            lines[0] += f": {detail}"
        for error in problem.get("errors") or []:
            where = error.get("field") or "(the document)"
            lines.append(f"  {where}: {error.get('message')}")
        if response.status_code == 401:
            lines.append(
                "  set KUBETRAIN_TOKEN to a valid token (`kubetrain token create` makes one)"
            )
        return cls(response.status_code, "\n".join(lines), problem)


def client_settings(args: argparse.Namespace) -> ClientSettings:
    try:
        return ClientSettings.load(
            url=getattr(args, "url", None), project=getattr(args, "project", None)
        )
    except ValueError as exc:
        from pydantic_core import ValidationError  # only here: the settings do without it

        if isinstance(exc, ValidationError):
            raise settings_error(exc, "client") from None
        raise CommandError(str(exc)) from None  # the config file itself


def project_of(settings: ClientSettings) -> str:
    if not settings.project:
        raise CommandError("no project: pass --project or set KUBETRAIN_PROJECT")
    return settings.project


class Reply(NamedTuple):  # not a dataclass: `dataclasses` alone is a tenth of the start-up
    status: int
    body: Any


class ApiClient:
    """A thin client: one method per use, every failure a CommandError."""

    def __init__(self, settings: ClientSettings) -> None:
        if settings.token is None or not settings.token.get_secret_value():
            raise CommandError(
                "no API token: set KUBETRAIN_TOKEN (an admin makes one with "
                "`kubetrain token create`)"
            )
        token = settings.token.get_secret_value()
        if not (token.isascii() and token.isprintable()) or " " in token:
            # Said without the value: an error message must not show a credential.
            raise CommandError(
                "KUBETRAIN_TOKEN is not a token: it holds a space, a line break or a "
                "character other than ASCII"
            )
        self.url = settings.url.rstrip("/")
        self.timeout = settings.timeout
        try:
            self._http = _http.Client(
                self.url,
                timeout=settings.timeout,
                headers={
                    "Authorization": f"Bearer {token}",
                    "Accept": "application/json, application/problem+json",
                    "User-Agent": f"kubetrain-cli/{__version__}",
                },
            )
        except ValueError as exc:
            raise CommandError(
                f"the kubetrain server's URL {exc} (KUBETRAIN_URL, --url or the config file)"
            ) from None

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        try:
            response = self._http.request(method, path, json=json, params=params, headers=headers)
        except _http.TransportError as exc:
            raise self._failure(exc, "the request to") from None
        if not response.is_success:
            raise ApiError.of(response)
        if response.status_code == 204:  # No Content, by definition
            return Reply(204, None)
        try:
            return Reply(response.status_code, response.json())
        except ValueError:
            raise CommandError(
                f"the server at {self.url} answered with something not JSON"
            ) from None

    def stream_text(
        self, path: str, *, params: dict[str, Any] | None = None, follow: bool = False
    ) -> Iterator[str]:
        """A text answer as it arrives, chunk by chunk; with `follow`, no read timeout
        (a quiet log is no failure)."""
        try:
            with self._http.stream(
                "GET", path, params=params, headers={"Accept": "text/plain"}, endless=follow
            ) as response:
                if not response.is_success:
                    raise ApiError.of(response.read())
                yield from response.iter_text()
        except _http.TransportError as exc:
            raise self._failure(exc, "the stream from") from None

    def _failure(self, exc: _http.TransportError, what: str) -> CommandError:
        if isinstance(exc, _http.Unreachable):
            return CommandError(
                f"cannot reach the kubetrain server at {self.url} ({exc}); "
                "is it running, and is KUBETRAIN_URL right?"
            )
        if isinstance(exc, _http.TimedOut):
            return CommandError(
                f"the kubetrain server at {self.url} did not answer within {self.timeout:g} s"
            )
        return CommandError(f"{what} {self.url} failed: {exc}")

    # -- jobs -------------------------------------------------------------------

    @staticmethod
    def jobs_path(project: str) -> str:
        return f"/api/v1/projects/{quote(project, safe='')}/jobs"

    def job_path(self, project: str, job_id: str) -> str:
        return f"{self.jobs_path(project)}/{quote(job_id, safe='')}"

    def list_jobs(
        self, project: str, *, limit: int | None = None, **filters: Any
    ) -> list[dict[str, Any]]:
        """Every matching job (or the newest `limit`), following the pages."""
        jobs: list[dict[str, Any]] = []
        cursor = None
        while limit is None or len(jobs) < limit:
            size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - len(jobs))
            params = {key: value for key, value in filters.items() if value}
            params["limit"] = size
            if cursor:
                params["cursor"] = cursor
            page = self.request("GET", self.jobs_path(project), params=params).body
            jobs += page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return jobs

    def find_job(self, project: str, ref: str) -> dict[str, Any]:
        """The job with id `ref`, else the newest job named `ref`."""
        if _JOB_ID.fullmatch(ref):
            try:
                job: dict[str, Any] = self.request("GET", self.job_path(project, ref)).body
                return job
            except ApiError as exc:
                if exc.status != 404:
                    raise
        found = self.list_jobs(project, limit=1, name=ref)
        if not found:
            raise CommandError(f"no job named {ref!r} (nor with that id) in project {project!r}")
        return found[0]
