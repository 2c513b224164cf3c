"""Webhooks and their delivery state; the history rows still to deliver.

A webhook's `cursor` starts at the newest history row when it is created, so a
new receiver gets what happens from then on. Each delivery moves the cursor in
its own short transaction, after the receiver answered 2xx: a crash in between
delivers that event again (at least once; the CloudEvent id stays the same).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kubetrain.domain.notifications import new_secret
from kubetrain.store.models import Job, Transition, TransitionKind, Webhook

__all__ = [
    "MAX_WEBHOOKS_PER_PROJECT",
    "count_webhooks",
    "create_webhook",
    "delete_webhook",
    "due_webhooks",
    "list_webhooks",
    "newest_history_id",
    "pending_history",
    "previous_business_detail",
    "record_delivered",
    "record_failed",
]

MAX_WEBHOOKS_PER_PROJECT = 20
MAX_ERROR_LENGTH = 500


def create_webhook(
    session: Session,
    *,
    project: str,
    url: str,
    events: Sequence[str],
    created_by: str,
    now: datetime | None = None,
) -> tuple[Webhook, str]:
    """A new webhook (validated by the caller) and its secret, shown only now."""
    secret = new_secret()
    hook = Webhook(
        id=str(uuid.uuid4()),
        project=project,
        url=url,
        secret=secret,
        events=sorted(set(events)),
        created_at=now or datetime.now(UTC),
        created_by=created_by,
        cursor=newest_history_id(session),
        delivered=0,
        failures=0,
    )
    session.add(hook)
    session.flush()
    return hook, secret


def count_webhooks(session: Session, project: str) -> int:
    return session.scalar(select(func.count()).where(Webhook.project == project)) or 0


def list_webhooks(session: Session, project: str) -> list[Webhook]:
    query = select(Webhook).where(Webhook.project == project).order_by(Webhook.created_at)
    return list(session.scalars(query))


def delete_webhook(session: Session, project: str, webhook_id: str) -> bool:
    hook = session.get(Webhook, webhook_id)
    if hook is None or hook.project != project:
        return False
    session.delete(hook)
    return True


def due_webhooks(session: Session, now: datetime) -> list[Webhook]:
    """Webhooks not backing off after a failure."""
    query = select(Webhook).where(
        (Webhook.next_attempt_at.is_(None)) | (Webhook.next_attempt_at <= now)
    )
    return list(session.scalars(query.order_by(Webhook.id)))


def pending_history(
    session: Session, hook: Webhook, limit: int = 100
) -> list[tuple[Transition, Job]]:
    """The project's business history rows after the webhook's cursor, oldest first."""
    query = (
        select(Transition, Job)
        .join(Job, Job.id == Transition.job_id)
        .where(
            Transition.id > hook.cursor,
            Transition.kind == TransitionKind.BUSINESS,
            Job.project == hook.project,
        )
        .order_by(Transition.id)
        .limit(limit)
    )
    return [(row[0], row[1]) for row in session.execute(query)]


def newest_history_id(session: Session) -> int:
    return session.scalar(select(func.max(Transition.id))) or 0


def previous_business_detail(session: Session, row: Transition) -> dict[str, Any] | None:
    """The detail of the job's business row before `row` (to tell a change of waitable)."""
    query = (
        select(Transition.detail)
        .where(
            Transition.job_id == row.job_id,
            Transition.kind == TransitionKind.BUSINESS,
            Transition.id < row.id,
        )
        .order_by(Transition.id.desc())
        .limit(1)
    )
    detail = session.scalar(query)
    return detail if isinstance(detail, dict) else None


def record_delivered(session: Session, webhook_id: str, cursor: int, count: int) -> None:
    hook = session.get(Webhook, webhook_id)
    if hook is None:  # deleted meanwhile
        return
    hook.cursor = max(hook.cursor, cursor)
    hook.delivered += count
    hook.failures = 0
    hook.failing_since = None
    hook.next_attempt_at = None
    hook.last_error = None


def record_failed(
    session: Session, webhook_id: str, *, error: str, now: datetime, retry_at: datetime
) -> None:
    hook = session.get(Webhook, webhook_id)
    if hook is None:
        return
    hook.failures += 1
    hook.failing_since = hook.failing_since or now
    hook.next_attempt_at = retry_at
    hook.last_error = error[:MAX_ERROR_LENGTH]
