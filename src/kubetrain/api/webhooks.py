"""`/api/v1/projects/{project}/webhooks`: a project's receivers of job events.

Admins of the project (or of `*`) create, list and delete them. The signing
secret is in the creation's answer only. What is sent, and how it is signed,
is in domain/notifications.py; how it is delivered, in control/notifier.py.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from kubetrain.api.auth import Caller, require_project
from kubetrain.api.body import json_body
from kubetrain.api.context import ApiContext, get_context
from kubetrain.api.principal import Action, Principal
from kubetrain.api.problems import ProblemError, not_found, problem_responses, validation_error
from kubetrain.domain.networks import Network
from kubetrain.domain.notifications import EventType, url_problem
from kubetrain.domain.spec import FieldProblem
from kubetrain.store.models import Webhook
from kubetrain.store.webhooks import (
    MAX_WEBHOOKS_PER_PROJECT,
    count_webhooks,
    create_webhook,
    delete_webhook,
    list_webhooks,
)

router = APIRouter(
    prefix="/api/v1/projects/{project}/webhooks",
    tags=["webhooks"],
    responses=problem_responses(401, 403, 422, 500, 503),
)

Context = Annotated[ApiContext, Depends(get_context)]
ProjectName = Annotated[str, Path(description="the project whose jobs' events are sent")]
EVENT_TYPES = sorted(str(t) for t in EventType)


class WebhookEntry(BaseModel):
    """A webhook and how its deliveries go (never its secret)."""

    model_config = ConfigDict(populate_by_name=True)

    id: str
    project: str
    url: str
    events: list[str] = Field(description="event types sent; empty: every type")
    created_at: datetime = Field(alias="createdAt")
    created_by: str = Field(alias="createdBy")
    delivered: int = Field(description="events delivered so far")
    status: str = Field(description="`ok`, or `failing` since `failingSince`")
    failures: int = Field(description="failed attempts in a row")
    failing_since: datetime | None = Field(alias="failingSince")
    next_attempt_at: datetime | None = Field(alias="nextAttemptAt")
    last_error: str | None = Field(alias="lastError")

    @classmethod
    def of(cls, hook: Webhook) -> WebhookEntry:
        return cls(
            id=hook.id,
            project=hook.project,
            url=hook.url,
            events=list(hook.events),
            created_at=hook.created_at,
            created_by=hook.created_by,
            delivered=hook.delivered,
            status="failing" if hook.failures else "ok",
            failures=hook.failures,
            failing_since=hook.failing_since,
            next_attempt_at=hook.next_attempt_at,
            last_error=hook.last_error,
        )


class CreatedWebhook(WebhookEntry):
    secret: str = Field(
        description="the signing secret (Standard Webhooks, `whsec_…`): shown only now"
    )


class WebhookList(BaseModel):
    items: list[WebhookEntry]


WEBHOOK_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": "`url` (http or https, no credentials, no invisible or bidirectional "
        "control characters; an address in the platform's closed networks is refused unless "
        "`webhook_allowed_networks` opens it) and optionally `events`, "
        f"a list of: {', '.join(EVENT_TYPES)} (default: every type).",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["url"],
                    "additionalProperties": False,
                    "properties": {
                        "url": {"type": "string", "maxLength": 2048},
                        "events": {
                            "type": "array",
                            "items": {"type": "string", "enum": EVENT_TYPES},
                            "maxItems": len(EVENT_TYPES),
                        },
                    },
                }
            }
        },
    }
}


async def _may_admin(project: ProjectName, caller: Caller, context: Context) -> Principal:
    require_project(caller, project, Action.ADMIN, context.settings)
    return caller


def _parse(body: Any, allowed: tuple[Network, ...]) -> tuple[str, list[str]]:
    if not isinstance(body, dict):
        raise validation_error(
            [FieldProblem("", "must be an object with `url` and optionally `events`")],
            "the webhook is refused",
        )
    problems = [
        FieldProblem(key, "is not a field of a webhook (allowed: url, events)")
        for key in body
        if key not in ("url", "events")
    ]
    url = body.get("url")
    if not isinstance(url, str):
        problems.append(FieldProblem("url", "is required: the receiver's http(s) URL"))
    elif (problem := url_problem(url, allowed)) is not None:
        problems.append(FieldProblem("url", problem))
    events = body.get("events", [])
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        problems.append(FieldProblem("events", "must be a list of event types"))
        events = []
    for index, event in enumerate(events):
        if event not in EVENT_TYPES:
            problems.append(
                FieldProblem(f"events[{index}]", f"must be one of {', '.join(EVENT_TYPES)}")
            )
    if problems:
        raise validation_error(problems[:50], "the webhook is refused")
    assert isinstance(url, str)
    return url, events


@router.post(
    "",
    status_code=201,
    summary="Create a webhook; the answer holds its signing secret, shown only once",
    response_model=CreatedWebhook,
    response_model_by_alias=True,
    responses=problem_responses(400, 409, 413, 415),
    openapi_extra=WEBHOOK_BODY,
)
def create(
    project: ProjectName,
    caller: Annotated[Principal, Depends(_may_admin)],
    context: Context,
    body: Annotated[Any, Depends(json_body)],
) -> CreatedWebhook:
    try:
        context.settings.namespace_for(project)
    except ValueError as exc:
        # `*` or a name no project can have: nothing would ever be sent to it.
        problem = FieldProblem("project", f"{project!r} is no project that can have jobs: {exc}")
        raise validation_error([problem], "the webhook is refused") from None
    url, events = _parse(body, context.settings.webhook_networks())
    with context.db.transaction() as session:
        if count_webhooks(session, project) >= MAX_WEBHOOKS_PER_PROJECT:
            raise ProblemError(
                409, f"project {project!r} has {MAX_WEBHOOKS_PER_PROJECT} webhooks, the most"
            )
        hook, secret = create_webhook(
            session, project=project, url=url, events=events, created_by=caller.name
        )
        entry = WebhookEntry.of(hook)
    return CreatedWebhook(**entry.model_dump(), secret=secret)


@router.get(
    "",
    summary="The project's webhooks and how their deliveries go",
    response_model=WebhookList,
    response_model_by_alias=True,
)
def listing(
    project: ProjectName,
    caller: Annotated[Principal, Depends(_may_admin)],
    context: Context,
) -> WebhookList:
    with context.db.read_only() as session:
        return WebhookList(items=[WebhookEntry.of(h) for h in list_webhooks(session, project)])


@router.delete(
    "/{webhook_id}",
    status_code=204,
    summary="Delete a webhook; nothing more is sent to it",
    responses=problem_responses(404),
)
def delete(
    project: ProjectName,
    webhook_id: str,
    caller: Annotated[Principal, Depends(_may_admin)],
    context: Context,
) -> Response:
    with context.db.transaction() as session:
        if not delete_webhook(session, project, webhook_id):
            raise not_found(f"webhook {webhook_id!r} in project {project!r}")
    return Response(status_code=204)
