"""The syncer: watch -> runtime state -> business state -> history.

Level-triggered: every watch event only marks a job dirty; a worker then
rebuilds that job's snapshot from the caches, runs the one pure diagnosis, and
writes what changed (attempts, business state, the diagnosis itself). Replays
write nothing, a relist converges, and a periodic resync repairs anything a
lost event left behind.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubetrain.cluster.cache import CLUSTER_WIDE, ClusterCache, job_id_of
from kubetrain.cluster.reflector import Obj
from kubetrain.domain.diagnosis import Diagnosis, JobFacts, diagnose
from kubetrain.domain.manifest import job_name
from kubetrain.domain.snapshot import Snapshot
from kubetrain.domain.states import BusinessState
from kubetrain.metrics import SYNC_LAG
from kubetrain.store import (
    Database,
    IllegalTransition,
    PodObservation,
    Progress,
    Source,
    apply_business_change,
    apply_runtime_change,
    get_job_any_project,
    list_unfinished_jobs,
    progress_by_job,
    record_diagnosis,
)

log = logging.getLogger(__name__)

# A Job we created seconds ago may not have reached the watch yet: its absence
# from the cache is not yet evidence that someone deleted it.
DISPATCH_GRACE = 30.0
# Jobs diagnosed per round: bounds how stale the shared snapshot gets.
BATCH = 500


@dataclass
class SyncStats:
    syncs: int = 0
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
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.db = db
        self.cache = cache
        self.resync_interval = resync_interval
        self.clock = clock
        self.dirty: dict[str, float] = {}  # job id -> monotonic time first marked
        self.wake = asyncio.Event()
        self.dispatched_at: dict[str, float] = {}
        self.stats = SyncStats(lags=[])
        cache.listener = self.on_change

    # -- triggers ---------------------------------------------------------------------

    def on_change(self, resource: str, kind: str, obj: Obj, job_id: str | None) -> None:
        if job_id is not None:
            self.mark(job_id)
        elif resource in CLUSTER_WIDE:
            # A node, claim or quota change can unblock any waiting job.
            for job in self.cache.jobs():
                waiting_id = job_id_of(job)
                if waiting_id and not _finished(job):
                    self.mark(waiting_id)

    def mark(self, job_id: str) -> None:
        self.dirty.setdefault(job_id, time.monotonic())
        self.wake.set()

    def note_dispatched(self, job_id: str) -> None:
        self.dispatched_at[job_id] = time.monotonic()
        self.mark(job_id)

    # -- loops ------------------------------------------------------------------------

    async def run(self) -> None:
        await self.cache.wait_synced(timeout=120)
        await asyncio.gather(self._work(), self._resync())

    async def _resync(self) -> None:
        while True:
            ids = await asyncio.to_thread(self._unfinished_ids)
            for job_id in ids:
                self.mark(job_id)
            await asyncio.sleep(self.resync_interval)

    def _unfinished_ids(self) -> list[str]:
        with self.db.read_only() as session:
            return [job.id for job in list_unfinished_jobs(session)]

    async def _work(self) -> None:
        while True:
            if not self.dirty:
                self.wake.clear()
                await self.wake.wait()
            batch = dict(itertools.islice(self.dirty.items(), BATCH))
            for job_id in batch:
                del self.dirty[job_id]
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

        One snapshot serves the whole batch: building it reads every node and
        Pod once, where a snapshot per job made each sync cost O(cluster).
        """
        records = await asyncio.to_thread(self._load, list(batch))
        due = [
            facts
            for facts in records
            if self.cache.job(facts.namespace, facts.k8s_name) is not None
            or not facts.dispatched
            or self._absence_is_real(facts)
        ]
        if not due:
            return []
        # Built on the event loop, where the caches change; the rest runs in a thread.
        listing = self.cache.listing()
        failed, finished = await asyncio.to_thread(self._apply, due, listing, batch)
        for namespace, k8s_name, pods in finished:
            self.cache.forget(namespace, k8s_name, pods)  # their events are recorded now
        return failed

    def _absence_is_real(self, facts: _Facts) -> bool:
        if self.cache.deleted(facts.namespace, facts.k8s_name):
            return True
        recent = self.dispatched_at.get(facts.job_id)
        return recent is None or time.monotonic() - recent > DISPATCH_GRACE

    def _load(self, job_ids: list[str]) -> list[_Facts]:
        out = []
        with self.db.read_only() as session:
            progress = progress_by_job(session, job_ids)
            for job_id in job_ids:
                job = get_job_any_project(session, job_id)
                if job is None or job.business_state.terminal:
                    continue  # never left; the dispatcher deletes a cancelled job's Job
                k8s_name = job.k8s_job_name or job_name(job.id)
                present = self.cache.job(job.namespace, k8s_name) is not None
                if job.business_state == BusinessState.CREATED and not present:
                    continue  # the dispatcher's to create; it records why not
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
                    )
                )
        return out

    def _apply(
        self, due: list[_Facts], listing: dict[str, Any], marked: dict[str, float]
    ) -> tuple[list[str], list[tuple[str, str, list[str]]]]:
        snapshot = Snapshot.from_list(listing)
        now = self.clock()
        failed: list[str] = []
        finished: list[tuple[str, str, list[str]]] = []
        for facts in due:
            try:
                diagnosis = diagnose(facts, snapshot.for_job(facts.k8s_name, facts.namespace), now)
                changed = self._record(facts, diagnosis)
            except Exception:
                log.exception(
                    "syncing the job failed; it will be retried", extra={"job_id": facts.job_id}
                )
                self.stats.errors += 1
                failed.append(facts.job_id)
                continue
            self.stats.syncs += 1
            if diagnosis.state.terminal:
                pods = [a.pod_name for a in diagnosis.attempts]
                finished.append((facts.namespace, facts.k8s_name, pods))
            if changed:
                lag = time.monotonic() - marked[facts.job_id]
                SYNC_LAG.observe(lag)
                self.stats.business_changes += 1
                if self.stats.lags is not None:
                    self.stats.lags.append(lag)
        return failed, finished

    def _record(self, facts: _Facts, diagnosis: Diagnosis) -> bool:
        job_id = facts.job_id
        with self.db.transaction() as session:
            for attempt in diagnosis.attempts:
                apply_runtime_change(session, job_id, _observation(attempt))
            try:
                changed = apply_business_change(
                    session,
                    job_id,
                    diagnosis.state,
                    diagnosis.reason,
                    diagnosis.raw_reason,
                    diagnosis.raw_message,
                    source=Source.SYNCER,
                    attempt=diagnosis.attempts[-1].number if diagnosis.attempts else None,
                    message=diagnosis.explanation,
                    detail={"link": str(diagnosis.link), "waitable": diagnosis.waitable},
                )
            except IllegalTransition as exc:
                log.warning("%s", exc, extra={"job_id": job_id})
                changed = None
            record_diagnosis(session, job_id, diagnosis.to_json(facts.name))
        if changed is not None:
            log.info(
                "job is %s (%s)",
                diagnosis.state.value,
                diagnosis.reason.value,
                extra={
                    "job_id": job_id,
                    "attempt": diagnosis.attempts[-1].number if diagnosis.attempts else None,
                    "state": diagnosis.state.value,
                    "reason": diagnosis.reason.value,
                    "raw_reason": diagnosis.raw_reason,
                },
            )
        return changed is not None


@dataclass(frozen=True)
class _Facts(JobFacts):
    """The diagnosis' facts plus our record's id."""

    job_id: str = ""


def _reported_phase(progress: Progress | None) -> tuple[str, str, datetime | None] | None:
    if progress is None or progress.phase is None:
        return None
    return (progress.pod, progress.phase, progress.phase_since)


def _observation(attempt: Any) -> PodObservation:
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
    )


def _finished(job: Obj) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )
