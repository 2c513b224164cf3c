"""The server's log: one JSON object per line for collectors, a plain line on a terminal.

Context travels as fields, not inside the message, so a collector can filter
on them: `log.info("created the Job", extra={"job_id": id, "attempt": 1})`
becomes `{"time": ..., "level": "info", "logger": ..., "message": "created the
Job", "job_id": "...", "attempt": 1}`.

Every line passes `redact` first: messages, fields and tracebacks can carry
what an exception quoted (a DSN with its password, a request's Authorization
header, a ServiceAccount token, a session cookie), and
none of that may reach a log. What counts as a credential is
kubetrain.runtime.credentials', the one rule the runtime and the spec use too.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from kubetrain.runtime.credentials import redact_text

LogFormat = Literal["auto", "json", "text"]

# The rule every credential detector of kubetrain shares (stdlib only, in the runtime).
redact = redact_text

# Attributes every LogRecord has; anything else on a record came as `extra=`.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in record.__dict__.items():
        if key in _STANDARD or key.startswith("_"):
            continue
        if isinstance(value, str):
            value = redact(value)
        elif not isinstance(value, int | float | bool) and value is not None:
            value = redact(str(value))
        out[key] = value
    return out


def _time(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _time(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
            **_fields(record),
        }
        if record.exc_info:
            entry["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` for a person at a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{key}={value}" for key, value in _fields(record).items())
        line = f"{_time(record)} {record.levelname} {record.name}: {redact(record.getMessage())}"
        if fields:
            line = f"{line} {fields}"
        if record.exc_info:
            line = f"{line}\n{redact(self.formatException(record.exc_info))}"
        return line


def setup_logging(
    level: str = "info", fmt: LogFormat = "auto", stream: TextIO | None = None
) -> None:
    """Route every logger (uvicorn's too, when it is given log_config=None) to `stream`.

    "auto" writes text to a terminal and JSON anywhere else (a Pod's log).
    """
    stream = stream or sys.stderr
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # The HTTP clients log every request at INFO: each replica's Lease renewal every 2 s,
    # every watch and list. An operator reads kubetrain's own lines; `debug` shows them.
    quiet = logging.NOTSET if level.upper() == "DEBUG" else logging.WARNING
    for name in _CHATTY_CLIENTS:
        logging.getLogger(name).setLevel(quiet)


_CHATTY_CLIENTS = ("httpx", "httpx2", "httpcore", "httpcore2")
