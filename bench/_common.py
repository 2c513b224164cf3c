"""What the benchmarks share: a real `kubetrain serve` subprocess, percentiles, tables."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubetrain.local_server import LocalServer

CLI = [sys.executable, "-m", "kubetrain.cli.main"]
RESULTS = Path(__file__).parent / "results"


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def table(header: Sequence[str], rows: Sequence[Sequence[object]], widths: Sequence[int]) -> str:
    def cell(value: object, width: int, first: bool) -> str:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        return f"{text:<{width}}" if first else f"{text:>{width}}"

    lines = [
        "".join(cell(h, w, i == 0) for i, (h, w) in enumerate(zip(header, widths, strict=False)))
    ]
    for row in rows:
        lines.append(
            "".join(cell(v, w, i == 0) for i, (v, w) in enumerate(zip(row, widths, strict=False)))
        )
    return "\n".join(lines)


# The benchmarks' server is the one the demo and the end-to-end tests use.
Serve = LocalServer


def training_job(
    name: str, project: str, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "kubetrain.io/v1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "project": project, "annotations": annotations or {}},
        "spec": {
            "image": "registry.example/trainer:2026-08",
            "command": ["python", "train.py"],
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        },
    }
