"""/metrics on a real database, and the probes' view of the watches."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from kubetrain.api import create_app
from kubetrain.api.timing import HTTP_METHODS
from kubetrain.settings import ServerSettings
from kubetrain.store import Database
from tests.api.builders import JOBS, Tokens, submitted

pytestmark = pytest.mark.db


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(client: TestClient, headers: dict[str, str] | None = None) -> Samples:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def test_jobs_are_counted_by_state_and_reason_from_the_database(client: TestClient, tokens: Tokens):
    before = value(samples(client), "kubetrain_jobs", state="CREATED", reason="JOB_NOT_CREATED")
    submitted(client, tokens, "one")
    submitted(client, tokens, "two")
    found = samples(client)
    assert value(found, "kubetrain_jobs", state="CREATED", reason="JOB_NOT_CREATED") == before + 2


def test_leaving_a_state_is_observed_in_the_time_per_state_histogram(
    client: TestClient, tokens: Tokens
):
    name = "kubetrain_job_state_seconds_count"
    before = value(samples(client), name, state="CREATED")
    job_id = submitted(client, tokens)
    assert client.post(f"{JOBS}/{job_id}/cancel", headers=tokens("submitter")).status_code == 200
    assert value(samples(client), name, state="CREATED") == before + 1


def test_request_latency_is_labelled_by_route_template_not_raw_path(
    client: TestClient, tokens: Tokens
):
    job_id = submitted(client, tokens)
    client.get(f"{JOBS}/{job_id}", headers=tokens("viewer"))
    found = samples(client)
    route = "/api/v1/projects/{project}/jobs/{job_id}"
    labelled = {
        dict(labels).get("route") for (n, labels) in found if n.startswith("kubetrain_http")
    }
    assert route in labelled
    assert not any(job_id in (r or "") for r in labelled)
    assert (
        value(
            found,
            "kubetrain_http_request_duration_seconds_count",
            method="POST",
            route="/api/v1/projects/{project}/jobs",
            status="201",
        )
        >= 1
    )


def test_the_metrics_name_no_job_and_need_no_token(client: TestClient, tokens: Tokens):
    submitted(client, tokens, "secret-project-name")
    text = client.get("/metrics").text
    assert "secret-project-name" not in text


def test_probes_report_failing_watches(db: Database, settings: ServerSettings):
    problems: list[str] = []
    asked: list[tuple[float, bool]] = []

    def watch_problems(failing_for: float, *, synced: bool) -> list[str]:
        asked.append((failing_for, synced))
        return problems

    with TestClient(create_app(settings, db, watch_problems=watch_problems)) as client:
        assert client.get("/readyz").status_code == 200
        assert client.get("/livez").status_code == 200
        problems.append("the watch of pods has failed for 45 s (ConnectError)")
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["detail"] == problems[0]
        assert client.get("/livez").status_code == 503
    # readiness asks sooner and wants synced caches; liveness only a long failure
    assert asked[0] == (30.0, True)
    assert asked[1] == (300.0, False)


def test_no_request_can_add_series_to_the_metrics(client: TestClient, tokens: Tokens):
    """Label values come from bounded sets: unknown methods and unmatched paths
    share one series each, so no client can grow /metrics (or the process)."""

    def series() -> set[tuple[str, frozenset[tuple[str, str]]]]:
        return {key for key in samples(client) if key[0].startswith("kubetrain_http")}

    # One of each kind first, so their single series exist before counting.
    client.request("XYZZY", "/healthz")
    client.get("/no/such/path")
    client.request("XYZZY", "/no/such/path")
    series()  # the scrape itself is timed once it has answered
    before = series()
    for i in range(300):
        client.request(f"M{i}{'X' * 200}", "/healthz")
        client.get(f"/unknown-{i}/{'p' * 100}")
        client.request(f"Q{i}", f"/api/v1/projects/p{i}/nothing")
    after = series()
    assert after == before, sorted(map(str, after ^ before))
    methods = {dict(labels).get("method") for (_, labels) in after}
    # The registry is process-wide: earlier tests' requests (a DELETE) have series too.
    assert methods <= HTTP_METHODS | {"other"}
