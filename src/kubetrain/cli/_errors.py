"""CommandError on its own, so a command that never calls the server need not import
the HTTP client to refuse something (the SDK's refusals, kubetrain/client/errors.py,
are kubetrain's errors too: main prints them the same way)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubetrain.client_settings import describe_invalid
from kubetrain.errors import KubetrainError

if TYPE_CHECKING:
    from pydantic import ValidationError


class CommandError(KubetrainError):
    """What the user reads after `kubetrain: error:`."""


def settings_error(exc: ValidationError, what: str) -> CommandError:
    """A settings refusal as one line: each field and pydantic's words for it."""
    return CommandError(describe_invalid(exc, what))
