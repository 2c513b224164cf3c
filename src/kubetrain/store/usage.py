"""GPU-seconds read from the record: every attempt's Pod, its binding, its TRAINING report
and its end, counted by domain/usage.py.

Nothing is accumulated as it happens: the attempts (bound_at, started_at,
finished_at, kept by the syncer) and the reports (the TRAINING phase of each
Pod) already say it all, so any replica computes the same numbers, at any time,
for any window; /metrics' kubetrain_gpu_seconds_total (GpuSecondsTotal) is summed
from them at each scrape.

An attempt's end is its container's finish; for a Pod that ended without one
(deleted, or gone with its node) the moment the syncer recorded it gone; for an
attempt still open in the record of a finished job, the job's end.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from kubetrain.domain.states import TERMINAL
from kubetrain.domain.usage import (
    ANY_GPU_TYPE,
    GpuSeconds,
    PodTime,
    UsagePhase,
    pod_gpu_seconds,
    training_start,
)
from kubetrain.store.db import Database
from kubetrain.store.in_lists import in_chunks, padded
from kubetrain.store.models import Attempt, Job, Report

_ENDED_PHASES = frozenset({"Succeeded", "Failed", None})  # None: gone, rebuilt from events


@dataclass(frozen=True, slots=True)
class AttemptUsage:
    """One attempt's Pod and the GPU-seconds it held (in the window asked for)."""

    job_id: str
    project: str
    gpu_type: str
    number: int
    pod: str
    pod_time: PodTime
    seconds: GpuSeconds


def attempt_usage(
    session: Session,
    *,
    now: datetime,
    job_ids: Sequence[str] | None = None,
    projects: Collection[str] | None = None,
    since: datetime | None = None,
) -> list[AttemptUsage]:
    """Every attempt that held GPUs, of `job_ids` or of `projects` (None: all), with
    the GPU-seconds it held after `since` up to `now`."""
    resources = Job.spec["spec"]["resources"]
    query = (
        select(
            Attempt.job_id,
            Attempt.number,
            Attempt.pod_name,
            Attempt.pod_phase,
            Attempt.bound_at,
            Attempt.started_at,
            Attempt.finished_at,
            Attempt.updated_at,
            Job.project,
            Job.business_state,
            Job.finished_at.label("job_finished_at"),
            resources["gpus"].as_integer().label("gpus"),
            resources["gpuType"].as_string().label("gpu_type"),
        )
        .join(Job, Job.id == Attempt.job_id)
        .where(Attempt.bound_at.is_not(None))
        .order_by(Attempt.job_id, Attempt.number)
    )
    if job_ids is not None:
        query = query.where(Attempt.job_id.in_(padded(list(job_ids))))
    if projects is not None:
        query = query.where(Job.project.in_(sorted(projects)))
    if since is not None:
        # What surely ended before the window is left out; the rest is clipped below.
        query = query.where(
            or_(
                Attempt.finished_at.is_(None),
                Attempt.finished_at >= since,
            )
        )
    rows = [row for row in session.execute(query).mappings() if (row["gpus"] or 0) > 0]
    phases = _phase_reports(session, sorted({row["job_id"] for row in rows}))
    out = []
    for row in rows:
        reported = phases.get((row["job_id"], row["pod_name"]), {})
        ended = row["finished_at"]
        if ended is None and row["pod_phase"] in _ENDED_PHASES:
            ended = row["updated_at"]
        if ended is None and row["business_state"] in TERMINAL:
            ended = row["job_finished_at"]
        pod = PodTime(
            gpus=int(row["gpus"]),
            bound_at=row["bound_at"],
            training_at=training_start(
                reported_training=reported.get("TRAINING"),
                reported_any=bool(reported),
                started_at=row["started_at"],
            ),
            ended_at=ended,
        )
        out.append(
            AttemptUsage(
                job_id=row["job_id"],
                project=row["project"],
                gpu_type=row["gpu_type"] or ANY_GPU_TYPE,
                number=row["number"],
                pod=row["pod_name"],
                pod_time=pod,
                seconds=pod_gpu_seconds(pod, now, since),
            )
        )
    return out


def _phase_reports(
    session: Session, job_ids: Sequence[str]
) -> dict[tuple[str, str], dict[str, datetime]]:
    """(job, pod) -> phase -> the first time the Pod reported it."""
    phase = Report.data["phase"].as_string()
    out: dict[tuple[str, str], dict[str, datetime]] = {}
    for chunk in in_chunks(list(job_ids)):
        query = (
            select(Report.job_id, Report.pod, phase, func.min(Report.reported_at))
            .where(and_(Report.job_id.in_(chunk), Report.kind == "phase"))
            .group_by(Report.job_id, Report.pod, phase)
        )
        for job_id, pod, name, first in session.execute(query):
            out.setdefault((job_id, pod), {})[str(name)] = first  # min() keeps the UTC type
    return out


@dataclass(frozen=True, slots=True)
class UsageRow:
    project: str
    gpu_type: str
    seconds: GpuSeconds
    jobs: int


def usage_by_project(attempts: Sequence[AttemptUsage]) -> list[UsageRow]:
    """GPU-seconds summed per (project, GPU type), with the number of jobs, sorted."""
    sums: dict[tuple[str, str], GpuSeconds] = {}
    jobs: dict[tuple[str, str], set[str]] = {}
    for attempt in attempts:
        if attempt.seconds.total <= 0:
            continue
        key = (attempt.project, attempt.gpu_type)
        sums[key] = sums.get(key, GpuSeconds()) + attempt.seconds
        jobs.setdefault(key, set()).add(attempt.job_id)
    return [UsageRow(p, g, sums[(p, g)], len(jobs[(p, g)])) for p, g in sorted(sums)]


class GpuSecondsTotal(Collector):
    """kubetrain_gpu_seconds_total{gpu_type,phase}, and with `families(projects)`
    kubetrain_project_gpu_seconds_total{project,gpu_type,phase}, summed from the attempts
    at scrape time (store/usage.py). Projects are bounded by the database, GPU types by
    the spec's validation, phases by UsagePhase.

    The first has no project label: it is what the open /metrics shows, and project
    names and their consumption are tenant data. The second is for a scraper whose
    token covers those projects (api/metrics.py).

    An open attempt counts up to the scrape; when the syncer then records its end a
    few seconds earlier, or its TRAINING report arrives late, a sum could step back,
    which Prometheus would read as a counter reset. So each per-project series never
    goes below what this process showed before, and the totals are summed from those
    (a restart is a reset, as for any counter).
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._shown: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        return self.families(projects=())

    def families(self, projects: Collection[str] | None) -> Iterator[Metric]:
        """The totals, then the series of `projects` (None: every project) by project."""
        total = CounterMetricFamily(
            "kubetrain_gpu_seconds",
            "GPU-seconds held by jobs' Pods from their binding to a node until they end, by "
            "GPU type and phase (before_training: pull, create, preflight; training)",
            labels=["gpu_type", "phase"],
        )
        by_project = CounterMetricFamily(
            "kubetrain_project_gpu_seconds",
            "kubetrain_gpu_seconds_total by project (for a scraper with a token)",
            labels=["project", "gpu_type", "phase"],
        )
        with self.db.read_only() as session:
            attempts = attempt_usage(session, now=datetime.now(UTC))
        sums: dict[tuple[str, str, str], float] = {}
        for attempt in attempts:
            for phase in UsagePhase:
                key = (attempt.project, attempt.gpu_type, str(phase))
                sums[key] = sums.get(key, 0.0) + attempt.seconds.of(phase)
        totals: dict[tuple[str, ...], float] = {}  # by (GPU type, phase)
        with self._lock:
            for key, value in sums.items():
                self._shown[key] = max(value, self._shown.get(key, 0.0))
            for series, shown in sorted(self._shown.items()):
                project, kind = series[0], series[1:]
                totals[kind] = totals.get(kind, 0.0) + shown
                if projects is None or project in projects:
                    by_project.add_metric(list(series), shown)
        for by, value in sorted(totals.items()):
            total.add_metric(list(by), value)
        yield total
        if projects is None or projects:
            yield by_project
