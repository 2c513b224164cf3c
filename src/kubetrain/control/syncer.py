"""The syncer: watch -> runtime state -> business state -> history.

Level-triggered: every watch event only marks a job dirty; a worker then
rebuilds that job's snapshot from the caches, runs the one pure diagnosis, and
writes what changed (attempts, business state, the diagnosis itself). Replays
write nothing, a relist converges, and a periodic resync repairs anything a
lost event left behind and notices what no event announces: a training job
whose steps stopped (NO_PROGRESS) is seen within a resync interval.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubetrain.cluster.cache import CLUSTER_WIDE, ClusterCache, job_id_of
from kubetrain.cluster.reflector import Obj
from kubetrain.domain.diagnosis import (
    AttemptView,
    Diagnosis,
    JobFacts,
    cancel_for_no_progress,
    cancel_for_non_finite_loss,
    diagnose,
)
from kubetrain.domain.manifest import job_name
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState
from kubetrain.metrics import SYNC_JOBS, SYNC_LAG, SYNC_ROUND
from kubetrain.runtime.contract import NON_FINITE, is_loss
from kubetrain.store import (
    Database,
    PodObservation,
    Progress,
    cancel_stalled_job,
    phase_reports,
    progress_by_job,
)
from kubetrain.store.sync import (
    SyncedJob,
    plan_synced,
    record_planned,
    sync_facts,
    unfinished_job_ids,
)

log = logging.getLogger(__name__)

# A Job we created seconds ago may not have reached the watch yet: its absence
# from the cache is not yet evidence that someone deleted it.
DISPATCH_GRACE = 30.0
# Jobs diagnosed per round (~1-2 ms each on a loaded 2-core host): bounds how long
# a fresh watch event waits behind the round in progress, and how stale a round's
# snapshot gets, while still sharing a round's fixed costs (two queries, one commit).
BATCH = 100


@dataclass
class SyncStats:
    syncs: int = 0
    resyncs: int = 0  # full passes over the unfinished jobs
    ended: int = 0  # marked jobs found finished in the database: not diagnosed again
    business_changes: int = 0
    errors: int = 0
    # seconds from the Kubernetes event to the committed business change
    lags: list[float] | None = None


class Syncer:
    def __init__(
        self,
        db: Database,
        cache: ClusterCache,
        *,
        resync_interval: float = 30.0,
        stall_after: int | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
        on_cancelled: Callable[[], None] | None = None,
        yield_to: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`clock` dates what the syncer writes; `monotonic` times marks, lags, the
        dispatch grace and the rounds' stages. `on_cancelled` (on the event loop): the
        syncer cancelled a stalled job (spec.cancelAfterStall), whose Job is to delete.
        `yield_to` is awaited before each round: the process's other work that goes
        first (the dispatcher's backlog, whose wait it bounds)."""
        self.db = db
        self.cache = cache
        self.resync_interval = resync_interval
        self.stall_after = stall_after  # the platform's default; a job's spec.stallAfter wins
        self.clock = clock
        self.monotonic = monotonic
        self.on_cancelled = on_cancelled
        self.yield_to = yield_to
        # job id -> monotonic time first marked. Jobs a watch event of their own
        # marked go first; the resync's and cluster-wide changes' marks (every
        # unfinished job at once) fill the rest of a round, so that they never
        # queue ahead of a Pod that just started.
        self.dirty: dict[str, float] = {}
        self.background: dict[str, float] = {}
        # Cluster-wide kinds changed since the last round: when each was first seen.
        self.cluster_changes: dict[str, float] = {}
        self.wake = asyncio.Event()
        self.dispatched_at: dict[str, float] = {}
        self.stats = SyncStats(lags=[])
        cache.listener = self.on_change

    # -- triggers ---------------------------------------------------------------------

    def on_change(self, resource: str, kind: str, obj: Obj, job_id: str | None) -> None:
        if job_id is not None:
            self.mark(job_id)
        if resource in CLUSTER_WIDE and (job_id is None or resource == "bound_pods"):
            # A node, claim or quota change can unblock any waiting job; so can room
            # that one of our own Pods takes or frees. Noted, not acted on: every such
            # change until the next round marks the jobs once (a busy cluster's Pods
            # start and end many times a second).
            self.cluster_changes.setdefault(resource, self.monotonic())
            self.wake.set()

    def _mark_cluster_wide(self) -> None:
        """Mark the jobs the cluster-wide changes noted since the last round can move:
        after a Pod merely took or freed room on a node, the jobs with a Pod the
        scheduler found no room for; after any other change (a node, a claim, a quota,
        a queue), every unfinished one."""
        if not self.cluster_changes:
            return
        changes, self.cluster_changes = self.cluster_changes, {}
        room_only = changes.keys() == {"bound_pods"}
        at = min(changes.values())
        for job in self.cache.unplaced() if room_only else self.cache.jobs():
            waiting_id = job_id_of(job)
            if waiting_id and not _finished(job):
                self.mark(waiting_id, urgent=False, at=at)

    def mark(self, job_id: str, *, urgent: bool = True, at: float | None = None) -> None:
        """Mark a job to be diagnosed: `urgent`, a change of its own objects; else in
        the background, after the urgent ones. `at`: when the change was seen (now)."""
        at = self.monotonic() if at is None else at
        if urgent:
            self.background.pop(job_id, None)
            self.dirty.setdefault(job_id, at)
        elif job_id not in self.dirty:
            self.background.setdefault(job_id, at)
        self.wake.set()

    def note_dispatched(self, job_id: str) -> None:
        now = self.monotonic()
        self.dispatched_at.pop(job_id, None)  # kept in time order: the oldest first
        self.dispatched_at[job_id] = now
        # Past the grace an entry says what its absence says: drop it (one per job).
        for old, at in list(itertools.islice(self.dispatched_at.items(), 8)):
            if now - at <= DISPATCH_GRACE:
                break
            del self.dispatched_at[old]
        self.mark(job_id)

    # -- loops ------------------------------------------------------------------------

    async def run(self) -> None:
        await self.cache.wait_synced(timeout=120)
        await asyncio.gather(self._work(), self._resync())

    async def _resync(self) -> None:
        while True:
            ids = await asyncio.to_thread(self._unfinished_ids)
            for job_id in ids:
                self.mark(job_id, urgent=False)
            self.stats.resyncs += 1
            await asyncio.sleep(self.resync_interval)

    def _unfinished_ids(self) -> list[str]:
        with self.db.read_only() as session:
            return unfinished_job_ids(session)

    def _next_batch(self) -> dict[str, float]:
        batch: dict[str, float] = {}
        for trigger, queue in (("event", self.dirty), ("background", self.background)):
            taken = len(batch)
            for job_id, marked in itertools.islice(queue.items(), BATCH - len(batch)):
                batch[job_id] = marked
            for job_id in batch:
                queue.pop(job_id, None)
            SYNC_JOBS.labels(trigger).inc(len(batch) - taken)
        return batch

    async def _work(self) -> None:
        while True:
            self._mark_cluster_wide()
            if not self.dirty and not self.background:
                self.wake.clear()
                await self.wake.wait()
                continue  # what woke it may be a cluster-wide change, to mark first
            if self.yield_to is not None:
                await self.yield_to()
            batch = self._next_batch()
            try:
                failed = await self.sync_batch(batch)
            except Exception:  # e.g. the database is down: keep the work, try again
                self.stats.errors += 1
                log.exception("a sync batch of %d jobs failed; it will be retried", len(batch))
                failed = list(batch)
                await asyncio.sleep(0.5)
            for job_id in failed:
                self.dirty.setdefault(job_id, batch[job_id])

    async def sync_batch(self, batch: dict[str, float]) -> list[str]:
        """Diagnose and record a batch of jobs; returns the ids that failed.

        One snapshot serves the whole batch; it holds the batch's own objects
        and the node state the cache keeps up to date, so its cost follows the
        batch, not the cluster. The writes of the batch commit together.
        """
        began = self.monotonic()
        SYNC_ROUND.labels("wait").observe(began - min(batch.values(), default=began))
        records, ended = await asyncio.to_thread(self._load, list(batch))
        loaded = self.monotonic()
        SYNC_ROUND.labels("load").observe(loaded - began)
        self.stats.ended += len(ended)
        for job_id in ended:
            # Marked by what the cache took in of a finished job since it was forgotten.
            self.cache.forget_again(job_id)
        due = [
            facts
            for facts in records
            if self.cache.job(facts.namespace, facts.k8s_name) is not None
            or not facts.dispatched
            or self._absence_is_real(facts)
        ]
        if not due:
            return []
        # Taken on the event loop, where the caches change; the rest runs in a thread.
        snapshot = self.cache.snapshot(facts.job_id for facts in due)
        SYNC_ROUND.labels("snapshot").observe(self.monotonic() - loaded)
        failed, finished, cancelled = await asyncio.to_thread(self._apply, due, snapshot, batch)
        for namespace, k8s_name, pods in finished:
            self.cache.forget(namespace, k8s_name, pods)  # their events are recorded now
        if cancelled and self.on_cancelled is not None:
            self.on_cancelled()
        return failed

    def _absence_is_real(self, facts: _Facts) -> bool:
        """Past the grace of a create: a gang's next attempt replaces a Job of the same
        name, whose deletion the watch may tell just before it tells the creation, so a
        deletion seen is no evidence either until the grace is over."""
        recent = self.dispatched_at.get(facts.job_id)
        return recent is None or self.monotonic() - recent > DISPATCH_GRACE

    def _load(self, job_ids: list[str]) -> tuple[list[_Facts], list[str]]:
        """The facts of the jobs to diagnose, and the ids of those already finished."""
        out, ended = [], []
        with self.db.read_only() as session:
            records = sync_facts(session, job_ids)
            progress = progress_by_job(session, list(records))
            phases = phase_reports(session, list(records))
        for job_id in job_ids:
            job = records.get(job_id)
            if job is None:
                continue  # not in the database
            if job.business_state.terminal:
                ended.append(job_id)  # the dispatcher deletes a cancelled job's Job
                continue
            k8s_name = job.k8s_job_name or job_name(job.id)
            present = self.cache.job(job.namespace, k8s_name) is not None
            if job.business_state == BusinessState.CREATED and not present:
                continue  # the dispatcher's to create; it records why not
            if job.restart_job_uid is not None:
                # A gang's ended attempt, its next due: the dispatcher's now. Read on, the
                # Job it deletes would say the job was deleted.
                continue
            out.append(
                _Facts(
                    job_id=job.id,
                    name=job.name,
                    k8s_name=k8s_name,
                    namespace=job.namespace,
                    dispatched=job.k8s_job_name is not None or present,
                    cancel_requested=job.cancel_requested,
                    dispatch_error=job.last_dispatch_error,
                    reported_phase=_reported_phase(progress.get(job.id)),
                    pod_reports=tuple(phases.get(job.id, ())),
                    last_step=_last_step(progress.get(job.id)),
                    non_finite_loss=_non_finite_loss(progress.get(job.id)),
                    stall_after=job.stall_after
                    if job.stall_after is not None
                    else self.stall_after,
                    cancel_after_stall=job.cancel_after_stall,
                    cancel_on_non_finite_loss=job.cancel_on_non_finite_loss,
                )
            )
        return out, ended

    def _apply(
        self, due: list[_Facts], snapshot: Snapshot, marked: dict[str, float]
    ) -> tuple[list[str], list[tuple[str, str, list[str]]], list[str]]:
        """Diagnose and record; returns the ids that failed, the finished jobs' Pods to
        forget, and the ids of stalled jobs cancelled (spec.cancelAfterStall)."""
        began, now = self.monotonic(), self.clock()
        failed: list[str] = []
        diagnosed: list[tuple[_Facts, Diagnosis]] = []
        for facts in due:
            try:
                diagnosis = diagnose(facts, snapshot.for_job(facts.k8s_name, facts.namespace), now)
            except Exception:
                log.exception(
                    "diagnosing the job failed; it will be retried", extra={"job_id": facts.job_id}
                )
                self.stats.errors += 1
                failed.append(facts.job_id)
                continue
            diagnosed.append((facts, diagnosis))
        diagnosed_at = self.monotonic()
        SYNC_ROUND.labels("diagnose").observe(diagnosed_at - began)
        if not diagnosed:
            return failed, [], []
        # A read first: most rounds (replays, the resync) have nothing to write and
        # so need not queue for SQLite's one writer, which the API needs for
        # submissions. The rest commit in one transaction for the round, its rows read
        # again under the lock (planned again only if they changed meanwhile): a commit
        # per job kept the writer ~15 ms a job.
        synced = [_synced(f, d) for f, d in diagnosed]
        with self.db.read_only() as session:
            plan = plan_synced(session, synced, now=now, lock=False)
        results = plan.results
        if not plan.empty:
            with self.db.transaction() as session:
                results = record_planned(session, synced, plan)
        committed = self.monotonic()
        SYNC_ROUND.labels("write").observe(committed - diagnosed_at)
        finished: list[tuple[str, str, list[str]]] = []
        for facts, diagnosis in diagnosed:
            result = results[facts.job_id]
            self.stats.syncs += 1
            if result.refused is not None:
                log.warning("%s", result.refused, extra={"job_id": facts.job_id})
            if diagnosis.state.terminal and result.refused is None:
                pods = [a.pod_name for a in diagnosis.attempts]
                finished.append((facts.namespace, facts.k8s_name, pods))
            if result.changed:
                self._changed(facts, diagnosis, committed - marked[facts.job_id])
        return failed, finished, self._cancel_stalled(diagnosed, now)

    def _cancel_stalled(
        self, diagnosed: list[tuple[_Facts, Diagnosis]], now: datetime
    ) -> list[str]:
        """Cancel, as a user would, each job NO_PROGRESS for its spec.cancelAfterStall."""
        due = {
            facts.job_id: message
            for facts, diagnosis in diagnosed
            if not facts.cancel_requested
            and (
                message := cancel_for_no_progress(
                    diagnosis.reason,
                    diagnosis.since,
                    stall_after=facts.stall_after,
                    cancel_after_stall=facts.cancel_after_stall,
                    now=now,
                )
                or cancel_for_non_finite_loss(diagnosis, cancel=facts.cancel_on_non_finite_loss)
            )
        }
        if not due:
            return []
        with self.db.transaction() as session:
            cancelled = [
                job_id
                for job_id, message in sorted(due.items())  # locked in id order, as batches are
                if cancel_stalled_job(session, job_id, message=message, now=now)
            ]
        for job_id in cancelled:
            log.info("%s", due[job_id], extra={"job_id": job_id, "state": "CANCELLED"})
        return cancelled

    def _changed(self, facts: _Facts, diagnosis: Diagnosis, lag: float) -> None:
        SYNC_LAG.observe(lag)
        self.stats.business_changes += 1
        if self.stats.lags is not None:
            self.stats.lags.append(lag)
        attempt = diagnosis.attempts[-1].number if diagnosis.attempts else None
        log.info(
            "job is %s (%s)",
            diagnosis.state.value,
            diagnosis.reason.value,
            extra={
                "job_id": facts.job_id,
                "attempt": attempt,
                "state": diagnosis.state.value,
                "reason": diagnosis.reason.value,
                "raw_reason": diagnosis.raw_reason,
            },
        )


@dataclass(frozen=True)
class _Facts(JobFacts):
    """The diagnosis' facts plus our record's id and what the syncer acts on."""

    job_id: str = ""
    cancel_after_stall: int | None = None  # seconds NO_PROGRESS before it is cancelled
    cancel_on_non_finite_loss: bool = False  # LOSS_NOT_FINITE cancels it


def _synced(facts: _Facts, diagnosis: Diagnosis) -> SyncedJob:
    return SyncedJob(
        job_id=facts.job_id,
        pods=[_observation(attempt) for attempt in diagnosis.attempts],
        state=diagnosis.state,
        reason=diagnosis.reason,
        raw_reason=diagnosis.raw_reason,
        raw_message=diagnosis.raw_message,
        message=diagnosis.explanation,
        attempt=diagnosis.attempts[-1].number if diagnosis.attempts else None,
        detail={"link": str(diagnosis.link), "waitable": diagnosis.waitable}
        | ({"restart": diagnosis.restart.to_json()} if diagnosis.restart else {})
        # The history of a job whose admission preempted others names them.
        | ({"preempted": list(diagnosis.preempted)} if diagnosis.preempted else {}),
        diagnosis=diagnosis.to_json(facts.name),
        restart=diagnosis.restart,
    )


def _reported_phase(progress: Progress | None) -> tuple[str, str, datetime | None] | None:
    if progress is None or progress.phase is None:
        return None
    return (progress.pod, progress.phase, progress.phase_since)


def _last_step(progress: Progress | None) -> tuple[int, datetime] | None:
    """The last step, and when this server last heard from the job's Pods: a stall is
    judged on our clock, so a Pod whose clock runs behind is never taken for stalled."""
    if progress is None or progress.step is None or progress.step_at is None:
        return None
    return (progress.step, progress.updated_at)


def _non_finite_loss(progress: Progress | None) -> tuple[int, str, str, datetime | None] | None:
    """The last step's loss when the runtime reported it NaN or infinite (spelled)."""
    if progress is None or progress.step is None or not progress.metrics:
        return None
    for name, value in sorted(progress.metrics.items()):
        if is_loss(name) and value in NON_FINITE:
            return (progress.step, name, str(value), progress.step_at)
    return None


def _observation(attempt: AttemptView) -> PodObservation:
    return PodObservation(
        pod_name=attempt.pod_name,
        pod_uid=attempt.pod_uid,
        node=attempt.node,
        pod_phase=attempt.phase,
        container_state=attempt.container_state,
        raw_reason=attempt.raw_reason,
        raw_message=attempt.raw_message,
        exit_code=attempt.exit_code,
        termination_message=attempt.termination_message,
        started_at=attempt.started_at,
        finished_at=attempt.finished_at,
        bound_at=attempt.bound_at,
        rank=attempt.rank,
        # A gang's Pods are on their Job's attempt; a single Pod's are numbered as seen.
        attempt=attempt.number if attempt.rank is not None else None,
    )


def _finished(job: Obj) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )
