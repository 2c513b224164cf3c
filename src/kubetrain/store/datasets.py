"""The dataset registry: which PVC and sub-path hold each (name, version).

Versions are immutable once registered: a job that names `imagenet@v3` must get
the same bytes today and next month, so registering it again with other
contents is refused instead of silently repointing running work.

The domain's `DatasetVersion` (what the admin's API body and the Pod use) is
stored with its checksum manifest in the `checksums` column as
`{"manifest": PATH, "sha256": HEX}` (keys only when given);
`register_dataset_version`, `dataset_version` and `resolve_job_dataset` are
the one place that mapping lives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kubetrain.domain.datasets import DatasetVersion, resolve_dataset
from kubetrain.domain.spec import DatasetRef
from kubetrain.store._unique import insert_unless_exists
from kubetrain.store.errors import DatasetConflict
from kubetrain.store.models import Dataset


def register_dataset(
    session: Session,
    *,
    name: str,
    version: str,
    claim: str,
    created_by: str,
    sub_path: str | None = None,
    checksums: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> tuple[Dataset, bool]:
    """Register a dataset version; returns it and whether it was new.

    Registering the same contents again is a no-op (safe to retry); other
    contents for an existing (name, version) raise `DatasetConflict`.
    """
    sums = json.loads(json.dumps(checksums)) if checksums is not None else None

    def make() -> Dataset:
        return Dataset(
            name=name,
            version=version,
            claim=claim,
            sub_path=sub_path,
            checksums=sums,
            created_at=now if now is not None else datetime.now(UTC),
            created_by=created_by,
        )

    dataset, created = insert_unless_exists(
        session, lambda: get_dataset(session, name, version), make
    )
    if not created and (dataset.claim, dataset.sub_path, dataset.checksums) != (
        claim,
        sub_path,
        sums,
    ):
        raise DatasetConflict(name, version)
    return dataset, created


def get_dataset(session: Session, name: str, version: str) -> Dataset | None:
    return session.scalars(
        select(Dataset).where(Dataset.name == name, Dataset.version == version)
    ).one_or_none()


def list_datasets(session: Session, *, name: str | None = None) -> list[Dataset]:
    """Registered versions by name, each name's oldest first."""
    query = select(Dataset)
    if name is not None:
        query = query.where(Dataset.name == name)
    return list(session.scalars(query.order_by(Dataset.name, Dataset.created_at, Dataset.id)))


def register_dataset_version(
    session: Session, version: DatasetVersion, *, created_by: str, now: datetime | None = None
) -> tuple[Dataset, bool]:
    """`register_dataset` for a validated `DatasetVersion`."""
    checksums: dict[str, str] | None = None
    if version.checksums is not None:
        checksums = {"manifest": version.checksums}
        if version.checksums_sha256 is not None:
            checksums["sha256"] = version.checksums_sha256
    return register_dataset(
        session,
        name=version.name,
        version=version.version,
        claim=version.claim,
        sub_path=version.sub_path,
        checksums=checksums,
        created_by=created_by,
        now=now,
    )


def dataset_version(dataset: Dataset) -> DatasetVersion:
    """The stored row as the domain's `DatasetVersion` (what `render_job` mounts)."""
    checksums = dataset.checksums or {}
    return DatasetVersion.model_validate(
        {
            "name": dataset.name,
            "version": dataset.version,
            "claim": dataset.claim,
            "subPath": dataset.sub_path,
            "checksums": checksums.get("manifest"),
            "checksumsSha256": checksums.get("sha256"),
        }
    )


def resolve_job_dataset(session: Session, ref: DatasetRef | None) -> DatasetVersion | None:
    """The dataset version a job mounts, looked up in the registry unless it gives a claim.

    None for a job without a dataset; `SpecError` naming `spec.dataset.name` or
    `spec.dataset.version` for one the registry does not know.
    """
    if ref is None:
        return None
    if ref.claim is not None:
        return resolve_dataset(ref, None)
    row = get_dataset(session, ref.name, ref.version)
    if row is not None:
        return resolve_dataset(ref, dataset_version(row))
    known = [dataset.version for dataset in list_datasets(session, name=ref.name)]
    return resolve_dataset(ref, None, known_versions=known)
