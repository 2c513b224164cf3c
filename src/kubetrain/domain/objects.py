"""Reading plain Kubernetes objects (dicts) without trusting their shape.

A dump handed to `kubetrain why --from-file` may come from another Kubernetes
version, be cut short or be edited by hand; the diagnosis must say what it
could not read instead of raising. Every read of an object field goes through
these accessors: a missing key or a value of the wrong type reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from typing import Any

__all__ = [
    "as_list",
    "as_map",
    "boolean",
    "get",
    "integer",
    "labels",
    "meta_name",
    "meta_namespace",
    "text",
    "timestamp",
]


def get(obj: object, *path: str | int) -> object:
    """The value at `path` (dict keys, list indexes), None where the path breaks."""
    current: object = obj
    for step in path:
        # Decoded JSON is plain dicts: the exact type check first, as ABC isinstance
        # checks are most of the cost of reading a gang's hundreds of Pods.
        if (type(current) is dict and type(step) is str) or (
            isinstance(step, str) and isinstance(current, Mapping)
        ):
            current = current.get(step)
        elif isinstance(step, int) and isinstance(current, list) and -len(current) <= step:
            current = current[step] if step < len(current) else None
        else:
            return None
        if current is None:
            return None
    return current


def as_map(obj: object, *path: str | int) -> Mapping[str, Any]:
    value = get(obj, *path)
    return value if isinstance(value, Mapping) else {}


def as_list(obj: object, *path: str | int) -> list[Any]:
    value = get(obj, *path)
    return value if isinstance(value, list) else []


def text(obj: object, *path: str | int) -> str | None:
    value = get(obj, *path)
    return value if isinstance(value, str) else None


def integer(obj: object, *path: str | int) -> int | None:
    value = get(obj, *path)
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
        return int(value)
    return None


def boolean(obj: object, *path: str | int) -> bool | None:
    value = get(obj, *path)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("True", "true", "False", "false"):
        return value in ("True", "true")
    return None


def timestamp(obj: object, *path: str | int) -> datetime | None:
    """An RFC 3339 time (or a YAML-loaded datetime) as an aware UTC datetime."""
    value = get(obj, *path)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if not isinstance(value, str) or not 10 <= len(value) <= 40:
        return None
    raw = value.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    # Go writes up to nine fractional digits; Python reads at most six.
    if "." in raw:
        head, _, tail = raw.partition(".")
        digits = len(tail) - len(tail.lstrip("0123456789"))
        raw = head + "." + tail[: min(digits, 6)].ljust(1, "0") + tail[digits:]
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def labels(obj: object) -> Mapping[str, str]:
    found = as_map(obj, "metadata", "labels")
    return {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str)}


def meta_name(obj: object) -> str | None:
    return text(obj, "metadata", "name")


def meta_namespace(obj: object) -> str:
    return text(obj, "metadata", "namespace") or ""
