"""Kubernetes name and label syntax, checked the way the API server checks it.

Each check returns None when the value is allowed, or a message that says what
is allowed, so that callers (the TrainingJob spec, the dataset registry, the
manifest renderer) can attach it to the field they validate. The patterns are
those of k8s.io/apimachinery/pkg/util/validation; every one is matched with
`fullmatch`, because `$` would let a trailing newline through.
"""

from __future__ import annotations

import re

__all__ = [
    "DNS1123_LABEL_MAX",
    "DNS1123_SUBDOMAIN_MAX",
    "JOB_NAME_PREFIX",
    "LABEL_VALUE_MAX",
    "RESERVED_PREFIX",
    "c_identifier_problem",
    "config_key_problem",
    "control_character_problem",
    "dns1123_label_problem",
    "dns1123_subdomain_problem",
    "label_value_problem",
    "length_problem",
    "qualified_name_problem",
    "relative_path_problem",
]

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
LABEL_VALUE_MAX = 63
# Every Kubernetes Job we create is named JOB_NAME_PREFIX + the job id; see manifest.job_name.
JOB_NAME_PREFIX = "kt-"
# Labels and annotations under this prefix are ours: the syncer selects on them.
RESERVED_PREFIX = "kubetrain.io"

_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUALIFIED_NAME_MAX = 63

_LABEL_RULE = "lowercase letters, digits and '-', starting and ending with a letter or digit"


def length_problem(value: str, max_length: int) -> str | None:
    """Over `max_length` characters; every length check here and in the spec says it so."""
    if len(value) > max_length:
        return f"is {len(value)} characters long; at most {max_length} allowed"
    return None


def dns1123_label_problem(value: str, max_length: int = DNS1123_LABEL_MAX) -> str | None:
    """A DNS-1123 label: what Kubernetes requires of namespace and Job names."""
    if not value:
        return f"must not be empty: use up to {max_length} {_LABEL_RULE}"
    if (problem := length_problem(value, max_length)) is not None:
        return problem
    if not _DNS1123_LABEL.fullmatch(value):
        return f"{value!r} is not a DNS-1123 label: use up to {max_length} {_LABEL_RULE}"
    return None


def dns1123_subdomain_problem(value: str) -> str | None:
    """A DNS-1123 subdomain: what Kubernetes requires of PVC, Secret and PriorityClass names."""
    if not value:
        return f"must not be empty: use up to {DNS1123_SUBDOMAIN_MAX} {_LABEL_RULE} or '.'"
    if (problem := length_problem(value, DNS1123_SUBDOMAIN_MAX)) is not None:
        return problem
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        return (
            f"{value!r} is not a DNS-1123 subdomain: use {_LABEL_RULE}, in parts separated by '.'"
        )
    return None


def qualified_name_problem(key: str) -> str | None:
    """A label or annotation key: an optional DNS subdomain prefix and '/', then a name."""
    prefix, slash, name = key.rpartition("/")
    if slash and (problem := dns1123_subdomain_problem(prefix)) is not None:
        return f"key {key!r}: the prefix before '/' {problem}"
    if not name or len(name) > _QUALIFIED_NAME_MAX or not _QUALIFIED_NAME.fullmatch(name):
        return (
            f"key {key!r} is not a Kubernetes key: an optional prefix (a DNS subdomain and "
            f"'/') then a name of at most {_QUALIFIED_NAME_MAX} letters, digits, '-', '_' "
            "and '.', starting and ending with a letter or digit"
        )
    return None


def label_value_problem(value: str, *, allow_empty: bool = True) -> str | None:
    """A label value: empty, or up to 63 letters, digits, '-', '_' and '.', alphanumeric ends."""
    if not value:
        return None if allow_empty else "must not be empty"
    if (problem := length_problem(value, LABEL_VALUE_MAX)) is not None:
        return problem
    if not _QUALIFIED_NAME.fullmatch(value):
        return (
            f"{value!r} is not a label value: use letters, digits, '-', '_' and '.', "
            "starting and ending with a letter or digit"
        )
    return None


def config_key_problem(value: str) -> str | None:
    """A key of a Secret or ConfigMap (IsConfigMapKey): what a secretKeyRef may name."""
    if (
        not value
        or len(value) > DNS1123_SUBDOMAIN_MAX
        or not _CONFIG_KEY.fullmatch(value)
        or value in (".", "..")
        or value.startswith("..")
    ):
        return (
            f"{value!r} is not a Secret key: use up to {DNS1123_SUBDOMAIN_MAX} letters, "
            "digits, '-', '_' and '.' (not '.' or '..')"
        )
    return None


def c_identifier_problem(value: str) -> str | None:
    """An environment variable name every shell and runtime can read back."""
    if not _C_IDENTIFIER.fullmatch(value):
        return (
            f"{value!r} is not a valid environment variable name: use letters, digits and "
            "'_', not starting with a digit"
        )
    return None


# Unicode's Cc (C0, DEL and C1; fixed by Unicode's stability policy) and Cs (the
# surrogates), as one character class: a search in C, where a loop asking
# `unicodedata.category` of each character was ~1.5 % of a submission's server CPU.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_BUT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def control_character_problem(value: str, *, multiline: bool = False) -> str | None:
    """Control characters and lone surrogates: they garble logs and terminals, and break UTF-8.

    `multiline` admits tab and newline, for free text such as a shell script in
    `args` (YAML block scalars are common there).
    """
    found = (_CONTROL_BUT_TAB_NEWLINE if multiline else _CONTROL).search(value)
    if found is None:
        return None
    allowed = " (tab and newline are allowed here)" if multiline else ""
    return f"contains the control character U+{ord(found.group()):04X} at {found.start()}{allowed}"


def relative_path_problem(value: str, max_length: int = 1024) -> str | None:
    """A path inside a volume: relative, never climbing out (what Kubernetes asks of subPath)."""
    if not value:
        return "must not be empty"
    if (problem := length_problem(value, max_length)) is not None:
        return problem
    if (problem := control_character_problem(value)) is not None:
        return problem
    if value.startswith("/"):
        return f"{value!r} must be a relative path (no leading '/')"
    if ".." in value.split("/"):
        return f"{value!r} must not contain '..'"
    if "\\" in value:
        return f"{value!r} must use '/' to separate directories"
    return None
