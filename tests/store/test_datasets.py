"""The dataset registry: versions are registered once and never repointed."""

from __future__ import annotations

import pytest

from kubetrain.domain.datasets import DatasetVersion
from kubetrain.domain.spec import DatasetRef, SpecError
from kubetrain.store import (
    Database,
    DatasetConflict,
    dataset_version,
    get_dataset,
    list_datasets,
    register_dataset,
    register_dataset_version,
    resolve_job_dataset,
)
from tests.store.builders import T0, at

pytestmark = pytest.mark.db

V3 = {
    "name": "imagenet",
    "version": "v3",
    "claim": "dataset-imagenet",
    "sub_path": "v3",
    "checksums": {"train.tar": "sha256:ab12"},
    "created_by": "admin",
}


def test_register_get_and_list(db: Database) -> None:
    with db.transaction() as session:
        _dataset, created = register_dataset(session, **V3, now=T0)
        assert created
        register_dataset(
            session, name="imagenet", version="v4", claim="dataset-imagenet", sub_path="v4",
            created_by="admin", now=at(1),
        )  # fmt: skip
        register_dataset(
            session, name="coco", version="2017", claim="coco", created_by="admin", now=at(2)
        )
    with db.read_only() as session:
        found = get_dataset(session, "imagenet", "v3")
        assert found is not None
        assert (found.claim, found.sub_path, found.checksums, found.created_at) == (
            "dataset-imagenet",
            "v3",
            {"train.tar": "sha256:ab12"},
            T0,
        )
        assert get_dataset(session, "imagenet", "v9") is None
        everything = [(d.name, d.version) for d in list_datasets(session)]
        assert everything == [("coco", "2017"), ("imagenet", "v3"), ("imagenet", "v4")]
        assert [d.version for d in list_datasets(session, name="imagenet")] == ["v3", "v4"]


def test_registering_again_is_a_no_op_and_repointing_is_refused(db: Database) -> None:
    with db.transaction() as session:
        first, _ = register_dataset(session, **V3, now=T0)
    with db.transaction() as session:
        again, created = register_dataset(session, **V3, now=at(5))
        assert (again.id, created, again.created_at) == (first.id, False, T0)
    for change in ({"claim": "elsewhere"}, {"sub_path": "v3b"}, {"checksums": None}):
        with pytest.raises(DatasetConflict), db.transaction() as session:
            register_dataset(session, **{**V3, **change})
    with db.read_only() as session:
        assert len(list_datasets(session)) == 1


def test_domain_versions_round_trip_and_jobs_resolve_through_the_registry(db: Database) -> None:
    pinned = DatasetVersion.model_validate(
        {
            "name": "imagenet",
            "version": "v5",
            "claim": "dataset-imagenet",
            "subPath": "v5",
            "checksums": "SHA256SUMS",
            "checksumsSha256": "ab" * 32,
        }
    )
    with db.transaction() as session:
        row, created = register_dataset_version(session, pinned, created_by="admin", now=T0)
        assert created
        assert row.checksums == {"manifest": "SHA256SUMS", "sha256": "ab" * 32}
        register_dataset(session, **V3, now=at(1))
    with db.read_only() as session:
        assert resolve_job_dataset(session, None) is None
        ref = DatasetRef.model_validate({"name": "imagenet", "version": "v5"})
        assert resolve_job_dataset(session, ref) == pinned
        assert dataset_version(row) == pinned
        direct = DatasetRef.model_validate(
            {"name": "private", "version": "1", "claim": "mine", "subPath": "a"}
        )
        resolved = resolve_job_dataset(session, direct)  # not looked up
        assert resolved is not None
        assert (resolved.claim, resolved.sub_path) == ("mine", "a")
        with pytest.raises(SpecError) as unknown_version:
            resolve_job_dataset(
                session, DatasetRef.model_validate({"name": "imagenet", "version": "v9"})
            )
        assert [p.field for p in unknown_version.value.problems] == ["spec.dataset.version"]
        assert "v3, v5" in str(unknown_version.value)
        nope = DatasetRef.model_validate({"name": "nope", "version": "1"})
        with pytest.raises(SpecError) as unknown_name:
            resolve_job_dataset(session, nope)
        assert [p.field for p in unknown_name.value.problems] == ["spec.dataset.name"]
