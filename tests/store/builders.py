"""Small constructors for the store tests: a fixed clock, a job in any business state,
what the syncer records of its Pods and diagnosis, and a writer held by another thread."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import select
from sqlalchemy.orm import Session

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import (
    Database,
    Job,
    PodObservation,
    Source,
    Transition,
    apply_business_change,
    dispatch_backoff,
    record_dispatch_outcomes,
    submit_job,
)
from kubetrain.store.sync import SyncedJob, SyncResult, record_synced

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {"image": "registry.example/trainer:1", "resources": {"gpus": 1}}


def digest_of(spec: Mapping[str, Any]) -> str:
    """A stand-in identity for specs that are no full TrainingJob (the API passes
    domain.spec.spec_digest of the parsed job): equal dicts, equal digests."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# A legal way into each state, from CREATED, and a reason that fits it.
PATHS: dict[BusinessState, list[tuple[BusinessState, ReasonCode]]] = {
    BusinessState.CREATED: [],
    BusinessState.QUEUED: [(BusinessState.QUEUED, ReasonCode.SCHEDULING)],
    BusinessState.RUNNING: [
        (BusinessState.QUEUED, ReasonCode.SCHEDULING),
        (BusinessState.RUNNING, ReasonCode.TRAINING),
    ],
    BusinessState.SUCCEEDED: [
        (BusinessState.QUEUED, ReasonCode.SCHEDULING),
        (BusinessState.SUCCEEDED, ReasonCode.COMPLETED),
    ],
    BusinessState.FAILED: [(BusinessState.FAILED, ReasonCode.EXIT_NONZERO)],
    BusinessState.CANCELLED: [(BusinessState.CANCELLED, ReasonCode.CANCELLED)],
}
FITTING_REASON = {state: path[-1][1] for state, path in PATHS.items() if path} | {
    BusinessState.CREATED: ReasonCode.JOB_NOT_CREATED
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# One Pod's life as the syncer observes it: pending, running, evicted, a replacement
# Pod pending, then succeeded.
PENDING = PodObservation(
    pod_name="train-0-x7k2p",
    pod_uid="uid-1",
    pod_phase="Pending",
    raw_reason="Unschedulable",
    raw_message="0/3 nodes are available: 3 Insufficient cpu.",
)
RUNNING = dataclasses.replace(
    PENDING,
    pod_phase="Running",
    node="n1",
    container_state="running",
    raw_reason=None,
    raw_message=None,
    started_at=at(5),
)
EVICTED = dataclasses.replace(
    RUNNING, pod_phase="Failed", container_state="terminated", raw_reason="Evicted"
)
SECOND = dataclasses.replace(PENDING, pod_name="train-0-b8c9d", pod_uid="uid-2")
DONE = dataclasses.replace(
    SECOND,
    pod_phase="Succeeded",
    node="n2",
    container_state="terminated",
    raw_reason="Completed",
    raw_message=None,
    exit_code=0,
)


@contextmanager
def writer_held(db: Database) -> Iterator[None]:
    """Another thread holds a write transaction (a job written in it) until the block ends:
    on SQLite, the Database's writer lock that this process's writers queue on."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.transaction() as session:
            new_job(session, name="holder")
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        release.set()
        holder.join()


def new_job(
    session: Session,
    *,
    project: str = "ai-training",
    name: str = "train",
    now: datetime = T0,
    state: BusinessState = BusinessState.CREATED,
    **kwargs: Any,
) -> Job:
    """A submitted job, walked along a legal path to `state`."""
    kwargs.setdefault("spec", SPEC)
    kwargs.setdefault("digest", digest_of(kwargs["spec"]))
    job = submit_job(
        session,
        project=project,
        name=name,
        owner="alice",
        namespace=project,
        now=now,
        **kwargs,
    ).job
    for target, reason in PATHS[state]:
        apply_business_change(session, job.id, target, reason, source=Source.SYNCER, now=now)
    return job


def observe(
    session: Session,
    job_id: str,
    *pods: PodObservation,
    diagnosis: Mapping[str, Any] | None = None,
    now: datetime = T0,
) -> SyncResult:
    """Record `pods` (oldest first) and `diagnosis` as the syncer does (`record_synced`),
    leaving the job's business state, reason and messages as they are. Without a
    diagnosis the stored one is kept (None stays None)."""
    job = session.scalars(
        # populate_existing: the batch path writes with Core, past the ORM's copies
        select(Job).where(Job.id == job_id).execution_options(populate_existing=True)
    ).one()
    kept = diagnosis if diagnosis is not None else cast(Mapping[str, Any], job.diagnosis)
    synced = SyncedJob(
        job_id=job_id,
        pods=pods,
        state=job.business_state,
        reason=job.reason,
        raw_reason=job.raw_reason,
        raw_message=job.raw_message,
        message=job.reason_message,
        attempt=None,
        detail=None,
        diagnosis=kept,
    )
    return record_synced(session, [synced], now=now)[job_id]


# One job's outcome through the dispatcher's `record_dispatch_outcomes`.


def mark_dispatched(
    session: Session, job_id: str, *, k8s_job_name: str, now: datetime | None = None
) -> Transition | None:
    """Its Job exists; the history row of its move to `QUEUED`, if one was made."""
    return record_dispatch_outcomes(session, dispatched={job_id: k8s_job_name}, now=now).get(job_id)


def record_dispatch_failure(
    session: Session,
    job_id: str,
    *,
    raw_reason: str,
    raw_message: str,
    backoff: Callable[[int], timedelta] = dispatch_backoff,
    now: datetime | None = None,
) -> Transition | None:
    """Its create failed; the history row written, if the reason changed."""
    failed = {job_id: (raw_reason, raw_message)}
    return record_dispatch_outcomes(session, failed=failed, backoff=backoff, now=now).get(job_id)


def mark_deleted(session: Session, job_id: str, *, now: datetime | None = None) -> None:
    """It was cancelled and its Kubernetes Job is gone."""
    record_dispatch_outcomes(session, deleted=[job_id], now=now)
