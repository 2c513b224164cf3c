"""The dashboard's HTML routes on the real app and database, with a cluster view made
of dumps recorded from the testbed (tests/fixtures/snapshots)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.cluster.tokenreview import TokenReviewer
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import OTHER, PROJECT, FakeReviewer, Tokens, make_tokens
from tests.isolated import isolated_settings
from tests.pg import backend, database_url, db, postgres_server

__all__ = ["backend", "database_url", "db", "isolated_settings", "postgres_server"]

SNAPSHOTS = Path(__file__).parent.parent / "fixtures" / "snapshots"
# Where the two recorded dumps live: PROJECT's has a Pod waiting for GPUs, OTHER's a quota.
PROJECT_NAMESPACE = "fixture-insufficient-gpu-167d"
OTHER_NAMESPACE = "fixture-waiting-for-quota-ebe6"


def recorded_cluster() -> dict[str, Any]:
    """Two recorded dumps as one List, their shared nodes once: what the watch caches hold."""
    gpu = json.loads((SNAPSHOTS / "insufficient-gpu.json").read_text())
    quota = json.loads((SNAPSHOTS / "waiting-for-quota.json").read_text())
    items = gpu["items"] + [i for i in quota["items"] if i["kind"] != "Node"]
    return {"apiVersion": "v1", "kind": "List", "items": items}


@pytest.fixture
def tokens(db: Database) -> Tokens:
    return make_tokens(db)


@pytest.fixture
def reviewer() -> FakeReviewer:
    """The Pods' tokens the reports are sent with (tests/api/builders.py's `enrol`)."""
    return FakeReviewer()


@pytest.fixture
def app(db: Database, reviewer: FakeReviewer) -> FastAPI:
    settings = ServerSettings(
        database_url=db.url.render_as_string(hide_password=False),
        namespaces={PROJECT: PROJECT_NAMESPACE, OTHER: OTHER_NAMESPACE},
    )
    listing = recorded_cluster()
    pods = cast(TokenReviewer, reviewer)
    return create_app(settings, db, cluster=lambda: listing, pod_tokens=pods)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "the page has no CSRF field"
    return found.group(1)


def sign_in(client: TestClient, plaintext: str) -> None:
    """Through the sign-in form, as a browser does."""
    form = client.get("/ui/signin")
    resp = client.post(
        "/ui/signin",
        data={"csrf_token": csrf_of(form.text), "token": plaintext, "next": "/ui/"},
        follow_redirects=False,
    )
    assert resp.status_code == 303, resp.text


def plaintext(tokens: Tokens, role: str, project: str = PROJECT) -> str:
    return tokens(role, project)["Authorization"].removeprefix("Bearer ")
