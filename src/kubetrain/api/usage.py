"""`/api/v1/usage`: GPU-seconds per project and GPU type, over a window.

With `project`, any reader of that project may ask. Without it, the answer spans
every project the token covers (all of them for a token of `*`), which takes an
admin: how much each team used is the platform's business, not every reader's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from kubetrain.api.auth import Caller, require_project, role_may
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import ProblemError, problem_responses
from kubetrain.api.schemas import GpuSecondsView
from kubetrain.domain.usage import GpuSeconds
from kubetrain.store import ALL_PROJECTS
from kubetrain.store.usage import attempt_usage, usage_by_project

router = APIRouter(
    prefix="/api/v1/usage", tags=["usage"], responses=problem_responses(401, 403, 422, 500, 503)
)

Context = Annotated[ApiContext, Depends(get_context)]


class UsageEntry(GpuSecondsView):
    project: str
    gpu_type: str = Field(description="the jobs' spec.resources.gpuType; `any` when none named")
    jobs: int = Field(description="jobs whose Pods held GPUs in the window")
    gpu_hours: float


class Usage(BaseModel):
    since: datetime | None = Field(description="the window's start; null: since the beginning")
    until: datetime = Field(description="the moment of the answer: running Pods count until it")
    items: list[UsageEntry]
    total: GpuSecondsView


@router.get(
    "",
    summary="GPU-seconds per project and GPU type",
    response_model=Usage,
    description="From each Pod's binding to a node until it ends (a running Pod until now), "
    "split at its TRAINING report; every worker of a gang counts. Only the part after "
    "`since` is counted.",
)
def get_usage(
    caller: Caller,
    context: Context,
    project: Annotated[
        str | None, Query(description="one project; left out: every project the token covers")
    ] = None,
    since: Annotated[
        datetime | None, Query(description="RFC 3339 time: count only GPU time after it")
    ] = None,
) -> Usage:
    return usage_answer(context, caller, project=project, since=since)


def usage_answer(
    context: ApiContext, caller: Principal, *, project: str | None, since: datetime | None
) -> Usage:
    """The answer for `caller` (the dashboard's Usage page shows the same); a DB read."""
    if since is not None and (since.tzinfo is None or since.utcoffset() is None):
        raise ProblemError(422, "since: give a time zone (an RFC 3339 time, such as …Z)")
    if since is not None:
        try:  # stored as UTC: a time past UTC's range (9999-12-31T23:59-01:00) has none
            since = since.astimezone(UTC)
        except OverflowError:
            raise ProblemError(
                422, "since: the time is outside the years 1 to 9999 in UTC"
            ) from None
    if project is not None:
        require_project(caller, project, Action.READ, context.settings)
        projects: list[str] | None = [project]
    else:
        role_may(caller, Action.ADMIN)
        projects = None if caller.project == ALL_PROJECTS else [caller.project]
    now = datetime.now(UTC)
    with context.db.read_only() as session:
        attempts = attempt_usage(session, now=now, projects=projects, since=since)
    rows = usage_by_project(attempts)
    items = [
        UsageEntry(
            **GpuSecondsView.of(row.seconds).model_dump(),
            project=row.project,
            gpu_type=row.gpu_type,
            jobs=row.jobs,
            gpu_hours=round(row.seconds.total / 3600, 3),
        )
        for row in rows
    ]
    total = sum((row.seconds for row in rows), GpuSeconds())
    return Usage(since=since, until=now, items=items, total=GpuSecondsView.of(total))
