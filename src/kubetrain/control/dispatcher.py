"""The dispatcher: turns CREATED records into Kubernetes Jobs, deletes the Jobs of
cancelled records, and restarts a gang whose attempt ended (the syncer decides, in
the outbox: the ended attempt's Job is deleted and the next attempt's created).

The API only commits the record (an outbox) and returns; this loop creates
the Job. Creation is idempotent by the deterministic name, so a crash between
the create and the commit that records it repeats nothing. While the API
server is unreachable or refuses, the job stays CREATED/JOB_NOT_CREATED with
the raw error, and is retried with backoff; the first Job made after a batch of
outcomes with unanswered creates and no Job made (an outage) makes all the
backed-off jobs due at once.

Each Job is one request (a gang's two: the Job and its headless Service): the
Pods prove who they are to the reports endpoint with a projected ServiceAccount
token the kubelet makes, so no Secret is made per Job.

Up to 50 calls are in flight at once, each slot refilled from the claimed jobs as
soon as its call ends (rounds that waited for their slowest call left the API
server idle). The database's work goes on beside the calls, in short transactions
of many jobs each: a claim takes up to 50 due jobs with their preparation (their
manifests), taken while calls are in flight once fewer than 50 claimed jobs wait
to start; outcomes are written in batches of what ended while the last batch was
written. No transaction is open during a call. Transactions per job would cost each
job thread hand-offs and turns on SQLite's one writer. Outcomes the database failed
to write are kept and written with the next batch. While a flow works through a
backlog (`BACKLOG_CLAIMS` full claims in a row), the syncer's rounds wait for it
(`caught_up`, each at most control/runner.py's BACKLOG_FIRST): they share one
interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from kubetrain.cluster.client import CreatingClient, TypedClient
from kubetrain.cluster.errors import ClusterError
from kubetrain.cluster.jobs import (
    attempt_pods_left,
    create_job,
    delete_attempt,
    delete_job,
    ensure_namespace,
    put_service,
    resume_attempt,
    stop_attempt,
)
from kubetrain.domain.manifest import (
    ANNOTATION_RESTART,
    IN_PLACE,
    LABEL_ATTEMPT,
    RenderOptions,
    job_name,
    namespace_labels,
    render_job,
    render_service,
)
from kubetrain.domain.spec import SpecError, parse_training_job
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.metrics import DISPATCHER_CREATED, DISPATCHER_FAILURES, DISPATCHER_RETRIES
from kubetrain.store import (
    Database,
    Job,
    Source,
    WaitedForAttempt,
    apply_locked_business_change,
    claim_due_deletions,
    claim_due_jobs,
    record_dispatch_outcomes,
    release_claims,
    resolve_job_dataset,
    retry_backed_off_now,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """What creating one job's Job takes, read and written in the round's preparation."""

    job_id: str
    namespace: str
    manifest: dict[str, Any]
    ended: str | None = None  # a gang's ended attempt's Job (uid), to delete first


@dataclass(frozen=True, slots=True)
class _Created:
    job_id: str
    k8s_job_name: str
    waited: WaitedForAttempt | None = None  # a gang's restart: how long it waited


@dataclass(frozen=True, slots=True)
class _Waiting:
    """A gang's next attempt not made yet: Pods of the ended attempt have not ended."""

    job_id: str
    left: list[str]


@dataclass(frozen=True, slots=True)
class _Failed:
    job_id: str
    raw_reason: str
    raw_message: str
    unreachable: bool = False  # no API server answered: an outage, not a refusal


@dataclass(frozen=True, slots=True)
class _Deleted:
    job_id: str


_Outcome = _Created | _Failed | _Deleted | _Waiting
BATCH = 50  # calls in flight at once, and jobs a claim takes at most
# Full claims in a row that make a backlog (200 jobs at BATCH 50): then the Jobs to
# create go before the syncer's rounds (`caught_up`). Fewer are the ordinary queue
# of a busy API, which the syncer keeps pace with.
BACKLOG_CLAIMS = 4
# A claim: how many jobs it claimed, their preparations, and the Jobs to delete (job id,
# namespace, name).
_Claim = tuple[int, list[_Prepared], list[tuple[str, str, str]]]


class Dispatcher:
    def __init__(
        self,
        db: Database,
        client: TypedClient,
        *,
        http: CreatingClient,
        render_options: RenderOptions | None = None,
        manage_namespaces: bool = True,
        poll_interval: float = 1.0,
        on_dispatched: Callable[[str], None] | None = None,
    ) -> None:
        self.db = db
        self.client = client
        self.http = http  # the Jobs' creates (cluster.client.creating_client)
        self.render_options = render_options or RenderOptions()
        self.manage_namespaces = manage_namespaces
        self.poll_interval = poll_interval
        self.on_dispatched = on_dispatched
        self.wake = asyncio.Event()
        # Clear while a flow works through a backlog (`BACKLOG_CLAIMS` full claims in a
        # row, the last one included), for `backlog_through`.
        self.caught_up = asyncio.Event()
        self.caught_up.set()
        self.created = 0
        self.failures = 0
        # The last write of outcomes held creates that no API server answered and no Job
        # made: an outage, which the first Job made after it ends (`_record_after`).
        self._failing = False
        self._namespaces: set[str] = set()
        self._unrecorded: list[_Outcome] = []  # what was done but could not be written
        # Gang restarts waiting for the ended attempt's Pods: since when (wall clock, for
        # the history; monotonic, for the length), and the Pods first seen left.
        self._waits: dict[str, tuple[datetime, float, list[str]]] = {}
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)
        self.monotonic: Callable[[], float] = time.monotonic

    def notify(self) -> None:
        """Called (from any thread) after the API commits something for us."""
        self.wake.set()

    async def run(self) -> None:
        released = False
        while True:
            # Cleared before the flow's claims: what the API commits meanwhile wakes the next.
            self.wake.clear()
            try:
                if not released:
                    # This term's first act: what the dispatcher before us claimed is
                    # ours now, not held until its claims' hold ends (it stopped acting
                    # before our Lease began, or died).
                    count = await asyncio.to_thread(self._release_claims)
                    released = True
                    if count:
                        log.info("%d jobs held since before this term are due now", count)
                await self._flow(BATCH)
            except sa_exc.SQLAlchemyError as exc:
                # The database is down or restarting: the records wait there, so
                # wait for it rather than end the process. The class only: the
                # message carries statements and their parameters.
                self.failures += 1
                log.warning("dispatch round failed, retried: %s", type(exc).__name__)
                await asyncio.sleep(self.poll_interval)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_interval)

    async def backlog_through(self, at_most: float) -> None:
        """Returns once no backlog is being worked through, or after `at_most` seconds."""
        if not self.caught_up.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.caught_up.wait(), at_most)

    async def dispatch_once(self, limit: int = BATCH) -> bool:
        """One round: claim what is due (up to `limit` creates and as many deletes), make
        the calls, write their outcomes; True when a full batch was claimed (more may be
        waiting)."""
        return await self._flow(limit, once=True)

    async def _flow(self, limit: int, *, once: bool = False) -> bool:
        """Creates the Jobs of due records and deletes those of cancelled ones, `limit`
        calls in flight, each slot refilled from the claimed jobs as soon as its call
        ends: rounds that waited for their slowest call left the API server idle. The
        next claim is taken while calls are in flight, once fewer than `limit` claimed
        jobs wait to start; outcomes are written while calls are in flight, each record
        after the last, in batches of what ended meanwhile. Ends when a claim was not full
        (`once`: after one claim), every call has ended and every outcome is written;
        returns whether the last claim was full. A claim the database fails ends the
        flow once the calls started have ended, their outcomes written or kept."""
        if self._unrecorded:
            await self._record_outcomes([])  # first what the last flow could not write
        calls: set[asyncio.Future[_Outcome | None]] = set()
        claimed: deque[Callable[[], Awaitable[_Outcome | None]]] = deque()
        claim: asyncio.Future[_Claim] | None = None
        recording: asyncio.Future[None] | None = None
        ended: list[_Outcome] = []
        raised: list[BaseException] = []  # raised once the other outcomes are written
        full, claims, in_a_row = True, 0, 0
        try:
            while True:
                if claim is None and full and not (once and claims) and len(claimed) < limit:
                    claim = asyncio.ensure_future(asyncio.to_thread(self._claim, limit))
                    claims += 1
                while claimed and len(calls) < limit:
                    calls.add(asyncio.ensure_future(claimed.popleft()()))
                # One round (`once`) writes once, when its calls have all ended.
                last = not (calls or claimed or claim)
                if ended and (recording is None or recording.done()) and (last or not once):
                    recording = asyncio.ensure_future(self._record_after(recording, ended))
                    ended = []
                going = {f for f in (claim, recording) if f is not None and not f.done()}
                if not calls and not going:
                    break
                await asyncio.wait({*calls, *going}, return_when=asyncio.FIRST_COMPLETED)
                if claim is not None and claim.done():
                    try:
                        count, prepared, deletes = claim.result()
                        full = count == limit or len(deletes) == limit
                    except sa_exc.SQLAlchemyError as exc:
                        raised.append(exc)
                        prepared, deletes, full = [], [], False
                    claim = None
                    in_a_row = in_a_row + 1 if full else 0
                    if in_a_row >= BACKLOG_CLAIMS:
                        self.caught_up.clear()
                    else:
                        self.caught_up.set()
                    claimed.extend(functools.partial(self._create, job) for job in prepared)
                    claimed.extend(functools.partial(self._delete, *gone) for gone in deletes)
                for call in [call for call in calls if call.done()]:
                    calls.discard(call)
                    if (error := call.exception()) is not None:
                        raised.append(error)
                    elif (outcome := call.result()) is not None:
                        ended.append(outcome)
            if recording is not None:
                await recording  # the last record: its failure is raised (outcomes kept)
        except BaseException:
            # Stopped (the Lease lost) or failed: calls and a claim still going are not
            # waited for. A claim's jobs are held until the next term releases them first
            # thing; a Job made but not written is found again by its name.
            for going_on in (*calls, claim, recording):
                if going_on is not None:
                    going_on.cancel()
            raise
        finally:
            self.caught_up.set()
        for error in raised:
            raise error
        return full

    async def _record_after(
        self, last: asyncio.Future[None] | None, outcomes: list[_Outcome]
    ) -> None:
        """Writes outcomes once the last record is written, in order (a last record that
        failed left its outcomes to this one: `_record_outcomes`). A write with Jobs made
        after one with unanswered creates and no Job made ends an outage: the jobs backed
        off meanwhile are made due now, once this write has given its own failures their
        backoff."""
        if last is not None:
            with contextlib.suppress(sa_exc.SQLAlchemyError):
                await last
        await self._record_outcomes(outcomes)
        created = any(isinstance(o, _Created) for o in outcomes)
        if created and self._failing:
            released = await asyncio.to_thread(self._retry_backed_off)
            log.info("creates succeed again: %d backed-off jobs retried now", released)
            self._failing = False
            self.wake.set()  # they are due: claimed by the next flow, not after a poll
        elif not created and any(isinstance(o, _Failed) and o.unreachable for o in outcomes):
            self._failing = True

    async def _record_outcomes(self, outcomes: list[_Outcome]) -> None:
        """Writes these outcomes, after any an earlier write could not. A database that
        fails the write (down, restarting) raises, and they are kept for the next write:
        the Jobs exist, and their jobs need not wait out the claim's hold (60 s) to be
        found again."""
        pending = [*self._unrecorded, *outcomes]
        if not pending:
            return
        try:
            await asyncio.to_thread(self._record, pending)
        except sa_exc.SQLAlchemyError:
            self._unrecorded = pending
            raise
        self._unrecorded = []
        if self.on_dispatched is not None:
            for outcome in pending:
                if isinstance(outcome, _Created):
                    self.on_dispatched(outcome.job_id)

    def _release_claims(self) -> int:
        with self.db.transaction() as session:
            return release_claims(session)

    def _retry_backed_off(self) -> int:
        with self.db.transaction() as session:
            return retry_backed_off_now(session)

    def _claim(self, limit: int) -> _Claim:
        """Claims due jobs and prepares them (`_prepare`) in one transaction: a database
        that fails before its commit leaves no claim behind, where a claim committed on
        its own would hold its jobs for the claim's hold (60 s) with nothing created.
        Returns how many were claimed, those to create, and the Jobs to delete."""
        with self.db.transaction() as session:
            claimed = claim_due_jobs(session, limit=limit)
            deletes = [
                (job.id, job.namespace, job.k8s_job_name or job_name(job.id))
                for job in claim_due_deletions(session, limit=limit)
            ]
            return len(claimed), self._prepare(session, claimed), deletes

    async def _delete(self, job_id: str, namespace: str, name: str) -> _Deleted | None:
        """Delete a cancelled record's Job with its Pods; gone already is fine."""
        try:
            await delete_job(self.client, namespace, name)
        except ClusterError as exc:
            log.warning(
                "deleting the Job failed (retried later): %s", exc, extra={"job_id": job_id}
            )
            return None
        return _Deleted(job_id)

    async def _create(self, job: _Prepared) -> _Created | _Failed | _Waiting:
        job_id, namespace, manifest = job.job_id, job.namespace, job.manifest
        waited = None
        try:
            resumed: str | None = None  # the Job's uid, resumed as the next attempt
            fell_back = False
            if (
                job.ended is not None
                and manifest["metadata"]["annotations"].get(ANNOTATION_RESTART) == IN_PLACE
            ):
                in_place = await self._restart_in_place(job)
                if isinstance(in_place, _Waiting):
                    return in_place
                if in_place is None:
                    fell_back = True  # a new Job instead: the ended one is deleted
                else:
                    resumed, waited = in_place
            if job.ended is not None and resumed is None:
                name = manifest["metadata"]["name"]
                if fell_back or job_id not in self._waits:  # not deleted already
                    await delete_attempt(self.client, namespace, name, job.ended)
                # A blocking recreate (JobSet's BlockingRecreate): the next attempt only
                # once every Pod of the last has ended, so that no rank of the new one
                # finds a dying rank of the old (rank 0's name, its port).
                left = await attempt_pods_left(self.client, namespace, job.ended)
                since, began, first = self._waits.setdefault(
                    job_id, (self.clock(), self.monotonic(), left)
                )
                if left:
                    return _Waiting(job_id, left)
                waited = WaitedForAttempt(
                    attempt=int(manifest["metadata"]["labels"][LABEL_ATTEMPT]) - 1,
                    since=since,
                    seconds=round(self.monotonic() - began, 1),
                    pods=first,
                )
            if resumed is not None:
                pass  # the same Job, resumed as the next attempt
            elif self.manage_namespaces and namespace not in self._namespaces:
                await ensure_namespace(
                    self.client, namespace, namespace_labels(self.render_options)
                )
                self._namespaces.add(namespace)
            uid = (
                resumed
                if resumed is not None
                else await create_job(self.http, self.client, manifest)
            )
            if uid is not None and manifest["spec"].get("completionMode") == "Indexed":
                # A gang's Pods find rank 0 through it; owned by the Job, it goes with it.
                # It selects the attempt's Pods only.
                attempt = int(manifest["metadata"]["labels"][LABEL_ATTEMPT])
                await put_service(self.client, render_service(job_id, namespace, uid, attempt))
        except ClusterError as exc:
            self.failures += 1
            # The API server did not answer, or answered that it cannot now: an outage,
            # unlike a refusal of this one Job (a quota, a conflict) that retrying
            # sooner would not help.
            raw_reason, raw_message = exc.reason, exc.message
            DISPATCHER_FAILURES.labels(raw_reason).inc()
            log.warning(
                "creating the Job failed: %s: %s",
                raw_reason,
                raw_message,
                extra={"job_id": job_id, "namespace": namespace},
            )
            return _Failed(job_id, raw_reason, raw_message, bool(exc.unreachable))
        self._waits.pop(job_id, None)
        self.created += 1
        DISPATCHER_CREATED.inc()
        log.info(
            "created the Job",
            extra={
                "job_id": job_id,
                "namespace": namespace,
                "k8s_job": manifest["metadata"]["name"],
            },
        )
        return _Created(job_id, manifest["metadata"]["name"], waited)

    async def _restart_in_place(
        self, job: _Prepared
    ) -> tuple[str, WaitedForAttempt | None] | _Waiting | None:
        """A gang under Kueue restarts in place: its Job suspended (Kueue kept off, its
        Workload admitted), and once every Pod of the ended attempt has ended and been
        counted, resumed as the next attempt. The Job's uid with the wait, or the wait
        going on; None when the Job cannot restart in place (gone, finished, or a rank
        succeeded, which an Indexed Job would not run again): then a new Job is made."""
        assert job.ended is not None
        meta = job.manifest["metadata"]
        following = meta["labels"][LABEL_ATTEMPT]
        stopped = await stop_attempt(self.client, job.namespace, meta["name"], job.ended, following)
        if stopped is None or stopped.succeeded:
            return None
        if stopped.resumed:
            return job.ended, None
        # A blocking recreate, as for a new Job: no Pod of the next attempt while one of
        # the last is alive. The Job controller's count of them settles the last limit.
        left = await attempt_pods_left(self.client, job.namespace, job.ended)
        since, began, first = self._waits.setdefault(
            job.job_id, (self.clock(), self.monotonic(), left)
        )
        if left or not stopped.settled:
            return _Waiting(job.job_id, left or ["the Job controller's count of its Pods"])
        # Retries left: a limit never reached; the last attempt: the next failure fails it.
        limit = job.manifest["spec"]["backoffLimit"] or stopped.failed
        await resume_attempt(self.client, job.manifest, limit, by_kueue=stopped.by_kueue)
        waited = WaitedForAttempt(
            attempt=int(following) - 1,
            since=since,
            seconds=round(self.monotonic() - began, 1),
            pods=first,
            made="resumed in place",
        )
        return job.ended, waited

    def _prepare(self, session: Session, claimed: Sequence[Job]) -> list[_Prepared]:
        """The claimed jobs still to be created, with their manifests. A job cancelled
        meanwhile is finished as CANCELLED instead, and one whose spec no longer renders
        is failed. In the claim's transaction, rows locked."""
        prepared = []
        for job in claimed:  # in claim order: the longest waiting first
            restart = job.restart_job_uid is not None and job.business_state == BusinessState.QUEUED
            if job.business_state != BusinessState.CREATED and not restart:
                continue
            if job.last_dispatch_error is not None:
                DISPATCHER_RETRIES.inc()
            if job.cancel_requested and restart:
                self._waits.pop(job.id, None)
                continue  # the cancel deletes the Job; no next attempt
            if job.cancel_requested:
                apply_locked_business_change(
                    session,
                    job,
                    BusinessState.CANCELLED,
                    ReasonCode.CANCELLED,
                    source=Source.DISPATCHER,
                )
                continue
            try:
                manifest = self._render(session, job)
            except (SpecError, ValueError) as exc:
                # Validated at submission; a spec the renderer refuses now (a changed
                # rule, a dataset removed) fails the job plainly instead of looping.
                apply_locked_business_change(
                    session,
                    job,
                    BusinessState.FAILED,
                    ReasonCode.JOB_NOT_CREATED,
                    "InvalidSpec",
                    str(exc),
                    source=Source.DISPATCHER,
                )
                continue
            prepared.append(_Prepared(job.id, job.namespace, manifest, job.restart_job_uid))
        return prepared

    def _render(self, session: Session, job: Job) -> dict[str, Any]:
        spec = parse_training_job(job.spec)
        dataset = resolve_job_dataset(session, spec.spec.dataset)
        return render_job(
            job.id,
            spec,
            job.namespace,
            dataset=dataset,
            options=self.render_options,
            attempt=max(job.current_attempt, 1),
            retries_used=job.retries_used,
            digest=job.spec_digest,
        )

    def _record(self, outcomes: Sequence[_Outcome]) -> None:
        """Every outcome of the round in one transaction."""
        with self.db.transaction() as session:
            record_dispatch_outcomes(
                session,
                dispatched={o.job_id: o.k8s_job_name for o in outcomes if isinstance(o, _Created)},
                waited={
                    o.job_id: o.waited
                    for o in outcomes
                    if isinstance(o, _Created) and o.waited is not None
                },
                waiting={o.job_id: o.left for o in outcomes if isinstance(o, _Waiting)},
                failed={
                    o.job_id: (o.raw_reason, o.raw_message)
                    for o in outcomes
                    if isinstance(o, _Failed)
                },
                deleted=[o.job_id for o in outcomes if isinstance(o, _Deleted)],
            )
