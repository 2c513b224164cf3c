"""GPU-seconds: what each Pod of a job held, from its binding to a node until it ended.

A Pod holds its GPUs from the moment the scheduler binds it to a node (the kubelet
reserves them from then: image pull, container creation and preflight all happen
on held GPUs) until it ends. Its time splits in two:

* before training: from the binding until its runtime reported TRAINING;
* training: from that report until it ended.

A Pod whose image has no kubetrain runtime never reports; its training is taken to
start when its container started (what the diagnosis assumes too). A Pod that
reported a phase but never TRAINING (a failed preflight) spent all of it before
training. The count is per Pod, so a gang counts every worker, and each attempt
of a job counts its own Pod. Pure: the clock (`now`) is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class UsagePhase(StrEnum):
    BEFORE_TRAINING = "before_training"  # image pull, container creation, preflight
    TRAINING = "training"


# The label of a job that named no GPU type (it took what the scheduler gave it).
ANY_GPU_TYPE = "any"


@dataclass(frozen=True, slots=True)
class PodTime:
    """The moments of one Pod that GPU time is counted from."""

    gpus: int  # the Pod's GPUs (a gang's per-worker count)
    bound_at: datetime | None  # None: never bound, so it held nothing
    training_at: datetime | None  # its TRAINING report, or its container's start (no runtime)
    ended_at: datetime | None  # None: it still holds them


@dataclass(frozen=True, slots=True)
class GpuSeconds:
    before_training: float = 0.0
    training: float = 0.0

    @property
    def total(self) -> float:
        return self.before_training + self.training

    def __add__(self, other: GpuSeconds) -> GpuSeconds:
        return GpuSeconds(
            self.before_training + other.before_training, self.training + other.training
        )

    def of(self, phase: UsagePhase) -> float:
        return self.training if phase is UsagePhase.TRAINING else self.before_training


def training_start(
    *, reported_training: datetime | None, reported_any: bool, started_at: datetime | None
) -> datetime | None:
    """When a Pod began training: its TRAINING report; without any report (no runtime
    in the image), its container's start; a Pod that reported, but never TRAINING, never."""
    if reported_training is not None:
        return reported_training
    return None if reported_any else started_at


def pod_gpu_seconds(pod: PodTime, now: datetime, since: datetime | None = None) -> GpuSeconds:
    """GPU-seconds of one Pod up to `now` (an open Pod counts until then), only the
    part after `since` when given."""
    if pod.gpus <= 0 or pod.bound_at is None:
        return GpuSeconds()
    start = pod.bound_at if since is None else max(pod.bound_at, since)
    end = min(pod.ended_at or now, now)
    if end <= start:
        return GpuSeconds()
    training_at = pod.training_at
    # The Pod's clock dates its report: keep it inside the time the Pod held GPUs.
    split = end if training_at is None else min(max(training_at, start), end)
    return GpuSeconds(
        before_training=pod.gpus * (split - start).total_seconds(),
        training=pod.gpus * (end - split).total_seconds(),
    )


def total_gpu_seconds(
    pods: Iterable[PodTime], now: datetime, since: datetime | None = None
) -> GpuSeconds:
    total = GpuSeconds()
    for pod in pods:
        total += pod_gpu_seconds(pod, now, since)
    return total
