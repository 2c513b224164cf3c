"""The dispatcher: turns CREATED records into Kubernetes Jobs, and deletes the
Jobs of cancelled records.

The API only commits the record (an outbox) and returns; this loop creates
the Job. Creation is idempotent by the deterministic name, so a crash between
the create and the commit that records it repeats nothing. While the API
server is unreachable or refuses, the job stays CREATED/JOB_NOT_CREATED with
the raw error, and is retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import httpx2 as httpx
from lightkube import ApiError, AsyncClient
from sqlalchemy import exc as sa_exc

from kubetrain.cluster.jobs import JobConflictError, create_job, delete_job, ensure_namespace
from kubetrain.domain.manifest import RenderOptions, job_name, render_job
from kubetrain.domain.spec import SpecError, parse_training_job
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    Job,
    Source,
    apply_business_change,
    claim_due_deletions,
    claim_due_jobs,
    get_job_any_project,
    mark_deleted,
    mark_dispatched,
    record_dispatch_failure,
    resolve_job_dataset,
)

log = logging.getLogger(__name__)


class Dispatcher:
    def __init__(
        self,
        db: Database,
        client: AsyncClient,
        *,
        render_options: RenderOptions | None = None,
        manage_namespaces: bool = True,
        poll_interval: float = 1.0,
        on_dispatched: Callable[[str], None] | None = None,
    ) -> None:
        self.db = db
        self.client = client
        self.render_options = render_options or RenderOptions()
        self.manage_namespaces = manage_namespaces
        self.poll_interval = poll_interval
        self.on_dispatched = on_dispatched
        self.wake = asyncio.Event()
        self.created = 0
        self.failures = 0
        self._namespaces: set[str] = set()

    def notify(self) -> None:
        """Called (from any thread) after the API commits something for us."""
        self.wake.set()

    async def run(self) -> None:
        while True:
            try:
                busy = await self.dispatch_once()
            except sa_exc.SQLAlchemyError as exc:
                # The database is down or restarting: the records wait there, so
                # wait for it rather than end the process. The class only: the
                # message carries statements and their parameters.
                self.failures += 1
                log.warning("dispatch round failed, retried: %s", type(exc).__name__)
                await asyncio.sleep(self.poll_interval)
                continue
            if busy:
                continue
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_interval)

    async def dispatch_once(self, limit: int = 50) -> bool:
        """Create the Jobs of due records and delete those of cancelled ones;
        True when a full batch was claimed (more may be waiting)."""
        creates, deletes = await asyncio.to_thread(self._claim, limit)
        await asyncio.gather(
            *(self._dispatch(job_id) for job_id in creates),
            *(self._delete(job_id, namespace, name) for job_id, namespace, name in deletes),
        )
        return len(creates) == limit or len(deletes) == limit

    def _claim(self, limit: int) -> tuple[list[str], list[tuple[str, str, str]]]:
        with self.db.transaction() as session:
            creates = [job.id for job in claim_due_jobs(session, limit=limit)]
            deletes = [
                (job.id, job.namespace, job.k8s_job_name or job_name(job.id))
                for job in claim_due_deletions(session, limit=limit)
            ]
            return creates, deletes

    async def _delete(self, job_id: str, namespace: str, name: str) -> None:
        """Delete a cancelled record's Job with its Pods; gone already is fine."""
        try:
            await delete_job(self.client, namespace, name)
        except (ApiError, httpx.HTTPError, OSError) as exc:
            log.warning("deleting the Job of %s failed (retried later): %s", job_id, exc)
            return
        await asyncio.to_thread(self._deleted, job_id)

    def _deleted(self, job_id: str) -> None:
        with self.db.transaction() as session:
            mark_deleted(session, job_id)

    async def _dispatch(self, job_id: str) -> None:
        prepared = await asyncio.to_thread(self._prepare, job_id)
        if prepared is None:
            return
        manifest, namespace = prepared
        try:
            if self.manage_namespaces and namespace not in self._namespaces:
                await ensure_namespace(self.client, namespace)
                self._namespaces.add(namespace)
            await create_job(self.client, manifest)
        except (ApiError, httpx.HTTPError, OSError, JobConflictError) as exc:
            self.failures += 1
            raw_reason, raw_message = _describe(exc)
            log.warning("creating the Job of %s failed: %s: %s", job_id, raw_reason, raw_message)
            await asyncio.to_thread(self._failed, job_id, raw_reason, raw_message)
            return
        self.created += 1
        await asyncio.to_thread(self._dispatched, job_id, manifest["metadata"]["name"])
        if self.on_dispatched is not None:
            self.on_dispatched(job_id)

    def _prepare(self, job_id: str) -> tuple[dict[str, Any], str] | None:
        with self.db.transaction() as session:
            job = get_job_any_project(session, job_id)
            if job is None or job.business_state != BusinessState.CREATED:
                return None
            if job.cancel_requested:
                apply_business_change(
                    session,
                    job.id,
                    BusinessState.CANCELLED,
                    ReasonCode.CANCELLED,
                    source=Source.DISPATCHER,
                )
                return None
            try:
                return self._render(session, job), job.namespace
            except (SpecError, ValueError) as exc:
                # Validated at submission; a spec the renderer refuses now (a changed
                # rule, a dataset removed) fails the job plainly instead of looping.
                apply_business_change(
                    session,
                    job.id,
                    BusinessState.FAILED,
                    ReasonCode.JOB_NOT_CREATED,
                    "InvalidSpec",
                    str(exc),
                    source=Source.DISPATCHER,
                )
                return None

    def _render(self, session: Any, job: Job) -> dict[str, Any]:
        spec = parse_training_job(job.spec)
        dataset = resolve_job_dataset(session, spec.spec.dataset)
        return render_job(job.id, spec, job.namespace, dataset=dataset, options=self.render_options)

    def _failed(self, job_id: str, raw_reason: str, raw_message: str) -> None:
        with self.db.transaction() as session:
            record_dispatch_failure(session, job_id, raw_reason=raw_reason, raw_message=raw_message)

    def _dispatched(self, job_id: str, name: str) -> None:
        with self.db.transaction() as session:
            mark_dispatched(session, job_id, k8s_job_name=name)


def _describe(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, ApiError):
        return (exc.status.reason or f"HTTP{exc.status.code}", exc.status.message or str(exc))
    if isinstance(exc, JobConflictError):
        return ("NameConflict", str(exc))
    return (type(exc).__name__, str(exc) or repr(exc))
