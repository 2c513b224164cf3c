"""Hostile TrainingJobs, through the API and through `kubetrain submit -f`: each is refused with
a 4xx problem (or a CLI error) that names what is wrong, and no row of any table is written."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from kubetrain.cli.main import main
from kubetrain.domain.spec import MAX_PROBLEMS
from kubetrain.store import Database, Role
from kubetrain.store.models import Base
from tests.api.builders import JOBS, Tokens, training_job
from tests.cli.conftest import Server

pytestmark = pytest.mark.db


def row_counts(db: Database) -> dict[str, int]:
    """Rows in every table the store has, so "nothing written" covers tables added later."""
    with db.read_only() as session:
        return {
            name: session.execute(select(func.count()).select_from(table)).scalar_one()
            for name, table in Base.metadata.tables.items()
        }


def _with_metadata(**fields: Any) -> dict[str, Any]:
    document = training_job()
    document["metadata"].update(fields)
    return document


def _with_requests(**requests: Any) -> dict[str, Any]:
    document = training_job()
    document["spec"]["resources"]["requests"].update(requests)
    return document


@dataclass(frozen=True)
class Hostile:
    name: str
    body: str  # the raw request body: some hostile values have no Python spelling
    status: int
    field: str | None  # the field the answer must name; None where the whole body is refused


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document)


HOSTILE = [
    Hostile("oversize name", _json(training_job("a" * 10_000)), 422, "metadata.name"),
    Hostile("oversize image", _json(training_job(image="r/" + "x" * 20_000)), 422, "spec.image"),
    Hostile("oversize body", _json(training_job(command=["x" * 300_000])), 413, None),
    Hostile("NUL in name", _json(training_job("train\x00job")), 422, "metadata.name"),
    Hostile("escape in image", _json(training_job(image="r/t\x1b[31m:1")), 422, "spec.image"),
    Hostile("newline in label", _json(_with_metadata(labels={"team": "a\nb"})), 422, "metadata"),
    Hostile("../ in name", _json(training_job("../../etc")), 422, "metadata.name"),
    Hostile("../ in project", _json(_with_metadata(project="../other")), 422, "metadata.project"),
    Hostile("1e999 cpu", _json(_with_requests(cpu="1e999")), 422, "spec.resources.requests.cpu"),
    Hostile(
        "1e999 memory", _json(_with_requests(memory="1e999")), 422, "spec.resources.requests.memory"
    ),
    Hostile(
        "1e999 cpu as a number",
        _json(training_job()).replace('"cpu": "4"', '"cpu": 1e999'),
        422,
        "spec.resources.requests.cpu",
    ),
    Hostile(
        "1e999 gpus",
        _json(training_job()).replace('"gpus": 1', '"gpus": 1e999'),
        422,
        "spec.resources.gpus",
    ),
    Hostile(
        "memory past 2^63",
        _json(_with_requests(memory="999999999999999999999999Ei")),
        422,
        "spec.resources.requests.memory",
    ),
    Hostile(
        "cpu past 2^63", _json(_with_requests(cpu="9" * 40)), 422, "spec.resources.requests.cpu"
    ),
    Hostile(
        "10,000 env vars",
        _json(training_job(env=[{"name": f"V{i}", "value": "1"} for i in range(10_000)])),
        413,
        None,
    ),
    Hostile(
        "2,000 env vars under the body limit",
        _json(training_job(env=[{"name": f"V{i}", "value": ""} for i in range(2_000)])),
        422,
        "spec.env",
    ),
    Hostile("nested 10,000 deep", '{"a":' * 10_000 + "1" + "}" * 10_000, 400, None),
    Hostile("a duplicated key", _json(training_job())[:-1] + ', "spec": {}}', 422, "spec"),
]


def _names_field(answer: dict[str, Any], field: str) -> bool:
    return any(error["field"].startswith(field) for error in answer.get("errors", []))


@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda h: h.name)
def test_a_hostile_job_is_refused_and_nothing_is_written(
    client: TestClient, tokens: Tokens, db: Database, hostile: Hostile
) -> None:
    before = row_counts(db)
    response = client.post(
        JOBS,
        content=hostile.body.encode(),
        headers={**tokens(Role.SUBMITTER), "Content-Type": "application/json"},
    )
    assert response.status_code == hostile.status, response.text[:500]
    assert response.headers["content-type"] == "application/problem+json"
    answer = response.json()
    assert answer["detail"], answer
    if hostile.field is not None:
        assert _names_field(answer, hostile.field), answer
    assert row_counts(db) == before


JOB_YAML = """\
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: train-policy}
spec:
  image: registry.example/trainer:1
  command: [python, train.py]
  resources: {requests: {cpu: "4", memory: 16Gi}, gpus: 1}
"""

BILLION_LAUGHS = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
)


def _env_yaml(count: int) -> str:
    entries = "".join(f"  - {{name: V{i}, value: '1'}}\n" for i in range(count))
    return JOB_YAML + "  env:\n" + entries


# (the file's text, words the error must contain)
HOSTILE_YAML = {
    "billion laughs": (BILLION_LAUGHS, "anchors and aliases"),
    "an alias inside a job": (
        JOB_YAML.replace("spec:\n", "x: &big [1, 2]\nspec:\n  args: *big\n"),
        "anchors and aliases",
    ),
    "nested 1,000 deep": ("a: " + "[" * 1000 + "]" * 1000 + "\n", "nested deeper"),
    "a python object tag": (
        JOB_YAML + "  args: !!python/object/apply:os.system [echo hi]\n",
        "not a valid TrainingJob",
    ),
    "a second document": (JOB_YAML + "---\n" + JOB_YAML, "second YAML document"),
    "a 1 MiB file": (JOB_YAML + "# " + "x" * (1 << 20) + "\n", "larger than"),
    "10,000 env vars": (_env_yaml(10_000), "larger than"),
    "1,000 env vars": (_env_yaml(1_000), "spec.env"),
    "../ in the name": (JOB_YAML.replace("train-policy", "../../etc"), "metadata.name"),
    "1e999 cpu": (JOB_YAML.replace('cpu: "4"', "cpu: 1e999"), "spec.resources.requests.cpu"),
    "memory past 2^63": (
        JOB_YAML.replace("memory: 16Gi", "memory: 999999999999999999999999Ei"),
        "spec.resources.requests.memory",
    ),
    "a control character": (
        JOB_YAML.replace("trainer:1", 'trainer:1\\u0007"').replace(
            "image: registry", 'image: "registry'
        ),
        "spec.image",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_YAML), ids=str)
def test_submit_f_refuses_a_hostile_file_before_any_request(
    server: Server,
    use: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
) -> None:
    text, words = HOSTILE_YAML[case]
    path = tmp_path / "job.yaml"
    path.write_text(text, encoding="utf-8")
    before = row_counts(server.db)
    code = main(["submit", "-f", str(path)])
    captured = capsys.readouterr()
    assert code != 0
    assert words in captured.err, captured.err[:2000]
    assert "Traceback" not in captured.err
    assert len(captured.err) < 20_000  # one clear message, not the file echoed back
    assert server.requests == []
    assert row_counts(server.db) == before


def test_forty_thousand_duplicate_keys_get_fifty_problems_and_a_count(
    client: TestClient, tokens: Tokens, db: Database
) -> None:
    body = "{" + ",".join(['"a":1'] * 40_000) + "}"  # 240 KB, under the body limit
    response = client.post(
        JOBS,
        content=body.encode(),
        headers={**tokens(Role.SUBMITTER), "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert len(errors) == MAX_PROBLEMS + 1
    assert errors[-1]["message"] == f"and {39_999 - MAX_PROBLEMS} more problems"
    assert len(response.content) < 10_000
