"""Warm start of the testbed (binaries built) to schedulable nodes.

Runs `Testbed.up` several times per pool and, side by side in the same run, the
baseline every control plane pays: bare etcd + kube-apiserver to /readyz.
Prints a table and writes bench/results/testbed_start.json.

    .venv/bin/python bench/testbed_start.py [--runs 3] [--pools default large real]

For the `real` pool (root, containerd installed), "real_nodes_started" is when
every node's containerd answered and held the images, and "nodes_ready" when
both kubelets are Ready and schedulable with their device plugin's GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubetrain.testbed.cluster import Testbed

RESULTS = Path(__file__).parent / "results" / "testbed_start.json"


def baseline(root: Path) -> float:
    began = time.monotonic()
    bed = Testbed.prepare(root / "baseline", "none")
    try:
        bed.start_component("etcd")
        bed.start_component("kube-apiserver")
        return time.monotonic() - began
    finally:
        bed.down()


def full(root: Path, pool: str) -> dict[str, float]:
    bed = Testbed.up(root / f"full-{pool}", pool)
    try:
        return bed.state().phases
    finally:
        bed.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pools", nargs="+", default=["default", "large", "real"])
    args = parser.parse_args()
    report: dict[str, Any] = {"runs": args.runs, "baseline_etcd_apiserver": [], "pools": {}}
    with tempfile.TemporaryDirectory(prefix="kubetrain-bench-") as tmp:
        root = Path(tmp)
        for _ in range(args.runs):
            # Interleaved, so drift on this shared machine hits both alike.
            report["baseline_etcd_apiserver"].append(round(baseline(root), 3))
            for pool in args.pools:
                report["pools"].setdefault(pool, []).append(full(root, pool))
    base = statistics.median(report["baseline_etcd_apiserver"])
    print(f"{'what':<34}{'median s':>10}{'max s':>8}{'x baseline':>12}")
    print(
        f"{'etcd + kube-apiserver /readyz':<34}{base:>10.2f}"
        f"{max(report['baseline_etcd_apiserver']):>8.2f}{1.0:>12.2f}"
    )
    for pool, runs in report["pools"].items():
        for phase in ("real_nodes_started", "components_ready", "nodes_ready"):
            values = [r[phase] for r in runs if phase in r]
            if not values:
                continue
            print(
                f"{pool + ' ' + phase:<34}{statistics.median(values):>10.2f}"
                f"{max(values):>8.2f}{statistics.median(values) / base:>12.2f}"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
