"""The batch/v1 Job that runs a TrainingJob, rendered as plain data.

`render_job` is pure and deterministic: the same job id, spec, namespace,
dataset and options give the same dict, key order included, so the
dispatcher can create it idempotently under the name `job_name(job_id)` and
tell its own Job from another by the `kubetrain.io/job-id` label.

What the Job carries, and why:

* cpu and memory requests and limits. A memory limit left out is the request
  (a node's memory is not shared without OOM kills); a cpu limit left out is
  also the request, so a job that sets neither gets the Guaranteed QoS class:
  it is evicted last under node pressure and, with whole cores, can be pinned
  next to its GPUs by the CPU manager. A job that wants to burst sets a higher
  cpu limit.
* The GPU count in requests and limits under `RenderOptions.gpu_resource`, the
  toleration of the taint GPU nodes carry under that key, and a nodeSelector
  on `RenderOptions.accelerator_label` for a GPU type.
* Dataset (read-only, at DATASET_PATH, with its subPath), checkpoint and output
  PVCs, and an emptyDir cache with a sizeLimit. The cache's size plus
  `RenderOptions.ephemeral_headroom` is requested and limited as
  ephemeral-storage: the kubelet counts the container's logs and writable
  layer against the same limit as the emptyDir, so a limit of exactly the
  cache size would evict a job whose cache is full.
* The KUBETRAIN_* environment the in-container preflight reads, before the
  user's entries so those can refer to them as $(KUBETRAIN_DATASET_PATH).
  Secrets only ever as secretKeyRef: no credential is in a plain value.
* `restartPolicy: Never` and a podFailurePolicy: a disrupted Pod (node lost,
  preempted: the DisruptionTarget condition) is replaced without using up
  `backoffLimit` (the job's `retries`), and the preflight's exit code
  (PREFLIGHT_EXIT_CODE) fails the Job at once, since the next Pod would fail
  the same way. `podReplacementPolicy: Failed` keeps a new Pod from asking
  for the GPUs while the old one still holds them.
* `activeDeadlineSeconds` from maxRuntime. Kubernetes counts it from the Job's
  start, which includes the time its Pod waits for a node.
* With a Kueue LocalQueue (`spec.queue`, else the namespace's default queue in
  `RenderOptions.default_queues`): the `kueue.x-k8s.io/queue-name` label and
  `suspend: true`, as Kueue expects; Kueue unsuspends the Job when it admits it.
  Its `priorityClass` is then a WorkloadPriorityClass (label
  `kueue.x-k8s.io/priority-class`), not the Pod's priorityClassName: Kueue orders
  and preempts workloads, and a PriorityClass of that name need not exist.
* No token for the Kubernetes API (`automountServiceAccountToken: false`) and
  no service links: training talks to the status URL, not to the Kubernetes
  API, and service variables could shadow the user's. With a status URL, the
  Pod's one credential is a projected ServiceAccount token for kubetrain's
  audience alone (`RenderOptions.token_audience`), bound to the Pod and
  renewed by the kubelet: what the reports prove the Pod's identity with
  (api/reports.py checks it with a TokenReview). No Secret is made per Job.
* A locked-down container (CONTAINER_SECURITY_CONTEXT): no privilege escalation
  (setuid binaries, `no_new_privs`), every Linux capability dropped and the
  runtime's default seccomp profile, which is what Pod Security's `restricted`
  level asks of a container short of running as non-root (the image decides
  its user). Training needs none of what they take away: GPUs are reached
  through device nodes the device plugin mounts, not through capabilities.
  The namespaces kubetrain makes carry Pod Security labels
  (`namespace_labels`): `enforce` at `RenderOptions.pod_security_enforce`
  (baseline) and `warn` at `pod_security_warn` (restricted).

A gang (`spec.workers` > 1) is one Job of N Pods, rendered the way Kubernetes
documents pod-to-pod communication in a Job and the way Kubeflow Trainer v2's
torch runtime sets up torchrun, so its images run unchanged:

* `completionMode: Indexed`, `completions = parallelism = workers`: each Pod
  has an index (0..N-1) and the hostname `<job>-<index>`; with `subdomain`
  set to the headless Service `render_service` makes (named like the Job),
  rank 0 is `<job>-0.<job>.<namespace>.svc` for as long as the Job lives.
* The torchrun environment Trainer v2 sets: PET_NNODES (workers),
  PET_NPROC_PER_NODE (the GPUs of one worker, at least 1), PET_NODE_RANK from
  the `batch.kubernetes.io/job-completion-index` annotation (downward API),
  PET_MASTER_ADDR (rank 0's name), PET_MASTER_PORT (MASTER_PORT, torch's
  default, also a container port); and KUBETRAIN_WORKER_INDEX and
  KUBETRAIN_WORKERS for kubetrain's runtime.
* Failure is the gang's, and so is the restart, the way JobSet's
  `RestartJobSet` does it: each attempt is one Job (`backoffLimit: 0`), whose
  podFailurePolicy fails it at once when a worker's trainer exits non-zero or
  a worker is disrupted (DisruptionTarget: node lost, preempted), one rule per
  class of domain/failures.py, so the Job controller terminates the other
  ranks rather than leaving them to hold their GPUs in a broken collective.
  kubetrain then deletes that Job and, once every Pod of it has ended, creates
  the next attempt under the same name (the syncer decides,
  domain/diagnosis/gang.py `next_attempt`; the dispatcher acts). The Job
  carries its attempt (`kubetrain.io/attempt`, also on its Pods), the job's
  `retries` and the failures already counted against them
  (`kubetrain.io/retries`, `kubetrain.io/retries-used`), so the decision is
  read from the Job alone. Kubernetes' own `backoffLimitPerIndex` retries one
  index alone, which a gang must not do, and replacing a disrupted rank under
  its index leaves the others in a static rendezvous that cannot re-form
  (docs/diagnosis.md, "Gangs").
* A gang under Kueue restarts in place instead (`kubetrain.io/restart: in-place`):
  one Job for every attempt, so that its Workload keeps its admission and its
  place in the queue (a new Job would be a new Workload, behind every job
  submitted meanwhile). Its podFailurePolicy `Ignore`s a disruption and `Count`s
  the trainer's failure (domain/failures.py), so that the Job lives on: a
  `backoffLimit` out of reach while retries remain, 0 on a last attempt that is
  also the first (the dispatcher sets it to the failures counted so far when it
  resumes a last attempt). kubetrain suspends the Job, waits for every Pod to end,
  and resumes it with the next attempt's label (cluster/jobs.py `resume_attempt`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kubetrain.domain import names, render_defaults
from kubetrain.domain.datasets import DatasetVersion
from kubetrain.domain.failures import PREFLIGHT_EXIT_CODE, gang_failures
from kubetrain.domain.quantity import QuantityError, canonical_bytes, canonical_cpu, parse_quantity
from kubetrain.domain.spec import (
    SecretKeyRef,
    TrainingJob,
    bytes_value,
    duration_seconds,
    spec_digest,
)

__all__ = [
    "ANNOTATION_SPEC_DIGEST",
    "CACHE_DIR",
    "CHECKPOINT_DIR",
    "CONTAINER_NAME",
    "CONTAINER_SECURITY_CONTEXT",
    "CONTROLLER_UID",
    "DATASET_PATH",
    "DEFAULT_RENDER_OPTIONS",
    "LABEL_JOB_ID",
    "LABEL_MANAGED_BY",
    "LABEL_NAME",
    "LABEL_PROJECT",
    "LABEL_QUEUE",
    "LABEL_WORKLOAD_PRIORITY",
    "MANAGED_BY",
    "MASTER_PORT",
    "MAX_JOB_ID_LENGTH",
    "OUTPUT_DIR",
    "PREFLIGHT_EXIT_CODE",
    "STATUS_TOKEN_DIR",
    "STATUS_TOKEN_FILE",
    "STATUS_TOKEN_VOLUME",
    "TERMINATION_LOG",
    "RenderOptions",
    "job_name",
    "namespace_labels",
    "render_job",
    "render_service",
]

CONTAINER_NAME = "trainer"
DATASET_PATH = "/data"
CHECKPOINT_DIR = "/checkpoints"
OUTPUT_DIR = "/output"
CACHE_DIR = "/cache"
TERMINATION_LOG = "/dev/termination-log"  # the kubelet's default terminationMessagePath
# Where rank 0 listens for torchrun's rendezvous: torch's default, and Trainer v2's.
MASTER_PORT = 29500
# The Job controller's annotation (and label) with a Pod's index in an Indexed Job.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# Set by the Job controller on its Pods: the Job's uid (one attempt of a gang, where the
# name is every attempt's).
CONTROLLER_UID = "batch.kubernetes.io/controller-uid"

LABEL_JOB_ID = "kubetrain.io/job-id"
LABEL_PROJECT = "kubetrain.io/project"
LABEL_NAME = "kubetrain.io/name"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_WORKLOAD_PRIORITY = "kueue.x-k8s.io/priority-class"
MANAGED_BY = "kubetrain"
# The digest of the spec the Job was rendered from: an AlreadyExists Job with
# our job-id and this digest is the one we meant to create.
ANNOTATION_SPEC_DIGEST = "kubetrain.io/spec-digest"
# A gang's attempt (on its Job and Pods), the job's retries and those its earlier
# attempts used: what deciding a gang's restart reads from the Job.
LABEL_ATTEMPT = "kubetrain.io/attempt"
ANNOTATION_RETRIES = "kubetrain.io/retries"
ANNOTATION_RETRIES_USED = "kubetrain.io/retries-used"
# A gang restarted in place (under Kueue): one Job for every attempt.
ANNOTATION_RESTART = "kubetrain.io/restart"
IN_PLACE = "in-place"
# A gang restarted in place counts its trainer's failures against this while retries
# remain: never reached (the Job must not fail; kubetrain restarts it).
UNREACHED_BACKOFF_LIMIT = 2**31 - 1
# Kueue's own mark of a Job it is stopping (its batch/Job integration's `Stop`): while it
# is "true", Kueue reads the suspended Job as running and does not resume it.
KUEUE_STOPPING = "kueue.x-k8s.io/stopping"

# "kt-" + 60 characters is a DNS-1123 label (63), and so is the Job controller's
# `batch.kubernetes.io/job-name` label value on the Pods.
MAX_JOB_ID_LENGTH = names.DNS1123_LABEL_MAX - len(names.JOB_NAME_PREFIX)
_JOB_ID = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9]*[A-Za-z0-9])?")
_MAX_URL_LENGTH = 2048

# What Pod Security's `restricted` level asks of a container, but runAsNonRoot (the
# image's user is the image's choice; `warn: restricted` tells its owner).
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The Pod Security Admission levels and the namespace labels that set them
# (https://kubernetes.io/docs/concepts/security/pod-security-admission/).
POD_SECURITY_LEVELS = ("privileged", "baseline", "restricted")
_POD_SECURITY_LABEL = "pod-security.kubernetes.io/"


def job_name(job_id: str) -> str:
    """The Kubernetes Job's name for a job id: "kt-" + the id in lowercase.

    Deterministic, so creating it again finds the same Job. Job ids are taken
    to be case-insensitive (UUIDs, ULIDs are): "01HX" and "01hx" name the same
    Job. An id of other characters or over MAX_JOB_ID_LENGTH is a ValueError:
    the store makes ids, so such an id is a bug, and hashing it would hide that.
    """
    if len(job_id) > MAX_JOB_ID_LENGTH or not _JOB_ID.fullmatch(job_id):
        raise ValueError(
            f"job id {job_id!r} must be at most {MAX_JOB_ID_LENGTH} letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return names.JOB_NAME_PREFIX + job_id.lower()


# The Pod's identity towards kubetrain: a ServiceAccount token the kubelet projects
# for the audience `RenderOptions.token_audience`, bound to the Pod (its name and uid
# are in the token) and renewed by the kubelet before it expires. The runtime reads
# the file afresh for each report; kubetrain checks it with a TokenReview.
STATUS_TOKEN_VOLUME = "kubetrain-token"  # noqa: S105 - names, not secrets
STATUS_TOKEN_DIR = "/var/run/secrets/kubetrain.io/serviceaccount"  # noqa: S105
STATUS_TOKEN_FILE = STATUS_TOKEN_DIR + "/token"
# The API server's floor for a projected token's expirationSeconds (10 minutes).
MIN_TOKEN_SECONDS = 600


@dataclass(frozen=True, kw_only=True)
class RenderOptions:
    """What the platform decides for every Job; checked when made."""

    # The extended resource GPUs are counted in; also the key of the taint GPU
    # nodes carry (the NVIDIA GPU operator's convention).
    gpu_resource: str = render_defaults.GPU_RESOURCE
    # The node label whose value is a GPU type (spec.resources.gpuType).
    accelerator_label: str = render_defaults.ACCELERATOR_LABEL
    # Where the in-container reporter sends progress (kubetrain's base URL); no
    # credential in it. When set, every Pod gets a projected ServiceAccount token
    # for `token_audience` (at STATUS_TOKEN_FILE) that proves which Pod it is.
    status_url: str | None = None
    # The audience of that token: kubetrain's, so that it is good for nothing else
    # (the API server takes only tokens for its own audiences).
    token_audience: str = render_defaults.TOKEN_AUDIENCE
    # The token's lifetime; the kubelet renews it at 80 % of it.
    token_seconds: int = MIN_TOKEN_SECONDS
    # Added to the cache size for ephemeral-storage: logs and the writable layer.
    ephemeral_headroom: str = "2Gi"
    # (namespace, Kueue LocalQueue) pairs: the queue of a job in that namespace
    # whose spec names none.
    default_queues: tuple[tuple[str, str], ...] = ()
    # The Pod Security levels of the namespaces kubetrain makes: Pods beyond
    # `enforce` are refused, those beyond `warn` are admitted with a warning.
    pod_security_enforce: str = "baseline"
    pod_security_warn: str = "restricted"

    def __post_init__(self) -> None:
        for field, level in (
            ("pod_security_enforce", self.pod_security_enforce),
            ("pod_security_warn", self.pod_security_warn),
        ):
            if level not in POD_SECURITY_LEVELS:
                raise ValueError(
                    f"{field} {level!r} must be one of {', '.join(POD_SECURITY_LEVELS)}"
                )
        if "/" not in self.gpu_resource or names.qualified_name_problem(self.gpu_resource):
            raise ValueError(
                f"gpu_resource {self.gpu_resource!r} must be an extended resource such as "
                "nvidia.com/gpu"
            )
        if problem := names.qualified_name_problem(self.accelerator_label):
            raise ValueError(f"accelerator_label: {problem}")
        if self.status_url is not None:
            _check_status_url(self.status_url)
        if not self.token_audience or names.control_character_problem(self.token_audience):
            raise ValueError("token_audience must be a non-empty string without control characters")
        if not MIN_TOKEN_SECONDS <= self.token_seconds <= 2**32:
            raise ValueError(
                f"token_seconds must be between {MIN_TOKEN_SECONDS} (the API server's floor) "
                f"and {2**32}, not {self.token_seconds}"
            )
        try:
            headroom = parse_quantity(self.ephemeral_headroom)
        except QuantityError as exc:
            raise ValueError(f"ephemeral_headroom: {exc}") from None
        if headroom < 0 or headroom % 1 != 0:
            raise ValueError("ephemeral_headroom must be a whole, non-negative number of bytes")
        for namespace, queue in self.default_queues:
            if problem := names.dns1123_label_problem(queue):
                raise ValueError(f"default queue of namespace {namespace!r}: {problem}")

    def queue_for(self, namespace: str) -> str | None:
        return dict(self.default_queues).get(namespace)


DEFAULT_RENDER_OPTIONS = RenderOptions()


def namespace_labels(options: RenderOptions = DEFAULT_RENDER_OPTIONS) -> dict[str, str]:
    """The labels of a namespace kubetrain makes for a project: ours, and its Pod
    Security levels."""
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        _POD_SECURITY_LABEL + "enforce": options.pod_security_enforce,
        _POD_SECURITY_LABEL + "warn": options.pod_security_warn,
    }


def _check_status_url(url: str) -> None:
    if len(url) > _MAX_URL_LENGTH or names.control_character_problem(url) or " " in url:
        raise ValueError("status_url must be a URL without spaces or control characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"status_url {url!r} must be an http or https URL with a host")
    if "@" in parts.netloc:
        # It would be a plain env value in the Pod spec, readable by anyone who can read Jobs.
        raise ValueError("status_url must not carry a user or password; Pods prove who they are")


def _token_volume(options: RenderOptions) -> dict[str, Any]:
    """The projected ServiceAccount token the Pod reports with (STATUS_TOKEN_FILE)."""
    token = {
        "audience": options.token_audience,
        "expirationSeconds": options.token_seconds,
        "path": STATUS_TOKEN_FILE.rsplit("/", 1)[1],
    }
    return {"name": STATUS_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def _plain(name: str, value: str) -> dict[str, Any]:
    # The API server drops an empty value (Go's omitempty); leaving it out here keeps
    # what we render equal to what is stored.
    return {"name": name, "value": value} if value else {"name": name}


def _secret(name: str, ref: SecretKeyRef) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def _check_dataset(job: TrainingJob, dataset: DatasetVersion | None) -> None:
    ref = job.spec.dataset
    if ref is None and dataset is not None:
        raise ValueError("a dataset was given for a job that names none")
    if ref is not None:
        if dataset is None:
            raise ValueError("the job names a dataset: resolve it (resolve_dataset) first")
        if (dataset.name, dataset.version) != (ref.name, ref.version):
            raise ValueError(
                f"dataset {dataset.name}:{dataset.version} is not the job's "
                f"{ref.name}:{ref.version}"
            )


def pod_failure_policy(*, gang: bool = False, in_place: bool = False) -> dict[str, Any]:
    """A disrupted Pod (DisruptionTarget: node lost, preempted, evicted) is replaced
    without using a retry; the preflight's exit code fails the Job at once. A gang's
    Job is one attempt: every failure class of domain/failures.py fails it at once (the
    other ranks cannot go on without the failed one), each by its own rule so that the
    Job's failure message names the class; kubetrain decides what follows. A gang
    restarted in place (`in_place`) keeps its Job: each class's `in_place` action."""
    if gang:
        return {
            "rules": [
                {"action": failure.in_place if in_place else "FailJob", **failure.rule}
                for failure in gang_failures(CONTAINER_NAME)
            ]
        }
    return {
        "rules": [
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER_NAME,
                    "operator": "In",
                    "values": [PREFLIGHT_EXIT_CODE],
                },
            },
        ]
    }


def render_service(
    job_id: str, namespace: str, job_uid: str, attempt: int | None = None
) -> dict[str, Any]:
    """The headless Service that gives a gang's Pods their DNS names (`subdomain`).

    Named like the Job, selecting its Pods, publishing them before they are ready
    (rank 0 must resolve while every rank is still starting), and owned by the Job
    (`job_uid`), so the garbage collector removes it with the Job. It selects by the Job's
    uid, not its name: every attempt of a gang has the name, and rank 0's DNS name must
    never lead to an earlier attempt's Pod; and by the attempt's label, since a gang
    restarted in place has one Job (one uid) for every attempt.
    """
    selector = {CONTROLLER_UID: job_uid}
    if attempt is not None:
        selector[LABEL_ATTEMPT] = str(attempt)
    name = job_name(job_id)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LABEL_JOB_ID: job_id, LABEL_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job_uid,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
        },
    }


def _gang_env(
    name: str, namespace: str, workers: int, gpus: int, rendezvous_timeout: int | None
) -> list[dict[str, Any]]:
    index = {
        "valueFrom": {
            "fieldRef": {
                "apiVersion": "v1",
                "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']",
            }
        }
    }
    return [
        _plain("PET_NNODES", str(workers)),
        _plain("PET_NPROC_PER_NODE", str(max(gpus, 1))),
        {"name": "PET_NODE_RANK", **index},
        # The Indexed Job's hostname `<job>-<index>` under the Service's subdomain.
        _plain("PET_MASTER_ADDR", f"{name}-0.{name}.{namespace}.svc"),
        _plain("PET_MASTER_PORT", str(MASTER_PORT)),
        {"name": "KUBETRAIN_WORKER_INDEX", **index},
        _plain("KUBETRAIN_WORKERS", str(workers)),
        # The gang's attempt, from the Pod's own label: a rank can tell (and log) which
        # attempt it and its peers belong to.
        {
            "name": "KUBETRAIN_ATTEMPT",
            "valueFrom": {
                "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.labels['{LABEL_ATTEMPT}']"}
            },
        },
    ] + (
        # spec.rendezvousTimeout; unset, the runtime waits torchrun's default (600 s).
        [_plain("KUBETRAIN_RENDEZVOUS_TIMEOUT_SECONDS", str(rendezvous_timeout))]
        if rendezvous_timeout is not None
        else []
    )


def render_job(
    job_id: str,
    job: TrainingJob,
    namespace: str,
    *,
    dataset: DatasetVersion | None,
    options: RenderOptions = DEFAULT_RENDER_OPTIONS,
    attempt: int = 1,
    retries_used: int = 0,
    digest: str | None = None,
) -> dict[str, Any]:
    """The batch/v1 Job for `job`, as a plain dict ready for the API server.

    `dataset` is the resolved version (see datasets.resolve_dataset), None when
    the job names no dataset. A gang's Job is its attempt `attempt`, after earlier
    attempts used `retries_used` of its retries. `digest` is the job's `spec_digest` where
    the caller keeps it (the store does, from the submission): computed here, it is over
    half of rendering (canonical JSON and sha256; bench/create.py). ValueError for
    arguments that contradict each other or are not Kubernetes names: those are the
    caller's bugs, the spec itself was validated when it was parsed.
    """
    name = job_name(job_id)
    if problem := names.dns1123_label_problem(namespace):
        raise ValueError(f"namespace {problem}")
    _check_dataset(job, dataset)
    spec = job.spec
    res = spec.resources

    gang = spec.workers > 1
    if gang and (attempt < 1 or not 0 <= retries_used <= spec.retries):
        raise ValueError(f"attempt {attempt} with {retries_used} of {spec.retries} retries used")
    ours = {
        LABEL_JOB_ID: job_id,
        LABEL_PROJECT: job.metadata.project,
        LABEL_NAME: job.metadata.name,
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    queue = spec.queue or options.queue_for(namespace)
    kueue_labels: dict[str, str] = {}
    if queue is not None:
        kueue_labels[LABEL_QUEUE] = queue
        if spec.priority_class is not None:
            if problem := names.label_value_problem(spec.priority_class):
                raise ValueError(f"priorityClass as a Kueue label value: {problem}")
            kueue_labels[LABEL_WORKLOAD_PRIORITY] = spec.priority_class
    if gang:
        ours[LABEL_ATTEMPT] = str(attempt)

    requests: dict[str, str] = {
        "cpu": canonical_cpu(res.requests.cpu),
        "memory": canonical_bytes(res.requests.memory),
    }
    limits: dict[str, str] = {
        "cpu": canonical_cpu(res.limits.cpu or res.requests.cpu),
        "memory": canonical_bytes(res.limits.memory or res.requests.memory),
    }
    if spec.cache is not None:
        scratch = canonical_bytes(
            bytes_value(spec.cache.size) + bytes_value(options.ephemeral_headroom)
        )
        requests["ephemeral-storage"] = scratch
        limits["ephemeral-storage"] = scratch
    if res.gpus > 0:
        requests[options.gpu_resource] = str(res.gpus)
        limits[options.gpu_resource] = str(res.gpus)

    env: list[dict[str, Any]] = [
        _plain("KUBETRAIN_JOB_ID", job_id),
        # The reporter names its Pod, which the control plane maps to an attempt.
        {
            "name": "KUBETRAIN_POD_NAME",
            "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
        },
    ]
    # The preflight counts NVIDIA devices only (device nodes, nvidia-smi, the CUDA
    # driver): for another vendor's resource it would refuse every Pod, so it is
    # not asked, and the report says the check was skipped.
    if options.gpu_resource.startswith("nvidia.com/"):
        env.append(_plain("KUBETRAIN_EXPECTED_GPUS", str(res.gpus)))
    if gang:
        rendezvous = spec.rendezvous_timeout
        env += _gang_env(
            name,
            namespace,
            spec.workers,
            res.gpus,
            duration_seconds(rendezvous) if rendezvous is not None else None,
        )
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if dataset is not None:
        env += [
            _plain("KUBETRAIN_DATASET_PATH", DATASET_PATH),
            _plain("KUBETRAIN_DATASET_NAME", dataset.name),
            _plain("KUBETRAIN_DATASET_VERSION", dataset.version),
        ]
        if dataset.checksums is not None:
            env.append(_plain("KUBETRAIN_DATASET_CHECKSUMS", f"{DATASET_PATH}/{dataset.checksums}"))
        if dataset.checksums_sha256 is not None:
            env.append(_plain("KUBETRAIN_DATASET_CHECKSUMS_SHA256", dataset.checksums_sha256))
        volumes.append(
            {
                "name": "dataset",
                "persistentVolumeClaim": {"claimName": dataset.claim, "readOnly": True},
            }
        )
        mount: dict[str, Any] = {"name": "dataset", "mountPath": DATASET_PATH, "readOnly": True}
        if dataset.sub_path is not None:
            mount["subPath"] = dataset.sub_path
        mounts.append(mount)
    for volume, claim, path, variable in (
        ("checkpoints", spec.checkpoints, CHECKPOINT_DIR, "KUBETRAIN_CHECKPOINT_DIR"),
        ("output", spec.output, OUTPUT_DIR, "KUBETRAIN_OUTPUT_DIR"),
    ):
        if claim is not None:
            env.append(_plain(variable, path))
            volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": claim.claim}})
            mounts.append({"name": volume, "mountPath": path})
    if spec.cache is not None:
        env.append(_plain("KUBETRAIN_CACHE_DIR", CACHE_DIR))
        volumes.append(
            {"name": "cache", "emptyDir": {"sizeLimit": canonical_bytes(spec.cache.size)}}
        )
        mounts.append({"name": "cache", "mountPath": CACHE_DIR})
    if options.status_url is not None:
        env.append(_plain("KUBETRAIN_STATUS_URL", options.status_url))
        env.append(_plain("KUBETRAIN_STATUS_TOKEN_FILE", STATUS_TOKEN_FILE))
        volumes.append(_token_volume(options))
        mounts.append(
            {"name": STATUS_TOKEN_VOLUME, "mountPath": STATUS_TOKEN_DIR, "readOnly": True}
        )
    env.append(_plain("KUBETRAIN_TERMINATION_LOG", TERMINATION_LOG))
    for entry in spec.env:
        if entry.secret_ref is not None:
            env.append(_secret(entry.name, entry.secret_ref))
        else:
            env.append(_plain(entry.name, entry.value or ""))

    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": spec.image}
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    container["env"] = env
    if gang:
        container["ports"] = [{"containerPort": MASTER_PORT, "protocol": "TCP"}]
    container["resources"] = {"requests": requests, "limits": limits}
    if mounts:
        container["volumeMounts"] = mounts
    container["terminationMessagePath"] = TERMINATION_LOG
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container["securityContext"] = copy.deepcopy(CONTAINER_SECURITY_CONTEXT)

    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if spec.priority_class is not None and queue is None:
        pod["priorityClassName"] = spec.priority_class
    if res.gpu_type is not None:
        pod["nodeSelector"] = {options.accelerator_label: res.gpu_type}
    if res.gpus > 0:
        pod["tolerations"] = [
            {"key": options.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}
        ]
    if gang:
        pod["subdomain"] = name  # the headless Service of render_service
    pod["containers"] = [container]
    if volumes:
        pod["volumes"] = volumes

    template_meta: dict[str, Any] = {
        "labels": {**dict(sorted(job.metadata.labels.items())), **ours},
    }
    if job.metadata.annotations:
        template_meta["annotations"] = dict(sorted(job.metadata.annotations.items()))

    # A gang's attempt is one Job: kubetrain, not the Job controller, retries it. Restarted
    # in place, its trainer's failures count against a limit reached on the last attempt.
    in_place = gang and queue is not None
    backoff = spec.retries
    if gang:
        backoff = UNREACHED_BACKOFF_LIMIT if in_place and retries_used < spec.retries else 0
    job_spec: dict[str, Any] = {"backoffLimit": backoff}
    if gang:
        job_spec["completionMode"] = "Indexed"
        job_spec["completions"] = spec.workers
        job_spec["parallelism"] = spec.workers
    if queue is not None:
        job_spec["suspend"] = True
    if spec.max_runtime is not None:
        job_spec["activeDeadlineSeconds"] = duration_seconds(spec.max_runtime)
    job_spec["podReplacementPolicy"] = "Failed"
    job_spec["podFailurePolicy"] = pod_failure_policy(gang=gang, in_place=in_place)
    job_spec["template"] = {"metadata": template_meta, "spec": pod}

    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**ours, **kueue_labels},
            "annotations": {ANNOTATION_SPEC_DIGEST: digest or spec_digest(job)}
            | (
                {ANNOTATION_RETRIES: str(spec.retries), ANNOTATION_RETRIES_USED: str(retries_used)}
                if gang
                else {}
            )
            | ({ANNOTATION_RESTART: IN_PLACE} if in_place else {}),
        },
        "spec": job_spec,
    }
