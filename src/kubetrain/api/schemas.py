"""What the API answers with: the job (business state, reason, runtime state), pages,
history, attempts and datasets, as response models that the OpenAPI document describes.

Envelopes are snake_case; the documents users write (a TrainingJob, a
DatasetVersion) keep their own camelCase inside them (`spec`, `dataset`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from kubetrain.domain.datasets import DatasetVersion
from kubetrain.domain.objects import as_map
from kubetrain.domain.reasons import CATALOG, Actor
from kubetrain.domain.states import BusinessState, Link, ReasonCode
from kubetrain.domain.usage import GpuSeconds
from kubetrain.store import (
    Attempt,
    Dataset,
    Job,
    Progress,
    Resume,
    Source,
    Transition,
    TransitionKind,
    dataset_version,
)
from kubetrain.store.usage import AttemptUsage

# A reported metric: a finite number, or NaN / +inf / -inf spelled (JSON has none of them).
MetricValue = Literal["NaN", "Infinity", "-Infinity"] | float


class ReasonDetail(BaseModel):
    """The catalog's words for a reason code: which link blocks, what it means, who acts."""

    code: ReasonCode
    link: Link
    explanation: str
    action: str
    actor: Actor

    @classmethod
    def of(cls, code: ReasonCode) -> ReasonDetail:
        entry = CATALOG[code]
        return cls(
            code=code,
            link=entry.link,
            explanation=entry.explanation,
            action=entry.action,
            actor=entry.actor,
        )


class RuntimeState(BaseModel):
    """What Kubernetes last said about the Pod of one attempt."""

    attempt: int = Field(
        description="1, 2, ... in the order the job's Pods appeared; a gang's attempt is its "
        "Job, one entry per rank"
    )
    rank: int | None = Field(description="the gang worker's index; null for a single Pod")
    pod: str
    pod_uid: str
    node: str | None
    phase: str | None = Field(description="the Pod's phase: Pending, Running, Succeeded, ...")
    container_state: str | None
    scheduling_reason: str | None
    raw_reason: str | None
    raw_message: str | None
    exit_code: int | None
    termination_message: str | None
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @classmethod
    def of(cls, attempt: Attempt) -> RuntimeState:
        return cls(
            attempt=attempt.number,
            rank=attempt.rank,
            pod=attempt.pod_name,
            pod_uid=attempt.pod_uid,
            node=attempt.node,
            phase=attempt.pod_phase,
            container_state=attempt.container_state,
            scheduling_reason=attempt.scheduling_reason,
            raw_reason=attempt.raw_reason,
            raw_message=attempt.raw_message,
            exit_code=attempt.exit_code,
            termination_message=attempt.termination_message,
            started_at=attempt.started_at,
            finished_at=attempt.finished_at,
            updated_at=attempt.updated_at,
        )


class JobStatus(BaseModel):
    """A job as lists show it: the business state with its reason, and the current attempt.

    `node` and `exit_code` repeat the current attempt's, so a flat listing has them.
    """

    id: str
    name: str
    project: str
    namespace: str
    owner: str
    business_status: BusinessState
    reason: ReasonCode
    reason_detail: ReasonDetail
    message: str | None = Field(description="kubetrain's plain word on the reason, if any")
    raw_reason: str | None = Field(description="Kubernetes' reason, as it said it")
    raw_message: str | None = Field(description="Kubernetes' message, as it said it")
    attempt: int = Field(description="the current attempt; 0 before the first Pod")
    workers: int = Field(description="the Pods that run together (a gang when more than 1)")
    gpus: int = Field(description="GPUs per worker: the job holds workers x gpus")
    retries_used: int = Field(description="a gang's failed attempts counted against retries")
    node: str | None
    exit_code: int | None
    runtime: RuntimeState | None = Field(
        description="the current attempt (a gang's: its lowest rank's Pod); null before a Pod"
    )
    kubernetes_job: str | None = Field(description="the batch/v1 Job's name, once created")
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def fields_of(cls, job: Job, attempt: Attempt | None) -> dict[str, Any]:
        runtime = RuntimeState.of(attempt) if attempt is not None else None
        return {
            "id": job.id,
            "name": job.name,
            "project": job.project,
            "namespace": job.namespace,
            "owner": job.owner,
            "business_status": job.business_state,
            "reason": job.reason,
            "reason_detail": ReasonDetail.of(job.reason),
            "message": job.reason_message,
            "raw_reason": job.raw_reason,
            "raw_message": job.raw_message,
            "attempt": job.current_attempt,
            **_size(job.spec),
            "retries_used": job.retries_used,
            "node": runtime.node if runtime else None,
            "exit_code": runtime.exit_code if runtime else None,
            "runtime": runtime,
            "kubernetes_job": job.k8s_job_name,
            "cancel_requested": job.cancel_requested,
            "created_at": job.created_at,
            "updated_at": job.updated_at,
            "finished_at": job.finished_at,
        }

    @classmethod
    def of(cls, job: Job, attempt: Attempt | None) -> JobStatus:
        return cls(**cls.fields_of(job, attempt))

    @classmethod
    def unchecked(cls, job: Job) -> JobStatus:
        """`of(job, None)` without pydantic's checks of each field, for the job a
        submission has just written or read back: its values are the store's own, of
        the right types already. Half the cost of a submission's answer (~70 -> ~35 us)."""
        return cls.model_construct(**cls.fields_of(job, None))


def _size(spec: dict[str, Any]) -> dict[str, int]:
    """Workers and GPUs per worker, as submitted (validated then; defaults when absent)."""
    workers = as_map(spec, "spec").get("workers", 1)
    gpus = as_map(spec, "spec", "resources").get("gpus", 0)
    return {
        "workers": workers if isinstance(workers, int) and not isinstance(workers, bool) else 1,
        "gpus": gpus if isinstance(gpus, int) and not isinstance(gpus, bool) else 0,
    }


class ComparedView(BaseModel):
    """One field of a checkpoint against the attempt that resumed from it (docs/api.md)."""

    field: str = Field(
        description="node, dataset version, code version, params digest, world size; "
        "binding: the last four, when the runtime did not report them"
    )
    checkpoint: str | None = Field(description="the checkpoint's (its writer's); null: unknown")
    resumed: str | None = Field(description="the resuming attempt's; null: unknown")
    rule: str = Field(description="may differ | must match | must match unless allowed")
    verdict: str = Field(
        description="same | differs, allowed | differs, allowed by the run | "
        "differs, not allowed | not compared | not reported"
    )
    says: str = Field(description="the line kubetrain get job and the job page print")


class ResumeView(BaseModel):
    """A Pod that resumed from a checkpoint another Pod (or an earlier run of itself) wrote."""

    pod: str
    attempt: int | None = Field(description="the resuming Pod's attempt, once the syncer saw it")
    from_step: int
    from_pod: str | None
    from_attempt: int | None
    at: datetime
    node: str | None = Field(description="where the resuming Pod ran; null: not seen")
    from_node: str | None = Field(description="where the Pod that wrote the checkpoint ran")
    compared: list[ComparedView] = Field(
        description="what differed between the checkpoint and the resuming attempt, and "
        "whether the runtime's binding rule allows it"
    )


class ProgressView(BaseModel):
    """What the runtime inside the job's Pods last reported."""

    pod: str = Field(description="the Pod that reported last")
    phase: str | None = Field(description="PREFLIGHT or TRAINING: the RUNNING sub-phase")
    phase_since: datetime | None
    step: int | None
    step_at: datetime | None
    metrics: dict[str, MetricValue] = Field(
        description="the scalars reported with the last step; NaN, +inf and -inf as the "
        'strings "NaN", "Infinity", "-Infinity" (JSON has no such numbers)'
    )
    checkpoint: dict[str, Any] | None = Field(
        description="the last checkpoint saved: step, sizeBytes, durationSeconds, at"
    )
    checkpoints: int = Field(
        default=0, description="how many checkpoints the job's Pods reported saving"
    )
    dropped: int = Field(description="events the reporter dropped rather than block training")
    resumes: list[ResumeView] = Field(description="the resume lineage across attempts")

    @classmethod
    def of(
        cls, progress: Progress, resumes: Sequence[Resume], checkpoints: int = 0
    ) -> ProgressView:
        return cls(
            pod=progress.pod,
            phase=progress.phase,
            phase_since=progress.phase_since,
            step=progress.step,
            step_at=progress.step_at,
            metrics=progress.metrics or {},
            checkpoint=progress.checkpoint,
            checkpoints=checkpoints,
            dropped=progress.dropped,
            resumes=[ResumeView(**r.to_json()) for r in resumes],
        )


class GpuSecondsView(BaseModel):
    """GPU-seconds held: from a Pod's binding to a node until it ends (a running Pod up to
    the answer), split at its TRAINING report (docs/api.md)."""

    before_training: float = Field(description="image pull, container creation, preflight")
    training: float
    total: float

    @classmethod
    def of(cls, seconds: GpuSeconds) -> GpuSecondsView:
        return cls(
            before_training=round(seconds.before_training, 3),
            training=round(seconds.training, 3),
            total=round(seconds.total, 3),
        )


class AttemptGpuSeconds(GpuSecondsView):
    number: int = Field(description="the attempt (Pod) number, as in /attempts")
    pod: str
    gpus: int
    bound_at: datetime
    training_at: datetime | None
    ended_at: datetime | None = Field(description="null: it still holds its GPUs")


class JobGpuSeconds(GpuSecondsView):
    """A job's GPU-seconds: every attempt's Pod (every worker of a gang) added up."""

    gpu_type: str = Field(description="the spec's gpuType; `any` when it named none")
    attempts: list[AttemptGpuSeconds]

    @classmethod
    def of_attempts(cls, attempts: Sequence[AttemptUsage], gpu_type: str) -> JobGpuSeconds:
        total = sum((a.seconds for a in attempts), GpuSeconds())
        return cls(
            **GpuSecondsView.of(total).model_dump(),
            gpu_type=gpu_type,
            attempts=[
                AttemptGpuSeconds(
                    **GpuSecondsView.of(a.seconds).model_dump(),
                    number=a.number,
                    pod=a.pod,
                    gpus=a.pod_time.gpus,
                    bound_at=a.pod_time.bound_at,
                    training_at=a.pod_time.training_at,
                    ended_at=a.pod_time.ended_at,
                )
                for a in attempts
            ],
        )


class JobDetail(JobStatus):
    """One job in full: its status, the TrainingJob as stored, the latest diagnosis and
    what its runtime reported."""

    spec: dict[str, Any] = Field(description="the TrainingJob document as submitted")
    diagnosis: dict[str, Any] | None = Field(
        description="the syncer's latest diagnosis; null until it has made one"
    )
    progress: ProgressView | None = Field(
        description="null until a Pod of the job reports (without kubetrain's runtime, never)"
    )
    gpu_seconds: JobGpuSeconds | None = Field(
        default=None, description="the GPU-seconds its Pods held; null for a CPU-only job"
    )

    @classmethod
    def of(
        cls,
        job: Job,
        attempt: Attempt | None,
        progress: ProgressView | None = None,
        gpu_seconds: JobGpuSeconds | None = None,
    ) -> JobDetail:
        return cls(
            **cls.fields_of(job, attempt),
            spec=job.spec,
            diagnosis=job.diagnosis,
            progress=progress,
            gpu_seconds=gpu_seconds,
        )


class StepPoint(BaseModel):
    step: int
    at: datetime
    metrics: dict[str, MetricValue]


class ProgressSeries(BaseModel):
    """The job's reported steps, oldest first (the newest ones, when there are many)."""

    job_id: str
    progress: ProgressView | None
    steps: list[StepPoint]


class JobPage(BaseModel):
    items: list[JobStatus]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: last")


class HistoryEntry(BaseModel):
    """One row of the append-only history.

    Business rows carry the job's states and reason codes; runtime rows carry
    the Pod's phase in `from_state`/`to_state` and the changed fields in `detail`.
    """

    id: int
    at: datetime
    kind: TransitionKind
    source: Source
    from_state: str | None
    to_state: str | None
    from_reason: ReasonCode | None
    to_reason: ReasonCode | None
    raw_reason: str | None
    raw_message: str | None
    attempt: int | None
    rank: int | None = Field(description="a runtime row's gang worker; null for a single Pod")
    detail: dict[str, Any] | None

    @classmethod
    def of(cls, row: Transition) -> HistoryEntry:
        return cls(
            id=row.id,
            at=row.at,
            kind=row.kind,
            source=row.source,
            from_state=row.from_state,
            to_state=row.to_state,
            from_reason=row.from_reason,
            to_reason=row.to_reason,
            raw_reason=row.raw_reason,
            raw_message=row.raw_message,
            attempt=row.attempt,
            rank=(row.detail or {}).get("rank"),
            detail=row.detail,
        )


class History(BaseModel):
    job_id: str
    items: list[HistoryEntry]


class Attempts(BaseModel):
    job_id: str
    items: list[RuntimeState]


class DatasetEntry(BaseModel):
    """A registered dataset version: the DatasetVersion document, and who registered it when."""

    dataset: DatasetVersion
    created_at: datetime
    created_by: str

    @classmethod
    def of(cls, row: Dataset) -> DatasetEntry:
        return cls(
            dataset=dataset_version(row), created_at=row.created_at, created_by=row.created_by
        )


class DatasetList(BaseModel):
    items: list[DatasetEntry]


class Health(BaseModel):
    status: str


class DryRun(BaseModel):
    """A dry run's answer (`POST …/jobs?dryRun=All`): nothing was written (docs/api.md)."""

    dry_run: Literal[True]
    job: dict[str, Any] = Field(description="the job as it would be created (`id` null)")
    manifest: dict[str, Any] = Field(description="the batch/v1 Job it would run as")
    forecast: dict[str, Any] = Field(
        description="`verdict` (starts-now, waits, never-fits), `diagnosis` (a job's shape), "
        "`placements`, `held_by`, `held_by_total`, `queue`"
    )
