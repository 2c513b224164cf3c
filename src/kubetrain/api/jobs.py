"""`/api/v1/projects/{project}/jobs`: submit, list, read, history, attempts, manifest,
diagnosis and cancel.

Each request is one short transaction (read-only for reads), so any number of
API replicas answer from the database alone. Submissions and cancels call the
change hook after their commit, so the dispatcher acts at once.

Cancel, decided: a job that is not finished moves to `CANCELLED` at once (the
business state is what the API promises; the dispatcher then deletes the
Kubernetes Job and its Pods, as it does for every `CANCELLED` record whose Job
exists). Cancelling a `CANCELLED` job again answers 200 with the job
unchanged; cancelling one that has `SUCCEEDED` or `FAILED` is a 409 naming its
state, since the caller's picture of it is out of date and nothing was done.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match, Route
from starlette.types import Scope

from kubetrain.api.auth import (
    Caller,
    bearer,
    job_not_found,
    principal,
    require_job_access,
    require_project,
)
from kubetrain.api.body import json_body
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import (
    IDEMPOTENCY_CONFLICT,
    INVALID_CURSOR,
    JOB_FINISHED,
    NO_DIAGNOSIS,
    ProblemError,
    problem_responses,
    validation_error,
)
from kubetrain.api.queues import NO_CLUSTER, NOT_WATCHING
from kubetrain.api.schemas import (
    Attempts,
    DryRun,
    History,
    HistoryEntry,
    JobDetail,
    JobGpuSeconds,
    JobPage,
    JobStatus,
    ProgressSeries,
    ProgressView,
    RuntimeState,
    StepPoint,
)
from kubetrain.domain.datasets import DatasetVersion, resolve_dataset
from kubetrain.domain.diagnosis import JobFacts
from kubetrain.domain.forecast import forecast
from kubetrain.domain.manifest import job_name, render_job
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.spec import FieldProblem, SpecError, TrainingJob, parse_training_job
from kubetrain.domain.spec import spec_digest as training_job_digest
from kubetrain.domain.states import TERMINAL, BusinessState, ReasonCode
from kubetrain.domain.usage import ANY_GPU_TYPE
from kubetrain.store import (
    MAX_PAGE_SIZE,
    MAX_STEP_REPORTS,
    IdempotencyConflict,
    InvalidCursor,
    Job,
    NewSubmission,
    Source,
    apply_business_change,
    count_checkpoints,
    current_attempts,
    get_attempt,
    get_job,
    get_progress,
    job_history,
    list_attempts,
    list_jobs,
    request_cancel,
    resolve_job_dataset,
    resume_lineage,
    step_series,
)
from kubetrain.store.usage import attempt_usage

DEFAULT_PAGE_SIZE = 50
# The id a dry run renders with: never a stored job's (ids are generated, not chosen).
DRY_RUN_ID = "dry-run"
IDEMPOTENCY_KEY_LENGTH = 255  # the column's size
# Visible ASCII only: a key is an opaque token (a UUID, say), and anything else
# is a client bug better refused than stored.
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]+$"

router = APIRouter(
    prefix="/api/v1/projects/{project}/jobs",
    tags=["jobs"],
    responses=problem_responses(401, 403, 422, 500, 503),
)

Context = Annotated[ApiContext, Depends(get_context)]
ProjectName = Annotated[str, Path(description="the project (by default also the namespace)")]
JobId = Annotated[str, Path(description="the job's id, as submit returned it")]

TRAINING_JOB_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "A TrainingJob (kubetrain.io/v1). `metadata.project` may be left out; "
        "given, it must be the project of the path.",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TrainingJob"}}},
    }
}


# The checks are async (no I/O): FastAPI would run a plain `def` in a worker thread.
async def _may_submit(project: ProjectName, caller: Caller, context: Context) -> Principal:
    require_project(caller, project, Action.SUBMIT, context.settings)
    return caller


async def _may_list(project: ProjectName, caller: Caller, context: Context) -> Principal:
    require_project(caller, project, Action.READ, context.settings)
    return caller


async def _may_read(
    project: ProjectName, job_id: JobId, caller: Caller, context: Context
) -> Principal:
    require_job_access(caller, project, job_id, Action.READ, context.settings)
    return caller


async def _may_cancel(
    project: ProjectName, job_id: JobId, caller: Caller, context: Context
) -> Principal:
    require_job_access(caller, project, job_id, Action.CANCEL, context.settings)
    return caller


def _status(session: Any, job: Job) -> JobStatus:
    attempt = get_attempt(session, job.id, job.current_attempt) if job.current_attempt else None
    return JobStatus.of(job, attempt)


@router.post(
    "",
    status_code=201,
    summary="Submit a training job",
    response_model=JobStatus,
    responses={
        200: {
            "model": JobStatus | DryRun,
            "description": "An earlier submission with this key; with `dryRun=All`, the "
            "job as it would be created, its `manifest` and its `forecast` (docs/api.md)",
        },
        201: {"description": "The new job, in CREATED"},
        **problem_responses(400, 409, 413, 415),
    },
    openapi_extra=TRAINING_JOB_BODY,
)
async def submit(
    project: ProjectName,
    caller: Annotated[Principal, Depends(_may_submit)],
    context: Context,
    response: Response,
    body: Annotated[Any, Depends(json_body)],
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=IDEMPOTENCY_KEY_LENGTH,
            pattern=IDEMPOTENCY_KEY_PATTERN,
            description="Retries with the same key and the same job return the first job; "
            "the same key with another job is a 409.",
        ),
    ] = None,
    dry_run: Annotated[
        Literal["All"] | None,
        Query(
            alias="dryRun",
            description="`All` (Kubernetes' convention): validate, render and forecast what "
            "the job would meet if submitted now; nothing is written. 200 with `job`, "
            "`manifest` and `forecast` (docs/api.md)",
        ),
    ] = None,
) -> Any:
    if dry_run is not None:
        # The caches are read on the event loop's thread; the forecast runs in the pool.
        take = context.cluster_snapshot
        snapshot = take() if take is not None else None
        return JSONResponse(
            await run_in_threadpool(_dry_run, context, caller, project, body, snapshot)
        )
    # async: the checks on the event loop, the write by the submission writer
    # (api/submissions.py); a plain `def` would cost a thread hop besides.
    status, replayed = await _submit(context, caller, project, body, idempotency_key)
    path = router.prefix.format(project=quote(project, safe=""))
    response.headers["Location"] = f"{path}/{quote(status.id, safe='')}"
    if replayed:
        response.status_code = 200
    return status


# A key the header's rules admit (IDEMPOTENCY_KEY_PATTERN, 1 to 255 characters).
_PLAIN_KEY = re.compile(rf"[\x21-\x7e]{{1,{IDEMPOTENCY_KEY_LENGTH}}}")


def _plain_submission(scope: Scope) -> bool:
    """A submission whose parameters need no checking beyond the body's: no query (no
    `dryRun`) and at most one Idempotency-Key, well-formed. Any other goes the whole
    FastAPI way (`submit`), which words every parameter's refusal."""
    if scope["query_string"]:
        return False
    keys = [value for name, value in scope["headers"] if name == b"idempotency-key"]
    return not keys or (
        len(keys) == 1 and _PLAIN_KEY.fullmatch(keys[0].decode("latin-1")) is not None
    )


async def submit_plain(request: Request) -> Response:
    """`submit` for a plain submission (`_plain_submission`), as a Starlette endpoint:
    the same checks in the same order (the caller, its right on the project, the body),
    without FastAPI's per-request solving of `submit`'s dependencies and parameters,
    and the JobStatus written once, straight to JSON. About a third of a submission's
    server time was that solving (docs/benchmarks.md)."""
    project = request.path_params["project"]
    context = await get_context(request)
    caller = await principal(request, await bearer(request), context)
    caller = await _may_submit(project, caller, context)
    body = await json_body(request)
    key = request.headers.get("idempotency-key")
    status, replayed = await _submit(context, caller, project, body, key)
    path = router.prefix.format(project=quote(project, safe=""))
    return Response(
        status.model_dump_json(by_alias=True),
        status_code=200 if replayed else 201,
        media_type="application/json",
        headers={"Location": f"{path}/{quote(status.id, safe='')}"},
    )


class PlainSubmitRoute(Route):
    """POST jobs for plain submissions only; the router then tries the next route
    (`submit`, which the OpenAPI document describes) for every other request."""

    def __init__(self) -> None:
        super().__init__(router.prefix, submit_plain, methods=["POST"], include_in_schema=False)

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is Match.FULL and not _plain_submission(scope):
            return Match.NONE, {}
        if match is Match.FULL:
            # As FastAPI's routes do: the request metrics label by this route's template.
            child["route"] = self
        return match, child


def _checked(
    context: ApiContext, project: str, body: Any
) -> tuple[TrainingJob, str, DatasetVersion | None]:
    """A submission validated (a real one and a dry run alike): the TrainingJob, its
    namespace and its dataset's version; the 422 naming the fields otherwise."""
    training_job, namespace = _parsed(context, project, body)
    return training_job, namespace, _dataset_version(context, training_job)


def _parsed(context: ApiContext, project: str, body: Any) -> tuple[TrainingJob, str]:
    """`_checked` but for the dataset: CPU only, fit for the event loop."""
    try:
        training_job = parse_training_job(body, project=project)
    except SpecError as exc:
        raise validation_error(exc.problems, "the TrainingJob is refused") from None
    try:
        namespace = context.settings.namespace_for(project)
    except ValueError as exc:
        problem = FieldProblem("metadata.project", f"{project!r} maps to no usable {exc}")
        raise validation_error([problem], "the project has no usable namespace") from None
    return training_job, namespace


def _reads_registry(training_job: TrainingJob) -> bool:
    """Whether `_dataset_version` reads the database (a registry dataset)."""
    dataset = training_job.spec.dataset
    return dataset is not None and dataset.claim is None


def _dataset_version(context: ApiContext, training_job: TrainingJob) -> DatasetVersion | None:
    """The job's dataset's version; the 422 if it is not registered."""
    dataset = training_job.spec.dataset
    try:
        if dataset is not None and dataset.claim is not None:
            return resolve_dataset(dataset, None)  # its own claim: the registry is not read
        if dataset is not None:
            # The registry's versions never change, so a read before the write is
            # safe and keeps the write transaction short.
            with context.db.read_only() as session:
                return resolve_job_dataset(session, dataset)
    except SpecError as exc:
        raise validation_error(exc.problems, "the job's dataset is not registered") from None
    return None


def _dry_run(
    context: ApiContext, caller: Principal, project: str, body: Any, snapshot: Snapshot | None
) -> dict[str, Any]:
    """Validate, render and forecast a submission; nothing is written anywhere."""
    training_job, namespace, dataset = _checked(context, project, body)
    if snapshot is None:  # after the checks: bad input is the same 422 with or without a cluster
        raise ProblemError(503, NOT_WATCHING, type=NO_CLUSTER, title="Not watching the cluster")
    manifest = render_job(
        DRY_RUN_ID,
        training_job,
        namespace,
        dataset=dataset,
        options=context.settings.render_options(),
    )
    spec = training_job.spec
    facts = JobFacts(
        name=training_job.metadata.name,
        k8s_name=job_name(DRY_RUN_ID),
        namespace=namespace,
        dispatched=True,
        gpus=spec.resources.gpus,
    )
    predicted = forecast(manifest, facts, snapshot, datetime.now(UTC))
    return {
        "dry_run": True,
        "job": {
            "id": None,
            "name": training_job.metadata.name,
            "project": project,
            "namespace": namespace,
            "owner": caller.name,
            "business_status": str(BusinessState.CREATED),
            "workers": spec.workers,
            "gpus": spec.resources.gpus,
            "spec": training_job.model_dump(mode="json"),
        },
        "manifest": manifest,
        "forecast": predicted.to_json(training_job.metadata.name),
    }


async def _submit(
    context: ApiContext, caller: Principal, project: str, body: Any, idempotency_key: str | None
) -> tuple[JobStatus, bool]:
    """Validate and store a submission; the job's status and whether it was a replay.
    The checks run on the event loop (but a registry dataset's read), the write with
    the other submissions queued at the time (api/submissions.py)."""
    training_job, namespace = _parsed(context, project, body)
    if _reads_registry(training_job):
        await run_in_threadpool(_dataset_version, context, training_job)
    else:
        _dataset_version(context, training_job)
    spec = training_job.model_dump(mode="json")
    try:
        submission = await context.submissions.submit(
            NewSubmission(
                project=project,
                name=training_job.metadata.name,
                owner=caller.name,
                namespace=namespace,
                spec=spec,
                idempotency_key=idempotency_key,
                digest=training_job_digest(training_job, spec),
                source=Source.API,
            )
        )
    except IdempotencyConflict as exc:
        raise ProblemError(
            409,
            f"the Idempotency-Key was used for job {exc.existing_job_id} with another "
            "TrainingJob; use a new key for a new job",
            type=IDEMPOTENCY_CONFLICT,
            title="Idempotency-Key reused with another job",
            job_id=exc.existing_job_id,
        ) from None
    job = submission.job
    if not submission.replayed:
        context.changed()
        return JobStatus.unchecked(job), False  # a new job has no attempt
    if not job.current_attempt:
        return JobStatus.unchecked(job), True
    return await run_in_threadpool(_replayed_status, context, job), True


def _replayed_status(context: ApiContext, job: Job) -> JobStatus:
    with context.db.read_only() as session:
        return _status(session, job)


@router.get(
    "",
    summary="List a project's jobs, newest first",
    response_model=JobPage,
    responses=problem_responses(400),
)
def list_project_jobs(
    project: ProjectName,
    caller: Annotated[Principal, Depends(_may_list)],
    context: Context,
    state: Annotated[
        list[BusinessState] | None, Query(description="business state; repeat for several")
    ] = None,
    reason: Annotated[
        list[ReasonCode] | None, Query(description="reason code; repeat for several")
    ] = None,
    name: Annotated[str | None, Query(description="jobs of this name (names may repeat)")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(description="`next_cursor` of the previous page")] = None,
) -> JobPage:
    with context.db.read_only() as session:
        try:
            page = list_jobs(
                session,
                project,
                states=state,
                reasons=reason,
                name=name,
                limit=limit,
                cursor=cursor,
                diagnosis=False,
            )
        except InvalidCursor:
            raise ProblemError(
                400,
                "the cursor is not one this API issued: pass `next_cursor` from the previous page",
                type=INVALID_CURSOR,
                title="Invalid cursor",
            ) from None
        attempts = current_attempts(session, page.jobs)
        items = [JobStatus.of(job, attempts.get(job.id)) for job in page.jobs]
    return JobPage(items=items, next_cursor=page.next_cursor)


def _job(session: Any, project: str, job_id: str) -> Job:
    job = get_job(session, project, job_id)
    if job is None:
        raise job_not_found(project, job_id)
    return job


@router.get(
    "/{job_id}",
    summary="One job: business state, reason, the current attempt's runtime state",
    response_model=JobDetail,
    responses=problem_responses(404),
)
def get_one_job(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
) -> JobDetail:
    with context.db.read_only() as session:
        job = _job(session, project, job_id)
        attempt = get_attempt(session, job.id, job.current_attempt) if job.current_attempt else None
        return JobDetail.of(
            job, attempt, progress_view(session, job.id), job_gpu_seconds(session, job)
        )


def job_gpu_seconds(session: Any, job: Job) -> JobGpuSeconds | None:
    resources = (job.spec.get("spec") or {}).get("resources") or {}
    if not resources.get("gpus"):
        return None
    attempts = attempt_usage(session, now=datetime.now(UTC), job_ids=[job.id])
    return JobGpuSeconds.of_attempts(attempts, resources.get("gpuType") or ANY_GPU_TYPE)


def progress_view(session: Any, job_id: str) -> ProgressView | None:
    progress = get_progress(session, job_id)
    if progress is None:
        return None
    return ProgressView.of(
        progress, resume_lineage(session, job_id), count_checkpoints(session, job_id)
    )


@router.get(
    "/{job_id}/progress",
    summary="What the job's runtime reported: phase, last step, checkpoints, resumes, steps",
    response_model=ProgressSeries,
    responses=problem_responses(404),
)
def get_job_progress(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
    limit: Annotated[int, Query(ge=1, le=MAX_STEP_REPORTS)] = 500,
) -> ProgressSeries:
    with context.db.read_only() as session:
        job = _job(session, project, job_id)
        steps = [
            StepPoint(step=r.data["step"], at=r.reported_at, metrics=r.data.get("metrics") or {})
            for r in step_series(session, job.id, limit)
        ]
        return ProgressSeries(job_id=job.id, progress=progress_view(session, job.id), steps=steps)


@router.get(
    "/{job_id}/history",
    summary="Every change of the job's business and runtime state, in order",
    response_model=History,
    responses=problem_responses(404),
)
def get_history(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
) -> History:
    with context.db.read_only() as session:
        job = _job(session, project, job_id)
        rows = job_history(session, project, job.id)
        return History(job_id=job.id, items=[HistoryEntry.of(row) for row in rows])


@router.get(
    "/{job_id}/attempts",
    summary="The runtime state of each of the job's Pods",
    response_model=Attempts,
    responses=problem_responses(404),
)
def get_attempts(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
) -> Attempts:
    with context.db.read_only() as session:
        job = _job(session, project, job_id)
        rows = list_attempts(session, job.id)
        return Attempts(job_id=job.id, items=[RuntimeState.of(row) for row in rows])


@router.get(
    "/{job_id}/manifest",
    summary="The batch/v1 Job that runs (or will run) this job",
    response_model=dict[str, Any],
    responses=problem_responses(404),
)
def get_manifest(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
) -> dict[str, Any]:
    with context.db.read_only() as session:
        job = _job(session, project, job_id)
        training_job = TrainingJob.model_validate(job.spec)
        dataset = resolve_job_dataset(session, training_job.spec.dataset)
    return render_job(
        job.id,
        training_job,
        job.namespace,
        dataset=dataset,
        options=context.settings.render_options(),
    )


@router.get(
    "/{job_id}/diagnosis",
    summary="The latest diagnosis of why the job is (not) running",
    response_model=dict[str, Any],
    responses=problem_responses(404),
)
def get_diagnosis(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_read)],
    context: Context,
) -> dict[str, Any]:
    with context.db.read_only() as session:
        job = _job(session, project, job_id)
    if job.diagnosis is None:
        raise ProblemError(
            404,
            f"job {job.id} has no diagnosis yet: the syncer makes one once it has seen the job",
            type=NO_DIAGNOSIS,
            title="No diagnosis yet",
        )
    return job.diagnosis


@router.post(
    "/{job_id}/cancel",
    summary="Cancel a job (idempotent)",
    response_model=JobStatus,
    responses=problem_responses(404, 409, 413),
)
def cancel(
    project: ProjectName,
    job_id: JobId,
    caller: Annotated[Principal, Depends(_may_cancel)],
    context: Context,
) -> JobStatus:
    return cancel_job(context, caller, project, job_id)


def cancel_job(
    context: ApiContext, caller: Principal, project: str, job_id: str, *, via: str = "the API"
) -> JobStatus:
    """Cancel as the module docstring says; the caller's access is checked already.
    Also what the web page's cancel button does (`via` names it in the history)."""
    changed = False
    with context.db.transaction() as session:
        job = request_cancel(session, project, job_id)  # locks the job's row
        if job is None:
            raise job_not_found(project, job_id)
        if job.business_state in TERMINAL and job.business_state != BusinessState.CANCELLED:
            raise ProblemError(
                409,
                f"job {job.id} has finished ({job.business_state}/{job.reason}); "
                "there is nothing to cancel",
                type=JOB_FINISHED,
                title="The job has finished",
                business_status=str(job.business_state),
                reason=str(job.reason),
            )
        if job.business_state != BusinessState.CANCELLED:
            apply_business_change(
                session,
                job.id,
                BusinessState.CANCELLED,
                ReasonCode.CANCELLED,
                source=Source.API,
                message=f"cancelled through {via} by {caller.name!r}",
            )
            changed = True
        status = _status(session, job)
    if changed:
        context.changed()
    return status
