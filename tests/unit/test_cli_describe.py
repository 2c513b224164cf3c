"""`kubetrain get job` in plain words: the next step comes from the job's own diagnosis."""

from __future__ import annotations

import io
import json
import unicodedata

import pytest

from kubetrain.cli._output import emit, table
from kubetrain.cli.jobs import describe
from kubetrain.domain.reasons import CATALOG
from tests.unit.diagnosis_helpers import recorded

pytestmark = pytest.mark.unit


def job_view(diagnosis: dict[str, object] | None, reason: str) -> dict[str, object]:
    entry = CATALOG[reason]
    return {
        "name": "llm",
        "id": "1",
        "project": "p",
        "namespace": "p",
        "business_status": "QUEUED",
        "reason": reason,
        "reason_detail": {
            "code": reason,
            "link": str(entry.link),
            "explanation": entry.explanation,
            "action": entry.action,
            "actor": str(entry.actor),
        },
        "message": None,
        "raw_reason": None,
        "raw_message": None,
        "runtime": None,
        "diagnosis": diagnosis,
        "cancel_requested": False,
        "created_at": "2026-12-02T10:00:00Z",
        "updated_at": "2026-12-02T10:00:05Z",
    }


def test_a_request_no_node_can_hold_says_waiting_will_not_help():
    diagnosis = recorded("insufficient-gpu").to_json("llm")
    text = describe(job_view(diagnosis, "INSUFFICIENT_GPU"))
    # 16 GPUs on 8-GPU nodes: one Pod never fits, a gang of two does.
    assert (
        "Run it as 2 workers of 8 GPUs: `workers: 2` with `gpus: 8`; waiting will not help." in text
    )
    assert "Wait for GPUs to free up" not in text


def test_without_a_diagnosis_the_catalog_speaks():
    text = describe(job_view(None, "INSUFFICIENT_GPU"))
    assert CATALOG["INSUFFICIENT_GPU"].action in text


def test_progress_shows_sub_phase_step_checkpoint_and_resume_lineage():
    job = {**job_view(None, "TRAINING"), "business_status": "RUNNING"}
    job["progress"] = {
        "pod": "kt-1-bbbbb",
        "phase": "TRAINING",
        "phase_since": "2026-12-02T10:01:00Z",
        "step": 1200,
        "step_at": "2026-12-02T10:05:00Z",
        "metrics": {"loss": 0.125, "lr": 0.0003},
        "checkpoint": {"step": 1000, "sizeBytes": 3 * 2**20, "durationSeconds": 0.5},
        "dropped": 2,
        "resumes": [
            {
                "pod": "kt-1-bbbbb",
                "attempt": 2,
                "from_step": 800,
                "from_pod": "kt-1-aaaaa",
                "from_attempt": 1,
                "at": "2026-12-02T10:01:00Z",
                "compared": [
                    {"says": "node: node-a -> node-b (allowed)"},
                    {"says": "dataset version: v3 (same)"},
                ],
            }
        ],
    }
    job["progress"]["checkpoints"] = 5
    text = describe(job)
    said = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    assert said["Phase"].strip().startswith("TRAINING on kt-1-bbbbb (")
    assert "1200 (loss 0.125, lr 0.0003)" in text
    assert said["Last checkpoint"].strip() == "step 1000, 3.0 MiB in 0.50 s; 5 checkpoints saved"
    assert "attempt 2 from step 800 of attempt 1" in text
    # what differed between the checkpoint and attempt 2, one line each, under it
    after = text[text.index("attempt 2 from step 800 of attempt 1") :].splitlines()
    assert after[1].strip() == "node: node-a -> node-b (allowed)"
    assert after[2].strip() == "dataset version: v3 (same)"
    assert "2 events dropped by the reporter" in text


def test_a_finished_run_says_its_last_phase_reported_and_a_small_checkpoint_in_kib():
    job = {**job_view(None, "COMPLETED"), "business_status": "SUCCEEDED"}
    job["progress"] = {
        "pod": "kt-1-bbbbb",
        "phase": "TRAINING",
        "phase_since": "2026-12-02T10:01:00Z",
        "step": 200,
        "checkpoint": {"step": 200, "sizeBytes": 18_022, "durationSeconds": 0.01},
        "checkpoints": 40,
    }
    lines = describe(job).splitlines()
    assert "Last phase reported: TRAINING by kt-1-bbbbb" in lines
    assert not any(line.startswith("Phase:") for line in lines)
    assert "Last checkpoint:     step 200, 17.6 KiB in 0.01 s; 40 checkpoints saved" in lines


def test_no_progress_no_progress_lines():
    text = describe({**job_view(None, "TRAINING"), "progress": None})
    assert "Step:" not in text
    assert "Phase:" not in text


HOSTILE = "\x1b[31mred\x07bell\x00nul\x9bcsi\x7fdel"


def test_text_from_kubernetes_or_a_pod_reaches_the_terminal_escaped():
    job = job_view(None, "CRASH_LOOP")
    job["raw_reason"] = "CrashLoopBackOff"
    job["raw_message"] = HOSTILE
    job["progress"] = {
        "pod": "kt-1-aaaaa",
        "resumes": [{"pod": "p", "attempt": None, "from_step": 4, "from_pod": HOSTILE}],
    }
    text = describe(job)
    assert not any(unicodedata.category(char) == "Cc" for char in text.replace("\n", "")), repr(
        text
    )
    assert "\\u001b[31mred\\u0007bell\\u0000nul\\u009bcsi\\u007fdel" in text


def test_tables_and_json_escape_control_characters_too():
    out = io.StringIO()
    table(["MESSAGE"], [[HOSTILE]], stream=out)
    assert "\x1b" not in out.getvalue()
    assert "\\u001b[31mred" in out.getvalue()
    out = io.StringIO()
    emit({"message": HOSTILE}, "json", stream=out)
    assert json.loads(out.getvalue()) == {"message": HOSTILE}  # still JSON, still the text
    assert not any(unicodedata.category(c) == "Cc" for c in out.getvalue().replace("\n", ""))


def test_a_gang_shows_its_workers_the_retries_it_used_and_the_rank_of_its_attempt():
    job = job_view(None, "TRAINING") | {"workers": 2, "gpus": 8, "retries_used": 1}
    job["runtime"] = {
        "attempt": 2,
        "rank": 0,
        "pod": "kt-1-0-abcde",
        "node": "gpu-h100-0",
        "phase": "Running",
    }
    text = describe(job)
    assert "GPUs:" in text
    assert "16 (2 workers of 8); 1 failed attempt counted against retries" in text
    assert "2: rank 0, pod kt-1-0-abcde on gpu-h100-0, phase Running" in text


def test_get_jobs_shows_a_gangs_gpus_per_worker():
    from kubetrain.cli.jobs import gpus

    assert gpus({"workers": 2, "gpus": 8}) == "2x8"
    assert gpus({"workers": 1, "gpus": 4}) == "4"
