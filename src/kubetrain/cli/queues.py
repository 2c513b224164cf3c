"""`kubetrain queues`: Kueue's ClusterQueues as the server's caches hold them
(GET /api/v1/queues): per flavor the quota and what is reserved, then the pending jobs
in the order Kueue will consider them."""

from __future__ import annotations

import argparse
from io import StringIO
from typing import Any

from kubetrain.cli._client import connect
from kubetrain.cli._output import emit, printable, table


def _queues(args: argparse.Namespace) -> int:
    with connect(argparse.Namespace(url=args.url)) as client:
        answer = client.request("GET", "/api/v1/queues").body
    if args.output != "table":
        emit(answer, args.output)
        return 0
    print(printable(render(answer)), end="")
    return 0


def _state(queue: dict[str, Any]) -> str:
    if queue["active"] is False:
        return f"INACTIVE: {queue['inactive_reason'] or 'not active'}"
    return "active" if queue["active"] else "state not reported yet"


def _who(pending: dict[str, Any]) -> str:
    if pending["job_name"]:
        return f"{pending['project']}/{pending['job_name']}"
    return f"{pending['namespace']}/{pending['kubernetes_job'] or pending['workload']}"


def render(answer: dict[str, Any]) -> str:
    queues = answer["cluster_queues"]
    if not queues:
        return "No ClusterQueue: Kueue is not installed, or it has no queues.\n"
    out = StringIO()
    for n, queue in enumerate(queues):
        if n:
            out.write("\n")
        cohort = f", cohort {queue['cohort']}" if queue["cohort"] else ""
        out.write(
            f"ClusterQueue {queue['name']} ({_state(queue)}{cohort}): {queue['admitted']} "
            f"admitted, {queue['pending_total']} pending\n"
        )
        rows = [
            [
                r["flavor"],
                r["resource"],
                r["reserved"],
                r["nominal"],
                r["borrowing_limit"] or ("-" if not queue["cohort"] else "no limit"),
                r["borrowed"],
            ]
            for r in queue["resources"]
        ]
        table(
            ["FLAVOR", "RESOURCE", "RESERVED", "NOMINAL", "BORROWING LIMIT", "BORROWED"],
            rows,
            stream=out,
        )
        if queue["pending"]:
            out.write("\n")
            table(
                ["POSITION", "JOB", "PRIORITY", "REQUESTS", "WHY"],
                [
                    [
                        p["position"],
                        _who(p),
                        p["priority"],
                        ", ".join(f"{k}={v}" for k, v in sorted(p["requests"].items())),
                        p["message"],
                    ]
                    for p in queue["pending"]
                ],
                stream=out,
            )
        hidden = queue["pending_total"] - len(queue["pending"])
        if hidden:
            out.write(f"({hidden} pending jobs of other projects not shown)\n")
    return out.getvalue()
