"""Request bodies: a size limit for every request, and JSON read strictly.

The limit is enforced twice: a `Content-Length` over it is refused before the
body reaches a handler, and a body sent without one (chunked) is counted as it
arrives and refused once it passes the limit, so no request can make the
server hold more than the limit in memory. (What follows the limit is read and
dropped, up to a bound, so the client gets to read the 413.)

JSON is read as UTF-8 only, and refuses what `json.loads` would otherwise let
through silently: a key given twice (the last one would win, so the job run
might not be the one reviewed), and NaN or Infinity (not JSON). It is decoded
in a worker thread: a body at the limit takes a few hundred milliseconds to
decode and check, which on the event loop would delay every other client.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kubetrain.api.context import get_context
from kubetrain.api.problems import MALFORMED_BODY, ProblemError, problem_response, validation_error
from kubetrain.domain.spec import FieldProblem


def body_too_large(limit: int) -> ProblemError:
    return ProblemError(413, f"the request body is larger than {limit} bytes")


# Up to this much of an oversize body is read and dropped before the 413 is
# sent (nginx's "lingering close"): a server that closes the connection with
# unread data makes the kernel reset it, and the client may then lose the
# answer. A client that sends more than this gets the 413 and the reset.
DRAIN_BYTES = 4 * 1024 * 1024
DRAIN_SECONDS = 5.0


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            # A client that waits for `100 Continue` has sent nothing yet; reading
            # would invite the body, so it is answered at once.
            if not _expects_continue(scope) and declared <= DRAIN_BYTES:
                await _drain(receive, declared)
            await self._refuse(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    if message.get("more_body", False):
                        await _drain(receive, DRAIN_BYTES)
                    # Raised inside the handler that reads the body, where the
                    # app's ProblemError handler answers it.
                    raise body_too_large(self.limit)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        problem = body_too_large(self.limit).problem(scope.get("path"))
        await problem_response(problem, {"Connection": "close"})(scope, receive, send)


async def _drain(receive: Receive, budget: int) -> None:
    """Read and drop the rest of a body, up to `budget` bytes and DRAIN_SECONDS."""
    left = budget
    with anyio.move_on_after(DRAIN_SECONDS):
        while left > 0:
            message = await receive()
            if message["type"] != "http.request":
                return
            left -= len(message.get("body", b""))
            if not message.get("more_body", False):
                return


def _expects_continue(scope: Scope) -> bool:
    return any(
        name == b"expect" and value.lower() == b"100-continue"
        for name, value in scope.get("headers", [])
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a malformed length itself
    return None


class _Ambiguous(dict[str, Any]):
    """A decoded object that gave some keys more than once (kept to name them)."""

    duplicates: list[str]


def _ambiguous(result: dict[str, Any], pairs: list[tuple[str, Any]]) -> _Ambiguous:
    """`result` (the object `pairs` decode to: the last value of a key given twice), with
    each repeated key named once per repetition."""
    ambiguous = _Ambiguous(result)
    ambiguous.duplicates = []
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            ambiguous.duplicates.append(key)
        seen.add(key)
    return ambiguous


def _duplicate_fields(document: Any) -> list[FieldProblem]:
    """Where keys were given twice, as dotted paths like the spec's errors use.

    Iterative, so a document nested as deep as json.loads allows cannot overflow here.
    """
    found: list[FieldProblem] = []
    stack: list[tuple[Any, str]] = [(document, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            found += [
                FieldProblem(f"{path}.{key}" if path else key, "is given twice")
                for key in getattr(value, "duplicates", [])
            ]
            children = [(item, f"{path}.{key}" if path else key) for key, item in value.items()]
        elif isinstance(value, list):
            children = [(item, f"{path}[{index}]") for index, item in enumerate(value)]
        else:
            continue
        stack.extend(reversed(children))  # depth first, in document order
    return found


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> Any:
    """The decoded document; ProblemError 400 (not JSON) or 422 (a key given twice)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProblemError(
            400, f"the body is not UTF-8 (byte {exc.start})", type=MALFORMED_BODY
        ) from None
    ambiguous = False

    def objects(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal ambiguous
        result = dict(pairs)  # in C; a key given twice leaves it shorter
        if len(result) == len(pairs):
            return result
        ambiguous = True
        return _ambiguous(result, pairs)

    try:
        document = json.loads(text, object_pairs_hook=objects, parse_constant=_no_constants)
    except json.JSONDecodeError as exc:
        raise ProblemError(
            400,
            f"the body is not JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
            type=MALFORMED_BODY,
        ) from None
    except (ValueError, RecursionError) as exc:  # NaN; a 5,000-digit number; deep nesting
        raise ProblemError(
            400, f"the body is not usable JSON: {exc}", type=MALFORMED_BODY
        ) from None
    # The walk only where a key was given twice (it cost as much as the decoding).
    if ambiguous and (duplicates := _duplicate_fields(document)):
        # Well-formed JSON, but ambiguous: which value was meant is not ours to guess.
        raise validation_error(duplicates, "a JSON object gives a key twice; give each key once")
    return document


# Bodies up to this size are parsed on the event loop (tens of microseconds); larger
# ones in a worker thread, so a big document does not hold other requests.
_PARSE_INLINE_BYTES = 16 * 1024


async def json_body(request: Request) -> Any:
    """FastAPI dependency: the request's JSON document, read within the size limit."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise ProblemError(415, "send the body as JSON with `Content-Type: application/json`")
    limit = (await get_context(request)).settings.max_body_bytes
    raw = await request.body()
    if len(raw) > limit:  # the middleware has counted already; this keeps the rule local
        raise body_too_large(limit)
    if not raw:
        raise ProblemError(
            400, "the request has no body: send a JSON document", type=MALFORMED_BODY
        )
    if len(raw) <= _PARSE_INLINE_BYTES:
        return parse_json(raw)  # a usual job: parsed in less than a thread hop costs
    return await run_in_threadpool(parse_json, raw)
