"""`kubetrain logs NAME`: an attempt's (a worker's) output, through the API
(GET …/jobs/{id}/logs), as `kubectl logs` prints it."""

from __future__ import annotations

import argparse
import sys

from kubetrain.cli._client import ApiClient, client_settings, project_of
from kubetrain.cli._errors import CommandError
from kubetrain.domain.durations import duration_seconds


def _logs(args: argparse.Namespace) -> int:
    if args.since is not None:
        try:
            duration_seconds(args.since)
        except ValueError as exc:
            raise CommandError(f"--since: {exc}") from None
    settings = client_settings(args)
    project = project_of(settings)
    params: dict[str, object] = {}
    for key, value in (
        ("attempt", args.attempt),
        ("worker", args.worker),
        ("tail", args.tail),
        ("since", args.since),
    ):
        if value is not None:
            params[key] = value
    if args.follow:
        params["follow"] = "true"
    if args.timestamps:
        params["timestamps"] = "true"
    with ApiClient(settings) as client:
        job = client.find_job(project, args.name)
        path = f"{client.job_path(project, job['id'])}/logs"
        for chunk in client.stream_text(path, params=params, follow=args.follow):
            sys.stdout.write(chunk)
            sys.stdout.flush()
    return 0
