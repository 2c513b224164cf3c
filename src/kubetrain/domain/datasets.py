"""Dataset versions: where a named version lives, and how a job's dataset is resolved.

The platform knows its datasets: an admin registers each version (name,
version, PVC claim, sub-path, optional checksum manifest). A job that names
only `dataset: {name, version}` is resolved through that registry, and an
unknown name or version is refused at submission (SpecError naming
`spec.dataset.name` or `spec.dataset.version`) instead of failing later in a
Pod. A job that gives `claim` (and `subPath`) itself is not looked up.

The lookup is the caller's (store/ holds the registry); `resolve_dataset` only
decides, from what the lookup found.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from pydantic import ValidationError, model_validator

from kubetrain.domain.spec import (
    DatasetName,
    DatasetRef,
    DatasetVersionName,
    ObjectName,
    SpecError,
    SpecModel,
    SubPath,
    checked_by,
    problems_from_validation_error,
    raise_at,
)

__all__ = ["DatasetVersion", "parse_dataset_version", "resolve_dataset"]

# How many known versions an "unknown version" message lists.
_VERSIONS_SHOWN = 20


def _sha256_problem(value: str) -> str | None:
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        return "must be a sha256 digest: 64 lowercase hexadecimal digits"
    return None


Sha256 = Annotated[str, checked_by(_sha256_problem)]


class DatasetVersion(SpecModel):
    """One registered (or directly given) version of a dataset, as the Pod will mount it.

    `checksums` is the path of a checksum manifest inside the dataset (relative
    to `subPath`); `checksumsSha256`, when given, pins that manifest, so the
    in-container preflight can tell the right version from one changed in place.
    """

    name: DatasetName
    version: DatasetVersionName
    claim: ObjectName
    sub_path: SubPath | None = None
    checksums: SubPath | None = None
    checksums_sha256: Sha256 | None = None

    @model_validator(mode="after")
    def _pin_needs_manifest(self) -> DatasetVersion:
        if self.checksums_sha256 is not None and self.checksums is None:
            raise_at(
                "DatasetVersion",
                [(("checksumsSha256",), "needs checksums (the manifest it pins)", None)],
            )
        return self


def parse_dataset_version(data: object) -> DatasetVersion:
    """Validate a registry entry (the admin's API body); SpecError naming each field."""
    try:
        return DatasetVersion.model_validate(data)
    except ValidationError as exc:
        raise SpecError(problems_from_validation_error(exc, DatasetVersion)) from None


def resolve_dataset(
    ref: DatasetRef,
    entry: DatasetVersion | None,
    *,
    known_versions: Sequence[str] = (),
) -> DatasetVersion:
    """The dataset version a job mounts.

    `entry` is what the registry holds for (ref.name, ref.version), or None;
    `known_versions` are the versions it holds for ref.name (empty: the name is
    unknown). A ref with its own claim is taken as it is and neither is read.
    """
    if ref.claim is not None:
        return DatasetVersion.model_validate(
            {
                "name": ref.name,
                "version": ref.version,
                "claim": ref.claim,
                "subPath": ref.sub_path,
            }
        )
    if entry is not None:
        if (entry.name, entry.version) != (ref.name, ref.version):
            # The caller looked up something else: a bug, not the user's mistake.
            raise ValueError(
                f"registry entry {entry.name}:{entry.version} does not match "
                f"{ref.name}:{ref.version}"
            )
        return entry
    if not known_versions:
        raise SpecError.single(
            "spec.dataset.name",
            f"unknown dataset {ref.name!r}: ask an admin to register it "
            "(kubetrain dataset register), or give claim (and subPath) directly",
        )
    shown = sorted(known_versions)[:_VERSIONS_SHOWN]
    more = len(known_versions) - len(shown)
    listed = ", ".join(shown) + (f" and {more} more" if more > 0 else "")
    raise SpecError.single(
        "spec.dataset.version",
        f"dataset {ref.name!r} has no version {ref.version!r}; registered versions: {listed}",
    )
