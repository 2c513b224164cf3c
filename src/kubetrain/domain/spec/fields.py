"""Field types and checks: what one value of a TrainingJob may be.

Each check returns None or what is allowed instead (the style of
`kubetrain.domain.names`, where the Kubernetes name syntax lives); `checked_by`
makes a pydantic validator of one. The Annotated types at the end are what the
models are written in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from kubetrain.domain import names
from kubetrain.domain.durations import duration_seconds
from kubetrain.domain.quantity import QuantityError, parse_quantity, quantity_text
from kubetrain.domain.spec.problems import fail
from kubetrain.runtime.credentials import holds_credential, is_credential_name

__all__ = [
    "ENV_RESERVED_PREFIX",
    "ENV_TORCH_NAMES",
    "ENV_TORCH_PREFIX",
    "MAX_ANNOTATION_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_WORKERS",
    "TESTBED_PREFIX",
    "AnnotationValue",
    "ArgItem",
    "Bytes",
    "CommandItem",
    "Cpu",
    "DatasetName",
    "DatasetVersionName",
    "Duration",
    "EnvName",
    "EnvValue",
    "GpuCount",
    "GpuType",
    "Image",
    "LabelKey",
    "LabelValue",
    "Name",
    "ObjectName",
    "PriorityClass",
    "Project",
    "QueueName",
    "Retries",
    "SecretKey",
    "SubPath",
    "Workers",
    "bytes_value",
    "checked_by",
    "cpu_value",
    "duration_seconds",
    "looks_like_credential",
    "none_is_empty",
    "utf8_size",
]

# -- limits, each with its reason -------------------------------------------------------------

# "kt-" + name is still a DNS-1123 label, so the name can stand for the job in
# any Kubernetes name we derive from it (names.JOB_NAME_PREFIX).
MAX_NAME_LENGTH = names.DNS1123_LABEL_MAX - len(names.JOB_NAME_PREFIX)
MAX_IMAGE_LENGTH = 512
MAX_ARGV_ITEM_BYTES = 32 * 1024  # Linux refuses a single exec argument over 128 KiB
MAX_ENV_NAME_LENGTH = 128
MAX_ENV_VALUE_BYTES = 32 * 1024
# Kubernetes allows 256 KiB of annotations on an object; ours share the Pod
# with the platform's, and the whole document is 256 KiB.
MAX_ANNOTATION_BYTES = 64 * 1024
MAX_GPUS = 1024  # beyond any node; a larger count is a typo, not a wait
MAX_RETRIES = 100
# A gang larger than this is a typo; the largest pools (1,000 nodes) hold it.
MAX_WORKERS = 256
MAX_CPU = Decimal(1_000_000)  # cores; beyond any node, and inside int64 millicores
MAX_BYTES = Decimal(2) ** 60  # 1Ei; inside int64 bytes
# A memory or cache size below this is a unit left off: `memory: 16` is 16 bytes.
MIN_BYTES = Decimal(2) ** 20
MAX_RUNTIME_SECONDS = 366 * 24 * 3600  # a deadline beyond a year is a typo

ENV_RESERVED_PREFIX = "KUBETRAIN_"  # the in-container preflight and reporter read these
# What places a process in a torch.distributed gang: torchrun reads its every option
# from PET_<OPTION> (kubetrain sets PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR... on a
# gang's workers, as Kubeflow Trainer does), and torchrun, or init_process_group's
# env:// without it, sets or reads the rest. A user's value would come after ours and
# win, giving a worker a wrong place in the gang. Matched as written: environment
# names are case-sensitive, and torch reads these in capitals only.
ENV_TORCH_PREFIX = "PET_"
ENV_TORCH_NAMES = frozenset(
    {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK"}
)
# Keys the Job controller or we set on every Pod; a user value would break the
# Job's selector or our own.
_RESERVED_KEYS = frozenset({"job-name", "controller-uid", "app.kubernetes.io/managed-by"})
# Kubernetes' own prefixes carry behaviour (AppArmor, seccomp, eviction); only the
# recommended app.kubernetes.io labels are left to users.
_KUBERNETES_DOMAINS = ("kubernetes.io", "k8s.io")
_USER_KUBERNETES_PREFIXES = frozenset({"app.kubernetes.io"})


# -- building blocks --------------------------------------------------------------------------


def checked_by(check: Callable[[str], str | None]) -> AfterValidator:
    """A validator from a check that returns None or what is allowed instead."""

    def validate(value: str) -> str:
        if (problem := check(value)) is not None:
            raise fail(problem)
        return value

    return AfterValidator(validate)


def utf8_size(text: str) -> int:
    """The bytes `text` takes in UTF-8: every size limit of the spec is counted so. A lone
    surrogate counts as its three bytes, so measuring never raises (checks refuse it)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _text(max_bytes: int, *, multiline: bool = False, nonempty: bool = False) -> AfterValidator:
    def check(value: str) -> str | None:
        if nonempty and not value:
            return "must not be empty"
        size = utf8_size(value)
        if size > max_bytes:
            return f"is {size} bytes long; at most {max_bytes} allowed"
        return names.control_character_problem(value, multiline=multiline)

    return checked_by(check)


def none_is_empty(empty: type[list[Any]] | type[dict[Any, Any]]) -> BeforeValidator:
    # `labels:` with nothing after it is null in YAML; Kubernetes reads that as absent.
    return BeforeValidator(lambda value: empty() if value is None else value)


def _whole_number(minimum: int, maximum: int, what: str) -> BeforeValidator:
    def validate(value: object) -> object:
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "a fraction" if isinstance(value, float) else type(value).__name__
            raise fail(f"must be a whole number of {what} from {minimum} to {maximum}, got {kind}")
        if not minimum <= value <= maximum:
            raise fail(f"must be from {minimum} to {maximum} {what}, got {value}")
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


def _nonempty_label_value_problem(value: str) -> str | None:
    # A GPU type is a node label's value (the Pod selects on it); a dataset version
    # is held to the same syntax. Neither may be empty.
    return names.label_value_problem(value, allow_empty=False)


def _env_name_problem(value: str) -> str | None:
    if (problem := names.length_problem(value, MAX_ENV_NAME_LENGTH)) is not None:
        return problem
    if (problem := names.c_identifier_problem(value)) is not None:
        return problem
    if value.upper().startswith(ENV_RESERVED_PREFIX):
        return f"{value!r}: names starting with {ENV_RESERVED_PREFIX} are set by kubetrain"
    if value.startswith(ENV_TORCH_PREFIX) or value in ENV_TORCH_NAMES:
        return (
            f"{value!r}: torchrun's variables ({ENV_TORCH_PREFIX}*, "
            f"{', '.join(sorted(ENV_TORCH_NAMES))}) are set by kubetrain and torchrun for "
            "each worker; a value here would give workers a wrong place in the gang"
        )
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
    if (problem := names.length_problem(value, MAX_IMAGE_LENGTH)) is not None:
        return problem
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
    if isinstance(value, bool):
        raise fail("must be a quantity such as 4, 500m or 16Gi, got a boolean")
    if isinstance(value, str | int | float):
        return quantity_text(value)
    return value  # the str schema names the wrong type


def _parse(value: str) -> Decimal:
    try:
        return parse_quantity(value)
    except QuantityError as exc:
        raise fail(str(exc)) from None


def _check_cpu(value: str) -> str:
    amount = _parse(value)
    if amount <= 0:
        raise fail(f"must be more than 0 cores, got {value}")
    if amount > MAX_CPU:
        raise fail(f"must be at most {MAX_CPU} cores, got {value}")
    if (amount * 1000) % 1 != 0:
        raise fail(f"{value} is finer than a millicore; cpu is counted in whole millicores (1m)")
    return value


def _check_bytes(value: str) -> str:
    amount = _parse(value)
    if amount % 1 != 0:
        raise fail(
            f"{value} is not a whole number of bytes (500m would be half a byte); "
            "use a binary suffix such as 512Mi or 16Gi"
        )
    if amount < MIN_BYTES:
        raise fail(
            f"{value} is under 1Mi; sizes are counted in bytes, so write the unit (16Gi, 512Mi)"
        )
    if amount > MAX_BYTES:
        raise fail(f"{value} is over 1Ei")
    return value


def cpu_value(text: str) -> Decimal:
    """The cores a validated cpu quantity stands for."""
    return parse_quantity(text)


def bytes_value(text: str) -> int:
    """The bytes a validated memory or storage quantity stands for."""
    return int(parse_quantity(text))


def _check_duration(value: str) -> str:
    try:
        seconds = duration_seconds(value)
    except ValueError as exc:
        raise fail(str(exc)) from None
    if not 1 <= seconds <= MAX_RUNTIME_SECONDS:
        raise fail(f"must be from 1s to {MAX_RUNTIME_SECONDS // 3600}h, got {value}")
    return value


# -- credentials ------------------------------------------------------------------------------


def looks_like_credential(name: str, value: str) -> bool:
    """A plain env value that, by its name or its shape, is a credential.

    A guard against the usual mistake (a token pasted into the spec, where it
    would sit in our database and in the Job), not a proof. The rule is
    kubetrain.runtime.credentials', shared with log and runtime redaction:
    MY_TOKEN, OPENAI_KEY, DB_PASS, PASSWORD_FILE, a DATABASE_URL with a
    password; PAD_TOKEN, MAX_TOKENS and SECRET_NAME are left alone.
    """
    return is_credential_name(name) or holds_credential(value)


# -- field types ------------------------------------------------------------------------------

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
SecretKey = Annotated[str, checked_by(names.config_key_problem)]
Cpu = Annotated[str, BeforeValidator(_quantity_text), AfterValidator(_check_cpu)]
Bytes = Annotated[str, BeforeValidator(_quantity_text), AfterValidator(_check_bytes)]
GpuCount = Annotated[int, _whole_number(0, MAX_GPUS, "GPUs")]
GpuType = Annotated[str, checked_by(_nonempty_label_value_problem)]
DatasetName = Annotated[str, checked_by(names.dns1123_label_problem)]
DatasetVersionName = Annotated[str, checked_by(_nonempty_label_value_problem)]
SubPath = Annotated[str, checked_by(names.relative_path_problem)]
PriorityClass = Annotated[str, checked_by(_priority_class_problem)]
# A Kueue LocalQueue: an object name that is also the value of the queue-name label.
QueueName = Annotated[str, checked_by(names.dns1123_label_problem)]
Duration = Annotated[str, AfterValidator(_check_duration)]
Retries = Annotated[int, _whole_number(0, MAX_RETRIES, "retries")]
Workers = Annotated[int, _whole_number(1, MAX_WORKERS, "workers")]
