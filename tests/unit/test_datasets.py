"""Dataset versions: registry entries and how a job's dataset is resolved through them."""

from __future__ import annotations

from typing import Any

import pytest

from kubetrain.domain.datasets import DatasetVersion, parse_dataset_version, resolve_dataset
from kubetrain.domain.spec import DatasetRef, SpecError

pytestmark = pytest.mark.unit

SHA = "0123456789abcdef" * 4


def ref(**fields: Any) -> DatasetRef:
    return DatasetRef.model_validate({"name": "imagenet", "version": "v3", **fields})


def entry(**fields: Any) -> DatasetVersion:
    return parse_dataset_version(
        {
            "name": "imagenet",
            "version": "v3",
            "claim": "datasets",
            "subPath": "imagenet/v3",
            **fields,
        }
    )


def test_a_ref_with_its_own_claim_is_not_looked_up():
    resolved = resolve_dataset(ref(claim="my-data", subPath="v3"), None)
    assert (resolved.name, resolved.version) == ("imagenet", "v3")
    assert (resolved.claim, resolved.sub_path) == ("my-data", "v3")
    assert resolved.checksums is None


def test_a_ref_with_its_own_claim_wins_over_a_registry_entry():
    resolved = resolve_dataset(ref(claim="my-data"), entry(), known_versions=["v1"])
    assert resolved.claim == "my-data"
    assert resolved.sub_path is None


def test_a_ref_by_name_and_version_takes_the_registry_entry():
    registered = entry(checksums="SHA256SUMS", checksumsSha256=SHA)
    assert resolve_dataset(ref(), registered, known_versions=["v3"]) is registered


def test_an_unknown_name_is_refused_naming_the_field():
    with pytest.raises(SpecError) as info:
        resolve_dataset(ref(), None)
    [problem] = info.value.problems
    assert problem.field == "spec.dataset.name"
    assert "unknown dataset 'imagenet'" in problem.message
    assert "claim" in problem.message


def test_an_unknown_version_is_refused_with_the_known_ones():
    with pytest.raises(SpecError) as info:
        resolve_dataset(ref(), None, known_versions=["v2", "v1"])
    [problem] = info.value.problems
    assert problem.field == "spec.dataset.version"
    assert "no version 'v3'" in problem.message
    assert "v1, v2" in problem.message


def test_a_long_list_of_versions_is_cut_short():
    versions = [f"v{i:03d}" for i in range(50)]
    with pytest.raises(SpecError) as info:
        resolve_dataset(ref(), None, known_versions=versions)
    message = info.value.problems[0].message
    assert "v019" in message
    assert "v020" not in message
    assert "and 30 more" in message


def test_an_entry_for_another_version_is_a_bug_not_a_spec_error():
    with pytest.raises(ValueError, match="does not match") as info:
        resolve_dataset(ref(), entry(version="v2"))
    assert not isinstance(info.value, SpecError)


def test_registry_entries_are_validated():
    registered = entry(checksums="meta/SHA256SUMS", checksumsSha256=SHA)
    assert registered.checksums == "meta/SHA256SUMS"
    assert registered.model_dump(exclude_none=True)["subPath"] == "imagenet/v3"


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("name", "ImageNet", "DNS-1123"),
        ("version", 3, "string"),
        ("claim", "", "empty"),
        ("subPath", "/imagenet", "relative"),
        ("checksums", "../SUMS", "'..'"),
        ("checksumsSha256", "ABC", "sha256"),
        ("owner", "me", "unknown field"),
    ],
)
def test_registry_entry_problems_name_the_field(field, value, says):
    data = {"name": "imagenet", "version": "v3", "claim": "datasets", "checksums": "SUMS"}
    with pytest.raises(SpecError) as info:
        parse_dataset_version({**data, field: value})
    found = {p.field: p.message for p in info.value.problems}
    assert says in found[field]


def test_a_checksum_pin_needs_its_manifest():
    with pytest.raises(SpecError) as info:
        entry(checksumsSha256=SHA)
    assert info.value.problems[0].field == "checksumsSha256"


def test_a_registry_entry_needs_a_claim():
    with pytest.raises(SpecError) as info:
        parse_dataset_version({"name": "imagenet", "version": "v3"})
    assert {p.field for p in info.value.problems} == {"claim"}
