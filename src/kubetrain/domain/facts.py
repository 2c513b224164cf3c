"""A job's facts in words, once: sizes, durations, counts, times, the runtime's phase and
its last checkpoint. `kubetrain get job` and the job page both say them through these
functions, so a fix in one is a fix in both.

Standard library only (the CLI's client path loads it without pydantic); pure: the
moment to measure from is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "PhaseFact",
    "age",
    "byte_size",
    "checkpoint_words",
    "clock",
    "count",
    "dropped_words",
    "phase_fact",
    "save_seconds",
]

_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB")


def byte_size(count: int) -> str:
    """A size in the unit that shows it: a small model's checkpoint of a few KiB is
    not "0.0 MiB"."""
    if count < 1024:
        return f"{count} B"
    value, unit = count / 1024, 0
    while value >= 1024 and unit < len(_BYTE_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{value:.1f} {_BYTE_UNITS[unit]}"


def save_seconds(seconds: float) -> str:
    """How long a save took: "0.50 s"."""
    return f"{seconds:.2f} s"


def count(number: int, noun: str, plural: str | None = None) -> str:
    """ "1 job", "2 jobs", "0 jobs": the noun agrees with the number."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def age(moment: datetime | None, now: datetime) -> str:
    """How long ago, to the two largest units: "45s", "12m", "3h 5m", "2d 4h"."""
    if moment is None:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = max(int((now - moment).total_seconds()), 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 60:
        return f"{seconds}s"
    if minutes < 60:
        return f"{minutes}m"
    if hours < 24:
        return f"{hours}h {minutes % 60}m" if minutes % 60 else f"{hours}h"
    return f"{days}d {hours % 24}h" if hours % 24 else f"{days}d"


def clock(moment: datetime) -> str:
    """A moment in UTC to the second, as tables under a "(UTC)" heading show it."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass(frozen=True)
class PhaseFact:
    """The runtime's last reported phase, said as the job's phase only while it runs."""

    label: str  # "Phase" | "Last phase reported"
    phase: str
    link: str  # "on" (it is there now) | "by" (it said so)
    pod: str
    current: bool

    def __str__(self) -> str:
        return f"{self.phase} {self.link} {self.pod}"


def phase_fact(phase: str, pod: str, *, running: bool) -> PhaseFact:
    """A finished (or not yet started) job's phase is what was last said, not a state."""
    if running:
        return PhaseFact("Phase", phase, "on", pod, current=True)
    return PhaseFact("Last phase reported", phase, "by", pod, current=False)


def dropped_words(dropped: int) -> str:
    """Reports the runtime's reporter dropped rather than block training."""
    return f"{count(dropped, 'event')} dropped by the reporter"


def checkpoint_words(checkpoint: Mapping[str, Any], saved: int | None = None) -> str:
    """The last checkpoint: "step 200, 17.6 KiB in 0.01 s" and, when known, how many
    the job saved in all ("; 40 checkpoints saved")."""
    words = (
        f"step {checkpoint.get('step')}, {byte_size(int(checkpoint.get('sizeBytes') or 0))} "
        f"in {save_seconds(float(checkpoint.get('durationSeconds') or 0.0))}"
    )
    if saved:
        words += f"; {count(saved, 'checkpoint')} saved"
    return words
