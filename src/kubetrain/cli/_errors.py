"""CommandError on its own, so a command that never calls the server need not import
the HTTP client to refuse something (cli/_client.py draws its tree)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubetrain.errors import KubetrainError

if TYPE_CHECKING:
    from pydantic import ValidationError


class CommandError(KubetrainError):
    """What the user reads after `kubetrain: error:`."""


def settings_error(exc: ValidationError, what: str) -> CommandError:
    """A settings refusal as one line: each field and pydantic's words for it."""
    problems = "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'settings'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)
    )
    return CommandError(f"{what} settings are not valid: {problems}")
