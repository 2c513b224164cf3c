"""Small constructors for the store tests: a fixed clock and a job in any business state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import Job, Source, apply_business_change, submit_job

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
SPEC: dict[str, Any] = {"image": "registry.example/trainer:1", "resources": {"gpus": 1}}

# A legal way into each state, from CREATED, and a reason that fits it.
PATHS: dict[BusinessState, list[tuple[BusinessState, ReasonCode]]] = {
    BusinessState.CREATED: [],
    BusinessState.QUEUED: [(BusinessState.QUEUED, ReasonCode.SCHEDULING)],
    BusinessState.RUNNING: [
        (BusinessState.QUEUED, ReasonCode.SCHEDULING),
        (BusinessState.RUNNING, ReasonCode.TRAINING),
    ],
    BusinessState.SUCCEEDED: [(BusinessState.SUCCEEDED, ReasonCode.COMPLETED)],
    BusinessState.FAILED: [(BusinessState.FAILED, ReasonCode.EXIT_NONZERO)],
    BusinessState.CANCELLED: [(BusinessState.CANCELLED, ReasonCode.CANCELLED)],
}
FITTING_REASON = {state: path[-1][1] for state, path in PATHS.items() if path} | {
    BusinessState.CREATED: ReasonCode.JOB_NOT_CREATED
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


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
