"""The reason catalog: for every code, its link, what it means, what to do, who acts,
whether waiting can help by default, and where on the chain it holds the job.

Which reason is primary when several hold (docs/diagnosis.md has the whole
rule):

* For an unschedulable Pod, the reason that keeps the *closest* nodes out
  (domain/fit.py): a node that meets every rule but lacks free resources is
  closer than one a taint, selector, cordon or readiness keeps out, which is
  closer than one whose allocatable could never hold the request. So a 1-GPU
  job without the GPU toleration is UNTOLERATED_TAINT, not INSUFFICIENT_GPU:
  the CPU-only nodes that lack GPUs are not close.
* For a failed job, the Pod-level root cause of the last attempt comes before
  the Job-level reason, which is primary only when no Pod-level cause explains
  the failure; DEADLINE_EXCEEDED is primary, since the deadline ended the job.
* Otherwise PRECEDENCE below, first wins: the control plane and quota before
  scheduling, claims before node filters, node filters closest first, then
  what happens after scheduling, root causes of an attempt, the Job-level
  verdicts, and last the codes of a job that is progressing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kubetrain.domain.states import Link, ReasonCode

R = ReasonCode


class Actor(StrEnum):
    USER = "user"
    PLATFORM = "platform"
    NONE = "none"  # nothing to do: the job is progressing or done


@dataclass(frozen=True)
class Reason:
    code: ReasonCode
    link: Link  # the link of the chain the reason is about
    explanation: str
    action: str
    actor: Actor
    # Whether waiting can help, when the numbers do not say otherwise: True where
    # the job starts once other work finishes or Kubernetes finishes what it is
    # doing (or the platform repairs a node); False where someone must change the
    # job or the cluster's configuration first; None: cannot tell, or not waiting.
    waitable: bool | None
    # The link where the job stands while this reason holds it: its own link
    # unless the chain stops earlier or later (a missing device plugin or claim
    # stops the Pod at the scheduler; a failed mount at the container runtime; a
    # lost node or an eviction ends an attempt that was training).
    stage: Link


def _r(
    code: ReasonCode,
    link: Link,
    explanation: str,
    action: str,
    actor: Actor,
    *,
    waitable: bool | None = None,
    stage: Link | None = None,
) -> Reason:
    return Reason(code, link, explanation, action, actor, waitable, stage or link)


U, P, N = Actor.USER, Actor.PLATFORM, Actor.NONE
L = Link

CATALOG: dict[ReasonCode, Reason] = {
    r.code: r
    for r in (
        _r(
            R.JOB_NOT_CREATED,
            L.CONTROL_PLANE,
            "kubetrain has stored the job but the Kubernetes Job does not exist yet.",
            "Wait: kubetrain retries. If it lasts, the platform must check that the API server "
            "is reachable and that kubetrain may create Jobs in the namespace.",
            P,
            waitable=True,
        ),
        _r(
            R.WAITING_FOR_QUOTA,
            L.QUOTA,
            "A quota refuses the job: a ResourceQuota or a Kueue ClusterQueue, named below.",
            "Wait for other jobs in the project to finish, ask for less, or ask the platform "
            "for more quota.",
            U,
            waitable=True,
        ),
        _r(
            R.POLICY_REFUSED,
            L.QUOTA,
            "The API server refuses to create the job's Pod: an admission policy of the "
            "namespace (PodSecurity, a validating webhook or policy) forbids it; the raw "
            "message names the rule.",
            "Change the job to meet the rule (for PodSecurity: the container's securityContext), "
            "or ask the platform whether the namespace's policy is meant to refuse it.",
            U,
            waitable=False,
        ),
        _r(
            R.QUEUE_INACTIVE,
            L.QUOTA,
            "The job's Kueue queue admits nothing: its LocalQueue or ClusterQueue is missing "
            "or stopped, named below.",
            "The platform must create or restart the queue, or point the LocalQueue at a "
            "ClusterQueue that exists; or submit to another queue. Waiting alone will not help.",
            P,
            waitable=False,
        ),
        _r(
            R.NO_GPU_NODES,
            L.DEVICE_PLUGIN,
            "No node in the cluster advertises the requested GPU resource at all: the device "
            "plugin is missing or not ready on the GPU nodes.",
            "The platform must deploy or repair the GPU device plugin; waiting will not help.",
            P,
            waitable=False,
            stage=L.SCHEDULER,
        ),
        _r(
            R.INSUFFICIENT_GPU,
            L.SCHEDULER,
            "GPU nodes exist, but none the job may use has enough GPUs free for it.",
            "Wait for GPUs to free up, or ask for fewer GPUs.",
            U,
            waitable=True,
        ),
        _r(
            R.INSUFFICIENT_CPU,
            L.SCHEDULER,
            "No otherwise suitable node has enough free CPU for the job's request.",
            "Wait for CPU to free up, or request less CPU.",
            U,
            waitable=True,
        ),
        _r(
            R.INSUFFICIENT_MEMORY,
            L.SCHEDULER,
            "No otherwise suitable node has enough free memory for the job's request.",
            "Wait for memory to free up, or request less memory.",
            U,
            waitable=True,
        ),
        _r(
            R.INSUFFICIENT_RESOURCE,
            L.SCHEDULER,
            "Suitable nodes lack another resource the Pod needs (an extended resource such "
            "as an FPGA or RDMA device, pods per node, ephemeral storage, hugepages or host "
            "ports).",
            "Wait, or request less of that resource.",
            U,
            waitable=True,
        ),
        _r(
            R.PLACEMENT_RULES,
            L.SCHEDULER,
            "The Pod's affinity, anti-affinity or topology spread rules exclude the nodes "
            "that have room.",
            "Relax the placement rules; waiting helps only if the Pods they depend on come or go.",
            U,
            waitable=False,
        ),
        _r(
            R.GPU_ALLOCATION_FAILED,
            L.DEVICE_PLUGIN,
            "The node accepted the Pod but could not allocate its GPU: a GPU was lost or the "
            "device plugin is unhealthy.",
            "The platform must check the node's GPUs and device plugin; resubmit afterwards.",
            P,
            waitable=False,
        ),
        _r(
            R.UNTOLERATED_TAINT,
            L.SCHEDULER,
            "The nodes that could hold the job carry a taint the Pod does not tolerate.",
            "Add the toleration (kubetrain adds the GPU toleration for GPU jobs), or ask the "
            "platform why the nodes are tainted.",
            U,
            waitable=False,
        ),
        _r(
            R.NODE_SELECTOR_MISMATCH,
            L.SCHEDULER,
            "No node with room matches the job's node selector (for example the GPU type).",
            "Ask for a GPU type the cluster has, or drop the selector.",
            U,
            waitable=False,
        ),
        _r(
            R.FLAVOR_NODE_MISMATCH,
            L.SCHEDULER,
            "Kueue admitted the job (its quota is reserved), but on a ResourceFlavor whose node "
            "labels, which Kueue adds to the Pods' node selector, match no node: the Pods can "
            "never be placed.",
            "The platform must fix the ResourceFlavor's nodeLabels, add nodes that carry them, "
            "or give the ClusterQueue a flavor the cluster has; waiting will not help unless "
            "such nodes are coming.",
            P,
            waitable=False,
        ),
        _r(
            R.NODE_NOT_READY,
            L.GPU_NODE,
            "The nodes that could hold the job are not ready or are cordoned.",
            "The platform must bring the nodes back (kubelet, network, drain).",
            P,
            waitable=True,
            stage=L.SCHEDULER,
        ),
        _r(
            R.PVC_NOT_FOUND,
            L.VOLUME,
            "A PersistentVolumeClaim the job mounts does not exist in the namespace.",
            "Create the claim, or fix the dataset/checkpoint/output claim name.",
            U,
            waitable=False,
            stage=L.SCHEDULER,
        ),
        _r(
            R.PVC_UNBOUND,
            L.VOLUME,
            "A PersistentVolumeClaim the job mounts is not bound to a volume yet.",
            "The platform must provision a volume (or a StorageClass) for the claim.",
            P,
            waitable=True,
            stage=L.SCHEDULER,
        ),
        _r(
            R.VOLUME_NODE_CONFLICT,
            L.VOLUME,
            "The bound volume lives where the Pod may not go (volume node affinity).",
            "Move the data, or let the job run in the volume's zone.",
            P,
            waitable=False,
            stage=L.SCHEDULER,
        ),
        _r(
            R.VOLUME_MOUNT_FAILED,
            L.VOLUME,
            "The node could not attach or mount one of the job's volumes: the storage driver "
            "(CSI driver, attacher or the node's mount tools) failed.",
            "The platform must check the storage driver named below; waiting will not help "
            "until it is repaired.",
            P,
            waitable=False,
            stage=L.RUNTIME,
        ),
        # Mount failures by cause (docs/diagnosis.md, "Volumes the kubelet cannot mount").
        _r(
            R.VOLUME_SOURCE_NOT_FOUND,
            L.VOLUME,
            "A ConfigMap or Secret that one of the job's volumes (or a projected volume's "
            "source) names does not exist in the job's namespace: the kubelet cannot mount it.",
            "Create the ConfigMap or Secret named below in that namespace, or fix the volume's "
            "reference; waiting will not help unless someone creates it.",
            U,
            waitable=False,
            stage=L.RUNTIME,
        ),
        _r(
            R.VOLUME_PATH_NOT_FOUND,
            L.VOLUME,
            "A path one of the job's volumes names on the node (a hostPath, or a local "
            "PersistentVolume's path) does not exist there, or is not of the type asked for.",
            "The platform must create the path on the node or fix the PersistentVolume's path; "
            "for a hostPath the job names itself, fix the path or its type. Waiting will not help.",
            P,
            waitable=False,
            stage=L.RUNTIME,
        ),
        _r(
            R.VOLUME_MULTI_ATTACH,
            L.VOLUME,
            "One of the job's volumes can be attached to one node at a time (ReadWriteOnce) and "
            "another Pod, on another node, still holds it.",
            "Wait for the Pod named below to end (often an earlier attempt still terminating); "
            "if it never does, stop it, or use a ReadWriteMany volume.",
            U,
            waitable=True,
            stage=L.RUNTIME,
        ),
        _r(
            R.SIDECAR_RESTARTING,
            L.RUNTIME,
            "A native sidecar of the job (an init container with restartPolicy Always: a log "
            "shipper, a proxy, a metrics agent) keeps failing and the kubelet restarts it with a "
            "back-off; the trainer runs meanwhile, without what the sidecar provides.",
            "Read the sidecar's logs (kubectl logs POD -c NAME --previous) and fix it; the "
            "training goes on meanwhile.",
            U,
            stage=L.TRAINING,
        ),
        _r(
            R.SCHEDULING_GATED,
            L.SCHEDULER,
            "The Pod is held by scheduling gates (a queue or admission controller).",
            "Wait for the controller that owns the gate to release it.",
            N,
            waitable=True,
        ),
        _r(
            R.IMAGE_PULL_FAILED,
            L.RUNTIME,
            "The node cannot pull the job's container image.",
            "Check the image name and tag, and the registry credentials.",
            U,
            waitable=False,
        ),
        _r(
            R.CONTAINER_CONFIG_ERROR,
            L.RUNTIME,
            "The container cannot be created: a Secret or ConfigMap it references is missing.",
            "Create the missing Secret/ConfigMap or fix the reference.",
            U,
            waitable=False,
        ),
        _r(
            R.CONTAINER_CREATING,
            L.RUNTIME,
            "The Pod is on its node and its container is being created.",
            "Wait; nothing has failed yet.",
            N,
            waitable=True,
        ),
        _r(
            R.SCHEDULING,
            L.SCHEDULER,
            "The Job exists and its Pod is waiting for the scheduler's verdict.",
            "Wait; nothing has failed yet.",
            N,
            waitable=True,
        ),
        _r(
            R.PREFLIGHT,
            L.PREFLIGHT,
            "The container runs kubetrain's preflight checks before training.",
            "Wait.",
            N,
        ),
        _r(
            R.GANG_PARTIAL,
            L.SCHEDULER,
            "Some workers of the gang are placed and others wait: the placed ones hold their "
            "GPUs idle, since no rank trains until every rank runs.",
            "See what the waiting rank needs (the reason beside this one).",
            U,
            waitable=True,
        ),
        _r(
            R.RENDEZVOUS,
            L.TRAINING,
            "Every worker of the gang runs; none has reported training yet (torchrun's "
            "rendezvous: the ranks find rank 0 and form the group).",
            "Wait. If it lasts, check that rank 0's name resolves and its port answers "
            "(the rendezvous-reachable preflight check), and the ranks' logs.",
            N,
        ),
        _r(R.TRAINING, L.TRAINING, "The job is training.", "Nothing to do.", N),
        _r(
            R.NO_PROGRESS,
            L.TRAINING,
            "The job runs but has reported no training step for longer than its stall "
            "threshold (spec.stallAfter, else the platform's default): it may hang (a stuck "
            "collective, a dead data loader, a deadlock). kubetrain does not stop it, unless "
            "its spec.cancelAfterStall runs out.",
            "Read its logs (kubetrain logs); cancel it if it is stuck, or raise spec.stallAfter "
            "if its steps are this slow.",
            U,
        ),
        _r(
            R.LOSS_NOT_FINITE,
            L.TRAINING,
            "The job runs, but the loss it last reported is not a finite number (NaN, "
            "+inf or -inf): training has diverged, and further steps are unlikely to recover "
            "it. kubetrain does not stop it, unless its spec.cancelOnNonFiniteLoss is true.",
            "Cancel it and resume from a checkpoint before the divergence with a lower "
            "learning rate, gradient clipping or a data check (kubetrain logs shows the "
            "steps before it).",
            U,
            waitable=False,
        ),
        _r(
            R.PREFLIGHT_FAILED,
            L.PREFLIGHT,
            "kubetrain's preflight found the container unfit to train (GPU, dataset, output "
            "or status endpoint); its message says which check failed.",
            "Fix what the preflight names (often the platform: GPU or volume), then resubmit.",
            U,
        ),
        _r(
            R.CRASH_LOOP,
            L.TRAINING,
            "The training container keeps crashing and Kubernetes backs off restarting it.",
            "Read the container's logs and termination message.",
            U,
            waitable=False,
        ),
        _r(
            R.OOM_KILLED,
            L.TRAINING,
            "The training process used more memory than its limit and was killed.",
            "Raise the memory limit or reduce the batch size.",
            U,
        ),
        _r(
            R.EXIT_NONZERO,
            L.TRAINING,
            "A container of the job exited with a non-zero code: the training process, "
            "unless another container (an init container) is named below.",
            "Read the termination message and logs of the attempt.",
            U,
        ),
        _r(
            R.EVICTED,
            L.GPU_NODE,
            "The kubelet evicted the Pod (node pressure or an ephemeral-storage limit).",
            "Lower disk use or raise the cache limit; the platform checks node pressure.",
            U,
            stage=L.TRAINING,
        ),
        _r(
            R.NODE_LOST,
            L.GPU_NODE,
            "The node running the Pod was lost or drained; Kubernetes replaces the Pod "
            "without counting it against retries.",
            "Nothing to do: the job continues as a new attempt from its checkpoint.",
            P,
            waitable=True,
            stage=L.TRAINING,
        ),
        _r(
            R.PREEMPTED,
            L.SCHEDULER,
            "A higher-priority job preempted this one (the scheduler, or Kueue's ClusterQueue, "
            "took its resources back); it runs again, as a new attempt, once they are free.",
            "Wait, or submit with a higher priority class.",
            N,
            waitable=True,
            stage=L.TRAINING,
        ),
        _r(
            R.DEADLINE_EXCEEDED,
            L.JOB,
            "The job ran longer than its maximum run time and Kubernetes stopped it.",
            "Raise maxRuntime, or resume from the last checkpoint.",
            U,
        ),
        _r(
            R.BACKOFF_LIMIT_EXCEEDED,
            L.JOB,
            "Every allowed attempt failed; Kubernetes gave up retrying.",
            "Fix the cause of the last attempt's failure, then resubmit.",
            U,
        ),
        _r(
            R.JOB_DELETED,
            L.CONTROL_PLANE,
            "The Kubernetes Job was deleted by someone other than kubetrain.",
            "Find out who deleted it (audit log); resubmit if needed.",
            P,
        ),
        _r(R.CANCELLED, L.CONTROL_PLANE, "The job was cancelled.", "Nothing to do.", N),
        _r(R.COMPLETED, L.JOB, "The job finished successfully.", "Nothing to do.", N),
    )
}

# The order in which reasons become primary when several hold (first wins).
PRECEDENCE: tuple[ReasonCode, ...] = (
    R.CANCELLED,
    R.JOB_DELETED,
    R.JOB_NOT_CREATED,
    R.QUEUE_INACTIVE,
    R.WAITING_FOR_QUOTA,
    R.POLICY_REFUSED,
    R.PVC_NOT_FOUND,
    R.PVC_UNBOUND,
    R.SCHEDULING_GATED,
    R.NO_GPU_NODES,
    # node filters, closest first
    R.INSUFFICIENT_GPU,
    R.INSUFFICIENT_CPU,
    R.INSUFFICIENT_MEMORY,
    R.INSUFFICIENT_RESOURCE,
    R.VOLUME_NODE_CONFLICT,
    R.PLACEMENT_RULES,
    R.UNTOLERATED_TAINT,
    R.FLAVOR_NODE_MISMATCH,
    R.NODE_SELECTOR_MISMATCH,
    R.NODE_NOT_READY,
    # after scheduling
    R.GPU_ALLOCATION_FAILED,
    R.VOLUME_SOURCE_NOT_FOUND,
    R.VOLUME_PATH_NOT_FOUND,
    R.VOLUME_MULTI_ATTACH,
    R.VOLUME_MOUNT_FAILED,
    R.IMAGE_PULL_FAILED,
    R.CONTAINER_CONFIG_ERROR,
    R.CRASH_LOOP,
    # root causes of a failed attempt, then the Job-level verdicts
    R.PREFLIGHT_FAILED,
    R.OOM_KILLED,
    R.EVICTED,
    R.NODE_LOST,
    R.PREEMPTED,
    R.EXIT_NONZERO,
    R.DEADLINE_EXCEEDED,
    R.BACKOFF_LIMIT_EXCEEDED,
    R.CONTAINER_CREATING,
    R.SCHEDULING,
    # beside the waiting rank's own code, never before it
    R.GANG_PARTIAL,
    R.PREFLIGHT,
    R.RENDEZVOUS,
    R.LOSS_NOT_FINITE,
    R.NO_PROGRESS,
    R.SIDECAR_RESTARTING,
    R.TRAINING,
    R.COMPLETED,
)


def rank(code: ReasonCode) -> int:
    return PRECEDENCE.index(code)
