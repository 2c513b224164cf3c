"""The user-facing TrainingJob (kubetrain.io/v1) and everything that is refused in it.

One shape serves as the YAML of `kubetrain submit -f` and the JSON body of the
API, so it reads like a Kubernetes object:

    apiVersion: kubetrain.io/v1
    kind: TrainingJob
    metadata: {name: train-policy-v12, project: ai-training, labels: {}, annotations: {}}
    spec:
      image: registry.example/trainer:2026-08
      command: [python, train.py]
      env: [{name: EPOCHS, value: "10"},
            {name: WANDB_API_KEY, secretRef: {name: wandb, key: token}}]
      resources: {requests: {cpu: "4", memory: 16Gi}, limits: {cpu: "8", memory: 32Gi},
                  gpus: 1, gpuType: nvidia-h100}
      dataset: {name: imagenet, version: v3, claim: dataset-imagenet, subPath: v3}
      checkpoints: {claim: ckpt-train-policy}
      output: {claim: out-train-policy}
      cache: {size: 100Gi}
      priorityClass: batch-normal
      maxRuntime: 24h
      retries: 3

Everything is checked here, before a record exists, so that a mistake is
refused at submission with the field named instead of failing later in a Pod:
unknown fields, types (no YAML coercion: `version: 1.10` is a float and is
refused, not turned into "1.1"), Kubernetes name and quantity syntax, limits
below requests, fractional GPUs, reserved names and oversize values.

Errors:

    * ValueError
      x SpecError            problems: list[FieldProblem(field, message)]

`parse_training_job` and `parse_training_job_yaml` raise nothing else for any
input. A field is a dotted path (`spec.resources.requests.cpu`,
`spec.env[1].name`, `metadata.labels["team"]`); the empty path is the whole
document.

Model attributes are snake_case; the wire names are the camelCase aliases
(`gpu_type` <-> `gpuType`), and only the wire names are accepted as input.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from kubetrain.domain import names
from kubetrain.domain.quantity import QuantityError, canonical_bytes, canonical_cpu, parse_quantity

__all__ = [
    "API_VERSION",
    "KIND",
    "MAX_YAML_BYTES",
    "Cache",
    "DatasetRef",
    "EnvVar",
    "FieldProblem",
    "Limits",
    "Metadata",
    "Requests",
    "Resources",
    "SecretKeyRef",
    "SpecError",
    "SpecModel",
    "TrainingJob",
    "TrainingJobSpec",
    "VolumeClaim",
    "bytes_value",
    "checked_by",
    "cpu_value",
    "duration_seconds",
    "parse_training_job",
    "parse_training_job_yaml",
    "problems_from_validation_error",
    "raise_at",
    "spec_digest",
]

API_VERSION = "kubetrain.io/v1"
KIND = "TrainingJob"

# -- limits, each with its reason -------------------------------------------------------------

# The whole document; the API refuses larger bodies before they get here.
MAX_YAML_BYTES = 256 * 1024
# Deeper nesting than any TrainingJob needs; PyYAML builds nodes recursively.
MAX_YAML_DEPTH = 32
# "kt-" + name is still a DNS-1123 label, so the name can stand for the job in
# any Kubernetes name we derive from it (names.JOB_NAME_PREFIX).
MAX_NAME_LENGTH = names.DNS1123_LABEL_MAX - len(names.JOB_NAME_PREFIX)
MAX_IMAGE_LENGTH = 512
MAX_ARGV_ITEMS = 256
MAX_ARGV_ITEM_BYTES = 32 * 1024  # Linux refuses a single exec argument over 128 KiB
MAX_ARGV_TOTAL_BYTES = 64 * 1024
MAX_ENV_ENTRIES = 200
MAX_ENV_NAME_LENGTH = 128
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_TOTAL_BYTES = 128 * 1024
MAX_LABELS = 64
MAX_ANNOTATIONS = 64
# Kubernetes allows 256 KiB of annotations on an object; ours share the Pod
# with the platform's, and the whole document is 256 KiB.
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_GPUS = 1024  # beyond any node; a larger count is a typo, not a wait
MAX_RETRIES = 100
MAX_CPU = Decimal(1_000_000)  # cores; beyond any node, and inside int64 millicores
MAX_BYTES = Decimal(2) ** 60  # 1Ei; inside int64 bytes
# A memory or cache size below this is a unit left off: `memory: 16` is 16 bytes.
MIN_BYTES = Decimal(2) ** 20
MAX_RUNTIME_SECONDS = 366 * 24 * 3600  # a deadline beyond a year is a typo
MAX_PROBLEMS = 50  # problems listed in one SpecError

ENV_RESERVED_PREFIX = "KUBETRAIN_"  # the in-container preflight and reporter read these
# Keys the Job controller or we set on every Pod; a user value would break the
# Job's selector or our own.
_RESERVED_KEYS = frozenset({"job-name", "controller-uid", "app.kubernetes.io/managed-by"})
# Kubernetes' own prefixes carry behaviour (AppArmor, seccomp, eviction); only the
# recommended app.kubernetes.io labels are left to users.
_KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io")
_USER_KUBERNETES_PREFIXES = frozenset({"app.kubernetes.io"})


# -- errors -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One refused field: its dotted path and what is allowed there."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class SpecError(ValueError):
    """A TrainingJob (or dataset registration) that is refused; `problems` names each field."""

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        self.problems: list[FieldProblem] = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems) or "invalid TrainingJob")

    @classmethod
    def single(cls, field: str, message: str) -> SpecError:
        return cls([FieldProblem(field, message)])


def _fail(message: str) -> PydanticCustomError:
    # PydanticCustomError keeps the message as written ("Value error, " is not prepended).
    return PydanticCustomError("kubetrain_spec", message)


def raise_at(model: str, problems: list[tuple[tuple[str | int, ...], str, object]]) -> None:
    """Raise problems found by a model validator at the paths of the fields concerned."""
    if problems:
        raise ValidationError.from_exception_data(
            model,
            [
                InitErrorDetails(type=_fail(msg), loc=loc, input=value)
                for loc, msg, value in problems
            ],
        )


# -- reusable field types ---------------------------------------------------------------------


def checked_by(check: Callable[[str], str | None]) -> AfterValidator:
    """A validator from a check that returns None or what is allowed instead."""

    def validate(value: str) -> str:
        if (problem := check(value)) is not None:
            raise _fail(problem)
        return value

    return AfterValidator(validate)


def _text(max_bytes: int, *, multiline: bool = False, nonempty: bool = False) -> AfterValidator:
    def check(value: str) -> str | None:
        if nonempty and not value:
            return "must not be empty"
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            return f"is {size} bytes long; at most {max_bytes} allowed"
        return names.control_character_problem(value, multiline=multiline)

    return checked_by(check)


def _none_is_empty(empty: type[list[Any]] | type[dict[Any, Any]]) -> BeforeValidator:
    # `labels:` with nothing after it is null in YAML; Kubernetes reads that as absent.
    return BeforeValidator(lambda value: empty() if value is None else value)


def _whole_number(minimum: int, maximum: int, what: str) -> BeforeValidator:
    def validate(value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "a fraction" if isinstance(value, float) else type(value).__name__
            raise _fail(f"must be a whole number of {what} from {minimum} to {maximum}, got {kind}")
        if not minimum <= value <= maximum:
            raise _fail(f"must be from {minimum} to {maximum} {what}, got {value}")
        return value

    return BeforeValidator(validate)


def _project_problem(value: str) -> str | None:
    if (problem := names.dns1123_label_problem(value)) is not None:
        return problem
    if value.startswith("kube-"):
        return f"{value!r}: projects starting with 'kube-' are reserved for Kubernetes' namespaces"
    return None


def _name_problem(value: str) -> str | None:
    return names.dns1123_label_problem(value, MAX_NAME_LENGTH)


# The local testbed's KWOK stages read a Pod's fate from these annotations; they
# must travel from a job to its Pod, and mean nothing on a real cluster.
TESTBED_PREFIX = "testbed." + names.RESERVED_PREFIX


def _reserved_key_problem(key: str) -> str | None:
    prefix = key.rpartition("/")[0]
    if prefix == TESTBED_PREFIX:
        return None
    if prefix == names.RESERVED_PREFIX or prefix.endswith("." + names.RESERVED_PREFIX):
        return f"key {key!r}: the prefix {names.RESERVED_PREFIX}/ is reserved for kubetrain"
    if prefix not in _USER_KUBERNETES_PREFIXES and any(
        prefix == domain or prefix.endswith("." + domain) for domain in _KUBERNETES_DOMAINS
    ):
        return (
            f"key {key!r}: the prefixes kubernetes.io/ and k8s.io/ are reserved for Kubernetes "
            "(app.kubernetes.io/ is allowed)"
        )
    if key in _RESERVED_KEYS:
        return f"key {key!r} is set by kubetrain or the Job controller"
    return None


def _key_problem(key: str) -> str | None:
    return names.qualified_name_problem(key) or _reserved_key_problem(key)


def _gpu_type_problem(value: str) -> str | None:
    return names.label_value_problem(value, allow_empty=False)


def _version_problem(value: str) -> str | None:
    return names.label_value_problem(value, allow_empty=False)


def _secret_key_problem(value: str) -> str | None:
    if (
        not value
        or len(value) > names.DNS1123_SUBDOMAIN_MAX
        or not re.fullmatch(r"[-._a-zA-Z0-9]+", value)
        or value in (".", "..")
        or value.startswith("..")
    ):
        return (
            f"{value!r} is not a Secret key: use up to {names.DNS1123_SUBDOMAIN_MAX} letters, "
            "digits, '-', '_' and '.' (not '.' or '..')"
        )
    return None


def _env_name_problem(value: str) -> str | None:
    if len(value) > MAX_ENV_NAME_LENGTH:
        return f"is {len(value)} characters long; at most {MAX_ENV_NAME_LENGTH} allowed"
    if (problem := names.c_identifier_problem(value)) is not None:
        return problem
    if value.upper().startswith(ENV_RESERVED_PREFIX):
        return f"{value!r}: names starting with {ENV_RESERVED_PREFIX} are set by kubetrain"
    return None


def _priority_class_problem(value: str) -> str | None:
    if (problem := names.dns1123_subdomain_problem(value)) is not None:
        return problem
    if value.startswith("system-"):
        return f"{value!r}: priority classes starting with 'system-' are for Kubernetes' own Pods"
    return None


# The distribution/reference grammar that container runtimes parse; an image
# refused here would otherwise fail in the Pod as InvalidImageName.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_IMAGE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_IMAGE_NAME_MAX = 255


def _image_problem(value: str) -> str | None:
    if not value:
        return "must not be empty: name a container image such as registry.example/trainer:1"
    if len(value) > MAX_IMAGE_LENGTH:
        return f"is {len(value)} characters long; at most {MAX_IMAGE_LENGTH} allowed"
    match = _IMAGE.fullmatch(value)
    if match is None:
        return (
            f"{value!r} is not an image reference: use [registry[:port]/]path[:tag][@digest] "
            "with a lowercase path, e.g. registry.example/team/trainer:1.2"
        )
    if len(match["name"]) > _IMAGE_NAME_MAX:
        return f"the image name before the tag is over {_IMAGE_NAME_MAX} characters"
    return None


# -- quantities and durations -----------------------------------------------------------------


def _quantity_text(value: object) -> object:
    # YAML reads `cpu: 4` and `cpu: 0.5` as numbers; Kubernetes accepts both spellings.
    if isinstance(value, bool):
        raise _fail("must be a quantity such as 4, 500m or 16Gi, got a boolean")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value.strip()
    return value  # the str schema names the wrong type


def _parse(value: str) -> Decimal:
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise _fail(str(exc)) from None


def _check_cpu(value: str) -> str:
    amount = _parse(value)
    if amount <= 0:
        raise _fail(f"must be more than 0 cores, got {value}")
    if amount > MAX_CPU:
        raise _fail(f"must be at most {MAX_CPU} cores, got {value}")
    if (amount * 1000) % 1 != 0:
        raise _fail(f"{value} is finer than a millicore; cpu is counted in whole millicores (1m)")
    return value


def _check_bytes(value: str) -> str:
    amount = _parse(value)
    if amount % 1 != 0:
        raise _fail(
            f"{value} is not a whole number of bytes (500m would be half a byte); "
            "use a binary suffix such as 512Mi or 16Gi"
        )
    if amount < MIN_BYTES:
        raise _fail(
            f"{value} is under 1Mi; sizes are counted in bytes, so write the unit (16Gi, 512Mi)"
        )
    if amount > MAX_BYTES:
        raise _fail(f"{value} is over 1Ei")
    return value


def cpu_value(text: str) -> Decimal:
    """The cores a validated cpu quantity stands for."""
    return parse_quantity(text)


def bytes_value(text: str) -> int:
    """The bytes a validated memory or storage quantity stands for."""
    return int(parse_quantity(text))


# Go's time.ParseDuration units, without the sign (a negative run time means nothing).
_DURATION_UNITS_NS = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,  # U+00B5, as Go accepts
    "μs": 10**3,  # U+03BC
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(rf"(?:{_DURATION_PART.pattern})+")
_DURATION_HINT = "a duration such as 24h, 90m or 1h30m (units h, m, s; no days)"


def duration_seconds(text: str) -> int:
    """Seconds in a Go-style duration ("24h", "1h30m", "90m"); ValueError if it is not one."""
    if len(text) > 64 or not _DURATION.fullmatch(text):
        raise ValueError(f"{text!r} is not {_DURATION_HINT}")
    nanos = sum(
        Decimal(number) * _DURATION_UNITS_NS[unit] for number, unit in _DURATION_PART.findall(text)
    )
    if nanos % 10**9 != 0:
        raise ValueError(f"{text!r} is not a whole number of seconds")
    return int(nanos // 10**9)


def _check_duration(value: str) -> str:
    try:
        seconds = duration_seconds(value)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if not 1 <= seconds <= MAX_RUNTIME_SECONDS:
        raise _fail(f"must be from 1s to {MAX_RUNTIME_SECONDS // 3600}h, got {value}")
    return value


# -- credentials ------------------------------------------------------------------------------

_CREDENTIAL_WORDS = frozenset({"PASSWORD", "PASSWD", "SECRET", "CREDENTIALS", "APIKEY"})
_CREDENTIAL_PAIRS = frozenset(
    {
        ("API", "KEY"),
        ("ACCESS", "KEY"),
        ("SECRET", "KEY"),
        ("PRIVATE", "KEY"),
        ("API", "TOKEN"),
        ("ACCESS", "TOKEN"),
        ("AUTH", "TOKEN"),
        ("HUB", "TOKEN"),
    }
)
_CREDENTIAL_NAMES = frozenset({"HF_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "NPM_TOKEN"})


def _looks_like_credential(name: str) -> bool:
    """Names that, by a common convention, hold a credential.

    A guard against the usual mistake (a token pasted into the spec, where it
    would sit in our database and in the Job), not a proof: PAD_TOKEN and
    MAX_TOKENS are left alone on purpose.
    """
    words = name.upper().split("_")
    return (
        words[-1] in _CREDENTIAL_WORDS
        or tuple(words[-2:]) in _CREDENTIAL_PAIRS
        or name.upper() in _CREDENTIAL_NAMES
    )


# -- models -----------------------------------------------------------------------------------

Name = Annotated[str, checked_by(_name_problem)]
Project = Annotated[str, checked_by(_project_problem)]
LabelKey = Annotated[str, checked_by(_key_problem)]
LabelValue = Annotated[str, checked_by(names.label_value_problem)]
AnnotationValue = Annotated[str, _text(MAX_ANNOTATION_BYTES, multiline=True)]
Image = Annotated[str, checked_by(_image_problem)]
CommandItem = Annotated[str, _text(MAX_ARGV_ITEM_BYTES, multiline=True, nonempty=True)]
ArgItem = Annotated[str, _text(MAX_ARGV_ITEM_BYTES, multiline=True)]
EnvName = Annotated[str, checked_by(_env_name_problem)]
EnvValue = Annotated[str, _text(MAX_ENV_VALUE_BYTES, multiline=True)]
ObjectName = Annotated[str, checked_by(names.dns1123_subdomain_problem)]
SecretKey = Annotated[str, checked_by(_secret_key_problem)]
Cpu = Annotated[str, BeforeValidator(_quantity_text), AfterValidator(_check_cpu)]
Bytes = Annotated[str, BeforeValidator(_quantity_text), AfterValidator(_check_bytes)]
GpuCount = Annotated[int, _whole_number(0, MAX_GPUS, "GPUs")]
GpuType = Annotated[str, checked_by(_gpu_type_problem)]
DatasetName = Annotated[str, checked_by(names.dns1123_label_problem)]
DatasetVersionName = Annotated[str, checked_by(_version_problem)]
SubPath = Annotated[str, checked_by(names.relative_path_problem)]
PriorityClass = Annotated[str, checked_by(_priority_class_problem)]
Duration = Annotated[str, AfterValidator(_check_duration)]
Retries = Annotated[int, _whole_number(0, MAX_RETRIES, "retries")]


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
            raise _fail("give exactly one of value or secretRef")
        if self.value and _looks_like_credential(self.name):
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


Argv = Annotated[list[CommandItem], _none_is_empty(list)]
Args = Annotated[list[ArgItem], _none_is_empty(list)]
EnvList = Annotated[list[EnvVar], _none_is_empty(list)]


class TrainingJobSpec(SpecModel):
    image: Image
    command: Argv = []
    args: Args = []
    env: EnvList = []
    resources: Resources
    dataset: DatasetRef | None = None
    checkpoints: VolumeClaim | None = None
    output: VolumeClaim | None = None
    cache: Cache | None = None
    priority_class: PriorityClass | None = None
    max_runtime: Duration | None = None
    retries: Retries = 0

    @model_validator(mode="after")
    def _cross_field(self) -> TrainingJobSpec:
        problems: list[tuple[tuple[str | int, ...], str, object]] = []
        for field, argv in (("command", self.command), ("args", self.args)):
            if len(argv) > MAX_ARGV_ITEMS:
                problems.append(
                    ((field,), f"has {len(argv)} entries; at most {MAX_ARGV_ITEMS} allowed", None)
                )
            total = sum(len(item.encode("utf-8", "surrogatepass")) for item in argv)
            if total > MAX_ARGV_TOTAL_BYTES:
                problems.append(
                    ((field,), f"is {total} bytes in all; at most {MAX_ARGV_TOTAL_BYTES}", None)
                )
        if len(self.env) > MAX_ENV_ENTRIES:
            problems.append(
                (("env",), f"has {len(self.env)} entries; at most {MAX_ENV_ENTRIES} allowed", None)
            )
        total = sum(len((e.value or "").encode("utf-8", "surrogatepass")) for e in self.env)
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


Labels = Annotated[dict[LabelKey, LabelValue], _none_is_empty(dict)]
Annotations = Annotated[dict[LabelKey, AnnotationValue], _none_is_empty(dict)]


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
        size = sum(
            len(k.encode()) + len(v.encode("utf-8", "surrogatepass"))
            for k, v in self.annotations.items()
        )
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


# -- parsing ----------------------------------------------------------------------------------

# Hints for required fields whose absence needs more than "required".
_MISSING_HINTS = {
    "apiVersion": f"required: {API_VERSION}",
    "kind": f"required: {KIND}",
    "spec.resources": "required: every job requests cpu and memory, e.g. "
    '{requests: {cpu: "4", memory: 16Gi}}',
    "spec.resources.requests": "required: every job requests cpu and memory, e.g. "
    '{cpu: "4", memory: 16Gi}',
    "spec.resources.requests.cpu": 'required: every job requests cpu (e.g. "4" or 500m); '
    "a GPU alone leaves the scheduler without the whole need",
    "spec.resources.requests.memory": "required: every job requests memory (e.g. 16Gi); "
    "a GPU alone leaves the scheduler without the whole need",
}
_TYPE_MESSAGES = {
    "string_type": 'must be a string (quote it in YAML: "10", "1.10", "no")',
    "int_type": "must be a whole number",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
}


def _unwrap(annotation: Any) -> Any:
    """The model class (if any) behind Annotated, Optional and list[...] wrappers."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated or origin is list:
            annotation = get_args(annotation)[0]
        elif origin is Union or origin is UnionType:
            annotation = next(a for a in get_args(annotation) if a is not NoneType)
        else:
            return annotation


def _model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    current: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        by_alias = {info.alias or name: info for name, info in current.model_fields.items()}
        if part not in by_alias:
            return None
        current = _unwrap(by_alias[part].annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _dict_fields(root: type[BaseModel]) -> set[tuple[str, ...]]:
    """Paths (by alias) of the dict-valued fields, whose next path part is a key."""
    found: set[tuple[str, ...]] = set()

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            path = (*prefix, info.alias or name)
            annotation = info.annotation
            while get_origin(annotation) is Annotated:
                annotation = get_args(annotation)[0]
            if get_origin(annotation) is dict:
                found.add(path)
                continue
            inner = _unwrap(annotation)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                walk(inner, path)

    walk(root, ())
    return found


def _path(loc: Sequence[str | int], dict_fields: set[tuple[str, ...]]) -> str:
    out = ""
    named: tuple[str, ...] = ()
    after_dict = False
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif after_dict:
            out += f"[{json.dumps(part)}]"
            after_dict = False
            continue
        else:
            out = f"{out}.{part}" if out else part
            named = (*named, part)
            after_dict = named in dict_fields
    return out


def problems_from_validation_error(
    exc: ValidationError, root: type[BaseModel], prefix: str = ""
) -> list[FieldProblem]:
    """Turn pydantic's errors into FieldProblems whose messages say what is allowed."""
    dict_fields = _dict_fields(root)
    problems: list[FieldProblem] = []
    for error in exc.errors(include_url=False, include_input=False):
        loc = error["loc"]
        field = _path(loc, dict_fields)
        bare = re.sub(r"\[[^\]]*\]", "", field)  # hints do not depend on list positions
        kind = error["type"]
        if kind == "kubetrain_spec":
            message = error["msg"]
        elif kind == "missing":
            message = _MISSING_HINTS.get(bare, "required")
        elif kind == "extra_forbidden":
            model = _model_at(root, loc[:-1])
            allowed = (
                ", ".join(info.alias or name for name, info in model.model_fields.items())
                if model
                else ""
            )
            message = f"unknown field; allowed here: {allowed}" if allowed else "unknown field"
        elif kind == "literal_error":
            message = "must be " + error["ctx"]["expected"] if "ctx" in error else error["msg"]
        else:
            message = _TYPE_MESSAGES.get(kind, error["msg"])
        if "[key]" in loc and kind != "kubetrain_spec":
            message = f"key {message}"
        full = f"{prefix}.{field}" if prefix and field else prefix or field
        problems.append(FieldProblem(full, message))
    if len(problems) > MAX_PROBLEMS:
        hidden = len(problems) - MAX_PROBLEMS
        problems = [*problems[:MAX_PROBLEMS], FieldProblem("", f"and {hidden} more problems")]
    return problems


def parse_training_job(data: object, *, project: str | None = None) -> TrainingJob:
    """Validate a decoded TrainingJob (a JSON body, a YAML document); SpecError if refused.

    `project`, when given (the project of the API path or `--project`), fills a
    missing `metadata.project` and must equal one that is given.
    """
    problems: list[FieldProblem] = []
    if project is not None and isinstance(data, Mapping):
        metadata = data.get("metadata")
        if isinstance(metadata, Mapping):
            given = metadata.get("project")
            if given is None:
                data = {**data, "metadata": {**metadata, "project": project}}
            elif given != project:
                problems.append(
                    FieldProblem(
                        "metadata.project",
                        f"is {given!r} but the job is submitted to project {project!r}; "
                        "leave it out or make them equal",
                    )
                )
    try:
        job = TrainingJob.model_validate(data)
    except ValidationError as exc:
        problems.extend(problems_from_validation_error(exc, TrainingJob))
        raise SpecError(problems) from None
    except RecursionError:
        raise SpecError.single("", "the document is nested too deeply") from None
    if problems:
        raise SpecError(problems)
    return job


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys instead of silently keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key; construct_mapping reports it
                break
            if duplicate:
                mark = key_node.start_mark
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"not valid YAML: {exc.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return f"not valid YAML: {exc}"


def _screen_yaml(text: str) -> None:
    """Refuse, before anything is built, what a TrainingJob never needs: aliases, several
    documents, deep nesting. Aliases are how small YAML expands into huge objects."""
    documents = 0
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            line = event.start_mark.line + 1 if event.start_mark else 0
            raise SpecError.single(
                "", f"YAML anchors and aliases (& and *) are not accepted (line {line})"
            )
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise SpecError.single(
                    "", "one TrainingJob per document: found a second YAML document (---)"
                )
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise SpecError.single("", f"nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def parse_training_job_yaml(text: str, *, project: str | None = None) -> TrainingJob:
    """Parse one YAML document into a TrainingJob; SpecError for anything refused."""
    if not isinstance(text, str):
        raise SpecError.single("", f"expected YAML text, got {type(text).__name__}")
    if len(text) > MAX_YAML_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_YAML_BYTES:
        raise SpecError.single("", f"the document is larger than {MAX_YAML_BYTES} bytes")
    try:
        _screen_yaml(text)
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise SpecError.single("", _yaml_problem(exc)) from None
    except (ValueError, RecursionError) as exc:  # e.g. an integer of 5,000 digits
        raise SpecError.single("", f"not a usable YAML value: {exc}") from None
    if data is None:
        raise SpecError.single("", "the document is empty: expected a TrainingJob")
    if not isinstance(data, dict):
        raise SpecError.single(
            "", f"expected a mapping (apiVersion, kind, metadata, spec), got {type(data).__name__}"
        )
    return parse_training_job(data, project=project)


# -- identity ---------------------------------------------------------------------------------


def _normalized(job: TrainingJob) -> dict[str, Any]:
    """The job with each value in one spelling: equal amounts, equal output."""
    data: dict[str, Any] = job.model_dump(mode="json")
    resources = data["spec"]["resources"]
    resources["requests"]["cpu"] = canonical_cpu(job.spec.resources.requests.cpu)
    resources["requests"]["memory"] = canonical_bytes(job.spec.resources.requests.memory)
    limits = job.spec.resources.limits
    if limits.cpu is not None:
        resources["limits"]["cpu"] = canonical_cpu(limits.cpu)
    if limits.memory is not None:
        resources["limits"]["memory"] = canonical_bytes(limits.memory)
    if job.spec.cache is not None:
        data["spec"]["cache"]["size"] = canonical_bytes(job.spec.cache.size)
    if job.spec.max_runtime is not None:
        data["spec"]["maxRuntime"] = f"{duration_seconds(job.spec.max_runtime)}s"
    return data


def spec_digest(job: TrainingJob) -> str:
    """sha256 (hex) of the normalized job (metadata and spec) as canonical JSON.

    Two submissions with the same idempotency key are the same when their digests
    are: `cpu: 1` and `cpu: "1000m"`, `maxRuntime: 90m` and `1h30m`, labels in any
    order. Env order is kept: later entries may refer to earlier ones as $(NAME).
    """
    canonical = json.dumps(
        _normalized(job), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
