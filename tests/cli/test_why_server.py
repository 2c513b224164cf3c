"""`kubetrain why NAME|ID` through a real server: the stored diagnosis, as text and JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import PROJECT, Server
from tests.cli.test_cli import job_file, run
from tests.store.builders import observe
from tests.unit.diagnosis_helpers import dump
from tests.unit.diagnosis_helpers import run as diagnose_dump

pytestmark = pytest.mark.db


def submit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    code, out, _ = run(capsys, "submit", "-f", job_file(tmp_path))
    assert code == 0
    return out.split()[3]


def test_why_prints_the_stored_diagnosis(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = submit(capsys, tmp_path)
    code, out, err = run(capsys, "why", "train-policy-v12")
    assert (code, out) == (1, "")
    assert err.startswith("kubetrain: error: No diagnosis yet (HTTP 404)")
    assert len(err.strip().splitlines()) == 1

    # What the syncer stores: the diagnosis of a recorded 16-GPU job.
    stored = diagnose_dump(dump("insufficient-gpu")).to_json("train-policy-v12")
    with server.db.transaction() as session:
        observe(session, job_id, diagnosis=stored)

    for ref in ("train-policy-v12", job_id):
        code, out, err = run(capsys, "why", ref, "-p", PROJECT, "-o", "json")
        assert (code, err) == (0, "")
        assert json.loads(out) == stored

    code, out, err = run(capsys, "why", "train-policy-v12")
    assert (code, err) == (0, "")
    assert out.startswith(f"Job train-policy-v12 ({job_id}, project {PROJECT})")
    assert "QUEUED · INSUFFICIENT_GPU · waiting will not help" in out
    assert "[!!] scheduler" in out
    assert "the largest node has 8" in out
    assert "  Nodes (4; 0 could take it now)" in out


def test_why_names_an_unknown_job_and_a_missing_project(
    server: Server, use, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "why", "no-such-job")
    assert code == 1
    assert err.startswith("kubetrain: error: no job named 'no-such-job' (nor with that id)")
    assert err.endswith(f"in project {PROJECT!r}\n")
    use(project=None)
    code, _, err = run(capsys, "why", "no-such-job")
    assert code == 1
    assert "no project" in err
