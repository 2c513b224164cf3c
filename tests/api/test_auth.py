"""Tokens, roles and scopes: 401 without a valid token, 403 for a role or project-wide scope
that may not act, 404 for a job outside the token's projects, on every endpoint."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import httpx2 as httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import event

from kubetrain.api import create_app
from kubetrain.api.principal import PERMISSIONS, Action
from kubetrain.api.token_cache import VerifiedTokens
from kubetrain.settings import ServerSettings
from kubetrain.store import (
    ALL_PROJECTS,
    Database,
    Role,
    create_token,
    list_tokens,
    revoke_token,
)
from tests.api.builders import (
    JOBS,
    OTHER,
    PROJECT,
    Tokens,
    bearer,
    make_tokens,
    submitted,
    training_job,
)
from tests.store.builders import observe

pytestmark = pytest.mark.db

DATASET = {"name": "imagenet", "version": "v3", "claim": "dataset-imagenet"}


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # {job} is the id of a job in PROJECT
    action: Action
    scope: str  # "project": project-wide; "job": one job; "global": no project
    body: dict[str, Any] | None = None

    def call(self, client: TestClient, job_id: str, headers: dict[str, str]) -> httpx.Response:
        return client.request(
            self.method, self.path.format(job=job_id), json=self.body, headers=headers
        )


ENDPOINTS = [
    Endpoint("GET", JOBS, Action.READ, "project"),
    Endpoint("POST", JOBS, Action.SUBMIT, "project", training_job("another")),
    Endpoint("GET", JOBS + "/{job}", Action.READ, "job"),
    Endpoint("GET", JOBS + "/{job}/history", Action.READ, "job"),
    Endpoint("GET", JOBS + "/{job}/attempts", Action.READ, "job"),
    Endpoint("GET", JOBS + "/{job}/manifest", Action.READ, "job"),
    Endpoint("GET", JOBS + "/{job}/diagnosis", Action.READ, "job"),
    Endpoint("POST", JOBS + "/{job}/cancel", Action.CANCEL, "job"),
    Endpoint("GET", "/api/v1/datasets", Action.READ, "global"),
    Endpoint("POST", "/api/v1/datasets", Action.ADMIN, "global", DATASET),
]
SCOPES = (PROJECT, OTHER, ALL_PROJECTS)


def expected_status(endpoint: Endpoint, role: Role, scope: str) -> int:
    may = endpoint.action in PERMISSIONS[role]
    covers = scope in (PROJECT, ALL_PROJECTS)
    if endpoint.scope == "project":
        return 200 if may and covers else 403
    if endpoint.scope == "job":
        if not may:
            return 403
        return 200 if covers else 404
    if endpoint.action == Action.ADMIN:
        return 200 if role == Role.ADMIN and scope == ALL_PROJECTS else 403
    return 200


@pytest.fixture
def job_id(client: TestClient, tokens: Tokens, db: Database) -> str:
    job_id = submitted(client, tokens)
    with db.transaction() as session:
        observe(session, job_id, diagnosis={"primary": "SCHEDULING"})
    return job_id


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_every_role_and_scope_gets_its_answer(
    client: TestClient, tokens: Tokens, job_id: str, endpoint: Endpoint
) -> None:
    answers = {}
    for role in Role:
        for scope in SCOPES:
            response = endpoint.call(client, job_id, tokens(role, scope))
            status = response.status_code
            answers[(str(role), scope)] = 200 if status in (200, 201) else status
            if status >= 400:
                assert response.headers["content-type"] == "application/problem+json"
    expected = {
        (str(role), scope): expected_status(endpoint, role, scope)
        for role in Role
        for scope in SCOPES
    }
    assert answers == expected


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
@pytest.mark.parametrize(
    "authorization", [None, "Bearer kt_not-a-token", "Basic YWRtaW46YWRtaW4=", "Bearer"]
)
def test_no_valid_token_is_401_with_a_bearer_challenge(
    client: TestClient, job_id: str, endpoint: Endpoint, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    response = endpoint.call(client, job_id, headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["www-authenticate"].startswith("Bearer")
    if authorization is not None:
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
    assert response.json()["status"] == 401


class Clock:
    """The token cache's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(app: FastAPI) -> Clock:
    """The app's token cache (5 s, as by default) on a clock the test moves."""
    clock = Clock()
    app.state.kubetrain = replace(
        app.state.kubetrain, tokens=VerifiedTokens(TOKEN_CACHE_TTL, clock=clock)
    )
    return clock


TOKEN_CACHE_TTL = ServerSettings.model_fields["token_cache_seconds"].default


def test_a_revoked_token_is_401_within_the_token_cache_ttl(
    client: TestClient, db: Database, clock: Clock
) -> None:
    with db.transaction() as session:
        token, plaintext = create_token(session, name="gone", role=Role.ADMIN, project="*")
    assert client.get(JOBS, headers=bearer(plaintext)).status_code == 200  # verified now
    with db.transaction() as session:
        revoke_token(session, token.id)
    # The documented grace: a replica that verified the token takes it on trust
    # until the TTL has passed since that lookup, and not a moment longer.
    clock.now += TOKEN_CACHE_TTL - 0.1
    assert client.get(JOBS, headers=bearer(plaintext)).status_code == 200
    clock.now += 0.1
    assert client.get(JOBS, headers=bearer(plaintext)).status_code == 401
    clock.now -= 10  # nothing of a refused token is remembered
    assert client.get(JOBS, headers=bearer(plaintext)).status_code == 401


def test_without_the_token_cache_a_revocation_is_immediate(
    settings: ServerSettings, db: Database
) -> None:
    app = create_app(settings.model_copy(update={"token_cache_seconds": 0}), db)
    with TestClient(app) as client:
        with db.transaction() as session:
            token, plaintext = create_token(session, name="gone", role=Role.ADMIN, project="*")
        assert client.get(JOBS, headers=bearer(plaintext)).status_code == 200
        with db.transaction() as session:
            revoke_token(session, token.id)
        assert client.get(JOBS, headers=bearer(plaintext)).status_code == 401


def test_a_verified_token_is_not_looked_up_again_within_the_ttl(
    client: TestClient, db: Database, clock: Clock
) -> None:
    with db.transaction() as session:
        _, plaintext = create_token(session, name="busy", role=Role.VIEWER, project=PROJECT)
    lookups: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "FROM tokens" in statement:
            lookups.append(statement)

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        assert client.get(JOBS, headers=bearer(plaintext)).status_code == 200
        first = len(lookups)  # the lookup, and the write of last_used_at
        assert first >= 1
        for _ in range(2):
            assert client.get(JOBS, headers=bearer(plaintext)).status_code == 200
        assert len(lookups) == first
        clock.now += TOKEN_CACHE_TTL
        assert client.get(JOBS, headers=bearer(plaintext)).status_code == 200
        assert len(lookups) == first + 1  # looked up again; last_used_at is a minute good
        # A remembered token keeps its scope and role: other projects and writes stay refused.
        assert (
            client.get(f"/api/v1/projects/{OTHER}/jobs", headers=bearer(plaintext)).status_code
            == 403
        )
        assert (
            client.post(JOBS, json=training_job("x"), headers=bearer(plaintext)).status_code == 403
        )
        assert len(lookups) == first + 1
    finally:
        event.remove(db.engine, "before_cursor_execute", count)


def test_an_unseen_job_reads_the_same_as_a_missing_one(
    client: TestClient, tokens: Tokens, job_id: str
) -> None:
    missing = "00000000-0000-4000-8000-000000000000"
    hidden = client.get(f"{JOBS}/{job_id}", headers=tokens(Role.ADMIN, OTHER)).json()
    absent = client.get(f"{JOBS}/{missing}", headers=tokens(Role.ADMIN, PROJECT)).json()
    assert hidden["status"] == absent["status"] == 404
    assert {k: str(v).replace(job_id, "ID") for k, v in hidden.items()} == {
        k: str(v).replace(missing, "ID") for k, v in absent.items()
    }


def test_a_job_is_found_only_under_its_own_project(
    client: TestClient, tokens: Tokens, job_id: str
) -> None:
    elsewhere = f"/api/v1/projects/{OTHER}/jobs/{job_id}"
    for headers in (tokens(Role.ADMIN, ALL_PROJECTS), tokens(Role.ADMIN, OTHER)):
        assert client.get(elsewhere, headers=headers).status_code == 404
        assert client.post(elsewhere + "/cancel", headers=headers).status_code == 404
        assert client.get(elsewhere + "/history", headers=headers).status_code == 404
    listed = client.get(f"/api/v1/projects/{OTHER}/jobs", headers=tokens(Role.ADMIN, OTHER))
    assert listed.json()["items"] == []


def test_a_read_records_the_tokens_use(client: TestClient, tokens: Tokens, db: Database) -> None:
    headers = tokens(Role.VIEWER, PROJECT)
    for _ in range(3):
        assert client.get(JOBS, headers=headers).status_code == 200
    with db.read_only() as session:
        used = {t.name: t.last_used_at for t in list_tokens(session)}
    assert used[f"viewer-{PROJECT}"] is not None
    assert used[f"viewer-{OTHER}"] is None


RESERVED = ["kubetrain", "default", "kube-system", "monitoring", "cert-manager", "kueue-system"]


@pytest.mark.parametrize("project", RESERVED)
def test_a_token_for_every_project_still_cannot_use_the_platforms_namespaces(
    client: TestClient, tokens: Tokens, project: str
):
    """A project names a namespace: kubetrain's own (its Secrets hold the database's
    password) and the system ones are refused as if outside the token's scope."""
    jobs = f"/api/v1/projects/{project}/jobs"
    for role in ("admin", "submitter"):
        headers = tokens(role, ALL_PROJECTS)
        refused = client.post(jobs, json=training_job("sneaky"), headers=headers)
        assert refused.status_code == 403, refused.text
        assert refused.json()["detail"] == f"project {project!r} is outside the API token's scope"
        assert client.get(jobs, headers=headers).status_code == 403
        assert client.get(f"{jobs}/no-such-id", headers=headers).status_code == 404
        assert client.post(f"{jobs}/no-such-id/cancel", headers=headers).status_code == 404
    # nothing was written half-way
    listing = client.get(JOBS, headers=tokens.admin).json()
    assert all(job["project"] == PROJECT for job in listing["items"])


def test_an_allow_list_opens_only_its_namespaces(db: Database, settings: ServerSettings):
    restricted = settings.model_copy(update={"allowed_namespaces": ["team-*", PROJECT]})
    tokens = make_tokens(db)
    with TestClient(create_app(restricted, db)) as client:
        headers = tokens("submitter", ALL_PROJECTS)
        opened = client.post(
            "/api/v1/projects/team-vision/jobs", json=training_job("a"), headers=headers
        )
        assert opened.status_code == 201, opened.text
        assert client.post(JOBS, json=training_job("b"), headers=headers).status_code == 201
        closed = client.post(
            "/api/v1/projects/research/jobs", json=training_job("c"), headers=headers
        )
        assert closed.status_code == 403
        # reserved wins over allowed
        kube = client.post(
            "/api/v1/projects/team-system/jobs", json=training_job("d"), headers=headers
        )
        assert kube.status_code == 403
