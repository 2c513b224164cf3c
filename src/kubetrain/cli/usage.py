"""`kubetrain usage`: GPU-hours per project and GPU type (GET /api/v1/usage)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from kubetrain.cli._client import connect
from kubetrain.cli._errors import CommandError
from kubetrain.cli._output import emit, short_time, table
from kubetrain.domain.durations import duration_seconds


def since_time(text: str, *, now: datetime) -> datetime:
    """--since: a duration back from now (`24h`, `90m`, `7d`) or an RFC 3339 time."""
    days = text[:-1]
    if text.endswith("d") and days.isdigit():
        return now - timedelta(days=int(days))
    try:
        return now - timedelta(seconds=duration_seconds(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise CommandError(
            f"--since {text!r}: give a duration (24h, 90m, 7d) or a time with its zone "
            "(2026-03-01T00:00:00Z)"
        )
    return moment


def _usage(args: argparse.Namespace) -> int:
    since = since_time(args.since, now=datetime.now(UTC)) if args.since else None
    with connect(argparse.Namespace(url=args.url)) as client:  # -p is no default here
        answer = client.usage(args.project, since).raw
    if args.output != "table":
        emit(answer, args.output)
        return 0
    window = f"since {short_time(answer['since'])}" if answer["since"] else "since the start"
    print(f"GPU-hours {window}, until {short_time(answer['until'])} (UTC)")
    rows = [
        [
            item["project"],
            item["gpu_type"],
            item["jobs"],
            _hours(item["before_training"]),
            _hours(item["training"]),
            _hours(item["total"]),
        ]
        for item in answer["items"]
    ]
    total = answer["total"]
    rows.append(
        [
            "total",
            "",
            "",
            _hours(total["before_training"]),
            _hours(total["training"]),
            _hours(total["total"]),
        ]
    )
    table(["PROJECT", "GPU TYPE", "JOBS", "BEFORE TRAINING", "TRAINING", "GPU-HOURS"], rows)
    return 0


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"
