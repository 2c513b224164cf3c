"""The benches' figures, drawn with matplotlib: axis titles with units, the baseline
drawn beside the measured figure (dashed, grey) so that a chart reads as the ratio the
bench reports, not an absolute time on a shared machine.

Apart from _common.py: it needs matplotlib, which bench/checkpoint.py's training image
does not have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
from matplotlib import ticker

BASELINE = {"color": "0.45", "linestyle": "--"}


def line_panels(
    path: Path,
    title: str,
    x: Sequence[float],
    xlabel: str,
    panels: Sequence[tuple[str, str, Mapping[str, Sequence[float]], Sequence[str]]],
) -> None:
    """One line chart per panel against the same x: (title, y-axis label with its unit,
    series by name, the names among them that are baselines)."""
    columns = 2 if len(panels) > 1 else 1
    rows = (len(panels) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.6 * rows), squeeze=False)
    for ax, (name, ylabel, series, baselines) in zip(axes.flat, panels, strict=False):
        for label, values in series.items():
            style = BASELINE if label in baselines else {}
            ax.plot(x, values, marker="o", label=label, **style)
        ax.set_title(name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def paired_bars(
    path: Path,
    title: str,
    groups: Sequence[str],
    measured: tuple[str, Sequence[float]],
    baseline: tuple[str, Sequence[float]],
    ylabel: str,
    *,
    log: bool = False,
) -> None:
    """Each group's measured figure beside its baseline from the same run, the ratio
    written over the pair."""
    width = 0.38
    positions = range(len(groups))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(groups)), 4.2))
    ax.bar([p - width / 2 for p in positions], baseline[1], width, label=baseline[0], color="0.7")
    bars = ax.bar([p + width / 2 for p in positions], measured[1], width, label=measured[0])
    for bar, value, base in zip(bars, measured[1], baseline[1], strict=True):
        if base:
            ax.annotate(
                f"{value / base:.2f}x",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize="small",
            )
    ax.set_xticks(list(positions), groups, fontsize="small")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_title(title, fontsize="medium", wrap=True)
    ax.legend(fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
