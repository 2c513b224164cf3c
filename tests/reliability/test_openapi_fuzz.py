"""Every endpoint of the served OpenAPI document under schemathesis: generated requests, valid and
invalid (negative mode), sent with tokens of each kind. No answer may be a 5xx, and every answer
must match the document: its status listed, its content type and its body schema.

Dates are drawn across the whole calendar and every UTC offset, so times with no UTC spelling
(0001-01-01T00:00:00+01:00) come up; the reports endpoint is called with the seeded job's status
token too. A second test sends the shapes a schema does not suggest: numbers at and past 2^62 and
2^63, quantities past int64, one seq twice in a batch, control characters in every string, and
list cursors crafted around out-of-range times."""

from __future__ import annotations

import base64
import json
import os
from datetime import datetime, timedelta, timezone
from typing import Any, cast

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CheckFunction
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from kubetrain.api import create_app
from kubetrain.cluster.logs import PodLogs
from kubetrain.cluster.tokenreview import TokenReviewer
from kubetrain.domain.manifest import job_name
from kubetrain.settings import ServerSettings
from kubetrain.store import ALL_PROJECTS, Database, Role
from tests.api.builders import (
    JOBS,
    PROJECT,
    FakeLogs,
    FakeReviewer,
    Tokens,
    enrol,
    kueue_cluster,
    submitted,
    training_job,
)
from tests.store.builders import observe

pytestmark = pytest.mark.db

# Examples per operation and generation mode; raise it for a longer hunt.
EXAMPLES = int(os.environ.get("KUBETRAIN_TEST_FUZZ_EXAMPLES", "25"))

CHECKS: list[CheckFunction] = [
    schemathesis.checks.not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
# Who sends the request: a token of each reach, one that is unknown, a malformed header, none,
# and the token of the seeded job's Pod (the reports endpoint's credential).
CALLERS = (
    "admin-all",
    "submitter-project",
    "viewer-other",
    "unknown",
    "malformed",
    "none",
    "status-token",
)
STATUS_TOKEN = "the-seeded-jobs-pods-token"

# Times at the calendar's ends, in offsets that push them past UTC's range, and anywhere between.
EDGE_TIMES = ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z")
TIMES = st.one_of(
    st.sampled_from(EDGE_TIMES),
    st.datetimes(
        min_value=datetime(1, 1, 1),
        max_value=datetime(9999, 12, 31, 23, 59, 59),
        timezones=st.integers(-1439, 1439).map(lambda m: timezone(timedelta(minutes=m))),
    ).map(datetime.isoformat),
)
schemathesis.openapi.format("date-time", TIMES)

# Numbers where 64-bit columns and Decimal arithmetic end, and any other.
EXTREME_INTS = st.one_of(
    st.sampled_from([0, 2**62, 2**62 + 1, 2**63 - 1, 2**63, 2**64, -1, -(2**63), 10**30]),
    st.integers(),
)
TEXTS = st.one_of(st.text(max_size=20), st.sampled_from(["\x1b[31m", "a\x00b", "\x9b", "\u202e"]))


@pytest.fixture
def reviewer() -> FakeReviewer:
    return FakeReviewer()


@pytest.fixture
def app(settings: ServerSettings, db: Database, reviewer: FakeReviewer) -> FastAPI:
    """The API with a view of a cluster (dumps recorded from the real Kueue), as where the
    control loops run, so that /api/v1/queues answers from it; its 503 where none run
    is tests/api/test_queues.py's."""
    listing = kueue_cluster()
    pods = cast(TokenReviewer, reviewer)
    # The seeded job's Pod is recorded (its reports are heard), so its logs are asked
    # of the cluster side too: no output there, as for a Pod that is gone.
    logs = cast(PodLogs, FakeLogs())
    return create_app(settings, db, cluster=lambda: listing, pod_tokens=pods, pod_logs=logs)


@pytest.fixture
def api_schema(app: FastAPI) -> schemathesis.schemas.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture
def seeded_job(app: FastAPI, tokens: Tokens, db: Database, reviewer: FakeReviewer) -> str:
    """A job in PROJECT with a diagnosis, so the per-job endpoints also answer 200."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        job_id = submitted(client, tokens)
    with db.transaction() as session:
        observe(session, job_id, diagnosis={"primary": "SCHEDULING"})
    # Its Pod's token, under the name the callers use.
    reviewer.pods[STATUS_TOKEN] = reviewer.pods[enrol(db, reviewer, job_id, "fuzzz")]
    return job_id


def _authorization(caller: str, tokens: Tokens) -> dict[str, str]:
    match caller:
        case "admin-all":
            return tokens(Role.ADMIN, ALL_PROJECTS)
        case "submitter-project":
            return tokens(Role.SUBMITTER, PROJECT)
        case "viewer-other":
            return tokens(Role.VIEWER, "other-team")
        case "unknown":
            return {"Authorization": "Bearer kt_0000000000000000000000000000"}
        case "malformed":
            return {"Authorization": "Token \x7f"}
        case "status-token":
            return {"Authorization": f"Bearer {STATUS_TOKEN}"}
    return {}


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_5xx_and_every_answer_matches_the_document(
    api_schema: schemathesis.schemas.BaseSchema,
    tokens: Tokens,
    seeded_job: str,
    mode: GenerationMode,
) -> None:
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 10, "the document lists fewer operations than the API serves"
    without_inputs = []
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not _has_inputs(operation):
            without_inputs.append(operation.label)  # nothing there to make invalid
            continue

        @given(
            case=operation.as_strategy(generation_mode=mode),
            caller=st.sampled_from(CALLERS),
            aim_at_seeded=st.booleans(),
        )
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def example(case: schemathesis.Case[Any], caller: str, aim_at_seeded: bool) -> None:
            if aim_at_seeded and case.path_parameters:
                # Generated ids almost never exist; half the examples hit a real job.
                case.path_parameters = {**case.path_parameters, "project": PROJECT}
                if "job_id" in case.path_parameters:
                    case.path_parameters["job_id"] = seeded_job
            case.headers.pop("Authorization", None)  # case-insensitive
            case.headers.update(_authorization(caller, tokens))
            response = case.call()
            case.validate_response(response, checks=CHECKS)

        example()
    assert len(without_inputs) < len(operations) // 2, without_inputs


def _has_inputs(operation: schemathesis.APIOperation[Any, Any, Any, Any]) -> bool:
    parameters = (operation.path_parameters, operation.query, operation.headers, operation.body)
    return any(len(group) for group in parameters)


def _events(pod: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    """1-5 events whose seqs often repeat, with extreme numbers, times and strings."""
    common = {"seq": st.one_of(st.sampled_from([0, 1]), EXTREME_INTS), "time": TIMES}
    event = st.one_of(
        st.fixed_dictionaries({**common, "type": st.just("step"), "step": EXTREME_INTS}),
        st.fixed_dictionaries(
            {
                **common,
                "type": st.just("checkpoint"),
                "step": EXTREME_INTS,
                "sizeBytes": EXTREME_INTS,
                # JSON has no infinities: a client cannot send one (the server refuses the
                # Infinity constant on its own, as tests/api/test_submit.py checks with NaN)
                "durationSeconds": st.floats(allow_nan=False, allow_infinity=False),
            }
        ),
        st.fixed_dictionaries(
            {
                **common,
                "type": st.just("resumed"),
                "fromStep": EXTREME_INTS,
                "fromPod": st.one_of(st.just(pod), TEXTS),
            }
        ),
        st.fixed_dictionaries({**common, "type": st.just("phase"), "phase": TEXTS}),
    )
    return st.lists(event, min_size=1, max_size=5)


def _cursors() -> st.SearchStrategy[str]:
    crafted = st.tuples(st.one_of(TIMES, TEXTS, EXTREME_INTS), st.one_of(TEXTS, EXTREME_INTS))
    return st.one_of(
        crafted.map(lambda pair: base64.urlsafe_b64encode(json.dumps(list(pair)).encode())),
        st.binary(max_size=40).map(base64.urlsafe_b64encode),
    ).map(lambda raw: raw.decode().rstrip("="))


QUANTITIES = st.one_of(
    st.from_regex(
        r"[0-9]{1,40}(\.[0-9]{0,5})?(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|e[0-9]{1,2})?", fullmatch=True
    ),
    EXTREME_INTS,
    st.floats(allow_nan=False, allow_infinity=False),
)


def test_crafted_shapes_are_4xx_never_5xx(app: FastAPI, tokens: Tokens, seeded_job: str) -> None:
    """What a schema does not suggest: extreme numbers, times, repeated seqs, crafted cursors."""
    from fastapi.testclient import TestClient

    pod = f"{job_name(seeded_job)}-fuzzz"
    reports_path = f"/api/v1/jobs/{seeded_job}/reports"
    status_token = {"Authorization": f"Bearer {STATUS_TOKEN}"}
    with TestClient(app) as client:

        @given(
            events=_events(pod),
            dropped=EXTREME_INTS,
            cursor=_cursors(),
            cpu=QUANTITIES,
            memory=QUANTITIES,
        )
        @settings(
            max_examples=EXAMPLES * 4,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def example(
            events: list[dict[str, Any]], dropped: int, cursor: str, cpu: Any, memory: Any
        ) -> None:
            batch = {"pod": pod, "dropped": dropped, "events": events}
            document = training_job()
            document["spec"]["resources"]["requests"] = {"cpu": cpu, "memory": memory}
            answers = [
                client.post(reports_path, json=batch, headers=status_token),
                client.get(JOBS, params={"cursor": cursor}, headers=tokens(Role.VIEWER)),
                client.post(JOBS, json=document, headers=tokens(Role.SUBMITTER)),
            ]
            for answer in answers:
                assert answer.status_code < 500, (answer.request.url, answer.text[:500])
                if answer.status_code >= 400:
                    assert answer.headers["content-type"] == "application/problem+json"

        example()
