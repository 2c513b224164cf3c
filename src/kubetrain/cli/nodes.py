"""`kubetrain nodes [--kubeconfig PATH] [-o text|json]`: the cluster's nodes, read directly.

Per node: the accelerator, GPUs / cpu / memory (allocatable, requested by the
Pods running there, free), taints, health and cordon; then one line per
kubetrain Pod waiting to be placed, saying where it could go. Read-only; the
table itself is computed by `kubetrain.domain.inventory`.
"""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from io import StringIO

from kubetrain.cli._client import CommandError
from kubetrain.cli._output import printable, table
from kubetrain.cluster.direct import BOUND_PODS, Kube, as_list
from kubetrain.domain.inventory import Amounts, Inventory, NodeRow, inventory
from kubetrain.domain.manifest import LABEL_JOB_ID
from kubetrain.domain.quantity import format_quantity
from kubetrain.domain.snapshot import Snapshot, SnapshotError


def _nodes(args: argparse.Namespace) -> int:
    with Kube(args.kubeconfig) as kube:
        items = kube.list("nodes")
        items += kube.list("pods", field_selector=BOUND_PODS)
        items += kube.list("pods", label_selector=LABEL_JOB_ID, field_selector="spec.nodeName=")
    try:
        snapshot = Snapshot.from_list(as_list(items))
    except SnapshotError as exc:
        raise CommandError(f"the cluster's objects cannot be read: {exc}") from None
    found = inventory(snapshot)
    if args.output == "json":
        print(printable(json.dumps(found.to_json(), indent=2, ensure_ascii=False)))
    else:
        print(printable(render(found)))
    return 0


def _share(amounts: Amounts, *, memory: bool = False) -> str:
    """'requested/allocatable (free N)' — the numbers a newcomer asks for."""
    q = format_quantity
    text = f"{q(amounts.requested)}/{q(amounts.allocatable)}"
    if amounts.capacity != amounts.allocatable:
        text += f" of {q(amounts.capacity)}"
    return text + f", {q(amounts.free)} free"


def _health(node: NodeRow) -> str:
    words = []
    ready = node.conditions.get("Ready")
    words.append("ready" if ready == "True" else f"NOT READY ({ready or 'unknown'})")
    if node.conditions.get("DiskPressure") == "True":
        words.append("disk pressure")
    if node.conditions.get("MemoryPressure") == "True":
        words.append("memory pressure")
    if node.cordoned:
        words.append("cordoned (no new Pods)")
    return ", ".join(words)


def render(found: Inventory) -> str:
    """The node table, then where each waiting kubetrain Pod could go."""
    lines: list[str] = []
    if not found.nodes:
        lines.append("The cluster has no nodes.")
    else:
        rows = [
            [
                n.name,
                n.accelerator or "-",
                _share(n.gpu) if n.gpu_resource else "none",
                _share(n.cpu),
                _share(n.memory),
                _health(n),
                ", ".join(n.taints) or "-",
            ]
            for n in found.nodes
        ]
        headers = ["NODE", "ACCELERATOR", "GPUS USED/ALL", "CPU USED/ALL", "MEMORY USED/ALL"]
        headers += ["HEALTH", "TAINTS"]
        gpus = sum((n.gpu.allocatable for n in found.nodes), Decimal(0))
        free = sum((n.gpu.free for n in found.nodes if n.ready and not n.cordoned), Decimal(0))
        lines.append(
            f"{len(found.nodes)} nodes; {format_quantity(free)} of {format_quantity(gpus)} "
            "GPUs free on nodes that take new Pods. USED counts what the Pods there requested."
        )
        lines.append("")
        buffer = StringIO()
        table(headers, rows, stream=buffer)
        lines += buffer.getvalue().rstrip("\n").splitlines()
    lines.append("")
    if not found.pending:
        lines.append("No kubetrain job is waiting to be placed on a node.")
    else:
        lines.append(f"Waiting to be placed ({len(found.pending)}):")
        for p in found.pending:
            lines.append(f"  {p.job} (pod {p.namespace}/{p.pod}, needs {p.requests}): {p.verdict}")
    if found.problems:
        lines += ["", "Could not read:"]
        lines += [f"  - {problem}" for problem in found.problems[:20]]
    return "\n".join(lines)
