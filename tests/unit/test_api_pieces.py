"""Pure pieces of the API and CLI: strict JSON, problem documents, how refusals and ages print."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest

from kubetrain.api.body import parse_json
from kubetrain.api.principal import PERMISSIONS, Action, Principal
from kubetrain.api.problems import ProblemError, validation_error
from kubetrain.api.streams import StreamSlots
from kubetrain.cli._output import age, table
from kubetrain.client import ApiError, NotFound
from kubetrain.domain.spec import FieldProblem
from kubetrain.store import Role

pytestmark = pytest.mark.unit


def test_json_is_read_strictly() -> None:
    assert parse_json(b'{"a": [1, {"b": 2}]}') == {"a": [1, {"b": 2}]}
    with pytest.raises(ProblemError) as duplicate:
        parse_json(b'{"a": {"b": 1, "b": 2, "c": 3, "c": 4}, "d": [{"e": 1, "e": 1}]}')
    assert duplicate.value.status == 422
    assert [e.field for e in duplicate.value.errors] == ["a.b", "a.c", "d[0].e"]
    with pytest.raises(ProblemError) as thrice:  # each repetition named, the last value kept
        parse_json(b'[{"x": 1}, {"x": 1, "x": 2, "x": 3}]')
    assert [e.field for e in thrice.value.errors] == ["[1].x", "[1].x"]
    for bad in (b"{", b"NaN", b'{"x": Infinity}', b"\xc3\x28", b"1" * 5000, b"[" * 100_000):
        with pytest.raises(ProblemError) as refused:
            parse_json(bad)
        assert refused.value.status == 400, bad[:20]


def test_a_problem_carries_its_fields_and_extensions() -> None:
    refusal = validation_error([FieldProblem("spec.image", "must not be empty")], "refused")
    problem = refusal.problem("/api/v1/projects/p/jobs").model_dump(exclude_none=True)
    assert problem == {
        "type": "urn:kubetrain:problem:validation",
        "title": "The request is not valid",
        "status": 422,
        "detail": "refused",
        "instance": "/api/v1/projects/p/jobs",
        "errors": [{"field": "spec.image", "message": "must not be empty"}],
    }
    extended = ProblemError(409, "taken", job_id="j-1").problem(None).model_dump(exclude_none=True)
    assert extended == {
        "type": "about:blank",
        "title": "Conflict",
        "status": 409,
        "detail": "taken",
        "job_id": "j-1",
    }


def test_roles_and_scopes() -> None:
    assert PERMISSIONS[Role.VIEWER] == {Action.READ}
    assert Action.ADMIN not in PERMISSIONS[Role.SUBMITTER]
    everywhere = Principal(token_id="t", name="n", role=Role.ADMIN, project="*")
    one = Principal(token_id="t", name="n", role=Role.VIEWER, project="a")
    assert everywhere.covers("anything")
    assert (one.covers("a"), one.covers("b"), one.may(Action.CANCEL)) == (True, False, False)


def test_refusals_print_as_a_few_lines() -> None:
    problem = {
        "type": "urn:kubetrain:problem:validation",
        "title": "The request is not valid",
        "status": 422,
        "detail": "the TrainingJob is refused",
        "errors": [
            {"field": "spec.resources.requests.cpu", "message": "required"},
            {"field": "", "message": "duplicate key"},
        ],
    }
    error = ApiError.of(422, json.dumps(problem).encode())
    assert str(error) == (
        "The request is not valid (HTTP 422): the TrainingJob is refused\n"
        "  spec.resources.requests.cpu: required\n"
        "  (the document): duplicate key"
    )
    assert (error.status, error.problem, error.errors[0]["field"]) == (
        422,
        problem,
        "spec.resources.requests.cpu",
    )
    assert (error.type, error.detail) == (problem["type"], problem["detail"])
    proxy = ApiError.of(502, b"<html>\n<b>Bad Gateway</b></html>")
    assert str(proxy) == "HTTP 502 from the server: <html> <b>Bad Gateway</b></html>"
    assert proxy.problem == {
        "status": 502,
        "title": "HTTP 502 from the server",
        "detail": "<html> <b>Bad Gateway</b></html>",
    }
    assert type(ApiError.of(404, b'{"title": "Not Found", "status": 404}')) is NotFound


def test_ages_and_tables() -> None:
    now = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    assert [
        age(when, now=now)
        for when in (
            "2026-03-01T11:59:18Z",
            "2026-03-01T11:30:00Z",
            "2026-03-01T02:00:00+00:00",
            "2026-02-20T12:00:00Z",
            None,
        )
    ] == ["42s", "30m", "10h", "9d", "-"]
    out = io.StringIO()
    table(["NAME", "NODE"], [["a-long-name", None], ["b", "gpu-1"]], stream=out)
    assert out.getvalue() == "NAME          NODE\na-long-name   -\nb             gpu-1\n"


def test_stream_slots_bound_each_key_and_come_back_when_given_back():
    slots = StreamSlots()
    assert [slots.take("a", 2) for _ in range(3)] == [True, True, False]
    assert slots.take("b", 2)  # another token's are its own
    slots.give_back("a")
    assert slots.held("a") == 1
    assert slots.take("a", 2)
    for _ in range(2):
        slots.give_back("a")
    assert slots.held("a") == 0
