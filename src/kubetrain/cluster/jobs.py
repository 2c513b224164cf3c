"""Create and delete kubetrain's Kubernetes Jobs idempotently."""

from __future__ import annotations

from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace
from lightkube.types import CascadeType

from kubetrain.domain.manifest import LABEL_JOB_ID, LABEL_MANAGED_BY, MANAGED_BY


class JobConflictError(RuntimeError):
    """A Job of that name exists but is not ours: we must not adopt or replace it."""


async def ensure_namespace(client: AsyncClient, name: str) -> None:
    try:
        await client.get(Namespace, name)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        labels = {LABEL_MANAGED_BY: MANAGED_BY}
        try:
            await client.create(Namespace(metadata=ObjectMeta(name=name, labels=labels)))
        except ApiError as again:
            if again.status.code != 409:
                raise


async def create_job(client: AsyncClient, manifest: dict[str, Any]) -> bool:
    """Create the Job; True if created now, False if it already existed as ours.

    The name is derived from our job id, so a retry after a lost response (or a
    dispatcher restarted mid-create) finds its own Job and calls it success.
    """
    obj = cast(Job, Job.from_dict(manifest))
    namespace: str = manifest["metadata"]["namespace"]
    try:
        await client.create(obj)  # the namespace is in the manifest
        return True
    except ApiError as exc:
        if exc.status.code != 409:
            raise
    existing = await client.get(Job, manifest["metadata"]["name"], namespace=namespace)
    labels = (existing.metadata.labels if existing.metadata else None) or {}
    if labels.get(LABEL_JOB_ID) != manifest["metadata"]["labels"][LABEL_JOB_ID]:
        raise JobConflictError(
            f"a Job named {manifest['metadata']['name']} exists in {namespace} "
            "and is not this kubetrain job's"
        )
    return False


async def delete_job(client: AsyncClient, namespace: str, name: str) -> bool:
    """Delete the Job and its Pods (background propagation); False if already gone."""
    try:
        await client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
        return True
    except ApiError as exc:
        if exc.status.code == 404:
            return False
        raise
