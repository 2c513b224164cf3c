"""Delivers a project's job events to its webhooks, from the webhooks' outbox.

Every business history row gets a delivery row per webhook of its project, in
its own transaction (store/webhooks.py), so there is no cursor for a row that
commits late to fall behind, and no clock to trust.

Each webhook is delivered by its own task, so a slow receiver holds up only
itself: the loop looks for webhooks with something due every `interval` and
starts a task for each one that has none running, never waiting for them. A
task posts the webhook's undelivered rows in id order, one event at a time: the
order of one job's events is the order of its rows, because a job's changes are
serialized by the lock on its row. Each row's delivery rows go, in their own
transaction, as soon as its events are answered 2xx, so a crash or a lost lease
sends again only the row then in flight. The first failure ends the task and
schedules a retry with exponential backoff and full jitter. At most
`max_in_flight` tasks post at once: a thousand slow receivers wait their turn
rather than hold a thousand connections (each is cut off by the poster's
deadline, and backs off after).

The loop runs on the leader only, beside the syncer and the dispatcher, and
never waits for them nor they for it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubetrain.delivery import DeliveryError, Post
from kubetrain.domain.notifications import EventType, Notification, event_types_for, wanted
from kubetrain.domain.reasons import CATALOG
from kubetrain.domain.states import ReasonCode
from kubetrain.store import Database
from kubetrain.store.models import Job, Transition, Webhook
from kubetrain.store.webhooks import (
    drop_deliveries,
    due_webhooks,
    installation_id,
    pending_deliveries,
    previous_business_detail,
    record_delivered,
    record_failed,
)

log = logging.getLogger(__name__)


BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0
MAX_IN_FLIGHT = 64


@dataclass(frozen=True, slots=True)
class _Hook:
    id: str
    url: str
    secret: str
    project: str
    events: tuple[str, ...]


def backoff(failures: int, rng: Callable[[], float]) -> float:
    """Seconds before the next try after `failures` failures in a row: exponential,
    capped, with full jitter (half to all of it) so receivers are not hit in step."""
    delay: float = min(BACKOFF_MAX_SECONDS, BACKOFF_BASE_SECONDS * 2.0 ** min(failures - 1, 20))
    return delay * (0.5 + 0.5 * rng())


class Notifier:
    def __init__(
        self,
        db: Database,
        post: Post,
        *,
        interval: float = 1.0,
        max_in_flight: int = MAX_IN_FLIGHT,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.db = db
        self.post = post
        self.interval = interval
        self.clock = clock
        self.rng = rng
        self._slots = asyncio.Semaphore(max_in_flight)
        self._running: dict[str, asyncio.Task[int]] = {}
        self._source: str | None = None

    async def run(self) -> None:
        try:
            while True:
                try:
                    self._start(await asyncio.to_thread(self._due))
                except Exception:
                    log.exception("looking for webhook deliveries failed; trying again")
                await asyncio.sleep(self.interval)
        finally:
            tasks = list(self._running.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def round(self) -> int:
        """Start a task for each due webhook that has none running, and wait for the
        ones started; the number of events they delivered."""
        started = self._start(await asyncio.to_thread(self._due))
        return sum(await asyncio.gather(*started))

    def _start(self, hooks: list[_Hook]) -> list[asyncio.Task[int]]:
        started = []
        for hook in hooks:
            if hook.id in self._running:
                continue
            task = asyncio.create_task(self._deliver(hook), name=f"webhook {hook.id}")
            self._running[hook.id] = task
            task.add_done_callback(functools.partial(self._finished, hook.id))
            started.append(task)
        return started

    def _finished(self, hook_id: str, _task: asyncio.Task[int]) -> None:
        self._running.pop(hook_id, None)

    def _due(self) -> list[_Hook]:
        with self.db.read_only() as session:
            if self._source is None:
                # CloudEvents: source + id identify an event; the source names the
                # installation, so two of them never repeat one another's pairs.
                self._source = f"urn:uuid:{installation_id(session)}"
            return [
                _Hook(h.id, h.url, h.secret, h.project, tuple(h.events))
                for h in due_webhooks(session, self.clock())
            ]

    def _pending(self, hook: _Hook) -> list[tuple[int, list[Notification]]]:
        """The webhook's undelivered rows, oldest first, with their events for it."""
        assert self._source is not None
        with self.db.read_only() as session:
            rows = []
            for key, row, job in pending_deliveries(session, hook.id):
                before = previous_business_detail(session, row)
                rows.append((row.id, _notifications(hook, self._source, key, row, job, before)))
            return rows

    async def _deliver(self, hook: _Hook) -> int:
        async with self._slots:
            rows = await asyncio.to_thread(self._pending, hook)
            delivered = 0
            passed: list[int] = []  # rows with no event for this webhook, not yet recorded
            for row_id, notifications in rows:
                if not notifications:
                    passed.append(row_id)
                    continue
                for sent, notification in enumerate(notifications):
                    error = await self._post_one(hook, notification)
                    if error is not None:
                        await asyncio.to_thread(self._record, hook.id, passed, 0, error)
                        return delivered + sent
                answered = [*passed, row_id]
                await asyncio.to_thread(self._record, hook.id, answered, len(notifications), None)
                delivered += len(notifications)
                passed = []
            if passed:
                await asyncio.to_thread(self._record, hook.id, passed, 0, None)
            return delivered

    async def _post_one(self, hook: _Hook, notification: Notification) -> str | None:
        headers = notification.headers(hook.secret, int(self.clock().timestamp()))
        try:
            status = await self.post(hook.url, notification.body(), headers)
        except DeliveryError as exc:
            return str(exc)
        except Exception as exc:  # the receiver's trouble, never the loop's
            return f"no answer ({type(exc).__name__})"
        if 200 <= status < 300:
            return None
        if 300 <= status < 400:
            return f"the receiver answered HTTP {status}; redirects are not followed"
        return f"the receiver answered HTTP {status}"

    def _record(self, hook_id: str, rows: list[int], count: int, error: str | None) -> None:
        with self.db.transaction() as session:
            if error is None:
                record_delivered(session, hook_id, rows, count)
            else:
                drop_deliveries(session, hook_id, rows)
                hook = session.get(Webhook, hook_id)
                failures = (hook.failures if hook is not None else 0) + 1
                now = self.clock()
                retry_at = now + timedelta(seconds=backoff(failures, self.rng))
                record_failed(session, hook_id, error=error, now=now, retry_at=retry_at)
                log.warning(
                    "webhook %s failed (%d in a row), retrying at %s: %s",
                    hook_id,
                    failures,
                    retry_at.isoformat(),
                    error,
                )


def _notifications(
    hook: _Hook,
    source: str,
    key: str,
    row: Transition,
    job: Job,
    before: dict[str, Any] | None,
) -> list[Notification]:
    detail = row.detail or {}
    waitable_now = detail.get("waitable") if isinstance(detail.get("waitable"), bool) else None
    waitable_before = before.get("waitable") if before else None
    types = event_types_for(
        row.from_state,
        row.to_state,
        str(row.from_reason) if row.from_reason else None,
        str(row.to_reason) if row.to_reason else None,
        waitable_before=waitable_before if isinstance(waitable_before, bool) else None,
        waitable_now=waitable_now,
    )
    reason = CATALOG.get(ReasonCode(row.to_reason)) if row.to_reason else None
    summary = (
        {
            "code": str(reason.code),
            "link": str(detail.get("link") or reason.link),
            "explanation": reason.explanation,
            "action": reason.action,
            "actor": str(reason.actor),
            "waitable": waitable_now if waitable_now is not None else reason.waitable,
        }
        if reason is not None
        else None
    )
    at = row.at
    return [
        Notification(
            id=f"{key}-{event_type.name.lower()}",
            source=source,
            type=event_type,
            time=at,
            job={
                "id": job.id,
                "project": job.project,
                "name": job.name,
                "state": row.to_state,
                "reason": str(row.to_reason) if row.to_reason else None,
                "attempt": row.attempt,
            },
            change={
                "fromState": row.from_state,
                "toState": row.to_state,
                "fromReason": str(row.from_reason) if row.from_reason else None,
                "toReason": str(row.to_reason) if row.to_reason else None,
                "rawReason": row.raw_reason,
                "rawMessage": row.raw_message,
                "source": str(row.source),
                "at": at.isoformat().replace("+00:00", "Z"),
            },
            diagnosis=summary,
        )
        for event_type in types
        if wanted(event_type, hook.events)
    ]


__all__ = ["BACKOFF_MAX_SECONDS", "EventType", "Notifier", "Post", "backoff"]
