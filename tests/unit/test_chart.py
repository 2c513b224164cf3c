"""The job page's progress chart (api/web/chart.py): round ticks on both axes, the log
scale past two decades, the learning rate's own panel, marks where they fall, and
non-finite values left out of the line."""

from __future__ import annotations

import itertools
import math

import pytest

from kubetrain.api.web import chart as c

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("span", "count", "step"),
    [(200, 5, 50), (3.84, 5, 1), (0.4, 5, 0.1), (7, 6, 2), (1, 6, 0.2), (0.0042, 5, 0.001)],
)
def test_a_step_is_one_two_or_five_times_a_power_of_ten(span: float, count: int, step: float):
    assert c.nice_step(span, count) == pytest.approx(step)


def test_linear_ticks_are_round_and_cover_the_values():
    assert c.linear_ticks(0.0121, 3.85) == [0.0, 1.0, 2.0, 3.0, 4.0]
    # no float noise (0.30000000000000004) in a label's value
    assert c.linear_ticks(0.31, 0.69) == [0.3, 0.4, 0.5, 0.6, 0.7]
    assert c.linear_ticks(-1.5, 2.2) == [-2.0, -1.0, 0.0, 1.0, 2.0, 3.0]
    flat = c.linear_ticks(5.0, 5.0)  # one value: a band around it
    assert flat[0] < 5.0 < flat[-1]
    assert c.linear_ticks(0.0, 0.0)[0] < 0.0 < c.linear_ticks(0.0, 0.0)[-1]


def test_step_ticks_are_whole_and_round():
    assert c.integer_ticks(1, 200) == [0, 50, 100, 150, 200]
    assert c.integer_ticks(61, 200) == [50, 100, 150, 200]
    assert c.integer_ticks(10_000, 10_020) == [10_000, 10_005, 10_010, 10_015, 10_020]
    assert c.integer_ticks(1, 3) == [1, 2, 3]  # never a half step
    assert c.integer_ticks(5, 5) == [5, 6]


def test_log_ticks_are_powers_of_ten_thinned_to_fit():
    assert c.log_ticks(0.0121, 3.85) == pytest.approx([0.01, 0.1, 1.0, 10.0])
    assert c.log_ticks(0.01, 1.0) == pytest.approx([0.01, 0.1, 1.0])
    wide = c.log_ticks(1e-9, 1e5)
    assert len(wide) <= c.MOST_TICKS
    assert wide[0] <= 1e-9
    assert wide[-1] >= 1e5
    exponents = [round(math.log10(t)) for t in wide]
    assert len({b - a for a, b in itertools.pairwise(exponents)}) == 1


def test_log_scale_only_past_two_decades_of_positive_values():
    assert c.spans_decades([3.85, 0.0121])  # 318 times: 2.5 decades
    assert not c.spans_decades([3.0, 0.05])  # 60 times
    assert not c.spans_decades([3.0, 0.0, 0.001])  # zero has no logarithm
    assert not c.spans_decades([])


def test_labels_have_the_decimals_of_their_step():
    assert [c.tick_label(v, 0.5) for v in (0.0, 0.5, 1.0)] == ["0.0", "0.5", "1.0"]
    assert [c.tick_label(v, 50) for v in (0, 1200)] == ["0", "1,200"]
    assert [c.tick_label(v, 0.02) for v in (0.04, 0.06)] == ["0.04", "0.06"]
    assert [c.log_label(v) for v in (1e-6, 1e-3, 0.1, 1.0, 100.0, 1e4, 1e6)] == [
        "1e-6",
        "0.001",
        "0.1",
        "1",
        "100",
        "10,000",
        "1e6",
    ]


def test_a_scale_maps_values_onto_pixels_linearly_or_by_logarithm():
    linear = c.Scale(0, 200, 72, 620)
    assert (linear(0), linear(100), linear(200)) == (72.0, 346.0, 620.0)
    log = c.Scale(0.01, 10, 202, 24, log=True)
    assert (log(0.01), log(0.1), log(1), log(10)) == (202.0, 142.7, 83.3, 24.0)


def _run(steps: int = 200) -> list[tuple[int, dict[str, float]]]:
    """A loss from 3.85 down two and a half decades, the learning rate halved every 20."""
    return [
        (s, {"loss": 3.85 * 10 ** (-2.5 * s / steps), "lr": 0.05 * 0.5 ** (s // 20)})
        for s in range(1, steps + 1)
    ]


def _points(points: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in points.split())]


def test_a_loss_over_two_decades_is_drawn_on_a_log_axis_with_labelled_ticks():
    chart = c.progress_chart(_run())
    assert chart is not None
    main = chart.main
    assert (main.metric, main.log, main.title) == ("loss", True, "loss (log scale)")
    assert [t.label for t in main.y_ticks] == ["0.01", "0.1", "1", "10"]
    assert [t.label for t in chart.x_ticks] == ["0", "50", "100", "150", "200"]
    assert chart.x_title == "step"
    # The ticks are where their values fall: step 100 half way, the line inside the plot.
    xs = {t.label: t.at for t in chart.x_ticks}
    assert xs["100"] == (chart.left + chart.right) / 2
    points = _points(main.points)
    assert len(points) == 200
    top, bottom = chart.top, main.bottom
    assert all(chart.left <= x <= chart.right and top <= y <= bottom for x, y in points)
    assert main.y_ticks[0].at == bottom
    assert main.y_ticks[-1].at == top


def test_a_loss_within_two_decades_is_linear():
    steps = [(s, {"loss": 2.0 - s / 100}) for s in range(1, 101)]
    chart = c.progress_chart(steps)
    assert chart is not None
    assert not chart.main.log
    assert [t.label for t in chart.main.y_ticks] == ["1.0", "1.2", "1.4", "1.6", "1.8", "2.0"]


def test_the_learning_rate_gets_its_own_panel_and_axis():
    chart = c.progress_chart(_run())
    assert chart is not None
    assert chart.rate is not None
    assert chart.rate.metric == "lr"
    assert chart.rate.title.startswith("learning rate")
    assert chart.rate.height < chart.main.height
    assert chart.rate.y_ticks[0].label != chart.main.y_ticks[0].label
    assert "lr: 0.05 at step 1" in chart.summary
    # Without a loss, a learning rate alone is the main line, with no second panel.
    alone = c.progress_chart([(1, {"lr": 0.1}), (2, {"lr": 0.05})])
    assert alone is not None
    assert alone.main.metric == "lr"
    assert alone.rate is None


def test_checkpoints_are_ticks_the_last_and_the_resume_marked_apart():
    chart = c.progress_chart(
        _run(), checkpoints=list(range(5, 201, 5)), resumes=[60], last_checkpoint=200
    )
    assert chart is not None
    assert [m.step for m in chart.checkpoints] == list(range(5, 201, 5))
    assert {m.kind for m in chart.checkpoints} == {"checkpoint"}
    assert chart.last_checkpoint is not None
    assert (chart.last_checkpoint.kind, chart.last_checkpoint.step) == ("last-checkpoint", 200)
    assert [(m.kind, m.step) for m in chart.resumes] == [("resume", 60)]
    x_of = {step: x for step, (x, _) in zip(range(1, 201), _points(chart.main.points), strict=True)}
    assert chart.resumes[0].x == x_of[60]
    assert chart.last_checkpoint.x == x_of[200] == chart.right
    assert chart.saved == 40
    said = "Resumed from the checkpoint of step 60. 40 checkpoints saved, the last at step 200."
    assert said in chart.summary


def test_marks_outside_the_steps_drawn_are_left_out():
    steps = [(100, {"loss": 2.0}), (200, {"loss": 1.0}), (300, {"loss": 0.5})]
    chart = c.progress_chart(steps, checkpoints=[50, 200, 200], resumes=[30])
    assert chart is not None
    assert [m.step for m in chart.checkpoints] == [200]
    assert chart.resumes == ()
    assert chart.last_checkpoint is not None
    assert chart.last_checkpoint.step == 200


def test_steps_trained_again_after_a_resume_are_drawn_once_as_last_reported():
    # Attempt 1 reported steps 1-12 and died after its checkpoint at 10; attempt 2
    # resumed from 10 and reported 11-14: the line runs 1..14, never back.
    first = [(step, {"loss": 1.0}) for step in range(1, 13)]
    second = [(step, {"loss": 2.0}) for step in range(11, 15)]
    chart = c.progress_chart([*first, *second], checkpoints=[5, 10], resumes=[10])
    assert chart is not None
    points = _points(chart.main.points)
    xs = [x for x, _ in points]
    assert len(xs) == 14
    assert xs == sorted(set(xs))
    ys = [y for _, y in points]
    assert ys[:10] == [ys[0]] * 10
    assert ys[10:] == [ys[-1]] * 4
    assert ys[-1] < ys[0]


def test_non_finite_values_are_left_out_of_the_line():
    steps = [
        (1, {"loss": 2.0}),
        (2, {"loss": math.nan}),
        (3, {"loss": math.inf}),
        (4, {"loss": 1.0}),
        (5, {"loss": -math.inf, "lr": math.nan}),
    ]
    chart = c.progress_chart(steps)
    assert chart is not None
    assert len(_points(chart.main.points)) == 2
    assert "nan" not in chart.main.points
    assert "inf" not in chart.main.points
    assert chart.rate is None  # no finite learning rate: no panel
    assert (chart.first_step, chart.last_step) == (1, 4)
    # Only NaNs: nothing to draw, and no error.
    assert c.progress_chart([(1, {"loss": math.nan}), (2, {"loss": math.nan})]) is None


def test_too_little_to_draw_is_no_chart():
    assert c.progress_chart([]) is None
    assert c.progress_chart([(1, {"loss": 1.0})]) is None  # one point is no line
    assert c.progress_chart([(1, {}), (2, {})]) is None
