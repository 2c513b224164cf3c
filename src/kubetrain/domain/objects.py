"""Reading plain Kubernetes objects (dicts) without trusting their shape.

A dump handed to `kubetrain why --from-file` may come from another Kubernetes
version, be cut short or be edited by hand; the diagnosis must say what it
could not read instead of raising. Every read of an object field goes through
these accessors: a missing key or a value of the wrong type reads as absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from functools import lru_cache
from typing import Any

__all__ = [
    "as_list",
    "as_map",
    "as_time",
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


def _walk(obj: object, path: tuple[str | int, ...]) -> object:
    """`get` for the common case, a path of keys through plain dicts, in one call;
    anything else (a list index, a Mapping that is not a dict) goes through `get`."""
    current = obj
    for at, step in enumerate(path):
        if type(current) is not dict or type(step) is not str:
            return get(current, *path[at:])
        current = current.get(step)
        if current is None:
            return None
    return current


def as_map(obj: object, *path: str | int) -> Mapping[str, Any]:
    value = _walk(obj, path)
    return value if type(value) is dict or isinstance(value, Mapping) else {}


def as_list(obj: object, *path: str | int) -> list[Any]:
    value = _walk(obj, path)
    return value if isinstance(value, list) else []


def text(obj: object, *path: str | int) -> str | None:
    value = _walk(obj, path)
    return value if isinstance(value, str) else None


def integer(obj: object, *path: str | int) -> int | None:
    value = _walk(obj, path)
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
    value = _walk(obj, path)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in ("True", "true", "False", "false"):
        return value in ("True", "true")
    return None


def timestamp(obj: object, *path: str | int) -> datetime | None:
    """An RFC 3339 time (or a YAML-loaded datetime) as an aware UTC datetime."""
    return as_time(_walk(obj, path))


def as_time(value: object) -> datetime | None:
    """A value read already (`timestamp` without the path) as an aware UTC datetime."""
    if value is None:
        return None
    if type(value) is str and 10 <= len(value) <= 40:
        return _parsed_time(value)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    if not isinstance(value, str) or not 10 <= len(value) <= 40:
        return None
    return _parsed_time(value)


@lru_cache(maxsize=4096)
def _parsed_time(value: str) -> datetime | None:
    # Kept per string: a gang's ranks and their events repeat the same seconds.
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
    if type(obj) is dict:
        meta = obj.get("metadata")
        if type(meta) is dict:
            name = meta.get("name")
            return name if isinstance(name, str) else None
    return text(obj, "metadata", "name")


def meta_namespace(obj: object) -> str:
    return text(obj, "metadata", "namespace") or ""
