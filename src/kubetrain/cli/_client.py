"""The client commands' connection to the server: the SDK's Client (kubetrain/client),
made from the command's flags. The commands print; the Client requests, and its
refusals (kubetrain.client.errors) are kubetrain's errors, which main prints as
`kubetrain: error: ...` lines: the title, detail and field errors of the server's
problem, the URL tried when no answer came, never a token.

What this path imports is kept small (the standard library's HTTP in client/_http.py,
the settings of kubetrain/client_settings.py): `kubetrain get jobs` answers in a
few interpreter starts (bench/cli_start.py; tests/unit/test_cli_main.py checks
that no pydantic, httpx or PyYAML is loaded).
"""

from __future__ import annotations

import argparse

from kubetrain import __version__
from kubetrain.cli._errors import CommandError
from kubetrain.client import Client

__all__ = ["CommandError", "connect", "project_of"]


def connect(args: argparse.Namespace) -> Client:
    """The client of a command's `--url` and `--project` (else KUBETRAIN_*, the config)."""
    return Client(
        url=getattr(args, "url", None),
        project=getattr(args, "project", None),
        user_agent=f"kubetrain-cli/{__version__}",
    )


def project_of(client: Client) -> str:
    if not client.project:
        raise CommandError("no project: pass --project or set KUBETRAIN_PROJECT")
    return client.project
