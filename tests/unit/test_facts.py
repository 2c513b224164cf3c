"""A job's facts in words (kubetrain.domain.facts): what `kubetrain get job` and the job
page both say, through the same functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kubetrain.domain import facts

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(-5, "0s"), (42, "42s"), (60 * 12, "12m"), (3600 * 3, "3h"), (3600 * 3 + 300, "3h 5m"),
     (86400 * 2 + 3600 * 4, "2d 4h"), (86400, "1d")],
)  # fmt: skip
def test_age_reads_in_the_two_largest_units(seconds: int, text: str) -> None:
    assert facts.age(NOW - timedelta(seconds=seconds), NOW) == text
    assert facts.age(None, NOW) == "-"


def test_sizes_are_shown_in_the_unit_that_shows_them() -> None:
    sizes = (0, 1023, 1024, 4300, 18_022, 2 * 2**20, 3 * 2**30, 5 * 2**40, 3 * 2**50)
    assert [facts.byte_size(n) for n in sizes] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "4.2 KiB",
        "17.6 KiB",
        "2.0 MiB",
        "3.0 GiB",
        "5.0 TiB",
        "3072.0 TiB",
    ]


def test_counts_agree_in_number() -> None:
    assert [facts.count(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]
    assert facts.count(1, "failed attempt") == "1 failed attempt"
    assert facts.dropped_words(1) == "1 event dropped by the reporter"


def test_a_phase_is_current_only_while_the_job_runs() -> None:
    running = facts.phase_fact("TRAINING", "kt-1-a", running=True)
    assert (running.label, str(running), running.current) == ("Phase", "TRAINING on kt-1-a", True)
    done = facts.phase_fact("TRAINING", "kt-1-a", running=False)
    assert (done.label, str(done), done.current) == (
        "Last phase reported",
        "TRAINING by kt-1-a",
        False,
    )


def test_the_last_checkpoint_with_its_size_save_time_and_how_many() -> None:
    checkpoint = {"step": 60, "sizeBytes": 18_022, "durationSeconds": 0.0123}
    assert facts.checkpoint_words(checkpoint) == "step 60, 17.6 KiB in 0.01 s"
    assert facts.checkpoint_words(checkpoint, 40) == (
        "step 60, 17.6 KiB in 0.01 s; 40 checkpoints saved"
    )
    assert facts.checkpoint_words(checkpoint, 1).endswith("; 1 checkpoint saved")


def test_a_moment_in_utc_to_the_second() -> None:
    assert facts.clock(datetime(2026, 12, 2, 13, 0, 5, 999, tzinfo=UTC)) == "2026-12-02 13:00:05"
    naive = datetime(2026, 12, 2, 13, 0, 5)  # a database's naive UTC
    assert facts.clock(naive) == "2026-12-02 13:00:05"
