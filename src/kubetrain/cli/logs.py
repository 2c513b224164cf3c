"""`kubetrain logs NAME`: an attempt's (a worker's) output, through the API
(GET …/jobs/{id}/logs), as `kubectl logs` prints it."""

from __future__ import annotations

import argparse
import sys

from kubetrain.cli._client import connect, project_of
from kubetrain.cli._errors import CommandError
from kubetrain.domain.durations import duration_seconds


def _logs(args: argparse.Namespace) -> int:
    if args.since is not None:
        try:
            duration_seconds(args.since)
        except ValueError as exc:
            raise CommandError(f"--since: {exc}") from None
    with connect(args) as client:
        chunks = client.log_chunks(
            args.name,
            project_of(client),
            follow=args.follow,
            attempt=args.attempt,
            worker=args.worker,
            tail=args.tail,
            since=args.since,
            timestamps=args.timestamps,
        )
        for chunk in chunks:
            sys.stdout.write(chunk)
            sys.stdout.flush()
    return 0
