"""The models: TrainingJob and its parts, with the checks that span several fields.

Frozen, strict and closed (SpecModel): no coercion, no unknown field, camelCase
on the wire. One value's rules are in `fields`; what is here relates values to
each other (limits cover requests, one claim per use) and bounds collections.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel

from kubetrain.domain.spec.fields import (
    MAX_ANNOTATION_BYTES,
    AnnotationValue,
    ArgItem,
    Bytes,
    CommandItem,
    Cpu,
    DatasetName,
    DatasetVersionName,
    Duration,
    EnvName,
    EnvValue,
    GpuCount,
    GpuType,
    Image,
    LabelKey,
    LabelValue,
    Name,
    ObjectName,
    PriorityClass,
    Project,
    QueueName,
    Retries,
    SecretKey,
    SubPath,
    Workers,
    bytes_value,
    cpu_value,
    looks_like_credential,
    none_is_empty,
    utf8_size,
)
from kubetrain.domain.spec.problems import fail, raise_at

__all__ = [
    "API_VERSION",
    "KIND",
    "MAX_ANNOTATIONS",
    "MAX_ENV_ENTRIES",
    "MAX_LABELS",
    "Cache",
    "DatasetRef",
    "EnvVar",
    "Limits",
    "Metadata",
    "Requests",
    "Resources",
    "SecretKeyRef",
    "SpecModel",
    "TrainingJob",
    "TrainingJobSpec",
    "VolumeClaim",
]

API_VERSION = "kubetrain.io/v1"
KIND = "TrainingJob"

# Bounds on collections; each element is bounded by its field type.
MAX_ARGV_ITEMS = 256
MAX_ARGV_TOTAL_BYTES = 64 * 1024
MAX_ENV_ENTRIES = 200
MAX_ENV_TOTAL_BYTES = 128 * 1024
MAX_LABELS = 64
MAX_ANNOTATIONS = 64


class SpecModel(BaseModel):
    """Frozen, strict, closed: no coercion, no unknown field, camelCase on the wire."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        alias_generator=to_camel,
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
        hide_input_in_errors=True,
    )


class SecretKeyRef(SpecModel):
    name: ObjectName
    key: SecretKey


class EnvVar(SpecModel):
    """A plain value, or a reference to a key of a Secret in the project's namespace."""

    name: EnvName
    value: EnvValue | None = None
    secret_ref: SecretKeyRef | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if (self.value is None) == (self.secret_ref is None):
            raise fail("give exactly one of value or secretRef")
        if self.value and looks_like_credential(self.name, self.value):
            raise_at(
                "EnvVar",
                [
                    (
                        ("value",),
                        f"{self.name} looks like a credential: put it in a Secret and use "
                        "secretRef {name, key} instead of a plain value",
                        self.value,
                    )
                ],
            )
        return self


class Requests(SpecModel):
    cpu: Cpu
    memory: Bytes


class Limits(SpecModel):
    cpu: Cpu | None = None
    memory: Bytes | None = None


class Resources(SpecModel):
    """cpu and memory are always requested: a GPU alone leaves the scheduler without the
    whole need and lets jobs on one node starve each other."""

    requests: Requests
    limits: Limits = Limits()
    gpus: GpuCount = 0
    gpu_type: GpuType | None = None

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> Resources:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        if self.limits.cpu is not None and cpu_value(self.limits.cpu) < cpu_value(
            self.requests.cpu
        ):
            problems.append(
                (
                    ("limits", "cpu"),
                    f"must be at least the request ({self.requests.cpu}), got {self.limits.cpu}",
                    self.limits.cpu,
                )
            )
        if self.limits.memory is not None and bytes_value(self.limits.memory) < bytes_value(
            self.requests.memory
        ):
            problems.append(
                (
                    ("limits", "memory"),
                    f"must be at least the request ({self.requests.memory}), "
                    f"got {self.limits.memory}",
                    self.limits.memory,
                )
            )
        if self.gpu_type is not None and self.gpus == 0:
            problems.append(
                (("gpuType",), "needs gpus of 1 or more (a CPU-only job has no GPU type)", None)
            )
        raise_at("Resources", problems)
        return self


class DatasetRef(SpecModel):
    """A dataset version: by name and version through the registry, or a claim given directly."""

    name: DatasetName
    version: DatasetVersionName
    claim: ObjectName | None = None
    sub_path: SubPath | None = None

    @model_validator(mode="after")
    def _sub_path_needs_claim(self) -> DatasetRef:
        if self.sub_path is not None and self.claim is None:
            raise_at(
                "DatasetRef",
                [
                    (
                        ("subPath",),
                        "needs claim: without a claim the registry says where the version lives",
                        self.sub_path,
                    )
                ],
            )
        return self


class VolumeClaim(SpecModel):
    """A PersistentVolumeClaim in the project's namespace, mounted read-write."""

    claim: ObjectName


class Cache(SpecModel):
    """A node-local scratch directory (an emptyDir), gone with the Pod."""

    size: Bytes


Argv = Annotated[list[CommandItem], none_is_empty(list)]
Args = Annotated[list[ArgItem], none_is_empty(list)]
EnvList = Annotated[list[EnvVar], none_is_empty(list)]


class TrainingJobSpec(SpecModel):
    image: Image
    command: Argv = []
    args: Args = []
    env: EnvList = []
    # A gang of this many Pods started, failed and restarted as one; resources are per worker.
    workers: Workers = 1
    resources: Resources
    dataset: DatasetRef | None = None
    checkpoints: VolumeClaim | None = None
    output: VolumeClaim | None = None
    cache: Cache | None = None
    priority_class: PriorityClass | None = None
    # A Kueue LocalQueue of the project's namespace (default: the project's, from the
    # server's settings); the job waits there for quota.
    queue: QueueName | None = None
    max_runtime: Duration | None = None
    # No step reported for this long makes a training job NO_PROGRESS (not failed);
    # unset: the platform's default (ServerSettings.stall_after_seconds).
    stall_after: Duration | None = None
    # NO_PROGRESS for this long (counted from the stall threshold) cancels the job, as a
    # user's cancel would; unset: a stalled job is never cancelled for it.
    cancel_after_stall: Duration | None = None
    # How long a gang's rendezvous check waits for rank 0 (placed, listening); unset:
    # torchrun's own rendezvous default, 600 s. Ignored for a single worker.
    rendezvous_timeout: Duration | None = None
    # A running job whose last step reported a NaN or infinite loss (LOSS_NOT_FINITE) is
    # cancelled, as a user's cancel would; false (the default): it is only said.
    cancel_on_non_finite_loss: bool = False
    retries: Retries = 0

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJobSpec:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        for field, argv in (("command", self.command), ("args", self.args)):
            if len(argv) > MAX_ARGV_ITEMS:
                problems.append(
                    ((field,), f"has {len(argv)} entries; at most {MAX_ARGV_ITEMS} allowed", None)
                )
            total = sum(utf8_size(item) for item in argv)
            if total > MAX_ARGV_TOTAL_BYTES:
                problems.append(
                    ((field,), f"is {total} bytes in all; at most {MAX_ARGV_TOTAL_BYTES}", None)
                )
        if len(self.env) > MAX_ENV_ENTRIES:
            problems.append(
                (("env",), f"has {len(self.env)} entries; at most {MAX_ENV_ENTRIES} allowed", None)
            )
        total = sum(utf8_size(e.value or "") for e in self.env)
        if total > MAX_ENV_TOTAL_BYTES:
            problems.append(
                (("env",), f"values are {total} bytes in all; at most {MAX_ENV_TOTAL_BYTES}", None)
            )
        seen: dict[str, int] = {}
        for index, entry in enumerate(self.env):
            if entry.name in seen:
                problems.append(
                    (
                        ("env", index, "name"),
                        f"{entry.name} is already set by env[{seen[entry.name]}]",
                        entry.name,
                    )
                )
            seen.setdefault(entry.name, index)
        # A writable volume on the dataset's claim could change a version in place,
        # and one claim for checkpoints and output mixes what resume reads with results.
        claims: dict[str, str] = {}
        for field, claim in (
            ("dataset", self.dataset.claim if self.dataset else None),
            ("checkpoints", self.checkpoints.claim if self.checkpoints else None),
            ("output", self.output.claim if self.output else None),
        ):
            if claim is None:
                continue
            if claim in claims:
                problems.append(
                    (
                        (field, "claim"),
                        f"{claim!r} is already used by spec.{claims[claim]}; give each its own",
                        claim,
                    )
                )
            claims.setdefault(claim, field)
        raise_at("TrainingJobSpec", problems)
        return self


Labels = Annotated[dict[LabelKey, LabelValue], none_is_empty(dict)]
Annotations = Annotated[dict[LabelKey, AnnotationValue], none_is_empty(dict)]


class Metadata(SpecModel):
    """Labels and annotations reach the Pod template."""

    name: Name
    project: Project
    labels: Labels = {}
    annotations: Annotations = {}

    @model_validator(mode="after")
    def _sizes(self) -> Metadata:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        if len(self.labels) > MAX_LABELS:
            problems.append(
                (("labels",), f"has {len(self.labels)} entries; at most {MAX_LABELS}", None)
            )
        if len(self.annotations) > MAX_ANNOTATIONS:
            problems.append(
                (
                    ("annotations",),
                    f"has {len(self.annotations)} entries; at most {MAX_ANNOTATIONS}",
                    None,
                )
            )
        size = sum(utf8_size(k) + utf8_size(v) for k, v in self.annotations.items())
        if size > MAX_ANNOTATION_BYTES:
            problems.append(
                (
                    ("annotations",),
                    f"are {size} bytes in all (keys and values); at most {MAX_ANNOTATION_BYTES}",
                    None,
                )
            )
        raise_at("Metadata", problems)
        return self


class TrainingJob(SpecModel):
    api_version: Literal["kubetrain.io/v1"]
    kind: Literal["TrainingJob"]
    metadata: Metadata
    spec: TrainingJobSpec
