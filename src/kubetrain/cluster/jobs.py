"""Create and delete kubetrain's Kubernetes Jobs (and their gang Services) idempotently.

Every function raises ClusterError (cluster/errors.py) for what Kubernetes or the
connection refused, never the client library's errors.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

import msgspec
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job, JobStatus
from lightkube.resources.core_v1 import Namespace, Pod, Service
from lightkube.types import CascadeType, PatchType

from kubetrain.cluster.client import FIELD_MANAGER, CreatingClient
from kubetrain.cluster.errors import ClusterError, JobConflictError, kube_errors, refused
from kubetrain.domain.manifest import (
    ANNOTATION_RESTART,
    CONTROLLER_UID,
    IN_PLACE,
    KUEUE_STOPPING,
    LABEL_ATTEMPT,
    LABEL_JOB_ID,
)

_R = TypeVar("_R")
_P = ParamSpec("_P")


def _wrapped(call: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """The call's client-library errors as ClusterError (kube_errors)."""

    @functools.wraps(call)
    async def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with kube_errors():
            return await call(*args, **kwargs)

    return wrapped


@_wrapped
async def ensure_namespace(client: AsyncClient, name: str, labels: dict[str, str]) -> None:
    """Make the namespace with `labels` (manifest.namespace_labels) unless it exists; one
    that exists is the cluster admin's and is left as it is."""
    try:
        await client.get(Namespace, name)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        try:
            await client.create(Namespace(metadata=ObjectMeta(name=name, labels=labels)))
        except ApiError as again:
            if again.status.code != 409:
                raise


class _Meta(msgspec.Struct):
    uid: str | None = None


class _Made(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_encode = msgspec.json.Encoder().encode
_read_made = msgspec.json.Decoder(_Made).decode


@_wrapped
async def create_job(
    http: CreatingClient, client: AsyncClient, manifest: dict[str, Any]
) -> str | None:
    """Create the Job, or find it already there as ours; returns its uid.

    The name is derived from our job id, so a retry after a lost response (or a
    dispatcher restarted mid-create) finds its own Job and calls it success.

    The create, one per job through a backlog, goes through `http` (`creating_client`:
    kept connections of our own, cluster/wire.py) as bytes, its answer read for the uid
    alone: the same bytes through httpx cost five times the CPU, lightkube's typed create
    six times (the manifest made a model and a dict again, the answer decoded into a
    model; bench/create.py). The rare rest uses `client`.
    """
    namespace: str = manifest["metadata"]["namespace"]
    response = await http.post(
        f"/apis/batch/v1/namespaces/{namespace}/jobs?fieldManager={FIELD_MANAGER}",
        _encode(manifest),
    )
    if response.ok:
        try:
            return _read_made(response.body).metadata.uid
        except msgspec.MsgspecError as exc:
            raise ClusterError("InvalidResponse", f"the created Job's answer: {exc}") from exc
    if response.status != 409:
        raise refused(response)
    existing = await client.get(Job, manifest["metadata"]["name"], namespace=namespace)
    labels = (existing.metadata.labels if existing.metadata else None) or {}
    if labels.get(LABEL_JOB_ID) != manifest["metadata"]["labels"][LABEL_JOB_ID]:
        raise JobConflictError(
            f"a Job named {manifest['metadata']['name']} exists in {namespace} "
            "and is not this kubetrain job's"
        )
    attempt = manifest["metadata"]["labels"].get(LABEL_ATTEMPT)
    if labels.get(LABEL_ATTEMPT) != attempt:
        # A gang's earlier attempt, still going: the next is created once it is gone.
        raise ClusterError(
            "PreviousAttempt",
            f"Job {manifest['metadata']['name']} of attempt {labels.get(LABEL_ATTEMPT)} "
            f"is still there; attempt {attempt} waits for it to go",
        )
    return _uid(existing)


def _uid(job: Job) -> str | None:
    return job.metadata.uid if job.metadata else None


@_wrapped
async def put_service(client: AsyncClient, manifest: dict[str, Any]) -> None:
    """Create a gang's headless Service, or find it there as ours (a create repeated after
    a lost answer). One left by an earlier Job of the same name is given the new owner."""
    obj = cast(Service, Service.from_dict(manifest))
    meta = manifest["metadata"]
    try:
        await client.create(obj)
        return
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    existing = await client.get(Service, meta["name"], namespace=meta["namespace"])
    labels = (existing.metadata.labels if existing.metadata else None) or {}
    if labels.get(LABEL_JOB_ID) != meta["labels"][LABEL_JOB_ID]:
        raise JobConflictError(
            f"a Service named {meta['name']} exists in {meta['namespace']} "
            "and is not this kubetrain job's"
        )
    owners = (existing.metadata.ownerReferences if existing.metadata else None) or []
    selector = (existing.spec.selector if existing.spec else None) or {}
    if [o.uid for o in owners] != [o["uid"] for o in meta["ownerReferences"]] or (
        selector != manifest["spec"]["selector"]
    ):
        # Its selector too: it names the Pods of one Job (controller uid) and one attempt
        # only (a gang restarted in place keeps its Job, and its Service).
        await client.patch(
            Service,
            meta["name"],
            {
                "metadata": {"ownerReferences": meta["ownerReferences"]},
                "spec": {"selector": manifest["spec"]["selector"]},
            },
            namespace=meta["namespace"],
            patch_type=PatchType.MERGE,
        )


@_wrapped
async def delete_job(client: AsyncClient, namespace: str, name: str) -> bool:
    """Delete the Job and its Pods (background propagation); False if already gone."""
    try:
        await client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
        return True
    except ApiError as exc:
        if exc.status.code == 404:
            return False
        raise


@_wrapped
async def delete_attempt(client: AsyncClient, namespace: str, name: str, uid: str) -> None:
    """Delete a gang's ended attempt: its Job (with its Pods) if it is still the one of
    `uid` (a Job of the name with another uid is the next attempt's), and the Service
    that Job owned, so that the next attempt's is made anew rather than adopted while
    the garbage collector deletes it. Gone already is fine."""
    cascade = CascadeType.BACKGROUND
    service = await _found(client.get(Service, name, namespace=namespace))
    if service is not None and _owned_by(service, uid):
        await _found(client.delete(Service, name, namespace=namespace, cascade=cascade))
    job = await _found(client.get(Job, name, namespace=namespace))
    if job is not None and _uid(job) == uid:
        await _found(client.delete(Job, name, namespace=namespace, cascade=cascade))


@_wrapped
async def attempt_pods_left(client: AsyncClient, namespace: str, uid: str) -> list[str]:
    """The Pods of the Job of `uid` that have not ended (phase neither Succeeded nor
    Failed), each as "name (phase, terminating)": a gang's next attempt waits until there
    are none, so that no two attempts' Pods are ever alive at once. Found by the label the
    Job controller puts on its Pods, so they are found after their Job is gone too."""
    left = []
    async for pod in client.list(Pod, namespace=namespace, labels={CONTROLLER_UID: uid}):
        phase = pod.status.phase if pod.status else None
        if phase in ("Succeeded", "Failed"):
            continue
        meta = pod.metadata
        terminating = ", terminating" if meta is not None and meta.deletionTimestamp else ""
        left.append(f"{meta.name if meta else '?'} ({phase or 'Unknown'}{terminating})")
    return sorted(left)


async def _found(call: Awaitable[_R]) -> _R | None:
    """The call's answer; None when the object is not there (404)."""
    try:
        return await call
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        return None


def _owned_by(obj: Service, uid: str) -> bool:
    owners = (obj.metadata.ownerReferences if obj.metadata else None) or []
    return any(o.uid == uid for o in owners)


@dataclass(frozen=True, slots=True)
class InPlaceJob:
    """A gang's Job that restarts in place, as `stop_attempt` left it: its attempt, and
    whether the Job controller has ended and counted every Pod of it (`settled`), with
    the failures it counted (`failed`: a last attempt's backoffLimit) and whether a rank
    succeeded (an Indexed Job would not run that index again: no restart in place)."""

    attempt: str | None
    resumed: bool  # already the next attempt: resumed before (a dispatcher that died then)
    by_kueue: bool  # suspended by Kueue (evicted): Kueue's to resume, not kubetrain's
    settled: bool
    failed: int
    succeeded: int


@_wrapped
async def stop_attempt(
    client: AsyncClient, namespace: str, name: str, uid: str, following: str
) -> InPlaceJob | None:
    """Suspend a gang's Job restarted in place (the Job controller then deletes its Pods),
    as Kueue's own `Stop` does: with Kueue's `kueue.x-k8s.io/stopping` mark, so that
    Kueue, which resumes a suspended Job whose Workload is admitted, leaves it suspended
    (its Workload keeps its admission and its quota), and with `status.startTime`
    cleared, so that the template's labels may change before it is resumed
    (`resume_attempt`). Idempotent; a Job that is attempt `following` already is left as it
    is (`resumed`). None when the Job of `uid` is gone, or is no Job restarted in place,
    or has finished: the caller makes a new Job instead."""
    job = await _found(client.get(Job, name, namespace=namespace))
    meta = job.metadata if job is not None else None
    if job is None or meta is None or meta.uid != uid:
        return None
    if (meta.annotations or {}).get(ANNOTATION_RESTART) != IN_PLACE:
        return None
    status = job.status
    attempt = (meta.labels or {}).get(LABEL_ATTEMPT)
    if attempt == following:
        return InPlaceJob(
            attempt, resumed=True, by_kueue=False, settled=True, failed=0, succeeded=0
        )
    conditions = (status.conditions if status else None) or []
    if any(
        c.type in ("Complete", "Failed", "FailureTarget", "SuccessCriteriaMet")
        and c.status == "True"
        for c in conditions
    ):
        return None
    marked = (meta.annotations or {}).get(KUEUE_STOPPING) == "true"
    # Suspended without the mark: Kueue stopped it itself (its Workload evicted, by a
    # preemption or its waitForPodsReady); Kueue resumes it once readmitted.
    by_kueue = bool(job.spec and job.spec.suspend) and not marked
    if not (job.spec and job.spec.suspend):
        await client.patch(
            Job,
            name,
            {"metadata": {"annotations": {KUEUE_STOPPING: "true"}}, "spec": {"suspend": True}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    if status is not None and status.startTime is not None:
        await client.patch(
            JobStatus,
            name,
            {"status": {"startTime": None}},
            namespace=namespace,
            patch_type=PatchType.MERGE,
        )
    uncounted = status.uncountedTerminatedPods if status else None
    settled = (
        status is not None
        and not status.active
        and not status.terminating
        and not (uncounted and (uncounted.failed or uncounted.succeeded))
    )
    return InPlaceJob(
        attempt=attempt,
        resumed=False,
        by_kueue=by_kueue,
        settled=settled,
        failed=(status.failed if status else None) or 0,
        succeeded=(status.succeeded if status else None) or 0,
    )


@_wrapped
async def resume_attempt(
    client: AsyncClient, manifest: dict[str, Any], backoff_limit: int, *, by_kueue: bool = False
) -> None:
    """Resume a gang's Job stopped by `stop_attempt` as the attempt `manifest` renders:
    its label and retries on the Job and its Pods' template (mutable while the Job is
    suspended and its startTime cleared), `backoff_limit`, Kueue's stopping mark removed
    and `suspend: false`, in one patch. Kueue sees a Job running on its admitted Workload
    and leaves it so: the Workload, its admission and its place in the queue persist. A
    Job Kueue suspended itself meanwhile (`by_kueue`) gets the next attempt's labels only:
    Kueue resumes it once its Workload is admitted again."""
    meta = manifest["metadata"]
    template = manifest["spec"]["template"]["metadata"]
    resume: dict[str, Any] = {} if by_kueue else {"suspend": False}
    mark: dict[str, Any] = {} if by_kueue else {KUEUE_STOPPING: None}
    await client.patch(
        Job,
        meta["name"],
        {
            "metadata": {
                "labels": {LABEL_ATTEMPT: meta["labels"][LABEL_ATTEMPT]},
                "annotations": {**meta["annotations"], **mark},
            },
            "spec": {
                **resume,
                "backoffLimit": backoff_limit,
                "template": {
                    "metadata": {"labels": {LABEL_ATTEMPT: template["labels"][LABEL_ATTEMPT]}}
                },
            },
        },
        namespace=meta["namespace"],
        patch_type=PatchType.MERGE,
    )
