"""`kubetrain webhook create | list | delete`: a project's receivers of job events.

`create` prints the signing secret once, on stdout alone, as `token create`
prints a token (`export SECRET=$(kubetrain webhook create ...)`); the rest of
what it says goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
from urllib.parse import quote

from kubetrain.cli._client import connect, project_of
from kubetrain.cli._output import emit, short_time, table


def _path(project: str) -> str:
    return f"/api/v1/projects/{quote(project, safe='')}/webhooks"


def _create(args: argparse.Namespace) -> int:
    document: dict[str, object] = {"url": args.url_to_call}
    if args.events:
        document["events"] = args.events
    with connect(args) as client:
        created = client.request("POST", _path(project_of(client)), json=document).body
    print(
        f"webhook {created['id']} created for project {created['project']}: "
        f"{created['url']} ({', '.join(created['events']) or 'every event type'}); "
        "its signing secret is on stdout and is shown only now",
        file=sys.stderr,
    )
    print(created["secret"])
    return 0


def _list(args: argparse.Namespace) -> int:
    with connect(args) as client:
        items = client.request("GET", _path(project_of(client))).body["items"]
    if args.output != "table":
        emit(items, args.output)
        return 0
    table(
        ["ID", "URL", "EVENTS", "STATUS", "DELIVERED", "LAST ERROR", "CREATED"],
        [
            [
                h["id"],
                h["url"],
                ",".join(e.rsplit(".", 1)[-1] for e in h["events"]) or "all",
                h["status"]
                + (f" since {short_time(h['failingSince'])}" if h.get("failingSince") else ""),
                h["delivered"],
                h.get("lastError"),
                short_time(h["createdAt"]),
            ]
            for h in items
        ],
    )
    return 0


def _delete(args: argparse.Namespace) -> int:
    with connect(args) as client:
        client.request("DELETE", f"{_path(project_of(client))}/{quote(args.id, safe='')}")
    print(f"webhook {args.id} deleted")
    return 0
