"""The business state machine: what a user sees and what the API promises.

`CREATED -> QUEUED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED`. The business
state is derived from the runtime state (what Kubernetes says) by one pure
function; this module holds the states, the reason codes and which moves are
legal, so that every history row can be checked against it.
"""

from __future__ import annotations

from enum import StrEnum


class BusinessState(StrEnum):
    CREATED = "CREATED"  # our record exists; the Kubernetes Job does not yet
    QUEUED = "QUEUED"  # the Job exists; training has not started
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({BusinessState.SUCCEEDED, BusinessState.FAILED, BusinessState.CANCELLED})

_S = BusinessState
# A job runs only once its Kubernetes Job exists, so it passes through QUEUED even
# when the watch shows it running before the create is recorded (the syncer writes
# both steps). A Pod that Kubernetes recreates (node lost, preempted) takes RUNNING
# back to QUEUED for the next attempt; nothing leaves a terminal state.
TRANSITIONS: dict[BusinessState, frozenset[BusinessState]] = {
    _S.CREATED: frozenset({_S.QUEUED, _S.FAILED, _S.CANCELLED}),
    _S.QUEUED: frozenset({_S.RUNNING, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED}),
    _S.RUNNING: frozenset({_S.QUEUED, _S.SUCCEEDED, _S.FAILED, _S.CANCELLED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
}


def can_move(current: BusinessState, target: BusinessState) -> bool:
    """True when `current -> target` is a legal step (staying put is not a step)."""
    return target in TRANSITIONS[current]


class Link(StrEnum):
    """The links of the chain a training job passes, in order."""

    CONTROL_PLANE = "control-plane"
    QUOTA = "quota"
    SCHEDULER = "scheduler"
    GPU_NODE = "gpu-node"
    DEVICE_PLUGIN = "device-plugin"
    RUNTIME = "runtime"
    VOLUME = "volume"
    PREFLIGHT = "preflight"
    TRAINING = "training"
    JOB = "job"


class ReasonCode(StrEnum):
    """Every reason code of DESIGN.md's catalog."""

    JOB_NOT_CREATED = "JOB_NOT_CREATED"
    WAITING_FOR_QUOTA = "WAITING_FOR_QUOTA"
    QUEUE_INACTIVE = "QUEUE_INACTIVE"
    NO_GPU_NODES = "NO_GPU_NODES"
    INSUFFICIENT_GPU = "INSUFFICIENT_GPU"
    INSUFFICIENT_CPU = "INSUFFICIENT_CPU"
    INSUFFICIENT_MEMORY = "INSUFFICIENT_MEMORY"
    INSUFFICIENT_RESOURCE = "INSUFFICIENT_RESOURCE"
    PLACEMENT_RULES = "PLACEMENT_RULES"
    GPU_ALLOCATION_FAILED = "GPU_ALLOCATION_FAILED"
    UNTOLERATED_TAINT = "UNTOLERATED_TAINT"
    NODE_SELECTOR_MISMATCH = "NODE_SELECTOR_MISMATCH"
    FLAVOR_NODE_MISMATCH = "FLAVOR_NODE_MISMATCH"
    NODE_NOT_READY = "NODE_NOT_READY"
    PVC_NOT_FOUND = "PVC_NOT_FOUND"
    PVC_UNBOUND = "PVC_UNBOUND"
    VOLUME_NODE_CONFLICT = "VOLUME_NODE_CONFLICT"
    VOLUME_MOUNT_FAILED = "VOLUME_MOUNT_FAILED"
    VOLUME_SOURCE_NOT_FOUND = "VOLUME_SOURCE_NOT_FOUND"
    VOLUME_PATH_NOT_FOUND = "VOLUME_PATH_NOT_FOUND"
    VOLUME_MULTI_ATTACH = "VOLUME_MULTI_ATTACH"
    SIDECAR_RESTARTING = "SIDECAR_RESTARTING"
    SCHEDULING_GATED = "SCHEDULING_GATED"
    IMAGE_PULL_FAILED = "IMAGE_PULL_FAILED"
    CONTAINER_CONFIG_ERROR = "CONTAINER_CONFIG_ERROR"
    POLICY_REFUSED = "POLICY_REFUSED"
    CONTAINER_CREATING = "CONTAINER_CREATING"
    SCHEDULING = "SCHEDULING"
    GANG_PARTIAL = "GANG_PARTIAL"
    RENDEZVOUS = "RENDEZVOUS"
    PREFLIGHT = "PREFLIGHT"
    TRAINING = "TRAINING"
    NO_PROGRESS = "NO_PROGRESS"
    LOSS_NOT_FINITE = "LOSS_NOT_FINITE"
    PREFLIGHT_FAILED = "PREFLIGHT_FAILED"
    CRASH_LOOP = "CRASH_LOOP"
    OOM_KILLED = "OOM_KILLED"
    EXIT_NONZERO = "EXIT_NONZERO"
    EVICTED = "EVICTED"
    NODE_LOST = "NODE_LOST"
    PREEMPTED = "PREEMPTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    BACKOFF_LIMIT_EXCEEDED = "BACKOFF_LIMIT_EXCEEDED"
    JOB_DELETED = "JOB_DELETED"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
