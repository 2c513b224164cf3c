"""Submitting: 201, 200 for a replay, 409 for a reused key, 422 naming fields, 413, strict JSON."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import httpx2 as httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from starlette.routing import Match

from kubetrain.api import create_app
from kubetrain.api.jobs import PlainSubmitRoute
from kubetrain.api.schemas import JobStatus
from kubetrain.settings import ServerSettings
from kubetrain.store import Database, Job, Transition, job_history
from kubetrain.store.models import Role
from tests.api.builders import JOBS, OTHER, PROJECT, Tokens, submit, training_job

pytestmark = pytest.mark.db

PROBLEM = "application/problem+json"


def fields(response: httpx.Response) -> list[str]:
    assert response.headers["content-type"] == PROBLEM, response.text
    return [error["field"] for error in response.json()["errors"]]


def job_count(db: Database) -> int:
    with db.read_only() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def test_a_new_job_is_201_with_its_location_and_wakes_the_dispatcher(
    client: TestClient, tokens: Tokens, db: Database, changes: list[str]
) -> None:
    response = submit(client, tokens)
    assert response.status_code == 201
    body = response.json()
    assert response.headers["location"] == f"{JOBS}/{body['id']}"
    assert (body["name"], body["project"], body["namespace"]) == (
        "train-policy",
        PROJECT,
        PROJECT,
    )
    assert (body["business_status"], body["reason"]) == ("CREATED", "JOB_NOT_CREATED")
    assert body["reason_detail"]["link"] == "control-plane"
    assert body["reason_detail"]["actor"] == "platform"
    assert body["owner"] == f"submitter-{PROJECT}"  # the token's name
    assert body["attempt"] == 0
    assert (body["node"], body["exit_code"], body["runtime"]) == (None, None, None)
    for key in ("raw_reason", "raw_message", "created_at", "updated_at"):
        assert key in body
    assert changes == ["changed"]
    with db.read_only() as session:
        stored = session.get(Job, body["id"])
        assert stored is not None
        assert stored.spec["metadata"]["project"] == PROJECT  # filled in from the path
        [row] = job_history(session, PROJECT, body["id"])
    assert (row.to_state, row.to_reason, row.source) == ("CREATED", "JOB_NOT_CREATED", "api")


def test_the_answer_is_the_checked_status_of_the_stored_job(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    """The answers of a submission and of its replay, built without pydantic's checks
    (`JobStatus.unchecked`), are the checked `JobStatus` of the job as stored."""
    first = submit(client, tokens, key="k")
    again = submit(client, tokens, key="k")
    with db.read_only() as session:
        stored = session.get(Job, first.json()["id"])
        assert stored is not None
        expected = json.loads(JobStatus.of(stored, None).model_dump_json(by_alias=True))
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == expected
    assert again.json() == expected


def test_the_same_key_and_job_is_the_same_job_and_another_job_is_409(
    client: TestClient, tokens: Tokens, db: Database, changes: list[str]
) -> None:
    first = submit(client, tokens, key="retry-1")
    again = submit(client, tokens, key="retry-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    # Another spelling of the same amounts is the same job.
    respelled = training_job()
    respelled["spec"]["resources"]["requests"] = {"cpu": "4000m", "memory": "16384Mi"}
    respelled["metadata"]["project"] = PROJECT
    assert submit(client, tokens, respelled, key="retry-1").status_code == 200

    conflict = submit(client, tokens, training_job("train-other"), key="retry-1")
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == PROBLEM
    problem = conflict.json()
    assert problem["type"] == "urn:kubetrain:problem:idempotency-conflict"
    assert problem["job_id"] == first.json()["id"]
    assert problem["instance"] == JOBS
    assert job_count(db) == 1
    assert changes == ["changed"]  # replays commit nothing new


def test_without_a_key_each_submission_is_a_new_job(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    assert submit(client, tokens).status_code == 201
    assert submit(client, tokens).status_code == 201
    assert job_count(db) == 2


@pytest.mark.parametrize("key", [b"", b"has space", b"x" * 256, "ключ".encode()])
def test_malformed_idempotency_keys_are_refused(
    client: TestClient, tokens: Tokens, db: Database, key: bytes
) -> None:
    headers: dict[str, str | bytes] = {**tokens("submitter"), "Idempotency-Key": key}
    response = client.post(JOBS, json=training_job(), headers=headers)
    assert response.status_code == 422
    assert fields(response) == ["header.idempotency-key"]
    assert job_count(db) == 0


def test_twenty_concurrent_clients_with_one_key_make_one_job(
    app: FastAPI, tokens: Tokens, db: Database, changes: list[str]
) -> None:
    clients = 20
    barrier = threading.Barrier(clients)
    results: list[httpx.Response] = []
    lock = threading.Lock()

    def one_client() -> None:
        # Each thread its own client, as separate processes would be.
        with TestClient(app) as client:
            barrier.wait()
            response = submit(client, tokens, key="the-one-key")
        with lock:
            results.append(response)

    threads = [threading.Thread(target=one_client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    statuses = sorted(response.status_code for response in results)
    assert statuses == [200] * (clients - 1) + [201], [r.text for r in results]
    assert len({response.json()["id"] for response in results}) == 1
    assert job_count(db) == 1
    with db.read_only() as session:
        assert session.scalar(select(func.count()).select_from(Transition)) == 1
    assert changes == ["changed"]


def test_refusals_name_every_field(client: TestClient, tokens: Tokens, db: Database) -> None:
    document = training_job(resources={"requests": {"cpu": "-1"}, "gpus": 0.5}, colour="red")
    response = submit(client, tokens, document)
    assert response.status_code == 422
    problem = response.json()
    assert problem["type"] == "urn:kubetrain:problem:validation"
    assert set(fields(response)) >= {
        "spec.resources.requests.cpu",
        "spec.resources.requests.memory",
        "spec.resources.gpus",
        "spec.colour",
    }
    assert all(error["message"] for error in problem["errors"])
    assert job_count(db) == 0


def test_the_project_in_the_document_must_be_the_paths(client: TestClient, tokens: Tokens) -> None:
    document = training_job()
    document["metadata"]["project"] = "elsewhere"
    response = submit(client, tokens, document)
    assert response.status_code == 422
    assert fields(response) == ["metadata.project"]


def url_of(db: Database) -> str:
    return db.url.render_as_string(hide_password=False)


def test_a_project_that_maps_to_no_namespace_is_refused(db: Database, tokens: Tokens) -> None:
    long_prefix = ServerSettings(database_url=url_of(db), namespace_prefix="x" * 60)
    with TestClient(create_app(long_prefix, db)) as client:
        response = submit(client, tokens)
    assert response.status_code == 422
    assert fields(response) == ["metadata.project"]


def test_a_mapped_project_runs_in_its_namespace(db: Database, tokens: Tokens) -> None:
    mapped = ServerSettings(database_url=url_of(db), namespaces={PROJECT: "team-ai"})
    with TestClient(create_app(mapped, db)) as client:
        response = submit(client, tokens)
    assert response.json()["namespace"] == "team-ai"


def test_datasets_resolve_through_the_registry_or_are_refused_by_name(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    registered = client.post(
        "/api/v1/datasets",
        json={"name": "imagenet", "version": "v3", "claim": "dataset-imagenet", "subPath": "v3"},
        headers=tokens.admin,
    )
    assert registered.status_code == 201, registered.text

    unknown_name = submit(client, tokens, training_job(dataset={"name": "coco", "version": "1"}))
    assert unknown_name.status_code == 422
    assert fields(unknown_name) == ["spec.dataset.name"]
    unknown_version = submit(
        client, tokens, training_job(dataset={"name": "imagenet", "version": "v9"})
    )
    assert unknown_version.status_code == 422
    assert fields(unknown_version) == ["spec.dataset.version"]
    assert "v3" in unknown_version.json()["errors"][0]["message"]
    assert job_count(db) == 0

    known = submit(client, tokens, training_job(dataset={"name": "imagenet", "version": "v3"}))
    assert known.status_code == 201
    direct = {"name": "private", "version": "1", "claim": "my-claim"}  # not looked up
    assert submit(client, tokens, training_job(dataset=direct)).status_code == 201


def test_a_body_over_the_limit_is_413_by_length_and_by_count(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    limit = 256 * 1024
    oversize = training_job(args=["x" * 30_000] * 10)  # ~300 KiB
    headers = tokens("submitter")
    by_length = client.post(JOBS, json=oversize, headers=headers)
    assert by_length.status_code == 413
    assert by_length.headers["content-type"] == PROBLEM
    assert str(limit) in by_length.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        yield b'{"apiVersion": "kubetrain.io/v1", "padding": "'
        for _ in range(40):
            yield b"y" * 8192
        yield b'"}'

    streamed = client.post(
        JOBS, content=chunks(), headers={**headers, "Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    assert streamed.headers["content-type"] == PROBLEM
    assert job_count(db) == 0


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "kind": "TrainingJob"}', 422),
        (b'{"apiVersion": "kubetrain.io/v1",', 400),
        (b'{"spec": {"retries": NaN}}', 400),
        (b"\xff\xfe{}", 400),
        (b"", 400),
        (b"[1, 2]", 422),
    ],
)
def test_bodies_are_read_strictly(
    client: TestClient, tokens: Tokens, db: Database, body: bytes, status: int
) -> None:
    headers = {**tokens("submitter"), "Content-Type": "application/json"}
    response = client.post(JOBS, content=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    assert job_count(db) == 0


def test_duplicate_keys_are_named_where_they_are(client: TestClient, tokens: Tokens) -> None:
    body = (
        b'{"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "metadata": {"name": "a"},'
        b' "spec": {"image": "r/t:1", "resources": {"requests": {"cpu": "1", "cpu": "64",'
        b' "memory": "1Gi"}}, "env": [{"name": "A", "value": "1", "value": "2"}]}}'
    )
    headers = {**tokens("submitter"), "Content-Type": "application/json"}
    response = client.post(JOBS, content=body, headers=headers)
    assert response.status_code == 422
    assert fields(response) == ["spec.resources.requests.cpu", "spec.env[0].value"]


def test_only_json_is_accepted(client: TestClient, tokens: Tokens) -> None:
    response = client.post(
        JOBS, content=b"apiVersion: kubetrain.io/v1", headers={**tokens("submitter")}
    )
    assert response.status_code == 415
    response = client.post(
        JOBS,
        content=b"apiVersion: kubetrain.io/v1",
        headers={**tokens("submitter"), "Content-Type": "application/yaml"},
    )
    assert response.status_code == 415
    assert response.headers["content-type"] == PROBLEM


def test_a_viewer_is_refused_before_its_body_is_read(client: TestClient, tokens: Tokens) -> None:
    response = client.post(
        JOBS,
        content=b"not json",
        headers={**tokens("viewer"), "Content-Type": "application/json"},
    )
    assert response.status_code == 403


def _plain_scope(query: bytes = b"", keys: tuple[bytes, ...] = ()) -> dict[str, object]:
    headers = [(b"content-type", b"application/json"), *((b"idempotency-key", k) for k in keys)]
    return {
        "type": "http",
        "method": "POST",
        "path": JOBS,
        "query_string": query,
        "headers": headers,
    }


def test_only_plain_submissions_take_the_plain_route() -> None:
    route = PlainSubmitRoute()
    for plain in (
        _plain_scope(),
        _plain_scope(keys=(b"a-key_1",)),
        _plain_scope(keys=(b"x" * 255,)),
    ):
        assert route.matches(plain)[0] is Match.FULL
    for other in (
        _plain_scope(b"dryRun=All"),
        _plain_scope(b"anything=1"),
        _plain_scope(keys=(b"has space",)),
        _plain_scope(keys=(b"x" * 256,)),
        _plain_scope(keys=(b"",)),
        _plain_scope(keys=(b"one", b"two")),
        _plain_scope(keys=("clé".encode(),)),
    ):
        assert route.matches(other)[0] is Match.NONE  # on to FastAPI's route, which words it


def test_the_plain_route_answers_as_fastapis_route_does(
    settings: ServerSettings, db: Database, tokens: Tokens
) -> None:
    plain = create_app(settings, db)
    whole = create_app(settings, db)
    whole.router.routes = [r for r in whole.router.routes if not isinstance(r, PlainSubmitRoute)]
    job, other = training_job(), training_job("another-name")
    json_type = {"Content-Type": "application/json"}
    cases: list[tuple[str, bytes | None, dict[str, str]]] = [
        ("new", None, {"Idempotency-Key": "k1"}),
        ("replayed", None, {"Idempotency-Key": "k1"}),
        ("reused key", json.dumps(other).encode(), {"Idempotency-Key": "k1"}),
        ("no key", None, {}),
        ("no token", None, {"Authorization": ""}),
        ("unknown token", None, {"Authorization": "Bearer kt_unknown"}),
        ("not a bearer", None, {"Authorization": "Basic abc"}),
        ("another project's token", None, tokens(Role.ADMIN, OTHER)),
        ("a viewer", None, tokens(Role.VIEWER)),
        ("not JSON's type", None, {"Content-Type": "text/plain"}),
        ("empty", b"", {}),
        ("not JSON", b"{", {}),
        ("a key twice", b'{"a": 1, "a": 2}', {}),
        ("refused", b'{"kind": "TrainingJob"}', {}),
        ("a key with a space", None, {"Idempotency-Key": "has space"}),
    ]
    for name, body, extra in cases:
        answers = []
        for app, side in ((plain, "p"), (whole, "w")):
            headers = {**tokens(Role.SUBMITTER), **json_type, **extra}
            if "Idempotency-Key" in extra:
                headers["Idempotency-Key"] = f"{side}-{extra['Idempotency-Key']}"
            with TestClient(app) as client:
                response = client.post(
                    JOBS, content=body or json.dumps(job).encode(), headers=headers
                )
            answers.append(
                (
                    response.status_code,
                    _comparable(response.text),
                    sorted(
                        (k, _comparable(v))
                        for k, v in response.headers.items()
                        if k != "content-length"
                    ),
                )
            )
        assert answers[0] == answers[1], name


def _comparable(text: str) -> str:
    """Without what differs between two jobs: ids and times."""
    text = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", text)
    return re.sub(r"\d{4}-\d\d-\d\dT[\d:.]+(Z|[+-]\d\d:\d\d)?", "<time>", text)
