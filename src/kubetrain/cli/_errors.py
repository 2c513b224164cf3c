"""CommandError on its own, so a command that never calls the server need not import
the HTTP client to refuse something (cli/_client.py draws its tree)."""

from __future__ import annotations

from kubetrain.errors import KubetrainError


class CommandError(KubetrainError):
    """What the user reads after `kubetrain: error:`."""
