"""What a call to Kubernetes can fail with, in kubetrain's words (the tree is in
kubetrain/errors.py).

The rooms above (control/) catch these, never the client library's own errors:
`kube_errors()` wraps lightkube's `ApiError`, httpx's errors and `OSError` at
the boundary, the original chained as `__cause__`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import httpx2 as httpx
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from kubetrain.cluster.wire import Answer
from kubetrain.errors import KubetrainError

# Statuses meaning the API server cannot answer now (overloaded, restarting, behind
# a proxy that cannot reach it): an outage, unlike the refusal of one object.
_UNAVAILABLE = (429, 500, 502, 503, 504)


class ClusterError(KubetrainError):
    """A call to Kubernetes failed.

    `reason` is a short word for it (the API server's reason, like `Forbidden`, or
    the class of the transport error, like `ConnectError`), `message` the rest;
    `unreachable` says the API server did not answer or cannot now (an outage,
    which retrying sooner may help) rather than refused this one call.
    """

    unreachable = False

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ClusterUnreachable(ClusterError):
    """No answer: the connection, TLS or a timeout failed."""

    unreachable = True


class ClusterRefused(ClusterError):
    """The API server answered with an error status. `causes` are its Status' details
    (field, message) for an Invalid (422) answer: which field was refused and why."""

    def __init__(
        self, code: int, reason: str, message: str, causes: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(reason, message)
        self.code = code
        self.unreachable = code in _UNAVAILABLE
        self.causes = causes


class JobConflictError(ClusterError):
    """A Job of that name exists but is not ours: we must not adopt or replace it."""

    def __init__(self, message: str) -> None:
        super().__init__("NameConflict", message)


class ClusterConfigError(ClusterError):
    """No usable cluster configuration; the message says where we looked."""

    def __init__(self, message: str) -> None:
        super().__init__("ClusterConfig", message)


def wrap(exc: ApiError | httpx.HTTPError | OSError) -> ClusterError:
    """The client library's error as kubetrain's (raise it `from` the original)."""
    if isinstance(exc, ApiError):
        code = exc.status.code or 0
        reason = exc.status.reason or f"HTTP{exc.status.code}"
        details = exc.status.details
        causes = tuple(
            (cause.field or "", cause.message or "")
            for cause in ((details.causes if details else None) or [])
        )
        return ClusterRefused(code, reason, exc.status.message or str(exc), causes)
    message = str(exc) or repr(exc)
    if isinstance(exc, httpx.TransportError | OSError):
        return ClusterUnreachable(type(exc).__name__, message)
    return ClusterError(type(exc).__name__, message)


def refused(answer: Answer) -> ClusterRefused:
    """An error answer to a plain call (cluster/wire.py), worded by `wrap` as lightkube's
    error for a typed call is: the answer's Status, or (not one: a proxy's page) its
    HTTP status."""
    try:
        body = json.loads(answer.body)
    except ValueError:
        body = None
    status = cast(Status, Status.from_dict(body)) if isinstance(body, dict) else Status()
    status.code = status.code or answer.status
    status.message = status.message or f"HTTP {answer.status} {answer.reason}".rstrip()
    error = wrap(ApiError(status=status))
    assert isinstance(error, ClusterRefused)
    return error


@contextmanager
def kube_errors() -> Iterator[None]:
    """Raise the client library's errors inside as ClusterError, the original as cause."""
    try:
        yield
    except (ApiError, httpx.HTTPError, OSError) as exc:
        raise wrap(exc) from exc
