"""`POST /api/v1/jobs/{job_id}/reports`: what the runtime inside a job's Pods reports.

Not a user endpoint: the caller is a Pod, and its credential is the projected
ServiceAccount token the kubelet keeps in it for kubetrain's audience (no Secret:
domain/manifest.py), good for nothing else in the API. The API server says, by a
TokenReview (cluster/tokenreview.py), which Pod it is bound to; the report is
taken only from a Pod of the job's current attempt, matched by the Pod's uid
against the attempts the syncer recorded. The Pod knows its job id but not its
project, hence the path outside `/projects`.

A batch is stored whole or not at all, and events already stored (the same
pod and seq, from a retry) are skipped, so retries are safe. A batch that
gives one seq twice is refused: which event the seq names is not ours to guess.
No string of a batch may hold a control character (they would reach
terminals through `kubetrain get job`). Numbers are as strict as the schema:
an integer field takes a JSON integer, not `true` or `"1"` (pydantic's strict
mode). Times lie within a window of the server's clock: at most
MAX_CLOCK_SKEW ahead (nodes' clocks drift) and at most MAX_REPORT_AGE behind
(the longest maxRuntime, and a little more for a reporter that waited out an
outage), so year 1 is refused, not stored and clamped.

The token stops being accepted once its job has finished (410, a problem): a
finished job's record is final, and a token that leaked from a finished Pod
can write nothing more.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)
from starlette.concurrency import run_in_threadpool

from kubetrain.api.body import json_body
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.problems import ProblemError, problem_responses, validation_error
from kubetrain.cluster.errors import ClusterError
from kubetrain.cluster.tokenreview import PodIdentity
from kubetrain.domain import names
from kubetrain.domain.manifest import job_name
from kubetrain.domain.spec import FieldProblem
from kubetrain.domain.spec.fields import MAX_RUNTIME_SECONDS
from kubetrain.runtime.contract import is_loss
from kubetrain.store import ReportEvent, ReportingPod, hash_token, record_reports, reporting_pod

MAX_EVENTS = 100
MAX_METRICS = 16
MAX_BINDING_VALUE = 256
_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")
MAX_CLOCK_SKEW = timedelta(minutes=10)
MAX_REPORT_AGE = timedelta(seconds=MAX_RUNTIME_SECONDS) + timedelta(days=7)
JOB_FINISHED = "urn:kubetrain:problem:job-finished"
# A JSON integer: not a boolean, a float or a string of digits.
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]  # a JSON number (an integer too), not a boolean

router = APIRouter(
    prefix="/api/v1/jobs/{job_id}",
    tags=["runtime"],
    responses=problem_responses(401, 403, 413, 422, 500, 503),
)

_bearer = HTTPBearer(
    auto_error=False,
    description="The Pod's projected ServiceAccount token (KUBETRAIN_STATUS_TOKEN_FILE).",
)
log = logging.getLogger(__name__)
RETRY_SECONDS = 1  # a Pod the syncer has not recorded yet is, within about a second


# A metric's value: a finite number, or NaN / +inf / -inf spelled as JSON cannot carry them.
MetricValue = Literal["NaN", "Infinity", "-Infinity"] | Number


def _metrics(value: dict[str, MetricValue]) -> dict[str, MetricValue]:
    if len(value) > MAX_METRICS:
        raise ValueError(f"at most {MAX_METRICS} metrics per step")
    for key, number in value.items():
        if not _METRIC_NAME.match(key):
            raise ValueError(
                f"metric name {key[:70]!r} must be 1-64 letters, digits, '_', '.', '/' or '-', "
                "starting with a letter or '_'"
            )
        if isinstance(number, float) and not math.isfinite(number):
            value[key] = "NaN" if number != number else ("Infinity" if number > 0 else "-Infinity")
    return value


def _in_utc(value: datetime) -> datetime:
    # 0001-01-01T00:00:00+01:00 is a valid time that has no UTC spelling.
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once in UTC") from None


def _plain_strings(value: Any) -> None:
    """ValueError naming the first string (key or value) with a control character."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if problem := names.control_character_problem(item):
                raise ValueError(f"{path or 'a value'} {problem}")
        elif isinstance(item, dict):
            for key, child in item.items():
                where = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and (problem := names.control_character_problem(key)):
                    raise ValueError(f"a key under {path or 'the batch'} {problem}")
                stack.append((child, where))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{index}]") for index, child in enumerate(item))


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seq: Int = Field(ge=0, le=2**62)
    time: Annotated[AwareDatetime, AfterValidator(_in_utc)]


class PhaseEvent(_Event):
    type: Literal["phase"]
    phase: Literal["PREFLIGHT", "TRAINING"]
    # Absent from runtimes before it, and from the PREFLIGHT that opens the checks.
    check: str | None = Field(
        default=None,
        pattern=r"^[a-z][a-z0-9-]{0,62}$",
        description="PREFLIGHT only: the preflight check the Pod runs now (gpu-visible, "
        "rendezvous-reachable, ...)",
    )


class StepEvent(_Event):
    type: Literal["step"]
    step: Int = Field(ge=0, le=2**62)
    metrics: Annotated[dict[str, MetricValue], AfterValidator(_metrics)] = Field(
        default_factory=dict
    )


class Binding(BaseModel):
    """What a checkpoint (or the run resuming from it) is bound to; null: unset."""

    model_config = ConfigDict(extra="forbid")

    dataset_version: str | None = Field(default=None, max_length=MAX_BINDING_VALUE)
    code_version: str | None = Field(default=None, max_length=MAX_BINDING_VALUE)
    params_sha256: str | None = Field(default=None, max_length=MAX_BINDING_VALUE)
    world_size: Int | None = Field(default=None, ge=1, le=2**31, description="absent: 1")


class CheckpointEvent(_Event):
    type: Literal["checkpoint"]
    step: Int = Field(ge=0, le=2**62)
    size_bytes: Int = Field(alias="sizeBytes", ge=0, le=2**62)
    duration_seconds: Number = Field(alias="durationSeconds", ge=0, allow_inf_nan=False)
    # Absent from runtimes before it: the table then says "not reported".
    binding: Binding | None = Field(default=None, description="what the checkpoint is bound to")


class ResumedEvent(_Event):
    type: Literal["resumed"]
    from_step: Int = Field(alias="fromStep", ge=0, le=2**62)
    from_pod: str | None = Field(alias="fromPod", default=None, max_length=253)
    # Absent from runtimes before them: the lineage then says "not reported".
    checkpoint_binding: Binding | None = Field(alias="checkpointBinding", default=None)
    binding: Binding | None = Field(default=None, description="the resuming run's")
    allowed_mismatch: list[Literal["dataset_version", "code_version", "params_sha256"]] | None = (
        Field(
            alias="allowedMismatch",
            default=None,
            max_length=3,
            description="the binding fields that differed and the run let differ",
        )
    )


AnyEvent = Annotated[
    PhaseEvent | StepEvent | CheckpointEvent | ResumedEvent, Field(discriminator="type")
]


class ReportBatch(BaseModel):
    """Up to 100 events from one Pod, oldest first."""

    model_config = ConfigDict(extra="forbid")

    pod: str = Field(min_length=1, max_length=253)
    rank: Int | None = Field(
        default=None, ge=0, le=2**31, description="the worker's index in a gang (rank 0 leads)"
    )
    dropped: Int = Field(default=0, ge=0, le=2**62, description="events dropped since last batch")
    events: list[AnyEvent] = Field(max_length=MAX_EVENTS)

    @model_validator(mode="before")
    @classmethod
    def _no_control_characters(cls, data: Any) -> Any:
        _plain_strings(data)
        return data

    @field_validator("events")
    @classmethod
    def _one_event_per_seq(cls, events: list[Any]) -> list[Any]:
        first: dict[int, int] = {}
        for index, event in enumerate(events):
            if event.seq in first:
                raise ValueError(
                    f"events[{index}] gives seq {event.seq} again (events[{first[event.seq]}]): "
                    "each event of a batch has its own seq"
                )
            first[event.seq] = index
        return events


class ReportAccepted(BaseModel):
    job_id: str
    stored: int = Field(description="new events; a retried batch stores 0")


def _unauthorized() -> ProblemError:
    return ProblemError(
        401,
        "a job's reports need the token the kubelet projects into its Pods "
        "(KUBETRAIN_STATUS_TOKEN_FILE)",
        headers={"WWW-Authenticate": 'Bearer realm="kubetrain", error="invalid_token"'},
    )


def _not_this_jobs() -> ProblemError:
    return ProblemError(
        403,
        "the token is not a Pod's of this job's current attempt",
        headers={"WWW-Authenticate": 'Bearer realm="kubetrain", error="insufficient_scope"'},
    )


def _later(detail: str) -> ProblemError:
    return ProblemError(503, detail, headers={"Retry-After": str(RETRY_SECONDS)})


@dataclass(frozen=True, slots=True)
class Reporter:
    """The Pod a report is from, as its token and the job's attempts say."""

    pod: PodIdentity
    rank: int | None  # the worker's rank the syncer recorded; None for a single Pod


Verdict = Literal["accept", "refuse", "wait"]


def verdict(job_id: str, pod: PodIdentity, found: ReportingPod | None) -> Verdict:
    """Whether the job hears this Pod: "refuse" another job's Pod, an earlier
    attempt's, or any Pod for no such job (one answer for all); "wait" for a Pod
    named as this job's that the syncer has not recorded yet (the next try finds it
    recorded, or it is not this job's)."""
    if found is None or found.namespace != pod.namespace:
        return "refuse"
    if found.attempt is None:
        return "wait" if pod.pod_name.startswith(job_name(job_id) + "-") else "refuse"
    return "accept" if found.attempt == found.current_attempt else "refuse"


def _event(event: PhaseEvent | StepEvent | CheckpointEvent | ResumedEvent) -> ReportEvent:
    data: dict[str, Any] = event.model_dump(mode="json", by_alias=True, exclude={"seq", "time"})
    if isinstance(event, PhaseEvent) and event.check is None:
        del data["check"]
    at: datetime = event.time
    return ReportEvent(seq=event.seq, at=at, kind=event.type, data=data)


async def _authorized(
    job_id: Annotated[str, Path(max_length=64)],
    context: Annotated[ApiContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Reporter:
    """The Pod behind the token, checked before the body is read: a caller without a
    Pod's token learns nothing, not even whether the job exists or what body it
    should send. The API server reviews the token (remembered by its hash for
    `token_cache_seconds`, never the token itself); the job's attempts are read for
    every report, so a Pod of an ended attempt is refused as soon as the next begins."""
    if credentials is None or not credentials.credentials:
        raise _unauthorized()
    if context.pod_tokens is None:
        raise _later("this replica has no cluster connection to check Pods' tokens with")
    key = hash_token(credentials.credentials)
    pod = context.pods.get(key)
    if pod is None:
        try:
            pod = await context.pod_tokens.review(credentials.credentials)
        except ClusterError as exc:
            log.warning("a token review failed: %s", exc.reason)
            raise _later("the Kubernetes API server did not review the token") from None
        if pod is None:
            raise _unauthorized()
        context.pods.put(key, pod)
    found = await run_in_threadpool(_reporting_pod, context, job_id, pod.pod_uid)
    match verdict(job_id, pod, found):
        case "accept":
            assert found is not None
            if found.state.terminal:
                raise ProblemError(
                    410,
                    f"job {job_id} has finished ({found.state}): its record is final and "
                    "takes no more reports",
                    type=JOB_FINISHED,
                    title="The job has finished",
                )
            return Reporter(pod, found.rank)
        case "wait":
            raise _later("kubetrain has not seen this Pod yet")
        case _:
            raise _not_this_jobs()


def _reporting_pod(context: ApiContext, job_id: str, pod_uid: str) -> ReportingPod | None:
    with context.db.read_only() as session:
        return reporting_pod(session, job_id, pod_uid)


def _out_of_window(events: list[Any], now: datetime) -> list[FieldProblem]:
    """The events whose time is too far from the server's clock `now`."""
    earliest, latest = now - MAX_REPORT_AGE, now + MAX_CLOCK_SKEW
    return [
        FieldProblem(
            f"events.{index}.{event.type}.time",  # as pydantic names a tagged union's
            f"must be within {MAX_REPORT_AGE.days} days before and "
            f"{MAX_CLOCK_SKEW.seconds // 60} minutes after the server's clock "
            f"({now.isoformat(timespec='seconds')})",
        )
        for index, event in enumerate(events)
        if not earliest <= event.time <= latest
    ]


def _non_finite_loss(event: Any) -> bool:
    """A step whose loss diverged: the syncer looks at once (LOSS_NOT_FINITE)."""
    metrics = getattr(event, "metrics", None) or {}
    return any(is_loss(k) and isinstance(v, str) for k, v in metrics.items())


@router.post(
    "/reports",
    status_code=202,
    summary="Progress from inside a Pod of the job (the runtime's reporter)",
    response_model=ReportAccepted,
    responses=problem_responses(400, 410, 415),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ReportBatch"}}
            },
        }
    },
)
def post_reports(
    job_id: Annotated[str, Path(max_length=64)],
    context: Annotated[ApiContext, Depends(get_context)],
    reporter: Annotated[Reporter, Depends(_authorized)],
    body: Annotated[Any, Depends(json_body)],
) -> ReportAccepted:
    try:
        batch = ReportBatch.model_validate(body)
    except ValidationError as exc:
        problems = [
            FieldProblem(".".join(str(p) for p in error["loc"]) or "body", error["msg"])
            for error in exc.errors(include_url=False, include_input=False)
        ]
        raise validation_error(problems, "the report batch is refused") from None
    if late := _out_of_window(batch.events, datetime.now(UTC)):
        raise validation_error(late, "the report batch is refused")
    # The batch speaks for the Pod its token is bound to, and for that Pod's rank.
    problems = []
    if batch.pod != reporter.pod.pod_name:
        problems.append(FieldProblem("pod", "must be the name of the Pod the token is bound to"))
    if reporter.rank is not None and batch.rank != reporter.rank:
        problems.append(FieldProblem("rank", f"must be this Pod's rank, {reporter.rank}"))
    if problems:
        raise validation_error(problems, "the report batch is refused")
    with context.db.transaction() as session:
        stored = record_reports(
            session,
            job_id,
            batch.pod,
            [_event(e) for e in batch.events],
            dropped=batch.dropped,
            rank=batch.rank,
        )
    if stored and any(e.type == "phase" or _non_finite_loss(e) for e in batch.events):
        context.reported(job_id)
    return ReportAccepted(job_id=job_id, stored=stored)
