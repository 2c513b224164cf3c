"""Every error the API answers with, as RFC 9457 problem details (application/problem+json).

Handlers raise `ProblemError`; `app.py` turns it, and everything else that can
go wrong, into a `Problem` response. `type` is `about:blank` when the HTTP
status says it all (the title is then the status phrase), else one of the
`urn:kubetrain:problem:*` URIs below, which clients may switch on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from kubetrain.domain.spec import MAX_PROBLEMS, FieldProblem

PROBLEM_MEDIA_TYPE = "application/problem+json"

BLANK = "about:blank"
VALIDATION = "urn:kubetrain:problem:validation"
MALFORMED_BODY = "urn:kubetrain:problem:malformed-body"
IDEMPOTENCY_CONFLICT = "urn:kubetrain:problem:idempotency-conflict"
JOB_FINISHED = "urn:kubetrain:problem:job-finished"
DATASET_CONFLICT = "urn:kubetrain:problem:dataset-conflict"
INVALID_CURSOR = "urn:kubetrain:problem:invalid-cursor"
DATABASE_UNAVAILABLE = "urn:kubetrain:problem:database-unavailable"
NO_DIAGNOSIS = "urn:kubetrain:problem:no-diagnosis"


class FieldError(BaseModel):
    """One refused field: a dotted path (`spec.resources.requests.cpu`, `query.limit`; empty
    for the whole body) and what is allowed there."""

    field: str
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")  # extension members, as the RFC allows

    type: str = BLANK
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[FieldError] | None = Field(
        default=None, description="validation problems (422), one per field"
    )


class ProblemError(Exception):
    """Raised by handlers and dependencies; answered as a Problem."""

    def __init__(
        self,
        status: int,
        detail: str | None = None,
        *,
        type: str = BLANK,
        title: str | None = None,
        errors: Sequence[FieldProblem] = (),
        headers: Mapping[str, str] | None = None,
        **extensions: Any,
    ) -> None:
        super().__init__(detail or HTTPStatus(status).phrase)
        self.status = status
        self.detail = detail
        self.type = type
        self.title = title or HTTPStatus(status).phrase
        self.errors = [FieldError(field=p.field, message=p.message) for p in errors]
        self.headers = dict(headers or {})
        self.extensions = extensions

    def problem(self, instance: str | None) -> Problem:
        return Problem(
            type=self.type,
            title=self.title,
            status=self.status,
            detail=self.detail,
            instance=instance,
            errors=self.errors or None,
            **self.extensions,
        )


def problem_response(problem: Problem, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(
        problem.model_dump(mode="json", exclude_none=True),
        status_code=problem.status,
        headers=dict(headers or {}),
        media_type=PROBLEM_MEDIA_TYPE,
    )


def validation_error(problems: Sequence[FieldProblem], detail: str) -> ProblemError:
    """A 422 listing at most MAX_PROBLEMS problems, then how many more there were: a
    body of 40,000 mistakes gets an answer of 50, not a megabyte."""
    if len(problems) > MAX_PROBLEMS:
        hidden = len(problems) - MAX_PROBLEMS
        problems = [*problems[:MAX_PROBLEMS], FieldProblem("", f"and {hidden} more problems")]
    return ProblemError(
        422, detail, type=VALIDATION, title="The request is not valid", errors=problems
    )


def not_found(what: str) -> ProblemError:
    return ProblemError(404, f"{what} not found")


def database_unavailable() -> ProblemError:
    # Retry-After: a restart or failover of the database takes seconds.
    return ProblemError(
        503,
        "the database is unreachable; try again shortly",
        type=DATABASE_UNAVAILABLE,
        title="Database unavailable",
        headers={"Retry-After": "5"},
    )


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for these error statuses, answered as a Problem.

    FastAPI lists them under application/json; `app.py` moves them to
    application/problem+json when it builds the document.
    """
    return {
        status: {"model": Problem, "description": HTTPStatus(status).phrase} for status in statuses
    }
