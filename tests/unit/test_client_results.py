"""The SDK's pure parts: its typed results cover the API's schemas field for field (so a
field the API adds cannot be missed here), a diagnosis reads as kubetrain made it,
logs split into lines whatever the chunks, and `wait` refuses a state that does not
exist before asking anything; `import kubetrain` stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from kubetrain.api.schemas import HistoryEntry as HistorySchema
from kubetrain.api.schemas import JobDetail, ReasonDetail
from kubetrain.api.usage import Usage as UsageSchema
from kubetrain.api.usage import UsageEntry as UsageEntrySchema
from kubetrain.client import Client, Diagnosis, HistoryEntry, Job, Reason, Usage, UsageEntry
from kubetrain.client.api import _lines
from kubetrain.client.results import Result
from tests.unit.diagnosis_helpers import NOW, recorded

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("result", "schema"),
    [
        (Job, JobDetail),
        (Reason, ReasonDetail),
        (HistoryEntry, HistorySchema),
        (Usage, UsageSchema),
        (UsageEntry, UsageEntrySchema),
    ],
)
def test_each_result_has_every_field_of_its_api_schema(result: type[Result], schema: Any) -> None:
    assert set(result._FIELDS) == set(schema.model_fields)


def test_a_diagnosis_has_every_field_kubetrain_writes_and_reads_in_plain_words() -> None:
    made = recorded("untolerated-taint").to_json("train-policy-v12")
    diagnosis = Diagnosis(json.loads(json.dumps(made, default=str)), job_id="0b5c")
    assert set(Diagnosis._FIELDS) == set(made)
    assert (diagnosis.state, diagnosis.reason, diagnosis.link) == (
        "QUEUED",
        "UNTOLERATED_TAINT",
        "scheduler",
    )
    assert diagnosis.since is not None
    assert diagnosis.since <= NOW
    assert diagnosis.since.tzinfo is not None
    assert diagnosis.blockers[0]["reason"] == "UNTOLERATED_TAINT"
    shown = repr(diagnosis)
    assert shown.startswith("Diagnosis(job='train-policy-v12', state='QUEUED', ")
    assert "explanation='The nodes that could hold the job carry a taint" in shown
    page = diagnosis._repr_html_()
    assert "why train-policy-v12: QUEUED / UNTOLERATED_TAINT" in page
    assert "scheduler: blocking" in page
    assert "<script" not in Diagnosis({**made, "job": "<script>"})._repr_html_()
    assert diagnosis == Diagnosis(diagnosis.raw)
    assert diagnosis != made


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        (["one\ntw", "o\n", "three"], ["one", "two", "three"]),
        (["a\n\nb\n"], ["a", "", "b"]),
        (["", "Grüße\n"], ["Grüße"]),
        ([], []),
    ],
)
def test_logs_are_whole_lines_whatever_the_chunks(chunks: list[str], lines: list[str]) -> None:
    assert list(_lines(iter(chunks))) == lines


def test_wait_refuses_a_state_that_does_not_exist_before_any_request() -> None:
    client = Client("http://127.0.0.1:9", "kt_x", project="p")  # nothing listens there
    with pytest.raises(ValueError, match="until: give states among CREATED"):
        client.wait("job", until=("DONE",))
    with pytest.raises(ValueError, match="until"):
        client.wait("job", until=())
    assert repr(client) == "Client(url='http://127.0.0.1:9', project='p')"


def test_importing_kubetrain_loads_no_client_and_the_client_no_server_library() -> None:
    script = (
        "import json, sys\n"
        "import kubetrain, kubetrain.runtime\n"
        "before = sorted(sys.modules)\n"
        "from kubetrain import Client\n"
        "print(json.dumps([before, sorted(sys.modules)]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    before, after = (
        {name.split(".")[0] if not name.startswith("kubetrain") else name for name in names}
        for names in json.loads(done.stdout)
    )
    assert not any(name.startswith("kubetrain.client") for name in before)
    assert "kubetrain.client.api" in after
    heavy = {"pydantic", "yaml", "fastapi", "sqlalchemy", "lightkube", "httpx2", "dataclasses"}
    assert (after - before) & heavy == set()
