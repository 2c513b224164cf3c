"""The dataset registry through the API: register once, list, refuse repointing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.builders import Tokens

pytestmark = pytest.mark.db

DATASETS = "/api/v1/datasets"
V3 = {
    "name": "imagenet",
    "version": "v3",
    "claim": "dataset-imagenet",
    "subPath": "v3",
    "checksums": "SHA256SUMS",
    "checksumsSha256": "0" * 64,
}


def test_register_then_list(client: TestClient, tokens: Tokens) -> None:
    created = client.post(DATASETS, json=V3, headers=tokens.admin)
    assert created.status_code == 201
    entry = created.json()
    assert entry["dataset"] == V3
    assert entry["created_by"] == "admin-*"
    again = client.post(DATASETS, json=V3, headers=tokens.admin)
    assert (again.status_code, again.json()) == (200, entry)
    coco = {"name": "coco", "version": "2017", "claim": "coco"}
    assert client.post(DATASETS, json=coco, headers=tokens.admin).status_code == 201

    listed = client.get(DATASETS, headers=tokens("viewer")).json()["items"]
    assert [(e["dataset"]["name"], e["dataset"]["version"]) for e in listed] == [
        ("coco", "2017"),
        ("imagenet", "v3"),
    ]
    only = client.get(f"{DATASETS}?name=coco", headers=tokens("viewer")).json()["items"]
    assert [e["dataset"]["name"] for e in only] == ["coco"]


def test_a_version_is_never_repointed(client: TestClient, tokens: Tokens) -> None:
    assert client.post(DATASETS, json=V3, headers=tokens.admin).status_code == 201
    moved = client.post(DATASETS, json={**V3, "claim": "elsewhere"}, headers=tokens.admin)
    assert moved.status_code == 409
    assert moved.headers["content-type"] == "application/problem+json"
    assert moved.json()["type"] == "urn:kubetrain:problem:dataset-conflict"


def test_refusals_name_the_field(client: TestClient, tokens: Tokens) -> None:
    bad = {"name": "Not_A_Label", "version": "v1", "claim": "No Spaces", "colour": "red"}
    response = client.post(DATASETS, json=bad, headers=tokens.admin)
    assert response.status_code == 422
    fields = {e["field"] for e in response.json()["errors"]}
    assert fields == {"name", "claim", "colour"}
