"""Every error is a problem+json document; nothing internal reaches a client; a database that
is down is a 503; health, readiness and the OpenAPI document."""

from __future__ import annotations

import logging
import socket

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from kubetrain.api import create_app
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import JOBS, Tokens, bearer, submit

pytestmark = pytest.mark.db

PROBLEM = "application/problem+json"


def test_routing_errors_are_problems(client: TestClient, tokens: Tokens) -> None:
    missing = client.get("/api/v1/nothing-here", headers=tokens.admin)
    assert missing.status_code == 404
    assert missing.headers["content-type"] == PROBLEM
    assert missing.json() == {
        "type": "about:blank",
        "title": "Not Found",
        "status": 404,
        "detail": "no such path",
        "instance": "/api/v1/nothing-here",
    }
    # The caller's own text, decoded, is never the detail; and no answer is sniffed.
    crafted = client.get("/api/v1/%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert crafted.status_code == 404
    assert crafted.json()["detail"] == "no such path"
    assert crafted.headers["x-content-type-options"] == "nosniff"
    wrong_method = client.delete(JOBS, headers=tokens.admin)
    assert wrong_method.status_code == 405
    assert wrong_method.headers["content-type"] == PROBLEM
    assert "allow" in wrong_method.headers


def test_an_unexpected_error_is_a_bare_500_and_is_logged(
    app: FastAPI, caplog: pytest.LogCaptureFixture
) -> None:
    def explode() -> None:
        raise RuntimeError("secret internals: password=hunter2")

    app.add_api_route("/explode", explode)
    with TestClient(app) as client, caplog.at_level(logging.ERROR, logger="kubetrain.api"):
        response = client.get("/explode")
    assert response.status_code == 500
    assert response.headers["content-type"] == PROBLEM
    assert "hunter2" not in response.text
    assert "Traceback" not in response.text
    assert set(response.json()) == {"type", "title", "status", "detail", "instance"}
    assert "secret internals" in caplog.text  # the operator sees it


def test_a_failing_change_hook_does_not_fail_the_committed_request(
    settings: ServerSettings, db: Database, tokens: Tokens
) -> None:
    def broken() -> None:
        raise ConnectionError("dispatcher gone")

    with TestClient(create_app(settings, db, on_change=broken)) as client:
        assert submit(client, tokens).status_code == 201


def _unreachable_postgres() -> Database:
    with socket.socket() as probe:  # a port nobody listens on once the probe closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return Database(f"postgresql://kubetrain@127.0.0.1:{port}/kubetrain")


def test_a_database_that_is_down_is_503_and_not_ready(caplog: pytest.LogCaptureFixture) -> None:
    down = _unreachable_postgres()
    settings = ServerSettings(database_url=down.url.render_as_string(hide_password=False))
    try:
        with TestClient(create_app(settings, down)) as client:
            assert client.get("/healthz").json() == {"status": "ok"}  # the process is alive
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.headers["content-type"] == PROBLEM
            assert ready.json()["type"] == "urn:kubetrain:problem:database-unavailable"
            token = "kt_" + "a" * 43
            for response in (
                client.get(JOBS, headers=bearer(token)),
                client.post(JOBS, json={}, headers=bearer(token)),
            ):
                assert response.status_code == 503
                assert response.headers["content-type"] == PROBLEM
                assert response.headers["retry-after"] == "5"
                assert "psycopg" not in response.text
    finally:
        down.dispose()
    assert token not in caplog.text  # the token never reaches a log


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}


def test_the_openapi_document_describes_bodies_answers_and_problems(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    paths = document["paths"]
    submit_op = paths["/api/v1/projects/{project}/jobs"]["post"]
    body = submit_op["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/TrainingJob"}
    schemas = document["components"]["schemas"]
    assert {"TrainingJob", "TrainingJobSpec", "DatasetVersion", "Problem", "JobStatus"} <= set(
        schemas
    )
    assert set(submit_op["responses"]) >= {"200", "201", "400", "401", "403", "409", "413", "422"}
    for path, operations in paths.items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                content = response.get("content", {})
                if status.startswith(("4", "5")):
                    assert set(content) == {PROBLEM}, (method, path, status)
                else:
                    assert PROBLEM not in content
    job_fields = set(schemas["JobStatus"]["properties"])
    assert job_fields >= {
        "id",
        "name",
        "project",
        "business_status",
        "reason",
        "raw_reason",
        "raw_message",
        "node",
        "exit_code",
        "attempt",
        "created_at",
        "updated_at",
    }
    assert "HTTPBearer" in document["components"]["securitySchemes"]
    assert "security" not in paths["/healthz"]["get"]


@pytest.mark.parametrize(
    ("target", "field"),
    [
        ("/api/v1/datasets?name=ab%00c", "query.name"),  # a 500 on PostgreSQL, found by fuzzing
        (f"{JOBS}?name=%07bell", "query.name"),
        (f"{JOBS}?limit=5&cursor=%00", "query.cursor"),
        ("/api/v1/projects/ai%00training/jobs", "path"),
        (f"{JOBS}/kt-%1b[2J", "path"),
        ("/projects/ai%00training/jobs", "path"),  # a web page
    ],
)
def test_a_control_character_in_a_path_or_query_is_a_422_naming_where(
    client: TestClient, tokens: Tokens, target: str, field: str
) -> None:
    reply = client.get(target, headers=tokens.admin)
    assert reply.status_code == 422
    assert reply.headers["content-type"] == PROBLEM
    errors = reply.json()["errors"]
    assert [error["field"] for error in errors] == [field]
    assert "control character" in errors[0]["message"]


@pytest.mark.parametrize("base", ["http://testserver", "https://testserver"])
def test_every_answer_refuses_framing_and_sniffing_and_tls_adds_hsts(
    app: FastAPI, tokens: Tokens, base: str
) -> None:
    with TestClient(app, base_url=base) as client:
        answers = [
            client.get("/healthz"),
            client.get(JOBS, headers=tokens.admin),
            client.get("/nowhere"),
            client.get("/ui/signin"),
        ]
    for answer in answers:
        assert answer.headers["x-content-type-options"] == "nosniff", answer.url
        assert answer.headers["x-frame-options"] == "DENY", answer.url
        hsts = answer.headers.get("strict-transport-security")
        assert hsts == ("max-age=31536000" if base.startswith("https") else None), answer.url
