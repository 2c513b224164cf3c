"""What the runtime inside a job's Pods reports: phase, steps, checkpoints, resumes.

Each Pod authenticates with the job's status token, whose plaintext lives only
in a Kubernetes Secret mounted into the Pod; we keep its SHA-256 (the same
reasoning as API tokens: 256 random bits, so a fast hash loses nothing).

Reports are stored once per (job, pod, seq), so a batch retried after a lost
response changes nothing, and folded into one `progress` row per job: the read
model the API, the CLI and the syncer use. Events are kept per job and kind up
to `MAX_REPORTS` (steps for the dashboard's chart, resumes for the lineage,
phases and checkpoints for the record), oldest dropped first, so no Pod can
grow a job's rows without bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from kubetrain.domain.diagnosis import PodReport
from kubetrain.domain.lineage import Compared, compare_resume
from kubetrain.domain.states import BusinessState
from kubetrain.store.in_lists import IDS, in_chunks, padded
from kubetrain.store.models import Attempt, Job, Progress, Report

MAX_STEP_REPORTS = 2000
# Rows kept per job for each kind; a Pod writes a phase or a resume a few times
# a run and a checkpoint every few minutes, so these caps are far above honest use.
MAX_REPORTS = {"step": MAX_STEP_REPORTS, "checkpoint": 1000, "phase": 200, "resumed": 200}
# `dropped` saturates here: a Pod may claim 2^62 at a time, and the stored total
# (a 64-bit integer) must survive every later batch.
MAX_DROPPED = 2**62


@dataclass(frozen=True)
class ReportEvent:
    """One validated event of a batch (the API checks shapes and sizes)."""

    seq: int
    at: datetime
    kind: str  # "phase" | "step" | "checkpoint" | "resumed"
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Resume:
    """One "resumed from step N" in the job's lineage, attempts resolved from Pod names."""

    pod: str
    attempt: int | None
    from_step: int
    from_pod: str | None
    from_attempt: int | None
    at: datetime
    # Where each Pod ran (the attempts' record; None: not seen), and what the runtime
    # reported of the checkpoint's binding and its own (None: not reported).
    node: str | None = None
    from_node: str | None = None
    checkpoint_binding: Mapping[str, Any] | None = None
    binding: Mapping[str, Any] | None = None
    allowed_mismatch: Sequence[str] | None = None

    def compared(self) -> list[Compared]:
        return compare_resume(
            from_node=self.from_node,
            node=self.node,
            checkpoint_binding=self.checkpoint_binding,
            binding=self.binding,
            allowed=self.allowed_mismatch,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "attempt": self.attempt,
            "from_step": self.from_step,
            "from_pod": self.from_pod,
            "from_attempt": self.from_attempt,
            "at": self.at,
            "node": self.node,
            "from_node": self.from_node,
            "compared": [c.to_json() for c in self.compared()],
        }


@dataclass(frozen=True, slots=True)
class ReportingPod:
    """What deciding whether a Pod may report for a job reads: the job's namespace and
    current attempt, and the attempt (and rank) the Pod of that uid is on, None while
    the syncer has not seen the Pod."""

    namespace: str
    current_attempt: int
    state: BusinessState  # the job's, now: a finished job's record is final
    attempt: int | None
    rank: int | None


def reporting_pod(session: Session, job_id: str, pod_uid: str) -> ReportingPod | None:
    """The job and the Pod of `pod_uid` among its attempts, in one query; None when
    there is no such job."""
    query = (
        select(Job.namespace, Job.current_attempt, Job.business_state, Attempt.number, Attempt.rank)
        .outerjoin(Attempt, (Attempt.job_id == Job.id) & (Attempt.pod_uid == pod_uid))
        .where(Job.id == job_id)
        .limit(1)
    )
    row = session.execute(query).first()
    if row is None:
        return None
    return ReportingPod(
        row.namespace, row.current_attempt, row.business_state, row.number, row.rank
    )


def record_reports(
    session: Session,
    job_id: str,
    pod: str,
    events: Sequence[ReportEvent],
    *,
    dropped: int = 0,
    rank: int | None = None,
    now: datetime | None = None,
) -> int:
    """Store a batch from `pod`; returns how many events were new.

    In a gang each worker's Pod reports with its `rank`; every report is kept,
    and the job's progress (its phase, step, checkpoint) is rank 0's alone.
    """
    now = now if now is not None else datetime.now(UTC)
    seqs = padded([e.seq for e in events])
    seen = set(
        session.scalars(
            select(Report.seq).where(
                Report.job_id == job_id, Report.pod == pod, Report.seq.in_(seqs)
            )
        )
    )
    fresh = sorted((e for e in events if e.seq not in seen), key=lambda e: e.seq)
    if not fresh and not dropped:
        return 0
    progress = session.get(Progress, job_id)
    if progress is None:
        progress = Progress(job_id=job_id, pod=pod, dropped=0, updated_at=now)
        session.add(progress)
    for event in fresh:
        session.add(
            Report(
                job_id=job_id,
                pod=pod,
                seq=event.seq,
                kind=event.kind,
                data=dict(event.data) | ({"rank": rank} if rank is not None else {}),
                reported_at=event.at,
                received_at=now,
            )
        )
        if not rank:
            _fold(progress, pod, event)
    progress.dropped = min(progress.dropped + dropped, MAX_DROPPED)
    progress.updated_at = now
    for kind in sorted({e.kind for e in fresh}):
        _prune(session, job_id, kind)
    return len(fresh)


def _fold(progress: Progress, pod: str, event: ReportEvent) -> None:
    """Apply one event to the latest view. A new Pod (the next attempt) starts its
    own phase; its step and checkpoint carry on from the previous Pod's."""
    if progress.pod != pod:
        progress.pod = pod
        progress.phase = None
        progress.phase_since = None
    if event.kind == "phase":
        # A PREFLIGHT per check (its name in the event) keeps the preflight's start.
        if progress.phase != str(event.data["phase"]) or progress.phase_since is None:
            progress.phase_since = event.at
        progress.phase = str(event.data["phase"])
    elif event.kind == "step":
        progress.step = int(event.data["step"])
        progress.step_at = event.at
        progress.metrics = dict(event.data.get("metrics") or {})
    elif event.kind == "checkpoint":
        progress.checkpoint = {**event.data, "at": event.at.isoformat()}
    elif event.kind == "resumed":
        progress.step = int(event.data["fromStep"])
        progress.step_at = event.at


def _prune(session: Session, job_id: str, kind: str) -> None:
    """Keep the newest MAX_REPORTS[kind] rows of the job's `kind`."""
    cutoff = session.scalar(
        select(Report.id)
        .where(Report.job_id == job_id, Report.kind == kind)
        .order_by(Report.id.desc())
        .offset(MAX_REPORTS[kind])
        .limit(1)
    )
    if cutoff is None:
        return
    doomed = delete(Report).where(Report.job_id == job_id, Report.kind == kind, Report.id <= cutoff)
    if kind == "phase":
        # Each Pod's last phase stays: a gang is as far as its least advanced rank, and
        # a rank that reported TRAINING early must not read as silent later.
        last = (
            select(func.max(Report.id))
            .where(Report.job_id == job_id, Report.kind == "phase")
            .group_by(Report.pod)
        )
        doomed = doomed.where(Report.id.not_in(last))
    session.execute(doomed)


# The syncer's reads of every batch, built once (`in_chunks` gives the IN lists).
# One row per Pod (the resync reads every unfinished job): its newest phase.
_LAST_PHASES = (
    select(Report.job_id, Report.pod, Report.data, Report.reported_at)
    .where(
        Report.id.in_(
            select(func.max(Report.id))
            .where(Report.job_id.in_(IDS), Report.kind == "phase")
            .group_by(Report.job_id, Report.pod)
        )
    )
    .order_by(Report.id)
)
_PROGRESS = select(Progress).where(Progress.job_id.in_(IDS))


def phase_reports(session: Session, job_ids: Sequence[str]) -> dict[str, list[PodReport]]:
    """Each Pod's last phase report (with the preflight check it named), per job: what
    the diagnosis reads to hold a gang at its least advanced rank."""
    out: dict[str, list[PodReport]] = {}
    for chunk in in_chunks(job_ids):
        for job_id, pod, data, at in session.execute(_LAST_PHASES, {"ids": chunk}):
            check = data.get("check")
            out.setdefault(job_id, []).append(
                PodReport(
                    pod, str(data.get("phase")), at, check if isinstance(check, str) else None
                )
            )
    return out


def get_progress(session: Session, job_id: str) -> Progress | None:
    return session.get(Progress, job_id)


def progress_by_job(session: Session, job_ids: Sequence[str]) -> dict[str, Progress]:
    if not job_ids:
        return {}
    rows = session.scalars(_PROGRESS, {"ids": padded(job_ids)})
    return {row.job_id: row for row in rows}


def resume_lineage(session: Session, job_id: str) -> list[Resume]:
    """Every resume the job's Pods reported, oldest first."""
    reports = session.scalars(
        select(Report).where(Report.job_id == job_id, Report.kind == "resumed").order_by(Report.id)
    ).all()
    if not reports:
        return []
    attempts = {
        a.pod_name: a for a in session.scalars(select(Attempt).where(Attempt.job_id == job_id))
    }
    lineage = []
    for report in reports:
        here = attempts.get(report.pod)
        from_pod = report.data.get("fromPod")
        origin = attempts.get(from_pod) if from_pod else None
        lineage.append(
            Resume(
                pod=report.pod,
                attempt=here.number if here else None,
                from_step=int(report.data["fromStep"]),
                from_pod=from_pod,
                from_attempt=origin.number if origin else None,
                at=report.reported_at,
                node=here.node if here else None,
                from_node=origin.node if origin else None,
                checkpoint_binding=report.data.get("checkpointBinding"),
                binding=report.data.get("binding"),
                allowed_mismatch=report.data.get("allowedMismatch"),
            )
        )
    return lineage


def step_series(session: Session, job_id: str, limit: int = MAX_STEP_REPORTS) -> list[Report]:
    """The newest `limit` step reports, oldest first (the dashboard's chart)."""
    rows = session.scalars(
        select(Report)
        .where(Report.job_id == job_id, Report.kind == "step")
        .order_by(Report.id.desc())
        .limit(limit)
    ).all()
    return list(reversed(rows))


def checkpoint_reports(
    session: Session, job_id: str, limit: int = MAX_STEP_REPORTS
) -> list[Report]:
    """The newest `limit` checkpoints the job's Pods reported, oldest first."""
    rows = session.scalars(
        select(Report)
        .where(Report.job_id == job_id, Report.kind == "checkpoint")
        .order_by(Report.id.desc())
        .limit(limit)
    ).all()
    return list(reversed(rows))


def count_checkpoints(session: Session, job_id: str) -> int:
    """How many checkpoints the job's Pods reported (those kept: MAX_REPORTS' cap)."""
    found = session.scalar(
        select(func.count())
        .select_from(Report)
        .where(Report.job_id == job_id, Report.kind == "checkpoint")
    )
    return int(found or 0)
