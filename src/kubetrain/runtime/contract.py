"""The runtime's side of the contract with the control plane: exit code, message, names.

The control plane reads these values back from the Pod (exit code, termination
message) and the reports endpoint; they are kept here, not in `domain`, since
the runtime must not import pydantic. tests/unit/test_runtime_contract.py
checks they agree with `kubetrain.domain.manifest`.
"""

from __future__ import annotations

from typing import Final

# The Job's podFailurePolicy turns this exit code into FailJob: a failed
# preflight fails the same way on the next Pod.
PREFLIGHT_EXIT_CODE: Final = 86
# The kubelet truncates a termination message beyond this many bytes.
TERMINATION_MESSAGE_LIMIT: Final = 4096
TERMINATION_LOG_DEFAULT: Final = "/dev/termination-log"
# The prefix the diagnosis shows verbatim as the explanation of PREFLIGHT_FAILED.
TERMINATION_PREFIX: Final = "preflight failed: "

# JSON has no NaN or infinity: a metric that is one is sent as the string Protocol
# Buffers' JSON mapping uses for it (a finite one stays a number).
NON_FINITE: Final = ("NaN", "Infinity", "-Infinity")


def encode_metric(number: float) -> float | str:
    """A metric value as a report carries it: the number, or NaN/Infinity/-Infinity spelled."""
    if number != number:  # NaN is the one value not equal to itself
        return "NaN"
    if number in (float("inf"), float("-inf")):
        return "Infinity" if number > 0 else "-Infinity"
    return number


def is_loss(name: str) -> bool:
    """Whether a metric is a loss: `loss`, or one ending `/loss`, `_loss`, `.loss`, `-loss`."""
    return name == "loss" or name.endswith(("/loss", "_loss", ".loss", "-loss"))


# The dataset's own statement of what it is, at its root.
DATASET_STAMP: Final = "kubetrain-dataset.json"

# The preflight checks, in the order they run (docs/runtime.md describes each).
CHECK_NAMES: Final = (
    "gpu-visible",
    "dataset-mounted",
    "dataset-version",
    "config-readable",
    "checkpoint-readable",
    "output-writable",
    "status-reachable",
    "rendezvous-reachable",  # last: a worker waits there for rank 0, after its own checks
)

# Run phases the reporter sends (the RUNNING sub-phases of the control plane).
PHASE_PREFLIGHT: Final = "PREFLIGHT"
PHASE_TRAINING: Final = "TRAINING"


def reports_path(job_id: str) -> str:
    """Where the reporter POSTs, relative to KUBETRAIN_STATUS_URL."""
    return f"/api/v1/jobs/{job_id}/reports"
