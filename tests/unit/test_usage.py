"""GPU-seconds of a Pod: from its binding until it ends, split at its TRAINING report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kubetrain.domain.usage import GpuSeconds, PodTime, pod_gpu_seconds, training_start

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_a_pod_counts_its_gpus_from_binding_to_end_split_at_its_training_report():
    # Bound at 0, pulled and preflighted for 5 minutes, trained 55: 8 GPUs.
    pod = PodTime(gpus=8, bound_at=at(0), training_at=at(5), ended_at=at(60))
    assert pod_gpu_seconds(pod, now=at(90)) == GpuSeconds(8 * 5 * 60, 8 * 55 * 60)


def test_a_running_pod_counts_until_now_and_a_window_counts_only_its_part():
    pod = PodTime(gpus=2, bound_at=at(0), training_at=at(10), ended_at=None)
    assert pod_gpu_seconds(pod, now=at(30)) == GpuSeconds(2 * 600, 2 * 1200)
    assert pod_gpu_seconds(pod, now=at(30), since=at(20)) == GpuSeconds(0, 2 * 600)
    assert pod_gpu_seconds(pod, now=at(30), since=at(5)) == GpuSeconds(2 * 300, 2 * 1200)
    assert pod_gpu_seconds(pod, now=at(30), since=at(40)) == GpuSeconds()


def test_what_holds_no_gpu_counts_nothing():
    assert pod_gpu_seconds(PodTime(0, at(0), at(1), at(9)), now=at(10)) == GpuSeconds()
    assert pod_gpu_seconds(PodTime(1, None, None, None), now=at(10)) == GpuSeconds()


def test_a_report_dated_outside_the_pods_time_by_its_clock_is_kept_inside():
    early = PodTime(gpus=1, bound_at=at(0), training_at=at(-1), ended_at=at(10))
    late = PodTime(gpus=1, bound_at=at(0), training_at=at(11), ended_at=at(10))
    assert pod_gpu_seconds(early, now=at(20)) == GpuSeconds(0, 600)
    assert pod_gpu_seconds(late, now=at(20)) == GpuSeconds(600, 0)


def test_training_starts_at_the_report_else_at_the_container_start_without_a_runtime():
    assert training_start(reported_training=at(5), reported_any=True, started_at=at(1)) == at(5)
    # No runtime in the image: it never reports; it trains once its container runs.
    assert training_start(reported_training=None, reported_any=False, started_at=at(1)) == at(1)
    # It reported PREFLIGHT and never TRAINING (the preflight failed): none of it trained.
    assert training_start(reported_training=None, reported_any=True, started_at=at(1)) is None
    pod = PodTime(gpus=1, bound_at=at(0), training_at=None, ended_at=at(3))
    assert pod_gpu_seconds(pod, now=at(20)) == GpuSeconds(180, 0)
