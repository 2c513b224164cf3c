"""The dispatcher's outbox: jobs in `CREATED` whose Kubernetes Job is still to be made.

The API commits a `CREATED` job and returns; the dispatcher then loops:

1. `claim_due_jobs` (one short transaction) takes the due jobs and pushes their
   `next_dispatch_at` forward by a hold, so a second dispatcher skips them and a
   dispatcher that dies mid-create leaves them due again once the hold ends.
2. It creates each Job in Kubernetes, with no transaction open.
3. `record_dispatch_outcomes` records every create (and delete) of the round in
   one more transaction.

Creation is idempotent by the Job's deterministic name, so a retry after a lost
answer is safe. Failures back off per job (1 s, 2 s, 4 s ...); when the API
server answers again after an outage, `retry_backed_off_now` makes every job
waiting out a backoff due at once, rather than each sleeping out its own
(up to 32 s after a 30 s outage). A dispatcher beginning its term first calls
`release_claims`: the claims of the one before it are dead. A claimed job with
`cancel_requested` set should be finished as `CANCELLED` rather than created.

A gang's restart goes through the same outbox: the syncer sets `restart_job_uid`
(the ended attempt's Job) and makes the job due while it stays `QUEUED`;
`claim_due_jobs` takes it too, the dispatcher deletes that Job and, once every Pod
of it has ended, creates attempt `current_attempt`; until then the job is due again
every `RESTART_POLL` (not a failure: no backoff), and recording the create clears
`restart_job_uid` and writes how long it waited into the history.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store.errors import JobNotFound
from kubetrain.store.jobs import apply_locked_business_change, lock_jobs, state_entered
from kubetrain.store.models import Job, Source, Transition, TransitionKind

_WAITING = "; waiting for attempt "
RESTART_POLL = timedelta(seconds=1)  # a gang's restart asks again whether attempt N ended
CLAIM_HOLD = timedelta(seconds=60)  # well over one create call, incl. client timeouts
BACKOFF_FIRST = timedelta(seconds=1)
BACKOFF_CAP = timedelta(minutes=5)  # an outage of hours still retries every few minutes


def dispatch_backoff(failures: int) -> timedelta:
    """1 s, 2 s, 4 s, ... up to 5 min after the `failures`-th failure in a row."""
    return min(BACKOFF_CAP, BACKOFF_FIRST * (1 << max(0, min(failures - 1, 30))))


def claim_due_jobs(
    session: Session,
    *,
    limit: int = 20,
    hold: timedelta = CLAIM_HOLD,
    now: datetime | None = None,
) -> list[Job]:
    """Claim up to `limit` due jobs to create: `CREATED` ones and gangs whose next
    attempt is due (`restart_job_uid`), longest waiting first.

    On PostgreSQL `FOR UPDATE SKIP LOCKED` lets concurrent claimers take
    disjoint sets without waiting on each other; SQLite has one writer at a
    time, so a plain select is already exclusive.
    """
    return _claim(session, _TO_CREATE, limit, hold, now)


# A restart of a cancelled job is never made (the cancel deletes the Job instead).
_TO_CREATE = or_(
    Job.business_state == BusinessState.CREATED,
    and_(Job.restart_job_uid.is_not(None), Job.business_state == BusinessState.QUEUED),
)


def _claim(
    session: Session,
    which: ColumnElement[bool],
    limit: int,
    hold: timedelta,
    now: datetime | None,
) -> list[Job]:
    """Claim due outbox rows matching `which`, and hold them for `hold`."""
    now = now if now is not None else datetime.now(UTC)
    jobs = list(
        session.scalars(
            select(Job)
            .where(which, Job.next_dispatch_at <= now)
            .order_by(Job.next_dispatch_at, Job.created_at, Job.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        )
    )
    for job in jobs:
        job.next_dispatch_at = now + hold
    return jobs


@dataclass(frozen=True, slots=True)
class WaitedForAttempt:
    """A gang's next attempt was made once every Pod of attempt `attempt` had ended: the
    dispatcher first looked at `since` and waited `seconds` for `pods` (those left then)."""

    attempt: int
    since: datetime
    seconds: float
    pods: list[str]
    made: str = "created"  # "resumed in place": the same Job, under Kueue

    def message(self) -> str:
        if not self.pods:
            return (
                f"attempt {self.attempt + 1} {self.made}: every Pod of attempt {self.attempt} "
                "had ended"
            )
        return (
            f"attempt {self.attempt + 1} {self.made} once every Pod of attempt {self.attempt} "
            f"had ended: waited {self.seconds:g} s for {', '.join(self.pods)}"
        )


def record_dispatch_outcomes(
    session: Session,
    *,
    dispatched: Mapping[str, str] | None = None,
    waited: Mapping[str, WaitedForAttempt] | None = None,
    waiting: Mapping[str, list[str]] | None = None,
    failed: Mapping[str, tuple[str, str]] | None = None,
    deleted: Collection[str] = (),
    backoff: Callable[[int], timedelta] = dispatch_backoff,
    now: datetime | None = None,
) -> dict[str, Transition]:
    """Record what a dispatch round did, for all its jobs at once; returns the business
    history rows written, by job id. Raises `JobNotFound` for an unknown id.

    * `dispatched` (job id -> Kubernetes Job name): the Job exists, so the job leaves
      the outbox and moves `CREATED -> QUEUED`. One the syncer (or a cancel) has moved
      on already only gets the name; one cancelled while the create was in flight
      stays due, so that its Job is deleted.
    * `failed` (job id -> raw reason, raw message): the create failed (API server
      unreachable, refused). The job stays `CREATED` with reason `JOB_NOT_CREATED`
      and the raw error, and is due again after `backoff(failures in a row)`. One
      that has moved on meanwhile is left alone.
    * `waited` (job id -> the wait): a gang's next attempt among `dispatched` waited for
      the ended attempt's Pods; a history row says so, on the ended attempt.
    * `waiting` (job id -> the Pods left): a gang's next attempt waits for these Pods of
      the ended one to end; the job stays `QUEUED` with its cause, due again after
      `RESTART_POLL`, no failure counted.
    * `deleted`: a cancelled job's Kubernetes Job is gone (or going): it leaves the outbox.
    """
    now = now if now is not None else datetime.now(UTC)
    dispatched = dispatched or {}
    waited = waited or {}
    waiting = waiting or {}
    failed = failed or {}
    # Every row of the round at once, in id order: no deadlock with another batch.
    jobs = lock_jobs(session, {*dispatched, *waiting, *failed, *deleted})
    for job_id in (*dispatched, *waiting, *failed, *deleted):
        if job_id not in jobs:
            raise JobNotFound(job_id)
    # When the jobs moving to QUEUED entered CREATED, for the time-per-state metric.
    entered = state_entered(
        session, [i for i in dispatched if jobs[i].business_state == BusinessState.CREATED]
    )
    rows: dict[str, Transition] = {}

    def move(job: Job, state: BusinessState, reason: ReasonCode, *raw: str) -> None:
        row = apply_locked_business_change(
            session, job, state, reason, *raw, source=Source.DISPATCHER, now=now, entered=entered
        )
        if row is not None:
            rows[job.id] = row

    for job_id, k8s_job_name in dispatched.items():
        job = jobs[job_id]
        job.k8s_job_name = k8s_job_name
        job.next_dispatch_at = now if job.cancel_requested else None
        job.last_dispatch_error = None
        job.restart_job_uid = None  # a gang's next attempt is made
        job.updated_at = now
        if job.business_state == BusinessState.CREATED:
            move(job, BusinessState.QUEUED, ReasonCode.SCHEDULING)
        if job_id in waited:
            session.add(_waited_row(job_id, waited[job_id], now))
    for job_id in waiting:
        job = jobs[job_id]
        if job.restart_job_uid is not None and job.business_state == BusinessState.QUEUED:
            job.next_dispatch_at = now + RESTART_POLL
            job.updated_at = now
            # The job's words say what it waits for (the syncer leaves it alone meanwhile).
            said = (job.reason_message or "").split(_WAITING)[0]
            job.reason_message = (
                f"{said}{_WAITING}{job.current_attempt - 1}'s Pods to end: "
                f"{', '.join(waiting[job_id])}"
            )
    for job_id, (raw_reason, raw_message) in failed.items():
        job = jobs[job_id]
        restarting = job.restart_job_uid is not None and job.business_state == BusinessState.QUEUED
        if job.business_state != BusinessState.CREATED and not restarting:
            continue
        if not restarting:  # a restart stays QUEUED with its cause; the error is kept below
            move(job, BusinessState.CREATED, ReasonCode.JOB_NOT_CREATED, raw_reason, raw_message)
        job.dispatch_attempts += 1
        job.last_dispatch_error = f"{raw_reason}: {raw_message}"
        job.next_dispatch_at = now + backoff(job.dispatch_attempts)
        job.updated_at = now
    for job_id in deleted:
        jobs[job_id].next_dispatch_at = None
        jobs[job_id].updated_at = now
    return rows


def _waited_row(job_id: str, wait: WaitedForAttempt, now: datetime) -> Transition:
    """The history row of a gang's restart that waited for its ended attempt: a runtime
    row of that attempt (its Pods are what was waited for), Kubernetes' state unchanged."""
    return Transition(
        job_id=job_id,
        at=now,
        source=Source.DISPATCHER,
        kind=TransitionKind.RUNTIME,
        from_state=None,
        to_state=None,
        raw_reason="PreviousAttemptEnded",
        raw_message=wait.message(),
        attempt=wait.attempt,
        detail={
            "waited_for_attempt": wait.attempt,
            "waited_seconds": wait.seconds,
            "waiting_since": wait.since.isoformat(),
            "pods": list(wait.pods),
        },
    )


def retry_backed_off_now(session: Session, *, now: datetime | None = None) -> int:
    """Make due now every job to create that waits out the backoff of a failed create;
    returns how many. For the dispatcher to call once the API server answers again, with
    none of its own claims in flight (it would claim those twice)."""
    now = now if now is not None else datetime.now(UTC)
    result = session.execute(
        update(Job)
        .where(
            _TO_CREATE,
            Job.last_dispatch_error.is_not(None),
            Job.next_dispatch_at > now,
        )
        .values(next_dispatch_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


def release_claims(session: Session, *, now: datetime | None = None) -> int:
    """Make due now every job of the outbox held for later, by a claim or by a backoff;
    returns how many. For a dispatcher beginning its term as the only one acting (the
    Lease's holder, or the one replica run without leader election): the dispatcher
    before it has stopped acting, so its claims are dead, and waiting out their hold
    (60 s) would only delay the jobs it held. A backed-off job is tried once sooner."""
    now = now if now is not None else datetime.now(UTC)
    result = session.execute(
        update(Job)
        .where(or_(_TO_CREATE, _TO_DELETE), Job.next_dispatch_at > now)
        .values(next_dispatch_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(getattr(result, "rowcount", 0) or 0)


_TO_DELETE = and_(Job.cancel_requested.is_(True), Job.k8s_job_name.is_not(None))


def claim_due_deletions(
    session: Session,
    *,
    limit: int = 20,
    hold: timedelta = CLAIM_HOLD,
    now: datetime | None = None,
) -> list[Job]:
    """Claim cancelled jobs whose Kubernetes Job is still to be deleted."""
    return _claim(session, _TO_DELETE, limit, hold, now)
