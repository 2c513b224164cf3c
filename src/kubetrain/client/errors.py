"""What the SDK raises: kubetrain's errors (kubetrain/errors.py draws the whole tree).

```
* ClientError          the client cannot do what was asked: no token, a bad URL, the
  |                    server unreachable or silent, no project named
  x ApiError           the server refused: `status` and the RFC 9457 `problem` it sent
  | x NotFound         404: no such job in the project (or not one the token may see)
  x WaitTimeout        wait() ran out of time; also a TimeoutError; `job` as last seen
  x JobEnded           wait() saw the job end in a state it was not waiting for; `job`
```

Messages are a few plain lines, never a traceback or a token; the CLI prints them
after `kubetrain: error:`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kubetrain.errors import KubetrainError

if TYPE_CHECKING:
    from kubetrain.client.results import Job

__all__ = ["ApiError", "ClientError", "JobEnded", "NotFound", "WaitTimeout"]


class ClientError(KubetrainError):
    """The client cannot do what was asked (the message says what, and what to set)."""


class ApiError(ClientError):
    """The server refused. `problem` is its RFC 9457 answer (`type`, `title`, `status`,
    `detail`, `instance`, and for a 422 `errors`: `[{field, message}]`); an answer that
    was not one (a proxy's page) is kept as `{"status", "title", "detail"}`."""

    def __init__(self, status: int, problem: dict[str, Any], message: str | None = None) -> None:
        self.status = status
        self.problem = problem
        super().__init__(message or _lines(status, problem))

    @property
    def type(self) -> str:
        return str(self.problem.get("type") or "about:blank")

    @property
    def title(self) -> str:
        return str(self.problem.get("title") or "")

    @property
    def detail(self) -> str | None:
        detail = self.problem.get("detail")
        return None if detail is None else str(detail)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """A 422's refused fields: `{"field": "spec.resources.gpus", "message": ...}`."""
        return list(self.problem.get("errors") or [])

    @classmethod
    def of(cls, status: int, body: bytes) -> ApiError:
        """The error for an answer of `status` with `body` (a problem, or anything)."""
        try:
            problem = json.loads(body)
        except ValueError:
            problem = None
        if not isinstance(problem, dict) or "title" not in problem:
            text = " ".join(body.decode("utf-8", errors="replace").split())[:200]
            title = f"HTTP {status} from the server"
            message = f"{title}: {text}"
            problem = {"status": status, "title": title, "detail": text}
            return (NotFound if status == 404 else cls)(status, problem, message)
        return (NotFound if status == 404 else cls)(status, problem)


class NotFound(ApiError):
    """404: no such job (a job of another project is not found either)."""


class WaitTimeout(ClientError, TimeoutError):
    """wait() ran out of time; `job` is the job as it was last seen."""

    def __init__(self, message: str, job: Job) -> None:
        super().__init__(message)
        self.job = job


class JobEnded(ClientError):
    """wait() saw the job end in a state it was not waiting for (it never will now)."""

    def __init__(self, message: str, job: Job) -> None:
        super().__init__(message)
        self.job = job


def _lines(status: int, problem: dict[str, Any]) -> str:
    lines = [f"{problem.get('title')} (HTTP {status})"]
    if detail := problem.get("detail"):
        lines[0] += f": {detail}"
    for error in problem.get("errors") or []:
        where = error.get("field") or "(the document)"
        lines.append(f"  {where}: {error.get('message')}")
    if status == 401:
        lines.append("  set KUBETRAIN_TOKEN to a valid token (`kubetrain token create` makes one)")
    return "\n".join(lines)
