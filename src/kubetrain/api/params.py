"""Path and query parameters: no control characters, for every route at once.

A NUL in a parameter made PostgreSQL refuse the query it went into (its text
cannot hold one: a 500, found by the OpenAPI fuzz test on `GET
/api/v1/datasets?name=`), and other control characters garble logs and
terminals. No name, id, project or cursor of this API has a use for them, so
they are refused here, with 422 naming the parameter, before any route (API
or web page) sees the request; bodies are validated field by field elsewhere.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from kubetrain.api.problems import problem_response, validation_error
from kubetrain.domain.names import control_character_problem
from kubetrain.domain.spec import FieldProblem


class PlainParameters:
    """ASGI middleware: 422 for a request whose path or query holds a control character."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (problems := parameter_problems(scope)):
            refusal = validation_error(problems, "the request's parameters are not valid")
            await problem_response(refusal.problem(None))(scope, receive, send)
            return
        await self.app(scope, receive, send)


def parameter_problems(scope: Scope) -> list[FieldProblem]:
    """One problem per offending part: `path`, or `query.<name>` (its name, when that is
    itself plain)."""
    problems = []
    if problem := control_character_problem(scope["path"]):
        problems.append(FieldProblem("path", problem))
    query = scope["query_string"].decode("utf-8", "replace")
    for name, value in parse_qsl(query, keep_blank_values=True, errors="replace"):
        if problem := control_character_problem(name):
            problems.append(FieldProblem("query", f"a parameter's name {problem}"))
        elif problem := control_character_problem(value):
            problems.append(FieldProblem(f"query.{name}", problem))
    return problems
