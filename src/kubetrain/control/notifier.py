"""Delivers a project's job events to its webhooks, from the history as outbox.

Each round reads the webhooks that are not backing off and, for each (all at
once, so a slow receiver holds up only itself), posts the CloudEvents of the
business history rows after its cursor, in id order, one at a time: the order
of one job's events is the order of its rows, because a job's changes are
serialized by the lock on its row. The cursor moves, in its own transaction,
as soon as a row's events are answered 2xx, so a crash or a lost lease sends
again only the row then in flight, not the whole round. The first failure
stops that webhook's round and schedules a retry with exponential backoff and
full jitter.

On PostgreSQL a history row can commit after one with a higher id (two
transactions of different jobs in flight at once); a cursor moved past it
would skip it. So a round delivers only rows with ids at most the highest id
seen `settle_seconds` before: by then every transaction that took a lower id
has long committed (kubetrain's transactions are short: milliseconds).

The loop runs on the leader only, beside the syncer and the dispatcher, and
never waits for them nor they for it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubetrain.delivery import Post
from kubetrain.domain.notifications import EventType, Notification, event_types_for, wanted
from kubetrain.domain.reasons import CATALOG
from kubetrain.domain.states import ReasonCode
from kubetrain.store import Database
from kubetrain.store.models import Job, Transition, Webhook
from kubetrain.store.webhooks import (
    due_webhooks,
    newest_history_id,
    pending_history,
    previous_business_detail,
    record_delivered,
    record_failed,
)

log = logging.getLogger(__name__)


BACKOFF_BASE_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 300.0


@dataclass(frozen=True, slots=True)
class _Work:
    hook_id: str
    url: str
    secret: str
    # (history row id, its notifications), oldest first
    rows: list[tuple[int, list[Notification]]]


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
        settle_seconds: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.db = db
        self.post = post
        self.interval = interval
        self.settle_seconds = settle_seconds
        self.clock = clock
        self.monotonic = monotonic
        self.rng = rng
        self._seen: deque[tuple[float, int]] = deque()  # (monotonic, highest id)

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception:
                log.exception("webhook delivery round failed; trying again")
            await asyncio.sleep(self.interval)

    async def round(self) -> int:
        """One pass over the due webhooks; the number of events delivered."""
        work = await asyncio.to_thread(self._read)
        delivered = await asyncio.gather(*(self._deliver(w) for w in work))
        return sum(delivered)

    def _settled_id(self, newest: int) -> int:
        now = self.monotonic()
        self._seen.append((now, newest))
        settled = 0
        while self._seen and self._seen[0][0] <= now - self.settle_seconds:
            settled = self._seen.popleft()[1]
        if settled:  # keep the last settled mark for the next round
            self._seen.appendleft((now - self.settle_seconds, settled))
        return settled

    def _read(self) -> list[_Work]:
        with self.db.read_only() as session:
            newest = newest_history_id(session)
            limit = self._settled_id(newest) if self.settle_seconds > 0 else newest
            work = []
            for hook in due_webhooks(session, self.clock()):
                rows = []
                for row, job in pending_history(session, hook):
                    if row.id > limit:
                        break
                    before = previous_business_detail(session, row)
                    rows.append((row.id, _notifications(hook, row, job, before)))
                if rows:
                    work.append(_Work(hook.id, hook.url, hook.secret, rows))
            return work

    async def _deliver(self, work: _Work) -> int:
        delivered = 0
        passed: int | None = None  # a row with no event for this webhook, not yet recorded
        for row_id, notifications in work.rows:
            if not notifications:
                passed = row_id
                continue
            for sent, notification in enumerate(notifications):
                error = await self._post_one(work, notification)
                if error is not None:
                    await asyncio.to_thread(self._record, work.hook_id, None, 0, error)
                    return delivered + sent
            await asyncio.to_thread(self._record, work.hook_id, row_id, len(notifications), None)
            delivered += len(notifications)
            passed = None
        if passed is not None:
            await asyncio.to_thread(self._record, work.hook_id, passed, 0, None)
        return delivered

    async def _post_one(self, work: _Work, notification: Notification) -> str | None:
        headers = notification.headers(work.secret, int(self.clock().timestamp()))
        try:
            status = await self.post(work.url, notification.body(), headers)
        except Exception as exc:  # the receiver's trouble, never the loop's
            return f"{type(exc).__name__}: {exc}"
        if 200 <= status < 300:
            return None
        return f"the receiver answered HTTP {status}"

    def _record(self, hook_id: str, cursor: int | None, count: int, error: str | None) -> None:
        with self.db.transaction() as session:
            if cursor is not None:
                record_delivered(session, hook_id, cursor, count)
            if error is not None:
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
    hook: Webhook, row: Transition, job: Job, before: dict[str, Any] | None
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
            id=f"kt-{row.id}-{event_type.name.lower()}",
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
