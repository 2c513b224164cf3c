"""`GET /api/v1/projects/{project}/jobs/{id}/logs`: one attempt's (one worker's) output,
streamed as text/plain from the Pod's `log` subresource.

Which Pod: attempt N (the numbers of `/attempts`), else the newest; `worker` picks a
gang's rank (the newest attempt of that rank). The same roles and projects as the
other reads: a job outside the token's projects is a 404.

Every parameter is checked before Kubernetes is asked (a 422 naming it: `since` must
be a positive duration of at most a year, as the API server's `sinceSeconds` is at
least 1; `tail`, `attempt`, `worker` within bounds; `follow`, `timestamps` booleans).

What cannot be streamed is said as a problem, before any byte: a Pod that is gone
(410, with the termination message the Job's `FallbackToLogsOnError` policy kept:
the last lines of a crash), a Pod on a KWOK fake node, which runs no containers
(409), a Pod with no container (409: not scheduled to a node, or its image not pulled),
a process without a cluster connection (503: it runs no control loops), an API server
that does not answer now (503 with Retry-After). A refusal of the API server is
translated, never passed on as a 503 that invites a retry: options it found invalid
are a 422 naming ours, anything else (kubetrain's own access refused) a 502.

`read_tail` gives the job page its logs panel: the last lines, or the same words on why
there are none.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from kubetrain.api.auth import Caller, job_not_found, require_job_access
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action
from kubetrain.api.problems import ProblemError, problem_responses, validation_error
from kubetrain.cluster.errors import ClusterError, ClusterRefused
from kubetrain.cluster.logs import FAKE_NODE_ANNOTATION, FAKE_NODE_VALUE, LogRequest
from kubetrain.domain.manifest import CONTAINER_NAME
from kubetrain.domain.spec import FieldProblem, duration_seconds
from kubetrain.domain.spec.fields import MAX_WORKERS
from kubetrain.store import Attempt, get_job, list_attempts

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/api/v1/projects/{project}/jobs",
    tags=["jobs"],
    responses=problem_responses(401, 403, 422, 500, 502, 503),
)

Context = Annotated[ApiContext, Depends(get_context)]
MAX_TAIL = 100_000  # lines; beyond, ask for a window (since) instead
# A window beyond a year is a typo: leaving `since` out gives the whole log.
MAX_SINCE_SECONDS = 366 * 24 * 3600
MAX_ATTEMPT = 1_000_000  # attempts are counted from 1; no job comes near
# The API server's PodLogOptions fields, as our parameters.
_OUR_PARAMETER = {
    "sinceSeconds": "since",
    "sinceTime": "since",
    "tailLines": "tail",
    "follow": "follow",
    "timestamps": "timestamps",
}

POD_GONE = "urn:kubetrain:problem:pod-gone"
TOO_MANY_STREAMS = "urn:kubetrain:problem:too-many-streams"
FOLLOW_RETRY_AFTER_SECONDS = 10  # a stream a person closes goes within seconds
FOLLOW_CHECK_SECONDS = 2.0  # how often a follow stream looks whether its Pod has ended
FOLLOW_GRACE_SECONDS = 5.0  # then how long the kubelet has to end the stream itself
LOGS_REFUSED = "urn:kubetrain:problem:logs-refused"
CLUSTER_UNAVAILABLE = "urn:kubetrain:problem:cluster-unavailable"
NO_LOGS_ON_FAKE_NODES = "urn:kubetrain:problem:fake-node"
NO_CLUSTER = "urn:kubetrain:problem:no-cluster"
NO_CONTAINER = "urn:kubetrain:problem:no-container"


def choose_attempt(
    attempts: Sequence[Attempt],
    ranks: Mapping[str, int | None],
    *,
    attempt: int | None,
    worker: int | None,
) -> Attempt | str:
    """The attempt asked for, or why there is none (in words)."""
    if worker is not None:
        attempts = [a for a in attempts if (ranks.get(a.pod_name) or 0) == worker]
        if not attempts:
            return f"no Pod of worker {worker}"
    if attempt is not None:
        found = [a for a in attempts if a.number == attempt]
        if not found:
            return f"no attempt {attempt}" + (f" of worker {worker}" if worker is not None else "")
        return found[0]
    return attempts[-1] if attempts else "no Pod yet"


def _ranks(diagnosis: Mapping[str, Any] | None) -> dict[str, int | None]:
    """Pod name -> its rank in a gang, as the syncer's diagnosis last read it."""
    return {
        str(a.get("pod")): a.get("rank")
        for a in (diagnosis or {}).get("attempts") or []
        if isinstance(a, Mapping)
    }


@router.get(
    "/{job_id}/logs",
    summary="One attempt's logs, streamed as text",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "the container's output, as the kubelet keeps it",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **problem_responses(404, 409, 410, 429),
    },
)
async def get_logs(
    http: Request,
    project: Annotated[str, Path()],
    job_id: Annotated[str, Path()],
    caller: Caller,
    context: Context,
    attempt: Annotated[
        int | None, Query(ge=1, le=MAX_ATTEMPT, description="the attempt; default the newest")
    ] = None,
    worker: Annotated[int | None, Query(ge=0, lt=MAX_WORKERS, description="a gang's rank")] = None,
    follow: Annotated[bool, Query(description="keep streaming until the container ends")] = False,
    tail: Annotated[int | None, Query(ge=0, le=MAX_TAIL, description="the last N lines")] = None,
    since: Annotated[
        str | None, Query(description="only lines newer than this duration (10m, 1h30m)")
    ] = None,
    timestamps: Annotated[bool, Query(description="each line starts with its time")] = False,
) -> StreamingResponse:
    require_job_access(caller, project, job_id, Action.READ, context.settings)
    since_seconds = None if since is None else _since_seconds(since)
    namespace, chosen = await run_in_threadpool(_attempt, context, project, job_id, attempt, worker)
    logs = context.pod_logs
    if logs is None:
        raise ProblemError(
            503,
            "this kubetrain server has no cluster connection (it runs no control loops); "
            "ask one that does",
            type=NO_CLUSTER,
        )
    missing = no_container(chosen)
    if missing is not None:
        raise ProblemError(409, missing, type=NO_CONTAINER, title="The Pod has no container")
    request = LogRequest(
        namespace=namespace,
        pod=chosen.pod_name,
        container=CONTAINER_NAME,
        follow=follow,
        tail=tail,
        since_seconds=since_seconds,
        timestamps=timestamps,
    )
    if chosen.node:
        # Asked first: the API server would try to reach a fake node's kubelet, which
        # is not there, and a dial to its made-up address can take long to fail.
        try:
            fake = await logs.is_fake_node(chosen.node)
        except ClusterError:
            fake = False  # the log's own error, below, says more
        if fake:
            raise _fake_node(chosen)
    stops: list[Coroutine[Any, Any, None]] = []
    release: Callable[[], None] | None = None
    if follow:
        limit = context.settings.log_follow_streams_per_token
        streams, key = context.follow_streams, caller.token_id
        if not streams.take(key, limit):
            raise _too_many_streams(limit)
        release = functools.partial(streams.give_back, key)
        stops = [_until_disconnected(http), _until_pod_ended(context, chosen.id)]
    lines = _Lines(logs.lines(request), stops, release)
    try:
        first = await lines.next()
    except ClusterError as exc:
        await lines.close()
        raise why_no_logs(exc, chosen) from None
    except BaseException:
        await lines.close()
        raise
    return StreamingResponse(_stream(first, lines), media_type="text/plain; charset=utf-8")


def _too_many_streams(limit: int) -> ProblemError:
    return ProblemError(
        429,
        f"this API token holds {limit} log streams (follow) open already, the most one "
        "token may hold; close one, or read without follow",
        type=TOO_MANY_STREAMS,
        title="Too many log streams",
        headers={"Retry-After": str(FOLLOW_RETRY_AFTER_SECONDS)},
    )


class _Lines:
    """A log's lines, ended early (`next` gives None) when one of `stops` completes: the
    client went away, or the Pod ended and the kubelet did not end the stream itself.
    `close` stops everything and calls `release` once."""

    def __init__(
        self,
        lines: AsyncGenerator[str],
        stops: Sequence[Coroutine[Any, Any, None]],
        release: Callable[[], None] | None,
    ) -> None:
        self._lines = lines
        self._stops = [asyncio.ensure_future(stop) for stop in stops]
        self._release = release
        self._step: asyncio.Future[str | None] | None = None

    async def next(self) -> str | None:
        if not self._stops:
            return await anext(self._lines, None)
        self._step = step = asyncio.ensure_future(anext(self._lines, None))
        await asyncio.wait({step, *self._stops}, return_when=asyncio.FIRST_COMPLETED)
        if not step.done():
            return None
        self._step = None
        return step.result()

    async def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()  # first, before any await a cancellation could cut short
        for stop in self._stops:
            stop.cancel()
        step, self._step = self._step, None
        # Shielded: Starlette cancels a streaming response whose client went away, and
        # its (anyio) cancellation would cut every await here short, leaving the
        # connection to the kubelet open.
        with anyio.CancelScope(shield=True):
            if step is not None:
                step.cancel()
                await asyncio.wait({step})  # the generator must be idle before aclose
            await self._lines.aclose()


async def _until_disconnected(request: Request) -> None:
    """Until the client has gone: an ASGI server says so only to `receive`, and a quiet
    stream writes nothing that would fail."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _until_pod_ended(context: ApiContext, attempt_id: int) -> None:
    """Until the syncer has recorded the attempt's Pod ended (or gone), and then a grace
    for the kubelet to end the stream itself with the last lines: a node that is lost
    leaves the connection open with nobody at its end."""
    while not await run_in_threadpool(_ended, context, attempt_id):
        await asyncio.sleep(FOLLOW_CHECK_SECONDS)
    await asyncio.sleep(FOLLOW_GRACE_SECONDS)


def _ended(context: ApiContext, attempt_id: int) -> bool:
    with context.db.read_only() as session:
        attempt = session.get(Attempt, attempt_id)
        return attempt is None or attempt.finished_at is not None


def _since_seconds(since: str) -> int:
    try:
        seconds = duration_seconds(since)
    except ValueError as exc:
        message = str(exc)
    else:
        if seconds < 1:
            message = "must be at least 1s (leave it out for the whole log)"
        elif seconds > MAX_SINCE_SECONDS:
            message = (
                f"must be at most {MAX_SINCE_SECONDS // 3600}h (leave it out for the whole log)"
            )
        else:
            return seconds
    raise _bad_parameters([FieldProblem("query.since", message)])


def _bad_parameters(problems: list[FieldProblem]) -> ProblemError:
    names = ", ".join(p.field.removeprefix("query.") for p in problems)
    return validation_error(problems, f"the log's parameters are not valid: {names}")


def _attempt(
    context: ApiContext, project: str, job_id: str, attempt: int | None, worker: int | None
) -> tuple[str, Attempt]:
    with context.db.read_only() as session:
        job = get_job(session, project, job_id)
        if job is None:
            raise job_not_found(project, job_id)
        chosen = choose_attempt(
            list_attempts(session, job.id), _ranks(job.diagnosis), attempt=attempt, worker=worker
        )
        if isinstance(chosen, str):
            raise ProblemError(404, f"job {job.name!r} ({job.id}) has {chosen}")
        session.expunge(chosen)
        return job.namespace, chosen


def _where(attempt: Attempt) -> str:
    return f"Pod {attempt.pod_name} (attempt {attempt.number})"


# The kubelet's waiting reasons of a container whose image it has not pulled.
IMAGE_NOT_PULLED = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)


def no_container(attempt: Attempt) -> str | None:
    """Why `attempt`'s Pod has no container to read a log from, as its record says: never
    scheduled to a node (the API server would answer an empty log, which reads as a
    container that printed nothing), or its image not pulled. None: it may have one."""
    said = ": ".join(part for part in (attempt.raw_reason, attempt.raw_message) if part)
    why = f" ({said})" if said else ""
    if not attempt.node and attempt.container_state is None:
        return (
            f"{_where(attempt)} has no container, so no logs: it has not been scheduled "
            f"to a node{why}"
        )
    if attempt.container_state == "waiting" and attempt.raw_reason in IMAGE_NOT_PULLED:
        return f"{_where(attempt)} has no container, so no logs: its image has not been pulled{why}"
    return None


def _fake_node(attempt: Attempt) -> ProblemError:
    return ProblemError(
        409,
        f"{_where(attempt)} runs on {attempt.node}, a fake node ({FAKE_NODE_ANNOTATION}="
        f"{FAKE_NODE_VALUE}, KWOK): fake nodes run no containers and have no logs",
        type=NO_LOGS_ON_FAKE_NODES,
        title="Fake nodes have no logs",
        termination_message=attempt.termination_message,
    )


def why_no_logs(exc: ClusterError, attempt: Attempt) -> ProblemError:
    """The problem to answer when the log could not be opened."""
    where = _where(attempt)
    if isinstance(exc, ClusterRefused) and exc.code == 404:
        kept = attempt.termination_message
        return ProblemError(
            410,
            f"{where} is gone, and its logs with it. "
            + (
                f"Its termination message (the end of its output on a crash): {kept}"
                if kept
                else "It left no termination message."
            ),
            type=POD_GONE,
            title="The Pod is gone",
            termination_message=kept,
            exit_code=attempt.exit_code,
        )
    if isinstance(exc, ClusterRefused) and exc.code == 400:
        # The kubelet's words, e.g. the container is waiting to start.
        return ProblemError(409, f"{where} has no logs yet: {exc.message}")
    if isinstance(exc, ClusterRefused) and exc.code == 422:
        # Options the checks above let through: named as ours, in the API server's words
        # for each (its message names our Pod and its own field names).
        problems = [
            FieldProblem(f"query.{_OUR_PARAMETER.get(field, field)}", message)
            for field, message in exc.causes
        ] or [FieldProblem("", exc.reason)]
        return _bad_parameters(problems)
    if exc.unreachable:
        return ProblemError(
            503,
            f"the logs of {where} could not be read: the Kubernetes API server did not "
            f"answer ({exc.reason}); try again shortly",
            type=CLUSTER_UNAVAILABLE,
            title="Kubernetes unavailable",
            headers={"Retry-After": "5"},
        )
    # Kubernetes refused kubetrain itself (its access, a conflict): no retry helps,
    # and its text is about kubetrain's identity, not the caller's request.
    log.warning("Kubernetes refused reading the logs of %s: %s: %s", where, exc.reason, exc.message)
    return ProblemError(
        502,
        f"the logs of {where} could not be read: Kubernetes refused kubetrain's request "
        f"({exc.reason}); the platform's administrators can tell why from the server's log",
        type=LOGS_REFUSED,
        title="Kubernetes refused the logs",
    )


async def _stream(first: str | None, rest: _Lines) -> AsyncIterator[bytes]:
    try:
        line = first
        while line is not None:
            yield line.encode()
            line = await rest.next()
    except ClusterError:
        return  # the stream broke after the answer began: the client sees it end
    finally:
        await rest.close()


# -- the job page's logs panel -------------------------------------------------------

PAGE_TAIL = 100  # lines the job page shows
PAGE_TAIL_SECONDS = 3.0  # the page waits no longer for them
PAGE_TAIL_CHARS = 64 * 1024  # a line can be long: the page keeps the end of the text


@dataclass(frozen=True, slots=True)
class LogTail:
    """The last lines of one attempt's log, or why there are none, in words."""

    attempt: int | None
    pod: str | None
    lines: str | None  # the text, when it was read ("" for a Pod that printed nothing)
    said: str | None  # why not, when it was not
    fake_node: bool = False
    termination_message: str | None = None


async def read_tail(
    context: ApiContext,
    namespace: str,
    attempt: Attempt | None,
    *,
    tail: int = PAGE_TAIL,
    timeout: float = PAGE_TAIL_SECONDS,
) -> LogTail:
    """The last `tail` lines of `attempt`'s Pod, as the logs endpoint would stream them;
    what the endpoint would refuse with is said instead (its same words)."""
    if attempt is None or not attempt.pod_name:
        return LogTail(None, None, None, "no Pod yet: the job has not started an attempt")
    number, pod, kept = attempt.number, attempt.pod_name, attempt.termination_message
    missing = no_container(attempt)
    if missing is not None:
        return LogTail(number, pod, None, missing, termination_message=kept)
    logs = context.pod_logs
    if logs is None:
        return LogTail(
            number,
            pod,
            None,
            "this server has no cluster connection (it runs no control loops), so it "
            "cannot read logs",
            termination_message=kept,
        )
    if attempt.node:
        try:
            fake = await asyncio.wait_for(logs.is_fake_node(attempt.node), timeout)
        except (ClusterError, TimeoutError):
            fake = False  # the log's own error, below, says more
        if fake:
            said = _fake_node(attempt).detail
            return LogTail(number, pod, None, said, fake_node=True, termination_message=kept)
    request = LogRequest(namespace=namespace, pod=pod, container=CONTAINER_NAME, tail=tail)
    chunks: list[str] = []
    lines = logs.lines(request)
    try:
        async with asyncio.timeout(timeout):
            async for line in lines:
                chunks.append(line)
    except ClusterError as exc:
        return LogTail(
            number, pod, None, why_no_logs(exc, attempt).detail, termination_message=kept
        )
    except TimeoutError:
        if not chunks:
            said = f"the logs of {_where(attempt)} did not come within {timeout:g} s"
            return LogTail(number, pod, None, said, termination_message=kept)
    finally:
        await lines.aclose()
    text = "".join(chunks)
    return LogTail(number, pod, text[-PAGE_TAIL_CHARS:], None, termination_message=kept)
