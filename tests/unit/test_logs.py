"""The log: one JSON object per line with context as fields, and no credential in it."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from kubetrain.logs import redact, setup_logging

pytestmark = pytest.mark.unit

API_TOKEN = "kt_Q2hhbmdlTWVQbGVhc2VUaGlzSXNBVG9rZW4"
JWT = "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXNpZw"
PASSWORD = "pw-4f9a1c"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    out = io.StringIO()
    setup_logging("info", "json", out)
    yield out
    root.handlers[:], root.level = saved[0], saved[1]


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_one_json_object_per_line_with_job_and_attempt_as_fields(stream):
    log = logging.getLogger("kubetrain.control.syncer")
    log.info("job is %s", "RUNNING", extra={"job_id": "j-1", "attempt": 2})
    log.warning("multi\nline")
    first, second = lines(stream)
    assert first["message"] == "job is RUNNING"
    assert (first["job_id"], first["attempt"]) == ("j-1", 2)
    assert first["level"] == "info"
    assert first["logger"] == "kubetrain.control.syncer"
    assert first["time"].endswith("Z")
    assert second["message"] == "multi\nline"


@pytest.mark.parametrize(
    "text",
    [
        f"Authorization: Bearer {API_TOKEN}",
        f"token {API_TOKEN} refused",
        f"kubeconfig token {JWT}",
        f"could not connect to postgresql://kubetrain:{PASSWORD}@db:5432/kubetrain",
        f"host=db user=kubetrain password={PASSWORD} dbname=kubetrain",
        f"GET /x?token={PASSWORD}&a=1",
        f"the token kt_{PASSWORD}xyz was refused",
        f"env: HF_TOKEN={PASSWORD}",
        f"Cookie: kubetrain_session={PASSWORD}.mac; other=1",
        f"set kubetrain_session={PASSWORD}.mac; Path=/ui",
        f"error: password={PASSWORD}",
    ],
)
def test_credentials_are_redacted(text):
    out = redact(text)
    assert API_TOKEN not in out
    assert JWT not in out
    assert PASSWORD not in out
    assert "***" in out


def test_plain_words_pass_unchanged():
    text = "basic information: the token was refused (401); password rules apply"
    assert redact(text) == text


def test_credentials_in_fields_and_tracebacks_are_redacted(stream):
    log = logging.getLogger("kubetrain.api")
    try:
        raise RuntimeError(f"connect to postgresql://u:{PASSWORD}@db/x failed")
    except RuntimeError:
        log.exception("database error", extra={"header": f"Bearer {API_TOKEN}"})
    text = stream.getvalue()
    assert PASSWORD not in text
    assert API_TOKEN not in text
    (entry,) = lines(stream)
    assert "RuntimeError" in entry["exception"]
    assert entry["header"] == "Bearer ***"


def test_text_format_for_a_person():
    out = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        setup_logging("info", "text", out)
        logging.getLogger("kubetrain.x").info("created the Job", extra={"job_id": "j-1"})
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
    line = out.getvalue().strip()
    assert " INFO kubetrain.x: created the Job job_id=j-1" in line
    assert not line.startswith("{")


def test_the_http_clients_request_lines_are_left_out_unless_debugging(stream):
    logging.getLogger("httpx2").info('HTTP Request: PUT https://api/leases/kubetrain "200"')
    logging.getLogger("httpx2").warning("connection reset")
    logging.getLogger("kubetrain.cluster.leader").info("leading")
    assert [line["message"] for line in lines(stream)] == ["connection reset", "leading"]
    debug = io.StringIO()
    setup_logging("debug", "json", debug)
    logging.getLogger("httpx2").info("HTTP Request: GET https://api/leases/kubetrain")
    assert "HTTP Request" in debug.getvalue()
    setup_logging("info", "json", stream)
