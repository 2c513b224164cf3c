"""Every endpoint of the served OpenAPI document under schemathesis: generated requests, valid and
invalid (negative mode), sent with tokens of each kind. No answer may be a 5xx, and every answer
must match the document: its status listed, its content type and its body schema."""

from __future__ import annotations

import os
from typing import Any

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

from kubetrain.store import ALL_PROJECTS, Database, Role
from tests.api.builders import PROJECT, Tokens, submitted
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
# Who sends the request: a token of each reach, one that is unknown, a malformed header, none.
CALLERS = ("admin-all", "submitter-project", "viewer-other", "unknown", "malformed", "none")


@pytest.fixture
def api_schema(app: FastAPI) -> schemathesis.schemas.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.fixture
def seeded_job(app: FastAPI, tokens: Tokens, db: Database) -> str:
    """A job in PROJECT with a diagnosis, so the per-job endpoints also answer 200."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        job_id = submitted(client, tokens)
    with db.transaction() as session:
        observe(session, job_id, diagnosis={"primary": "SCHEDULING"})
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
