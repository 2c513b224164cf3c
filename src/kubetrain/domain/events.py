"""The types of event a webhook receives (domain/notifications.py builds and signs
them), apart so that the CLI can offer them without loading the signing."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["EventType"]


class EventType(StrEnum):
    STATE_CHANGED = "io.kubetrain.job.state_changed"
    REASON_CHANGED = "io.kubetrain.job.reason_changed"
    NOT_WAITABLE = "io.kubetrain.job.not_waitable"
    NO_PROGRESS = "io.kubetrain.job.no_progress"
