"""diagnose() over every recorded fixture: state, reason, waitable, blockers, nodes, raw fields."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubetrain.domain.diagnosis import ChainState, Diagnosis, PodReport
from kubetrain.domain.reasons import CATALOG
from kubetrain.domain.states import BusinessState, Link, ReasonCode
from tests.unit.diagnosis_helpers import NOW, SNAPSHOTS, dump, items, recorded, run, the_job

pytestmark = pytest.mark.unit

R = ReasonCode
S = BusinessState


@dataclass(frozen=True)
class Expected:
    state: BusinessState
    reason: ReasonCode
    waitable: bool | None
    blockers: tuple[tuple[ReasonCode, int | None], ...]  # (reason, nodes) in order
    raw_reason: str | None
    raw_message: str | None = None  # a part of it
    chain: dict[Link, ChainState] = field(default_factory=dict)
    nodes: dict[str, tuple[bool, str]] = field(default_factory=dict)  # name -> (fits, a "why")
    attempts: int = 1
    explanation: str = ""  # a part of it
    numbers: dict[str, object] = field(default_factory=dict)  # the primary blocker's


SCHEDULER_BLOCKING = {Link.QUOTA: ChainState.PASSED, Link.SCHEDULER: ChainState.BLOCKING}
TAINT = "taint nvidia.com/gpu=present:NoSchedule not tolerated"


def passed_but(**others: ChainState) -> dict[Link, ChainState]:
    """Every link passed but the named ones (by Link member name)."""
    return {link: others.get(link.name, ChainState.PASSED) for link in Link}


CASES: dict[str, Expected] = {
    "succeeded": Expected(
        S.SUCCEEDED,
        R.COMPLETED,
        None,
        (),
        "CompletionsReached",
        "succeeded pods",
        chain=passed_but(PREFLIGHT=ChainState.NOT_OBSERVED, VOLUME=ChainState.NOT_NEEDED),
    ),
    # The real scheduler took the Job's GPUs for a higher-priority Pod; the
    # replacement waits for GPUs, and the preemption says why it is back in line.
    "preempted": Expected(
        S.QUEUED,
        R.INSUFFICIENT_GPU,
        True,
        ((R.INSUFFICIENT_GPU, 4), (R.PREEMPTED, None)),
        "Unschedulable",
        "4 Insufficient nvidia.com/gpu",
        chain=SCHEDULER_BLOCKING,
        nodes={
            "gpu-h100-0": (False, "nvidia.com/gpu 8/8 used, needs 8"),
            "cpu-0": (False, "no nvidia.com/gpu"),
        },
        attempts=2,
        explanation="Needs 8 GPUs; the most free on a node the job may use is 0 of 8",
    ),
    "backoff-limit": Expected(
        S.FAILED,
        R.EXIT_NONZERO,
        None,
        ((R.EXIT_NONZERO, None), (R.BACKOFF_LIMIT_EXCEEDED, None)),
        "Error",
        attempts=2,
        explanation="exited with code 2",
    ),
    "deadline-exceeded": Expected(
        S.FAILED,
        R.DEADLINE_EXCEEDED,
        None,
        ((R.DEADLINE_EXCEEDED, None),),
        "DeadlineExceeded",
        "active longer than specified deadline",
        chain={Link.JOB: ChainState.FAILED},
        # The deadline deleted the Pod; the Job controller's events still name it.
        attempts=1,
    ),
    "running": Expected(
        S.RUNNING,
        R.TRAINING,
        None,
        (),
        None,
        explanation="no report from kubetrain's runtime in the container yet",
        chain={
            Link.PREFLIGHT: ChainState.NOT_OBSERVED,  # nothing reported
            Link.TRAINING: ChainState.ACTIVE,
            Link.JOB: ChainState.NOT_REACHED,
        },
    ),
    "insufficient-gpu": Expected(
        S.QUEUED,
        R.INSUFFICIENT_GPU,
        False,
        ((R.INSUFFICIENT_GPU, 4),),
        "Unschedulable",
        "4 Insufficient nvidia.com/gpu",
        chain=SCHEDULER_BLOCKING,
        nodes={
            "gpu-h100-0": (False, "nvidia.com/gpu: has 8, needs 16"),
            "cpu-0": (False, "no nvidia.com/gpu"),
        },
        explanation="Needs 16 GPUs on one node; the largest node has 8",
        numbers={"resource": "nvidia.com/gpu", "requested": "16", "allocatable": "8"},
    ),
    "gpu-busy": Expected(
        S.QUEUED,
        R.INSUFFICIENT_GPU,
        True,
        ((R.INSUFFICIENT_GPU, 4),),
        "Unschedulable",
        nodes={
            "gpu-h100-0": (False, "nvidia.com/gpu 8/8 used, needs 4"),
            "cpu-1": (False, "no nvidia.com/gpu"),
        },
        explanation="the most free on a node the job may use is 0 of 8",
        numbers={"resource": "nvidia.com/gpu", "requested": "4", "free": "0", "allocatable": "8"},
    ),
    "untolerated-taint": Expected(
        S.QUEUED,
        R.UNTOLERATED_TAINT,
        False,
        ((R.UNTOLERATED_TAINT, 2), (R.INSUFFICIENT_GPU, 2)),
        "Unschedulable",
        "had untolerated taint {nvidia.com/gpu: present}",
        chain=SCHEDULER_BLOCKING,
        nodes={"gpu-h100-1": (False, TAINT), "cpu-0": (False, "no nvidia.com/gpu")},
        explanation="nvidia.com/gpu=present:NoSchedule",
    ),
    "node-selector-mismatch": Expected(
        S.QUEUED,
        R.NODE_SELECTOR_MISMATCH,
        False,
        ((R.NODE_SELECTOR_MISMATCH, 4),),
        "Unschedulable",
        "didn't match Pod's node affinity/selector",
        nodes={"gpu-h100-0": (False, "selector accelerator=nvidia-a100 ≠ nvidia-h100")},
        explanation="accelerator=nvidia-h100 (2)",
    ),
    "no-gpu-nodes": Expected(
        S.QUEUED,
        R.NO_GPU_NODES,
        False,
        ((R.NO_GPU_NODES, 4),),
        "Unschedulable",
        "4 Insufficient nvidia.com/gpu",
        # One link blocks: the scheduler, where the Pod stands; the device plugin it
        # lacks is after it, not reached.
        chain={
            Link.SCHEDULER: ChainState.BLOCKING,
            Link.GPU_NODE: ChainState.NOT_REACHED,
            Link.DEVICE_PLUGIN: ChainState.NOT_REACHED,
        },
        nodes={"gpu-h100-0": (False, "no nvidia.com/gpu")},
        explanation="no node advertises nvidia.com/gpu",
    ),
    "insufficient-cpu": Expected(
        S.QUEUED,
        R.INSUFFICIENT_CPU,
        False,
        ((R.INSUFFICIENT_CPU, 2), (R.UNTOLERATED_TAINT, 2)),
        "Unschedulable",
        "2 Insufficient cpu",
        nodes={"cpu-0": (False, "cpu: has 32, needs 200"), "gpu-h100-0": (False, TAINT)},
        explanation="Needs 200 cpu on one node",
        numbers={"resource": "cpu", "requested": "200", "allocatable": "32"},
    ),
    "insufficient-memory": Expected(
        S.QUEUED,
        R.INSUFFICIENT_MEMORY,
        False,
        ((R.INSUFFICIENT_MEMORY, 2), (R.UNTOLERATED_TAINT, 2)),
        "Unschedulable",
        "2 Insufficient memory",
        nodes={"cpu-0": (False, "memory: has 128Gi, needs 4Ti"), "gpu-h100-0": (False, TAINT)},
        explanation="Needs 4Ti memory on one node; the largest node the job may use has 128Gi",
        numbers={"resource": "memory", "requested": "4Ti", "allocatable": "128Gi"},
    ),
    "insufficient-resource": Expected(
        S.QUEUED,
        R.INSUFFICIENT_RESOURCE,
        False,
        ((R.INSUFFICIENT_RESOURCE, 2), (R.UNTOLERATED_TAINT, 2)),
        "Unschedulable",
        "2 Insufficient example.com/fpga",
        nodes={"cpu-0": (False, "no example.com/fpga"), "gpu-h100-0": (False, TAINT)},
        explanation="no node advertises example.com/fpga",
        numbers={"resource": "example.com/fpga", "requested": "1", "allocatable": "0"},
    ),
    "scheduling": Expected(
        S.QUEUED,
        R.SCHEDULING,
        True,
        ((R.SCHEDULING, None),),
        None,
        chain={Link.QUOTA: ChainState.PASSED, Link.SCHEDULER: ChainState.ACTIVE},
    ),
    "cordoned": Expected(
        S.QUEUED,
        R.NODE_NOT_READY,
        True,
        ((R.NODE_NOT_READY, 2), (R.INSUFFICIENT_GPU, 2)),
        "Unschedulable",
        "were unschedulable",
        chain={Link.SCHEDULER: ChainState.BLOCKING, Link.GPU_NODE: ChainState.NOT_REACHED},
        nodes={"gpu-h100-0": (False, "cordoned")},
        explanation="Cordoned nodes",
    ),
    "placement-rules": Expected(
        S.QUEUED,
        R.PLACEMENT_RULES,
        False,
        ((R.PLACEMENT_RULES, 2), (R.UNTOLERATED_TAINT, 2)),
        "Unschedulable",
        "didn't match pod affinity rules",
        nodes={"cpu-0": (True, "")},
    ),
    "pvc-not-found": Expected(
        S.QUEUED,
        R.PVC_NOT_FOUND,
        False,
        ((R.PVC_NOT_FOUND, 4),),
        "Unschedulable",
        'persistentvolumeclaim "dataset-imagenet" not found',
        chain={Link.SCHEDULER: ChainState.BLOCKING, Link.VOLUME: ChainState.NOT_REACHED},
        explanation='Claim "dataset-imagenet" does not exist',
    ),
    "pvc-unbound": Expected(
        S.QUEUED,
        R.PVC_UNBOUND,
        False,
        ((R.PVC_UNBOUND, 4),),
        "Unschedulable",
        "unbound immediate PersistentVolumeClaims",
        explanation="no storage class is set",
    ),
    "waiting-for-quota": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        False,
        ((R.WAITING_FOR_QUOTA, None),),
        "FailedCreate",
        "exceeded quota: gpu-quota",
        attempts=0,
        chain={
            Link.CONTROL_PLANE: ChainState.PASSED,
            Link.QUOTA: ChainState.BLOCKING,
            Link.SCHEDULER: ChainState.NOT_REACHED,
        },
        explanation="the limit is 2, 0 in use",
        numbers={
            "resource": "requests.nvidia.com/gpu",
            "requested": "4",
            "limit": "2",
            "used": "0",
        },
    ),
    "quota-busy": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        True,
        ((R.WAITING_FOR_QUOTA, None),),
        "FailedCreate",
        "used: requests.nvidia.com/gpu=6",
        attempts=0,
        numbers={"requested": "4", "limit": "8", "used": "6"},
    ),
    # The API server's own refusals of the job's Pod (kube-apiserver v1.33 admission).
    "quota-several": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        True,
        ((R.WAITING_FOR_QUOTA, None),),
        "FailedCreate",
        "exceeded quota: compute, requested: limits.memory=8Gi,requests.cpu=2",
        attempts=0,
        chain={
            Link.CONTROL_PLANE: ChainState.PASSED,
            Link.QUOTA: ChainState.BLOCKING,
            Link.SCHEDULER: ChainState.NOT_REACHED,
        },
        explanation="ResourceQuota compute: needs 8Gi limits.memory; the limit is 64Gi, 60Gi in "
        "use; needs 2 requests.cpu; the limit is 16, 15 in use",
        numbers={"resource": "limits.memory", "requested": "8Gi", "limit": "64Gi", "used": "60Gi"},
    ),
    "quota-unspecified": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        False,
        ((R.WAITING_FOR_QUOTA, None),),
        "FailedCreate",
        "must specify limits.cpu for: trainer; requests.cpu for: trainer",
        attempts=0,
        chain={Link.QUOTA: ChainState.BLOCKING, Link.SCHEDULER: ChainState.NOT_REACHED},
        explanation="ResourceQuota compute requires the Pod to declare limits.cpu, requests.cpu",
    ),
    "limit-range": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        False,
        ((R.WAITING_FOR_QUOTA, None),),
        "FailedCreate",
        "maximum cpu usage per Container is 2, but limit is 4",
        attempts=0,
        chain={Link.QUOTA: ChainState.BLOCKING, Link.SCHEDULER: ChainState.NOT_REACHED},
        explanation="The namespace's LimitRange: needs 4 cpu; the limit is 2",
        numbers={"resource": "cpu", "requested": "4", "limit": "2"},
    ),
    # Not a quota: the raw message says which policy and what to set.
    "pod-security": Expected(
        S.QUEUED,
        R.POLICY_REFUSED,
        False,
        ((R.POLICY_REFUSED, None),),
        "FailedCreate",
        'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false',
        attempts=0,
        chain={
            Link.QUOTA: ChainState.BLOCKING,
            Link.SCHEDULER: ChainState.NOT_REACHED,
            Link.RUNTIME: ChainState.NOT_REACHED,
        },
        explanation="an admission policy of the namespace (PodSecurity",
    ),
    "container-creating": Expected(
        S.QUEUED,
        R.CONTAINER_CREATING,
        True,
        ((R.CONTAINER_CREATING, None),),
        "ContainerCreating",
        chain={Link.GPU_NODE: ChainState.PASSED, Link.RUNTIME: ChainState.ACTIVE},
        explanation="On node gpu-h100-",
    ),
    # The kubelets report NotReady; the node-lifecycle controller's taint keeps Pods off.
    "node-not-ready": Expected(
        S.QUEUED,
        R.NODE_NOT_READY,
        True,
        ((R.NODE_NOT_READY, 2), (R.INSUFFICIENT_GPU, 2)),
        "Unschedulable",
        "2 node(s) had untolerated taint {node.kubernetes.io/not-ready: }",
        chain={Link.SCHEDULER: ChainState.BLOCKING, Link.GPU_NODE: ChainState.NOT_REACHED},
        nodes={"gpu-h100-0": (False, "NotReady"), "cpu-0": (False, "no nvidia.com/gpu")},
        explanation="node.kubernetes.io/not-ready",
    ),
    "volume-node-conflict": Expected(
        S.QUEUED,
        R.VOLUME_NODE_CONFLICT,
        False,
        ((R.VOLUME_NODE_CONFLICT, 2), (R.INSUFFICIENT_GPU, 2)),
        "Unschedulable",
        "2 node(s) didn't match PersistentVolume's node affinity",
        chain={Link.SCHEDULER: ChainState.BLOCKING, Link.VOLUME: ChainState.NOT_REACHED},
    ),
    # Caught between the Node's deletion and Pod garbage collection: the Pod's
    # status still says Running.
    "node-lost": Expected(
        S.QUEUED,
        R.NODE_LOST,
        True,
        ((R.NODE_LOST, None),),
        "NotFound",
        "not found",
        # The next attempt must get past a GPU node again: training is not reached.
        chain={
            Link.GPU_NODE: ChainState.BLOCKING,
            Link.TRAINING: ChainState.NOT_REACHED,
            Link.JOB: ChainState.NOT_REACHED,
        },
        explanation="no longer exists",
    ),
    # After Pod garbage collection failed and removed the Pod (it writes no event):
    # the new Pod waits for GPUs, and the vanished node says why it is back in line.
    "node-lost-replaced": Expected(
        S.QUEUED,
        R.INSUFFICIENT_GPU,
        True,
        ((R.INSUFFICIENT_GPU, 3), (R.NODE_LOST, None)),
        "Unschedulable",
        "3 Insufficient nvidia.com/gpu",
        chain=SCHEDULER_BLOCKING,
        nodes={"gpu-h100-0": (False, "nvidia.com/gpu 8/8 used, needs 8")},
        attempts=2,
    ),
    # Deleted with kubectl: no Job, its Pod gone with it (garbage collector).
    "job-deleted": Expected(
        S.FAILED,
        R.JOB_DELETED,
        None,
        ((R.JOB_DELETED, None),),
        None,
        chain={Link.CONTROL_PLANE: ChainState.FAILED},
        explanation="is gone from namespace",
    ),
    "scheduling-gated": Expected(
        S.QUEUED,
        R.SCHEDULING_GATED,
        True,
        ((R.SCHEDULING_GATED, None),),
        "SchedulingGated",
        "non-empty scheduling gates",
        explanation="example.com/queue",
    ),
    # Gangs (workers > 1): Indexed Jobs recorded on the default pool (two 8-GPU nodes).
    "gang-succeeded": Expected(
        S.SUCCEEDED,
        R.COMPLETED,
        None,
        (),
        "CompletionsReached",
        chain=passed_but(PREFLIGHT=ChainState.NOT_OBSERVED, VOLUME=ChainState.NOT_NEEDED),
        attempts=2,
    ),
    "gang-running": Expected(
        S.RUNNING,
        R.RENDEZVOUS,
        None,
        (),
        None,
        chain={Link.PREFLIGHT: ChainState.NOT_OBSERVED, Link.TRAINING: ChainState.ACTIVE},
        attempts=2,
        explanation="All 2 workers run (ranks 0, 1 on gpu-h100-1, gpu-h100-0)",
    ),
    # The real scheduler placed ranks 0 and 2; rank 1 can never have a node.
    "gang-partial": Expected(
        S.QUEUED,
        R.INSUFFICIENT_GPU,
        False,
        ((R.INSUFFICIENT_GPU, 4), (R.GANG_PARTIAL, None)),
        "Unschedulable",
        "Insufficient nvidia.com/gpu",
        chain=SCHEDULER_BLOCKING,
        nodes={
            "gpu-h100-0": (False, "nvidia.com/gpu 8/8 used, needs 8"),
            "gpu-h100-1": (False, "nvidia.com/gpu 8/8 used, needs 8"),
        },
        attempts=3,
        explanation="the gang needs 3 nodes with 8 free GPUs; the cluster has 2 such nodes",
    ),
    "gang-worker-failed": Expected(
        S.FAILED,
        R.EXIT_NONZERO,
        None,
        ((R.EXIT_NONZERO, None),),
        "Error",
        "NCCL error: unhandled system error",
        chain={Link.TRAINING: ChainState.FAILED, Link.JOB: ChainState.FAILED},
        attempts=2,
        explanation="Rank 1 (Pod kt-gang-worker-failed-1-",
    ),
    # Recorded from real kubelets (the `real` pool: containerd, runc, real cgroups).
    "real-succeeded": Expected(
        S.SUCCEEDED,
        R.COMPLETED,
        None,
        (),
        "CompletionsReached",
        "succeeded pods",
        chain=passed_but(
            DEVICE_PLUGIN=ChainState.NOT_NEEDED,
            PREFLIGHT=ChainState.NOT_OBSERVED,
            VOLUME=ChainState.NOT_NEEDED,
        ),
    ),
    # The termination message is the log's tail (FallbackToLogsOnError), which begins
    # with `kubetrain run`'s preflight lines: the training's own last words explain it.
    "real-exit-nonzero": Expected(
        S.FAILED,
        R.EXIT_NONZERO,
        None,
        ((R.EXIT_NONZERO, None), (R.BACKOFF_LIMIT_EXCEEDED, None)),
        "Error",
        "loss is NaN at step 120",
        chain={
            Link.PREFLIGHT: ChainState.PASSED,
            Link.TRAINING: ChainState.FAILED,
            Link.JOB: ChainState.FAILED,
        },
        explanation="exited with code 1: loss is NaN at step 120",
    ),
    "real-oom-killed": Expected(
        S.FAILED,
        R.OOM_KILLED,
        None,
        ((R.OOM_KILLED, None), (R.BACKOFF_LIMIT_EXCEEDED, None)),
        "OOMKilled",
        chain={Link.TRAINING: ChainState.FAILED},
        explanation="was OOM-killed (exit code 137)",
    ),
    # kubetrain's podFailurePolicy fails the Job at the preflight's exit code: no
    # backoff-limit verdict beside it.
    "real-preflight-failed": Expected(
        S.FAILED,
        R.PREFLIGHT_FAILED,
        None,
        ((R.PREFLIGHT_FAILED, None),),
        "Error",
        "preflight failed: gpu-visible: expected 1 GPU, found 0 (checked NVIDIA_VISIBLE_DEVICES",
        chain={
            Link.VOLUME: ChainState.NOT_NEEDED,  # no volumes
            Link.PREFLIGHT: ChainState.FAILED,
            Link.TRAINING: ChainState.NOT_REACHED,
        },
    ),
    # The kubelet follows containerd's words ("Failed to pull image …: connect:
    # connection refused") with "Error: ErrImagePull" and "Error: ImagePullBackOff",
    # which only repeat the waiting reason.
    "real-image-pull-failed": Expected(
        S.QUEUED,
        R.IMAGE_PULL_FAILED,
        False,
        ((R.IMAGE_PULL_FAILED, None),),
        "ImagePullBackOff",
        'Back-off pulling image "127.0.0.1:',
        chain={Link.GPU_NODE: ChainState.PASSED, Link.RUNTIME: ChainState.BLOCKING},
        explanation="failed to pull and unpack image",
    ),
    # The user's Secret is missing: theirs to create, waiting will not help.
    "real-mount-failed": Expected(
        S.QUEUED,
        R.VOLUME_SOURCE_NOT_FOUND,
        False,
        ((R.VOLUME_SOURCE_NOT_FOUND, None),),
        "FailedMount",
        'MountVolume.SetUp failed for volume "config" : secret "model-config" not found',
        chain={Link.RUNTIME: ChainState.BLOCKING, Link.VOLUME: ChainState.NOT_NEEDED},
        explanation='Secret "model-config" in namespace fixture-real-mount-failed-',
    ),
    # An emptyDir past its sizeLimit; the kubelet's message ends in a space.
    "real-evicted": Expected(
        S.FAILED,
        R.EVICTED,
        None,
        ((R.EVICTED, None), (R.BACKOFF_LIMIT_EXCEEDED, None)),
        "Evicted",
        'Usage of EmptyDir volume "cache" exceeds the limit "1Mi".',
        chain={Link.GPU_NODE: ChainState.FAILED, Link.JOB: ChainState.FAILED},
        explanation='exceeds the limit "1Mi".',
    ),
    # A Job that is not kubetrain's (restartPolicy OnFailure): only such a Pod loops.
    "real-crash-loop": Expected(
        S.QUEUED,
        R.CRASH_LOOP,
        False,
        ((R.CRASH_LOOP, None),),
        "CrashLoopBackOff",
        "back-off 10s restarting failed container=trainer",
        chain={Link.RUNTIME: ChainState.PASSED, Link.TRAINING: ChainState.BLOCKING},
        explanation="Last exit code 1: CUDA error: an illegal memory access",
    ),
    # The device plugin stopped after the node counted its GPUs: the device manager
    # refuses the Pod at admission, before any container.
    "real-gpu-allocation-failed": Expected(
        S.FAILED,
        R.GPU_ALLOCATION_FAILED,
        None,
        ((R.GPU_ALLOCATION_FAILED, None), (R.BACKOFF_LIMIT_EXCEEDED, None)),
        "UnexpectedAdmissionError",
        "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
        "unhealthy devices nvidia.com/gpu, which is unexpected",
        chain={
            Link.GPU_NODE: ChainState.PASSED,
            Link.DEVICE_PLUGIN: ChainState.FAILED,
            Link.RUNTIME: ChainState.NOT_REACHED,
        },
    ),
    "real-config-error": Expected(
        S.QUEUED,
        R.CONTAINER_CONFIG_ERROR,
        False,
        ((R.CONTAINER_CONFIG_ERROR, None),),
        "CreateContainerConfigError",
        'secret "wandb" not found',
        chain={Link.GPU_NODE: ChainState.PASSED, Link.RUNTIME: ChainState.BLOCKING},
        explanation='Secret "wandb" not found',
    ),
    # Mount failures by cause, from the real kubelet (docs/diagnosis.md, "Volumes the
    # kubelet cannot mount"): the object, the namespace and the volume named.
    "real-mount-missing-configmap": Expected(
        S.QUEUED,
        R.VOLUME_SOURCE_NOT_FOUND,
        False,
        ((R.VOLUME_SOURCE_NOT_FOUND, None),),
        "FailedMount",
        'MountVolume.SetUp failed for volume "cfg" : configmap "no-such-config" not found',
        chain={Link.GPU_NODE: ChainState.PASSED, Link.RUNTIME: ChainState.BLOCKING},
        explanation='ConfigMap "no-such-config" in namespace fixture-real-mount-missing-configmap-',
    ),
    "real-mount-missing-projected": Expected(
        S.QUEUED,
        R.VOLUME_SOURCE_NOT_FOUND,
        False,
        ((R.VOLUME_SOURCE_NOT_FOUND, None),),
        "FailedMount",
        '[configmap "tokenizer-vocab" not found, secret "hub-token" not found]',
        chain={Link.RUNTIME: ChainState.BLOCKING},
        explanation='ConfigMap "tokenizer-vocab", Secret "hub-token" in namespace',
    ),
    "real-mount-missing-hostpath": Expected(
        S.QUEUED,
        R.VOLUME_PATH_NOT_FOUND,
        False,
        ((R.VOLUME_PATH_NOT_FOUND, None),),
        "FailedMount",
        "hostPath type check failed: /srv/kubetrain-fixtures/imagenet is not a directory",
        chain={Link.RUNTIME: ChainState.BLOCKING},
        explanation="HostPath /srv/kubetrain-fixtures/imagenet is not a directory on the node",
    ),
    "real-mount-local-path-missing": Expected(
        S.QUEUED,
        R.VOLUME_PATH_NOT_FOUND,
        False,
        ((R.VOLUME_PATH_NOT_FOUND, None),),
        "FailedMount",
        'path "/srv/kubetrain-fixtures/local-imagenet" does not exist',
        chain={Link.SCHEDULER: ChainState.PASSED, Link.RUNTIME: ChainState.BLOCKING},
        explanation="Path /srv/kubetrain-fixtures/local-imagenet does not exist on the node",
    ),
    # Another Pod holds the ReadWriteOnce volume on real-0: the attach/detach
    # controller refuses to attach it to real-1. Waiting helps.
    "real-mount-multi-attach": Expected(
        S.QUEUED,
        R.VOLUME_MULTI_ATTACH,
        True,
        ((R.VOLUME_MULTI_ATTACH, None),),
        "FailedAttachVolume",
        'Multi-Attach error for volume "fixtures-iscsi-checkpoints" Volume is already used by '
        "pod(s) previous-run",
        chain={Link.RUNTIME: ChainState.BLOCKING},
        explanation="Volume is already used by pod(s) previous-run",
    ),
    # The platform's: a CSI driver no node runs. The driver advice is for this one only.
    "real-mount-driver-missing": Expected(
        S.QUEUED,
        R.VOLUME_MOUNT_FAILED,
        False,
        ((R.VOLUME_MOUNT_FAILED, None),),
        "FailedMount",
        "driver name fixtures.csi.kubetrain.io not found in the list of registered CSI drivers",
        chain={Link.RUNTIME: ChainState.BLOCKING},
        explanation="storage driver",
    ),
    # A native sidecar that keeps failing beside a trainer that runs (kubelet 1.33:
    # terminated with restarts and BackOff events, never CrashLoopBackOff).
    "real-sidecar-restarting": Expected(
        S.RUNNING,
        R.SIDECAR_RESTARTING,
        None,
        ((R.SIDECAR_RESTARTING, None),),
        "BackOff",
        "Back-off restarting failed container log-shipper",
        chain={Link.RUNTIME: ChainState.BLOCKING, Link.TRAINING: ChainState.ACTIVE},
        explanation="Sidecar log-shipper restarted 2 times; last exit code 1 (Error): "
        "log-shipper: connection refused: 127.0.0.1:9; the trainer runs meanwhile",
    ),
    # An init container that fails ends the Pod (restartPolicy Never): named as such.
    "real-init-failed": Expected(
        S.FAILED,
        R.EXIT_NONZERO,
        None,
        ((R.EXIT_NONZERO, None), (R.BACKOFF_LIMIT_EXCEEDED, None)),
        "Error",
        "fetch-dataset: s3://datasets: no such bucket",
        explanation="Init container fetch-dataset exited with code 1: fetch-dataset: "
        "s3://datasets: no such bucket",
    ),
    # Kueue's own Workloads (recorded from Kueue v0.17 on a testbed with --kueue).
    "kueue-admitted": Expected(
        S.RUNNING,
        R.TRAINING,
        None,
        (),
        None,
        explanation="On node gpu-h100-0",
    ),
    "kueue-waiting": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        True,
        ((R.WAITING_FOR_QUOTA, None),),
        "Pending",
        "insufficient unused quota for nvidia.com/gpu in flavor default-flavor, 8 more needed",
        attempts=0,
        explanation="ClusterQueue gpus (flavor default-flavor): the job needs 8 nvidia.com/gpu; "
        "its nominal quota is 8, 8 reserved by first-in-line; position 1 in the queue, "
        "nothing pending ahead of it",
        numbers={
            "resource": "nvidia.com/gpu",
            "requested": "8",
            "limit": "8",
            "used": "8",
            "queue": "gpus",
            "flavor": "default-flavor",
            "nominal": "8",
            "position": 1,
            "ahead": [],
        },
    ),
    "kueue-never-fits": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        False,
        ((R.WAITING_FOR_QUOTA, None),),
        "Pending",
        "> maximum capacity (8)",
        attempts=0,
        explanation="ClusterQueue gpus (flavor default-flavor) can never admit the job: it needs "
        "16 nvidia.com/gpu, more than the 8 the queue may ever hold (its nominal quota is 8",
        numbers={
            "resource": "nvidia.com/gpu",
            "requested": "16",
            "limit": "8",
            "queue": "gpus",
            "flavor": "default-flavor",
            "nominal": "8",
            "position": None,  # never-fits: no place in a line it can never leave
        },
    ),
    "kueue-preempted": Expected(
        S.QUEUED,
        R.PREEMPTED,
        True,
        ((R.PREEMPTED, None),),
        "Preempted",
        "Preempted to accommodate a workload",
        explanation="ClusterQueue gpus preempted the job for urgent (a higher-priority job of "
        "the same ClusterQueue); it waits for quota again; position 1 in the queue",
        numbers={"queue": "gpus", "position": 1, "ahead": []},
        # Kueue's eviction holds it at the quota: the scheduler is not reached.
        chain={
            Link.QUOTA: ChainState.BLOCKING,
            Link.SCHEDULER: ChainState.NOT_REACHED,
            Link.TRAINING: ChainState.NOT_REACHED,
        },
    ),
    "kueue-missing-cluster-queue": Expected(
        S.QUEUED,
        R.QUEUE_INACTIVE,
        False,
        ((R.QUEUE_INACTIVE, None),),
        "Inadmissible",
        "ClusterQueue no-such-queue doesn't exist",
        attempts=0,
        explanation="LocalQueue orphan sends its jobs to ClusterQueue no-such-queue, which does "
        "not exist",
        numbers={"queue": "no-such-queue"},
    ),
    "kueue-stopped-cluster-queue": Expected(
        S.QUEUED,
        R.QUEUE_INACTIVE,
        False,
        ((R.QUEUE_INACTIVE, None),),
        "Inadmissible",
        "ClusterQueue stopped is inactive",
        attempts=0,
        explanation="ClusterQueue stopped is stopped (stopPolicy Hold)",
        numbers={"queue": "stopped"},
    ),
    # Admitted (quota reserved in flavor nvidia-a100), never placeable: the flavor's node
    # labels, Kueue's nodeSelector on the Pod, match no node. The scheduler's verdict, the
    # platform's flavor; not a quota wait.
    "kueue-admitted-unplaceable": Expected(
        S.QUEUED,
        R.FLAVOR_NODE_MISMATCH,
        False,
        ((R.FLAVOR_NODE_MISMATCH, 4),),
        "Unschedulable",
        "4 node(s) didn't match Pod's node affinity/selector",
        chain=SCHEDULER_BLOCKING,
        nodes={
            "gpu-h100-0": (False, "selector accelerator=nvidia-a100 ≠ nvidia-h100"),
            "cpu-0": (False, "no nvidia.com/gpu"),
        },
        explanation="ClusterQueue a100 admitted the job on flavor nvidia-a100, whose node labels "
        "accelerator=nvidia-a100 match no node; the nodes have accelerator=nvidia-h100 (2), no "
        "such label (2); Kueue's waitForPodsReady will evict the job and requeue it "
        "(PodsReadyTimeout) unless all its Pods are ready within Kueue's timeout, counted from "
        "its admission at 2026-12-05 01:32:28Z",
        numbers={"queue": "a100", "flavor": "nvidia-a100"},
    ),
    # A gang of two 4-GPU workers admitted by Kueue: rank 0 runs, rank 1 waits for GPUs
    # other teams hold; Kueue's waitForPodsReady counts from the admission.
    "kueue-gang-partial": Expected(
        S.QUEUED,
        R.INSUFFICIENT_GPU,
        True,
        ((R.INSUFFICIENT_GPU, 4), (R.GANG_PARTIAL, None)),
        "Unschedulable",
        "4 Insufficient nvidia.com/gpu",
        chain=SCHEDULER_BLOCKING,
        nodes={
            "gpu-h100-0": (False, "nvidia.com/gpu 8/8 used, needs 4"),
            "gpu-h100-1": (False, "nvidia.com/gpu 8/8 used, needs 4"),
        },
        attempts=2,
        explanation="Rank 1: needs 4 GPUs; the most free on a node the job may use is 0 of 8; "
        "Kueue's waitForPodsReady will evict the whole gang and requeue it (PodsReadyTimeout) "
        "unless all its Pods are ready within Kueue's timeout, counted from its admission at "
        "2026-12-05 01:32:39Z",
        numbers={
            "resource": "nvidia.com/gpu",
            "requested": "4",
            "free": "0",
            "queue": "gpus",
            "flavor": "default-flavor",
        },
    ),
    # Evicted by Kueue's waitForPodsReady (recorded with a 10 s timeout): the Job is
    # suspended, its Pods gone, and Kueue keeps its Workload out of the queue until
    # status.requeueState.requeueAt (NOW is before it; tests/unit/test_queues.py judges
    # it at the recording's moment and after).
    "kueue-pods-ready-timeout": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        True,
        ((R.WAITING_FOR_QUOTA, None),),
        "Pending",
        "Exceeded the PodsReady timeout",
        attempts=1,  # its Pod, never placed, the events say
        explanation="Kueue evicted the job: not all its Pods were ready within Kueue's "
        "waitForPodsReady timeout (PodsReadyTimeout); out of the queue until "
        "2026-12-06 09:55:56Z (Kueue's backoff after an eviction",
        numbers={"queue": "gpus", "position": None},
    ),
    # Sent back by an AdmissionCheck (Retry) while it ran: Kueue evicted it and orders it
    # by the eviction, behind third-in-line, created after it (ClusterQueue `checked`).
    "kueue-admission-check-retry": Expected(
        S.QUEUED,
        R.WAITING_FOR_QUOTA,
        True,
        ((R.WAITING_FOR_QUOTA, None),),
        "Pending",
        "At least one admission check is false",
        attempts=1,  # its Pod ran, the events say
        explanation="Kueue evicted the job: AdmissionCheck fixture-check of its ClusterQueue "
        "asked for a retry; position 2 in the queue, behind third-in-line",
        numbers={"queue": "checked", "position": 2, "ahead": ["third-in-line"]},
    ),
}


def test_every_recorded_fixture_has_expectations() -> None:
    assert {p.stem for p in SNAPSHOTS.glob("*.json")} == set(CASES)


@pytest.fixture(params=sorted(CASES), ids=str)
def case(request: pytest.FixtureRequest) -> tuple[str, Diagnosis, Expected]:
    return request.param, recorded(request.param), CASES[request.param]


def test_state_reason_and_waitable(case: tuple[str, Diagnosis, Expected]) -> None:
    _, d, want = case
    assert (d.state, d.reason, d.waitable) == (want.state, want.reason, want.waitable)
    entry = CATALOG[d.reason]
    assert (d.link, d.actor) == (entry.link, entry.actor)
    assert d.explanation.startswith(entry.explanation)
    assert want.explanation in d.explanation
    assert ". ." not in d.explanation
    assert d.action


def test_blockers_with_the_schedulers_counts(case: tuple[str, Diagnosis, Expected]) -> None:
    _, d, want = case
    assert tuple((b.reason, b.nodes) for b in d.blockers) == want.blockers
    if d.blockers:
        assert d.blockers[0].reason is d.reason
        assert d.blockers[0].waitable == d.waitable or d.state is not S.QUEUED
        numbers = d.blockers[0].to_json()
        assert {k: numbers.get(k) for k in want.numbers} == want.numbers


def test_raw_reason_and_message(case: tuple[str, Diagnosis, Expected]) -> None:
    _, d, want = case
    assert d.raw_reason == want.raw_reason
    if want.raw_message:
        assert d.raw_message is not None
        assert want.raw_message in d.raw_message


def test_chain_marks(case: tuple[str, Diagnosis, Expected]) -> None:
    _, d, want = case
    marks = {m.link: m.state for m in d.chain}
    assert [m.link for m in d.chain] == list(Link)
    assert {link: marks[link] for link in want.chain} == want.chain
    if d.state is S.QUEUED and d.reason not in (R.SCHEDULING, R.CONTAINER_CREATING):
        # Those two are progress without a verdict yet: their link is active, not blocking.
        assert ChainState.BLOCKING in marks.values()
        assert marks[Link.CONTROL_PLANE] is ChainState.PASSED


def test_node_table(case: tuple[str, Diagnosis, Expected]) -> None:
    _, d, want = case
    table = {n.name: n for n in d.nodes}
    for name, (fits, why) in want.nodes.items():
        assert table[name].fits is fits
        assert not why or why in table[name].why
    if not want.nodes:
        assert d.nodes == ()
    # Closest first: nodes that fit, then waitable ones, then the rest.
    order = [(not n.fits, not n.waitable) for n in d.nodes]
    assert order == sorted(order)


def test_attempts(case: tuple[str, Diagnosis, Expected]) -> None:
    name, d, want = case
    assert len(d.attempts) == want.attempts
    if "gang-" in name:
        # A gang's attempt is its Job: one per rank, all attempt 1 (no restart here).
        assert [a.number for a in d.attempts] == [1] * want.attempts
        assert sorted(a.rank for a in d.attempts if a.rank is not None) == list(
            range(want.attempts)
        )
    else:
        assert [a.number for a in d.attempts] == list(range(1, want.attempts + 1))
    assert all(a.pod_name.startswith(f"kt-{name}-") for a in d.attempts)


# What leaves no time in the snapshot: a deleted Node, a deleted Job.
NO_SINCE = {"node-lost", "job-deleted"}


def test_since_is_set_for_everything_but_running_nothing(
    case: tuple[str, Diagnosis, Expected],
) -> None:
    name, d, _ = case
    if name in NO_SINCE:
        assert d.since is None
        return
    assert d.since is not None
    assert d.since.tzinfo is not None


def test_json_matches_the_documented_schema(case: tuple[str, Diagnosis, Expected]) -> None:
    name, d, _ = case
    data = d.to_json(name)
    assert json.loads(json.dumps(data)) == data
    assert list(data)[:14] == [
        "job",
        "business_status",
        "reason",
        "link",
        "waitable",
        "actor",
        "explanation",
        "action",
        "since",
        "raw_reason",
        "raw_message",
        "blockers",
        "chain",
        "nodes",
    ]
    assert data["business_status"] in {s.value for s in BusinessState}
    links = {link.value for link in Link}
    codes = {code.value for code in ReasonCode}
    assert data["reason"] in codes
    assert data["link"] in links
    assert data["actor"] in {"user", "platform", "none"}
    assert data["since"] is None or data["since"].endswith("Z")
    for blocker in data["blockers"]:
        assert blocker["reason"] in codes
        assert blocker["link"] in links
        assert isinstance(blocker["detail"], str)
        assert blocker["detail"]
        assert blocker["nodes"] is None or isinstance(blocker["nodes"], int)
    states = {s.value for s in ChainState}
    assert all(m["state"] in states for m in data["chain"])
    for node in data["nodes"]:
        assert set(node) == {"name", "fits", "why", "reasons", "waitable"}
        assert all(r in codes for r in node["reasons"])
    for attempt in data["attempts"]:
        assert {"number", "pod", "pod_uid", "phase", "exit_code"} <= set(attempt)


def _agreement_notes(d: Diagnosis) -> list[str]:
    return [n for n in d.notes if "does not agree" in n]


@pytest.mark.parametrize(
    "name",
    [
        "insufficient-gpu",
        "gpu-busy",
        "untolerated-taint",
        "node-selector-mismatch",
        "no-gpu-nodes",
        "insufficient-cpu",
        "cordoned",
        "node-not-ready",
        "volume-node-conflict",
        "node-lost-replaced",
    ],
)
def test_node_table_agrees_with_the_schedulers_counts(name: str) -> None:
    assert _agreement_notes(recorded(name)) == []


def test_what_the_table_cannot_evaluate_is_said() -> None:
    d = recorded("placement-rules")
    assert any("pod affinity" in n for n in d.notes)


def test_constraint_counts_per_requirement() -> None:
    d = recorded("untolerated-taint")
    counts = {c.constraint: (c.matched, c.ruled_out, c.never) for c in d.constraints}
    assert counts["tolerates taint nvidia.com/gpu=present:NoSchedule"] == (2, 2, None)
    assert counts["nvidia.com/gpu >= 1 free"] == (2, 2, 2)
    assert counts["node is Ready"] == (4, 0, None)


def _blocker_json(d: Diagnosis) -> list[dict[str, Any]]:
    return [b.to_json() for b in d.blockers]


def test_insufficient_gpu_says_how_many_are_free_and_allocatable() -> None:
    busy = _blocker_json(recorded("gpu-busy"))[0]
    assert busy["waitable"] is True
    assert (busy["requested"], busy["free"], busy["allocatable"]) == ("4", "0", "8")
    never = recorded("insufficient-gpu")
    assert "waiting will not help" in never.action
    assert "8" in never.action


def test_a_gang_with_a_rank_pending_is_queued_and_names_who_is_placed() -> None:
    d = recorded("gang-partial")
    partial = d.blockers[1]
    assert partial.reason is R.GANG_PARTIAL
    assert partial.waitable is False
    assert partial.detail.startswith(
        "2 of 3 workers placed (ranks 0, 2 on gpu-h100-1, gpu-h100-0, holding 16 GPUs idle); "
        "rank 1 waits: needs 8 GPUs"
    )
    assert d.blockers[0].detail.startswith("rank 1: ")
    assert d.action.startswith("Run at most 2 workers (`workers: 2`)")
    assert [(a.rank, a.node) for a in d.attempts] == [
        (0, "gpu-h100-1"),
        (1, None),
        (2, "gpu-h100-0"),
    ]


def test_the_gpus_a_gang_holds_idle_are_each_placed_ranks_own() -> None:
    # Ranks' requests are parsed once per distinct request, not once per gang: a rank
    # whose Pod asks for less (edited from the recording) still counts what it asks.
    data = dump("gang-partial")
    rank2 = next(
        p for p in items(data, "Pod") if p["metadata"]["name"].startswith("kt-gang-partial-2-")
    )
    for section in ("requests", "limits"):
        rank2["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu"] = "4"
    d = run(data)
    assert d.blockers[1].reason is R.GANG_PARTIAL
    assert "holding 12 GPUs idle" in d.blockers[1].detail


def test_a_gang_the_nodes_could_hold_waits_for_the_busy_ones() -> None:
    # Two ranks of 8 GPUs, one running: with the second node free of the third rank the
    # gang would fit, so waiting helps. Built from gang-partial by dropping rank 2's Pod
    # and shrinking the Job to 2 workers.
    data = dump("gang-partial")
    data["items"] = [
        i
        for i in data["items"]
        if not (i["kind"] == "Pod" and i["metadata"]["name"].startswith("kt-gang-partial-2-"))
    ]
    the_job(data)["spec"]["completions"] = the_job(data)["spec"]["parallelism"] = 2
    d = run(data)
    assert (d.state, d.reason) == (S.QUEUED, R.INSUFFICIENT_GPU)
    assert d.waitable is not False
    assert "the gang needs" not in d.explanation


def _rank_pod(data: dict[str, Any], rank: int) -> str:
    return str(
        next(
            p["metadata"]["name"]
            for p in items(data, "Pod")
            if p["metadata"]["name"].startswith(f"kt-gang-running-{rank}-")
        )
    )


def test_a_gang_is_training_once_every_rank_says_so() -> None:
    data = dump("gang-running")
    reports = tuple(PodReport(_rank_pod(data, r), "TRAINING", NOW) for r in (0, 1))
    d = run(data, pod_reports=reports)
    assert (d.state, d.reason) == (S.RUNNING, R.TRAINING)
    assert recorded("gang-running").reason is R.RENDEZVOUS


def test_a_gang_whose_rank_0_trains_is_not_training_until_rank_1_says_so() -> None:
    # The server once took rank 0's report for the gang's: rank 1 had not reported.
    data = dump("gang-running")
    d = run(data, reported_phase=(_rank_pod(data, 0), "TRAINING", NOW))
    assert (d.state, d.reason) == (S.RUNNING, R.RENDEZVOUS)
    assert "rank 1 has not reported yet; rank 0 reported TRAINING" in d.explanation


def test_a_rank_in_its_preflight_holds_the_gang_at_the_rendezvous_naming_the_check() -> None:
    # Rank 0 trains; rank 1 waits in rendezvous-reachable for rank 0's port (seen live).
    data = dump("gang-running")
    reports = (
        PodReport(_rank_pod(data, 0), "TRAINING", NOW),
        PodReport(_rank_pod(data, 1), "PREFLIGHT", NOW, "rendezvous-reachable"),
    )
    d = run(data, pod_reports=reports)
    assert (d.state, d.reason, d.link) == (S.RUNNING, R.RENDEZVOUS, Link.TRAINING)
    assert "rank 1 in its preflight check rendezvous-reachable; rank 0 reported TRAINING" in (
        d.explanation
    )
    # Every rank in its preflight: the gang is in its preflight, each rank's check named.
    both = (
        PodReport(_rank_pod(data, 0), "PREFLIGHT", NOW, "status-reachable"),
        PodReport(_rank_pod(data, 1), "PREFLIGHT", NOW, "rendezvous-reachable"),
    )
    d = run(data, pod_reports=both)
    assert (d.state, d.reason) == (S.RUNNING, R.PREFLIGHT)
    assert "rank 0 in its preflight check status-reachable" in d.explanation
    assert "rank 1 in its preflight check rendezvous-reachable" in d.explanation


def test_a_gang_whose_rank_0_trained_and_exited_first_is_still_training() -> None:
    # Seen on the real pool: rank 0 reports TRAINING and exits 0 while rank 1 is still
    # in torchrun's exit barrier; that is not a gang that has yet to meet. Rank 0's Pod
    # takes the recorded status of a gang's rank that exited 0.
    data = dump("gang-running")
    rank0 = next(
        p for p in items(data, "Pod") if p["metadata"]["name"].startswith("kt-gang-running-0-")
    )
    rank0["status"] = next(
        p["status"]
        for p in items(dump("gang-succeeded"), "Pod")
        if p["metadata"]["name"].startswith("kt-gang-succeeded-0-")
    )
    reports = tuple(PodReport(_rank_pod(data, r), "TRAINING", NOW) for r in (0, 1))
    d = run(data, pod_reports=reports)
    assert (d.state, d.reason) == (S.RUNNING, R.TRAINING)
    assert d.explanation.endswith("2 workers: rank 1 on gpu-h100-0; rank 0 exited 0.")


def test_a_gang_with_one_rank_running_is_never_running() -> None:
    data = dump("gang-running")
    rank1 = next(
        p for p in items(data, "Pod") if p["metadata"]["name"].startswith("kt-gang-running-1-")
    )
    rank1["status"] = {"phase": "Pending"}
    rank1["spec"].pop("nodeName")
    d = run(data)
    assert d.state is S.QUEUED
    assert d.reason is R.SCHEDULING
    assert d.blockers[1].reason is R.GANG_PARTIAL
    assert d.blockers[1].detail.startswith("1 of 2 workers placed (rank 0 on gpu-h100-1")


def test_a_single_pod_larger_than_any_node_is_told_to_split_into_workers() -> None:
    d = recorded("insufficient-gpu")  # 16 GPUs, two 8-GPU nodes
    assert d.waitable is False
    assert d.action == (
        "Run it as 2 workers of 8 GPUs: `workers: 2` with `gpus: 8`; waiting will not help."
    )


def test_a_lost_node_is_named_on_its_attempt_and_uses_no_retry() -> None:
    d = recorded("node-lost-replaced")
    lost = d.blockers[1]
    assert (lost.reason, lost.link, lost.waitable) == (R.NODE_LOST, Link.GPU_NODE, True)
    first = d.attempts[0]
    assert (first.phase, first.raw_reason) == (None, "NotFound")
    assert first.raw_message == f'nodes "{first.node}" not found'
    assert first.node not in {n.name for n in d.nodes}
    # kubetrain's podFailurePolicy ignored the disruption: the Job counts no failure.
    assert "failed" not in the_job(dump("node-lost-replaced"))["status"]


def test_a_pod_still_running_on_a_deleted_node_waits_as_node_lost() -> None:
    d = recorded("node-lost")
    (attempt,) = d.attempts
    assert attempt.phase == "Running"  # what the Pod says; its node is gone
    assert d.raw_message == f'nodes "{attempt.node}" not found'
    assert CATALOG[R.NODE_LOST].actor == d.actor


def test_a_crash_loop_is_only_a_pod_restarted_in_place() -> None:
    pod = items(dump("real-crash-loop"), "Pod")[0]
    assert pod["spec"]["restartPolicy"] == "OnFailure"
    assert pod["status"]["containerStatuses"][0]["restartCount"] >= 1
    assert all(
        p["spec"]["restartPolicy"] == "Never"
        for name in ("real-exit-nonzero", "real-preflight-failed", "node-lost")
        for p in items(dump(name), "Pod")
    )


# The codes of the lower half of the chain: what a kubelet, its runtime and the
# training say. Their fixtures come from a real kubelet (the `real` pool).
RUNTIME_CODES = {
    R.IMAGE_PULL_FAILED,
    R.CONTAINER_CONFIG_ERROR,
    R.VOLUME_SOURCE_NOT_FOUND,
    R.VOLUME_PATH_NOT_FOUND,
    R.VOLUME_MULTI_ATTACH,
    R.VOLUME_MOUNT_FAILED,
    R.SIDECAR_RESTARTING,
    R.OOM_KILLED,
    R.EVICTED,
    R.GPU_ALLOCATION_FAILED,
    R.CRASH_LOOP,
    R.EXIT_NONZERO,
    R.PREFLIGHT_FAILED,
}
# KWOK dumps whose exit is only the setting for what they test: the Job
# controller's backoff limit over two attempts, a gang of 8-GPU workers.
KWOK_EXITS = {"backoff-limit", "gang-worker-failed"}


def test_every_fixture_says_which_kind_of_node_it_came_from() -> None:
    for name in CASES:
        kind = dump(name)["recordedOn"]
        assert kind in {"kwok", "real"}, name
        assert (kind == "real") is name.startswith("real-"), name


def test_every_runtime_link_fixture_comes_from_a_real_kubelet() -> None:
    runtime = {name for name, want in CASES.items() if want.reason in RUNTIME_CODES}
    assert runtime - KWOK_EXITS == {name for name in runtime if name.startswith("real-")}
    assert {CASES[name].reason for name in runtime if name.startswith("real-")} == RUNTIME_CODES
    assert all(dump(name)["recordedOn"] == "real" for name in runtime - KWOK_EXITS)
