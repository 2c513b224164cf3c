"""`kubetrain get job` in plain words: the next step comes from the job's own diagnosis."""

from __future__ import annotations

import pytest

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
    assert "Ask for at most 8 GPUs per node; waiting will not help." in text
    assert "Wait for GPUs to free up" not in text


def test_without_a_diagnosis_the_catalog_speaks():
    text = describe(job_view(None, "INSUFFICIENT_GPU"))
    assert CATALOG["INSUFFICIENT_GPU"].action in text
