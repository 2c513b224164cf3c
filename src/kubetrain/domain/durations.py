"""Go-style durations ("24h", "1h30m"), as spec.maxRuntime and spec.stallAfter and
the `--since` of the logs and the usage take them; apart from the TrainingJob
models so that the client commands read one without loading pydantic."""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["duration_seconds"]

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
