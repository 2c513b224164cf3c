"""The job page's progress chart, laid out server-side in SVG coordinates: scales rounded
out to round ticks, tick labels, a log scale when the loss spans more than two decades,
the learning rate in a small chart of its own, and where checkpoints and resumes fall.

Pure (numbers in, numbers and words out), so the arithmetic is unit-tested without a
browser; job.html only draws what `progress_chart` returns. Non-finite values (a NaN
loss) are left out of the lines: they have no place on an axis.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# -- scales and ticks ------------------------------------------------------------------

LOG_DECADES = 2  # a loss spanning more than this many decades is drawn on a log scale
MOST_TICKS = 7  # labels per axis at most (a log axis thins its decades to fit)


def nice_step(span: float, count: int) -> float:
    """The round step (1, 2 or 5 times a power of ten) that cuts `span` into about
    `count` parts."""
    if not math.isfinite(span) or span <= 0:
        return 1.0
    raw = span / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power * (1 + 1e-9):
            return factor * power
    return 10 * power  # pragma: no cover - the loop always returns


def _decimals(step: float) -> int:
    return max(0, -math.floor(math.log10(step) + 1e-9))


def linear_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round values from the one at or below `low` to the one at or above `high`."""
    if high < low:
        low, high = high, low
    if high == low:  # one value: a band around it
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = nice_step(high - low, count)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    digits = _decimals(step) + 1
    return [round(i * step, digits) + 0.0 for i in range(first, last + 1)]


def integer_ticks(first: int, last: int, count: int = 6) -> list[int]:
    """Whole, round values covering [first, last] (steps are counted, never halved); at
    least two, so that a scale has a length."""
    last = max(last, first + 1)
    step = max(1, round(nice_step(max(last - first, 1), count)))
    return list(range((first // step) * step, -(-last // step) * step + 1, step))


def log_ticks(low: float, high: float, most: int = MOST_TICKS) -> list[float]:
    """Powers of ten covering [low, high] (both > 0), every k-th decade when there are
    more than `most`."""
    lo = math.floor(math.log10(low) + 1e-9)
    hi = math.ceil(math.log10(high) - 1e-9)
    hi = max(hi, lo + 1)
    every = max(1, math.ceil((hi - lo) / (most - 1)))
    hi = lo + math.ceil((hi - lo) / every) * every
    return [10.0**e for e in range(lo, hi + 1, every)]


def spans_decades(values: Sequence[float], decades: int = LOG_DECADES) -> bool:
    """Whether every value is positive and the largest is more than 10^decades times
    the smallest: then a linear axis would flatten all but the first steps."""
    return bool(values) and min(values) > 0 and max(values) > min(values) * 10**decades


def tick_label(value: float, step: float) -> str:
    """A linear tick's label, with as many decimals as the step has: "0.5", "1,200"."""
    if abs(value) >= 1e6 or (value != 0 and abs(value) < 1e-4 and step < 1e-4):
        return f"{value:.3g}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
    return f"{value:,.{_decimals(step)}f}"


def log_label(value: float) -> str:
    """A power of ten: "0.001", "1", "100", and past four decades "1e-6", "1e6"."""
    exponent = round(math.log10(value))
    if -4 <= exponent < 0:
        return f"{value:.{-exponent}f}"
    if 0 <= exponent <= 4:
        return f"{round(value):,}"
    return f"1e{exponent}"


def figure(value: float) -> str:
    """A metric's value in words: three significant figures ("0.0121", "3.85")."""
    return f"{value:.3g}" if math.isfinite(value) else str(value)


@dataclass(frozen=True)
class Scale:
    """`low`..`high` (values) onto `start`..`end` (pixels), linear or by logarithm."""

    low: float
    high: float
    start: float
    end: float
    log: bool = False

    def __call__(self, value: float) -> float:
        if self.log:
            lo, hi, at = math.log10(self.low), math.log10(self.high), math.log10(value)
        else:
            lo, hi, at = self.low, self.high, value
        share = (at - lo) / (hi - lo) if hi != lo else 0.5
        return round(self.start + share * (self.end - self.start), 1)


# -- the chart ---------------------------------------------------------------------------

WIDTH = 640
LEFT, RIGHT = 72, 20  # room for the y tick labels and the y axis' title
MAIN_HEIGHT, RATE_HEIGHT = 250, 150
TOP, BOTTOM = 24, 48  # room for the resume's label; the x tick labels and title
CHECKPOINT_TICK = 7  # a checkpoint's tick on the step axis, in pixels
RATE_METRICS = ("lr", "learning_rate")


@dataclass(frozen=True)
class Tick:
    at: float  # the pixel along its axis
    label: str


@dataclass(frozen=True)
class Mark:
    x: float
    step: int
    kind: str  # "checkpoint" | "last-checkpoint" | "resume"


@dataclass(frozen=True)
class Panel:
    """One metric against steps, with its own y axis."""

    metric: str
    title: str  # the y axis' title
    height: int  # the SVG's height; the plot runs from TOP to height - BOTTOM
    log: bool
    points: str  # "x,y x,y ..." in the SVG's coordinates
    y_ticks: tuple[Tick, ...]
    first: tuple[int, float]  # (step, value) of the first and last points drawn
    last: tuple[int, float]
    lowest: tuple[int, float]

    @property
    def bottom(self) -> int:
        return self.height - BOTTOM


@dataclass(frozen=True)
class Chart:
    main: Panel
    rate: Panel | None  # the learning rate, when the steps report one
    x_title: str
    x_ticks: tuple[Tick, ...]
    first_step: int
    last_step: int
    checkpoints: tuple[Mark, ...]  # small ticks on the step axis
    last_checkpoint: Mark | None
    resumes: tuple[Mark, ...]
    saved: int  # checkpoint reports, in all (as the table counts them; some may fall
    # outside the steps drawn, or save a step again after a resume)
    width: int = WIDTH
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP

    @property
    def summary(self) -> str:
        """The chart in words, for screen readers (and anyone without the picture)."""
        m = self.main
        words = (
            f"{m.metric} by step, steps {self.first_step} to {self.last_step}"
            f"{', log scale' if m.log else ''}: {figure(m.first[1])} at step {m.first[0]}, "
            f"{figure(m.last[1])} at step {m.last[0]}"
        )
        if m.lowest[1] < min(m.first[1], m.last[1]):
            words += f", lowest {figure(m.lowest[1])} at step {m.lowest[0]}"
        words += "."
        for resume in self.resumes:
            words += f" Resumed from the checkpoint of step {resume.step}."
        if self.last_checkpoint is not None:
            saved = f"{self.saved} checkpoint{'s' * (self.saved != 1)} saved"
            words += f" {saved}, the last at step {self.last_checkpoint.step}."
        if self.rate is not None:
            r = self.rate
            words += (
                f" {r.metric}: {figure(r.first[1])} at step {r.first[0]}, "
                f"{figure(r.last[1])} at step {r.last[0]}."
            )
        return words


def _series(
    steps: Sequence[tuple[int, Mapping[str, float]]], metric: str
) -> list[tuple[int, float]]:
    """The metric by step, each step as last reported (a resumed attempt trains again the
    steps after its checkpoint, and the line runs on with it); non-finite values left out."""
    latest: dict[int, float] = {}
    for step, metrics in steps:
        value = metrics.get(metric)
        if isinstance(value, int | float) and not isinstance(value, bool):
            latest[step] = float(value)
    return [(s, v) for s, v in sorted(latest.items()) if math.isfinite(v)]


def _panel(
    metric: str, series: list[tuple[int, float]], x: Scale, height: int, *, title: str
) -> Panel:
    values = [v for _, v in series]
    log = spans_decades(values)
    bottom = height - BOTTOM
    if log:
        ticks = log_ticks(min(values), max(values))
        labels = [log_label(t) for t in ticks]
    else:
        ticks = linear_ticks(min(values), max(values))
        step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
        labels = [tick_label(t, step) for t in ticks]
    y = Scale(ticks[0], ticks[-1], bottom, TOP, log=log)
    points = " ".join(f"{x(s)},{y(v)}" for s, v in series)
    lowest = min(series, key=lambda p: p[1])
    return Panel(
        metric=metric,
        title=title + (" (log scale)" if log else ""),
        height=height,
        log=log,
        points=points,
        y_ticks=tuple(Tick(y(t), label) for t, label in zip(ticks, labels, strict=True)),
        first=series[0],
        last=series[-1],
        lowest=lowest,
    )


def progress_chart(
    steps: Sequence[tuple[int, Mapping[str, float]]],
    checkpoints: Sequence[int] = (),
    resumes: Sequence[int] = (),
    last_checkpoint: int | None = None,
) -> Chart | None:
    """The loss (else the first metric reported) by step, the learning rate below it if
    reported, with the checkpoints saved as ticks on the step axis, the last one and each
    step resumed from marked apart. None: fewer than two finite points to draw.

    `steps` come in the order they were reported; `last_checkpoint` is the step of the
    newest checkpoint (default: the highest of `checkpoints`)."""
    names = [name for _, metrics in steps for name in metrics]
    if not names:
        return None
    plain = [n for n in names if n not in RATE_METRICS]
    metric = "loss" if "loss" in names else (plain or names)[0]
    series = _series(steps, metric)
    if len(series) < 2:
        return None
    first, last = series[0][0], series[-1][0]
    step_ticks = integer_ticks(first, last)
    x = Scale(step_ticks[0], step_ticks[-1], LEFT, WIDTH - RIGHT)
    main = _panel(metric, series, x, MAIN_HEIGHT, title=metric)
    rate = None
    rate_metric = next((n for n in RATE_METRICS if n in names and n != metric), None)
    if rate_metric is not None:
        rate_series = _series(steps, rate_metric)
        if len(rate_series) >= 2:
            rate = _panel(rate_metric, rate_series, x, RATE_HEIGHT, title="learning rate")

    def within(at: Sequence[int]) -> list[int]:
        return sorted({s for s in at if first <= s <= last})

    if last_checkpoint is None and checkpoints:
        last_checkpoint = max(checkpoints)
    newest = (
        Mark(x(last_checkpoint), last_checkpoint, "last-checkpoint")
        if last_checkpoint is not None and first <= last_checkpoint <= last
        else None
    )
    return Chart(
        main=main,
        rate=rate,
        x_title="step",
        x_ticks=tuple(Tick(x(t), f"{t:,}") for t in step_ticks),
        first_step=first,
        last_step=last,
        checkpoints=tuple(Mark(x(s), s, "checkpoint") for s in within(checkpoints)),
        last_checkpoint=newest,
        resumes=tuple(Mark(x(s), s, "resume") for s in within(resumes)),
        saved=len(checkpoints),
    )
