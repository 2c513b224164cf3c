"""Webhooks, their outbox (`webhook_deliveries`) and the installation's id.

Every business history row gets, in the transaction that writes it, one
delivery row per webhook of the job's project (`enqueue_deliveries`: the batch
writers call it; the one-job path notes its rows with `note_business_rows`, and
a listener queues them all at once when the transaction commits, so a round of
the dispatcher looks up the webhooks once, not once per job; a submission writes
its first row's with its own statements, `deliveries` and `delivery_insert`). A
delivery row goes once the receiver
answered 2xx, in its own short transaction: a crash in between delivers that
event again (at least once; its id, made from the row's random key, stays the
same). So a new webhook hears what happens after its creation, and a history
row that commits after rows with higher ids is delivered all the same.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Insert,
    bindparam,
    delete,
    event,
    exists,
    func,
    insert,
    inspect,
    select,
)
from sqlalchemy.orm import Session

from kubetrain.domain.notifications import new_secret
from kubetrain.store.in_lists import padded
from kubetrain.store.models import (
    Installation,
    Job,
    Transition,
    TransitionKind,
    Webhook,
    WebhookDelivery,
)

__all__ = [
    "MAX_WEBHOOKS_PER_PROJECT",
    "count_webhooks",
    "create_webhook",
    "delete_webhook",
    "deliveries",
    "delivery_insert",
    "drop_deliveries",
    "due_webhooks",
    "enqueue_deliveries",
    "installation_id",
    "list_webhooks",
    "note_business_rows",
    "pending_deliveries",
    "previous_business_detail",
    "record_delivered",
    "record_failed",
    "webhooks_of",
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
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == webhook_id))
    session.delete(hook)
    return True


def webhooks_of(session: Session, job_ids: Collection[str]) -> dict[str, list[str]]:
    """The ids of the webhooks of each job's project, for the jobs whose project has any."""
    hooks: dict[str, list[str]] = {}
    if not job_ids:
        return hooks
    query = (
        select(Job.id, Webhook.id)
        .join(Webhook, Webhook.project == Job.project)
        .where(Job.id.in_(padded(sorted(job_ids))))
    )
    for job_id, hook_id in session.execute(query):
        hooks.setdefault(job_id, []).append(hook_id)
    return hooks


def enqueue_deliveries(
    session: Session,
    rows: Collection[tuple[int, str]],
    hooks: Mapping[str, Collection[str]] | None = None,
) -> int:
    """Queue the business history rows `(row id, job id)` just written for every webhook
    of their jobs' projects (`hooks`, if the caller has read them: `webhooks_of`), in
    the caller's transaction; returns how many queued."""
    if not rows:
        return 0
    if hooks is None:
        hooks = webhooks_of(session, {job_id for _, job_id in rows})
    if not hooks:
        return 0
    queued = [row for row_id, job_id in rows for row in deliveries(row_id, hooks.get(job_id, ()))]
    session.execute(insert(WebhookDelivery), queued)
    return len(queued)


def deliveries(row_id: int, hooks: Iterable[str]) -> list[dict[str, Any]]:
    """The outbox rows of one business history row for these webhooks: one each, with
    its random event key (the event's id, the same on every try)."""
    return [
        {"webhook_id": hook_id, "transition_id": row_id, "event_key": secrets.token_hex(16)}
        for hook_id in hooks
    ]


def delivery_insert() -> Insert:
    """One outbox row (`deliveries`), every column a bind: for a submission's statements,
    which are compiled once (store/jobs.py)."""
    columns = WebhookDelivery.__table__.c
    return insert(WebhookDelivery).values(
        {name: bindparam(name, type_=columns[name].type) for name in _DELIVERY_COLUMNS}
    )


_DELIVERY_COLUMNS = ("webhook_id", "transition_id", "event_key")


# session.info key: the business history rows the one-job path wrote in this transaction.
NOTED_ROWS_KEY = "kubetrain.webhook_rows"


def note_business_rows(session: Session, rows: Collection[Transition]) -> None:
    """Queue these rows (added to the session, perhaps not flushed) when it commits."""
    session.info.setdefault(NOTED_ROWS_KEY, []).extend(rows)


@event.listens_for(Session, "before_commit")
def _queue_noted_rows(session: Session) -> None:
    rows: list[Transition] = session.info.pop(NOTED_ROWS_KEY, [])
    if rows:
        session.flush()  # their ids
        # (A row a rolled-back savepoint took with it is no longer persistent.)
        written = [(row.id, row.job_id) for row in rows if inspect(row).persistent]
        enqueue_deliveries(session, written)


@event.listens_for(Session, "after_rollback")
def _forget_noted_rows(session: Session) -> None:
    session.info.pop(NOTED_ROWS_KEY, None)


def due_webhooks(session: Session, now: datetime, *, limit: int = 1000) -> list[Webhook]:
    """Webhooks with something to deliver and not backing off after a failure."""
    query = select(Webhook).where(
        (Webhook.next_attempt_at.is_(None)) | (Webhook.next_attempt_at <= now),
        exists().where(WebhookDelivery.webhook_id == Webhook.id),
    )
    return list(session.scalars(query.order_by(Webhook.id).limit(limit)))


def pending_deliveries(
    session: Session, webhook_id: str, limit: int = 100
) -> list[tuple[str, Transition, Job]]:
    """The webhook's undelivered history rows, oldest first, each with its event key.
    A job's rows are in their order: its changes are serialized by the lock on its
    row, so a later one is written only after the one before it committed."""
    query = (
        select(WebhookDelivery.event_key, Transition, Job)
        .join(Transition, Transition.id == WebhookDelivery.transition_id)
        .join(Job, Job.id == Transition.job_id)
        .where(WebhookDelivery.webhook_id == webhook_id)
        .order_by(WebhookDelivery.transition_id)
        .limit(limit)
    )
    return [(row[0], row[1], row[2]) for row in session.execute(query)]


def installation_id(session: Session) -> str:
    """The id made once for this installation (by migration 0007)."""
    return str(session.scalars(select(Installation.id).order_by(Installation.created_at)).first())


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


def drop_deliveries(session: Session, webhook_id: str, transition_ids: Sequence[int]) -> None:
    """The rows are done with for this webhook (answered, or they raise no event for it)."""
    if transition_ids:
        session.execute(
            delete(WebhookDelivery).where(
                WebhookDelivery.webhook_id == webhook_id,
                WebhookDelivery.transition_id.in_(padded(transition_ids)),
            )
        )


def record_delivered(
    session: Session, webhook_id: str, transition_ids: Sequence[int], count: int
) -> None:
    """The rows' `count` events were answered 2xx: the webhook is healthy."""
    drop_deliveries(session, webhook_id, transition_ids)
    hook = session.get(Webhook, webhook_id)
    if hook is None:  # deleted meanwhile
        return
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
