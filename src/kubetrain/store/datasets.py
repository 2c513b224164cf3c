"""The dataset registry: which PVC and sub-path hold each (name, version).

Versions are immutable once registered: a job that names `imagenet@v3` must get
the same bytes today and next month, so registering it again with other
contents is refused instead of silently repointing running work.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

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
