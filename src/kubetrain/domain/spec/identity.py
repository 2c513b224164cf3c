"""Identity: a TrainingJob normalised to one spelling per value, and its digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kubetrain.domain.quantity import canonical_bytes, canonical_cpu
from kubetrain.domain.spec.fields import duration_seconds
from kubetrain.domain.spec.models import TrainingJob

__all__ = ["spec_digest"]


def _normalized(job: TrainingJob, dumped: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job with each value in one spelling: equal amounts, equal output. `dumped`:
    the job's `model_dump(mode="json")` if the caller has it (it is not changed)."""
    if dumped is None:
        dumped = job.model_dump(mode="json")
    # Copied along the paths changed below, the rest shared (only read).
    data = {**dumped, "spec": {**dumped["spec"]}}
    resources = data["spec"]["resources"] = {**data["spec"]["resources"]}
    resources["requests"] = {**resources["requests"]}
    resources["limits"] = {**resources["limits"]}
    resources["requests"]["cpu"] = canonical_cpu(job.spec.resources.requests.cpu)
    resources["requests"]["memory"] = canonical_bytes(job.spec.resources.requests.memory)
    limits = job.spec.resources.limits
    if limits.cpu is not None:
        resources["limits"]["cpu"] = canonical_cpu(limits.cpu)
    if limits.memory is not None:
        resources["limits"]["memory"] = canonical_bytes(limits.memory)
    if job.spec.cache is not None:
        size = canonical_bytes(job.spec.cache.size)
        data["spec"]["cache"] = {**data["spec"]["cache"], "size": size}
    if job.spec.max_runtime is not None:
        data["spec"]["maxRuntime"] = f"{duration_seconds(job.spec.max_runtime)}s"
    if job.spec.stall_after is None:
        del data["spec"]["stallAfter"]  # the digests of jobs made before it stay
    else:
        data["spec"]["stallAfter"] = f"{duration_seconds(job.spec.stall_after)}s"
    if job.spec.cancel_after_stall is None:
        del data["spec"]["cancelAfterStall"]  # likewise
    else:
        data["spec"]["cancelAfterStall"] = f"{duration_seconds(job.spec.cancel_after_stall)}s"
    if job.spec.rendezvous_timeout is None:
        del data["spec"]["rendezvousTimeout"]  # likewise
    else:
        data["spec"]["rendezvousTimeout"] = f"{duration_seconds(job.spec.rendezvous_timeout)}s"
    if not job.spec.cancel_on_non_finite_loss:
        del data["spec"]["cancelOnNonFiniteLoss"]  # the digests of jobs made before it stay
    if job.spec.workers == 1:
        # One worker is every job made before gangs: their digests stay what they were.
        del data["spec"]["workers"]
    return data


def spec_digest(job: TrainingJob, dumped: dict[str, Any] | None = None) -> str:
    """sha256 (hex) of the normalized job (metadata and spec) as canonical JSON.
    `dumped`: the job's `model_dump(mode="json")`, if the caller made it already.

    Two submissions with the same idempotency key are the same when their digests
    are: `cpu: 1` and `cpu: "1000m"`, `maxRuntime: 90m` and `1h30m`, labels in any
    order. Env order is kept: later entries may refer to earlier ones as $(NAME).
    """
    canonical = json.dumps(
        _normalized(job, dumped), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
