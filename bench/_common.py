"""What the benchmarks share: percentiles, tables, where results go.

The standard library only: bench/checkpoint.py runs where kubetrain.runtime
runs, in a training image with torch and none of the server's packages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

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
