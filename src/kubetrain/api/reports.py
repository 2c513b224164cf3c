"""`POST /api/v1/jobs/{job_id}/reports`: what the runtime inside a job's Pods reports.

Not a user endpoint: the caller is a Pod, and its credential is the job's own
status token (from the Secret the dispatcher made for the job), good for this
one job only and for nothing else in the API. The Pod knows its job id but not
its project, hence the path outside `/projects`.

A batch is stored whole or not at all, and events already stored (the same
pod and seq, from a retry) are skipped, so retries are safe. A batch that
gives one seq twice is refused: which event the seq names is not ours to guess.
No string of a batch may hold a control character (they would reach
terminals through `kubetrain get job`), and times must lie within UTC's range.
"""

from __future__ import annotations

import hmac
import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kubetrain.api.body import json_body
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.problems import ProblemError, problem_responses, validation_error
from kubetrain.domain import names
from kubetrain.domain.manifest import job_name
from kubetrain.domain.spec import FieldProblem
from kubetrain.store import ReportEvent, job_id_of_status_token, record_reports

MAX_EVENTS = 100
MAX_METRICS = 16
MAX_BINDING_VALUE = 256
_METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")

router = APIRouter(
    prefix="/api/v1/jobs/{job_id}",
    tags=["runtime"],
    responses=problem_responses(401, 413, 422, 500, 503),
)

_bearer = HTTPBearer(auto_error=False, description="The job's status token (from its Secret).")


def _metrics(value: dict[str, float]) -> dict[str, float]:
    if len(value) > MAX_METRICS:
        raise ValueError(f"at most {MAX_METRICS} metrics per step")
    for key, number in value.items():
        if not _METRIC_NAME.match(key):
            raise ValueError(
                f"metric name {key[:70]!r} must be 1-64 letters, digits, '_', '.', '/' or '-', "
                "starting with a letter or '_'"
            )
        if not math.isfinite(number):
            raise ValueError(f"metric {key} must be a finite number")
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

    seq: int = Field(ge=0, le=2**62)
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
    step: int = Field(ge=0, le=2**62)
    metrics: Annotated[dict[str, float], AfterValidator(_metrics)] = Field(default_factory=dict)


class Binding(BaseModel):
    """What a checkpoint (or the run resuming from it) is bound to; null: unset."""

    model_config = ConfigDict(extra="forbid")

    dataset_version: str | None = Field(default=None, max_length=MAX_BINDING_VALUE)
    code_version: str | None = Field(default=None, max_length=MAX_BINDING_VALUE)
    params_sha256: str | None = Field(default=None, max_length=MAX_BINDING_VALUE)
    world_size: int | None = Field(default=None, ge=1, le=2**31, description="absent: 1")


class CheckpointEvent(_Event):
    type: Literal["checkpoint"]
    step: int = Field(ge=0, le=2**62)
    size_bytes: int = Field(alias="sizeBytes", ge=0, le=2**62)
    duration_seconds: float = Field(alias="durationSeconds", ge=0, allow_inf_nan=False)
    # Absent from runtimes before it: the table then says "not reported".
    binding: Binding | None = Field(default=None, description="what the checkpoint is bound to")


class ResumedEvent(_Event):
    type: Literal["resumed"]
    from_step: int = Field(alias="fromStep", ge=0, le=2**62)
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
    rank: int | None = Field(
        default=None, ge=0, le=2**31, description="the worker's index in a gang (rank 0 leads)"
    )
    dropped: int = Field(default=0, ge=0, le=2**62, description="events dropped since last batch")
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
        "a job's reports need that job's status token (KUBETRAIN_STATUS_TOKEN)",
        headers={"WWW-Authenticate": 'Bearer realm="kubetrain", error="invalid_token"'},
    )


def _event(event: PhaseEvent | StepEvent | CheckpointEvent | ResumedEvent) -> ReportEvent:
    data: dict[str, Any] = event.model_dump(mode="json", by_alias=True, exclude={"seq", "time"})
    if isinstance(event, PhaseEvent) and event.check is None:
        del data["check"]
    at: datetime = event.time
    return ReportEvent(seq=event.seq, at=at, kind=event.type, data=data)


def _authorized(
    job_id: Annotated[str, Path(max_length=64)],
    context: Annotated[ApiContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """The job's status token, checked before the body is read: a caller without it
    learns nothing, not even whether the job exists or what body it should send.

    The token is looked up first and the job id compared after, so an unknown
    job and an existing one cost the same."""
    if credentials is None:
        raise _unauthorized()
    with context.db.read_only() as session:
        owner = job_id_of_status_token(session, credentials.credentials)
    if owner is None or not hmac.compare_digest(owner.encode(), job_id.encode()):
        raise _unauthorized()


@router.post(
    "/reports",
    status_code=202,
    summary="Progress from inside a Pod of the job (the runtime's reporter)",
    response_model=ReportAccepted,
    responses=problem_responses(400, 415),
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
    _: Annotated[None, Depends(_authorized)],
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
    # Only the job's own Pods (the Job controller names them <job>-<suffix>).
    ours = batch.pod.startswith(job_name(job_id) + "-")
    if not ours or names.dns1123_subdomain_problem(batch.pod):
        raise validation_error(
            [FieldProblem("pod", f"must be the name of a Pod of Job {job_name(job_id)}")],
            "the report batch is refused",
        )
    with context.db.transaction() as session:
        stored = record_reports(
            session,
            job_id,
            batch.pod,
            [_event(e) for e in batch.events],
            dropped=batch.dropped,
            rank=batch.rank,
        )
    if stored and any(e.type == "phase" for e in batch.events):
        context.reported(job_id)
    return ReportAccepted(job_id=job_id, stored=stored)
