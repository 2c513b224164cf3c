"""The CLI's last word: whatever a command raises is one line and a non-zero exit, a
traceback only with --debug; and importing the CLI pulls in no server-side library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubetrain.cli import why
from kubetrain.cli.main import main
from kubetrain.store.errors import JobNotFound
from tests.unit.diagnosis_helpers import SNAPSHOTS

pytestmark = pytest.mark.unit

DUMP = str(SNAPSHOTS / "untolerated-taint.json")


def _fail_with(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    def load_dumps(*_: object) -> None:
        raise exc

    monkeypatch.setattr(why, "load_dumps", load_dumps)


def test_an_unexpected_error_is_one_line_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fail_with(monkeypatch, ZeroDivisionError("division by zero"))
    code = main(["why", "--from-file", DUMP])
    out, err = capsys.readouterr()
    assert code == 70
    assert out == ""
    assert err.count("\n") == 1
    assert "Traceback" not in err
    assert err.startswith("kubetrain: internal error: ZeroDivisionError: division by zero")
    assert "--debug" in err


def test_debug_shows_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fail_with(monkeypatch, ZeroDivisionError("division by zero"))
    code = main(["--debug", "why", "--from-file", DUMP])
    err = capsys.readouterr().err
    assert code == 70
    assert err.startswith("Traceback (most recent call last):")
    assert "in load_dumps" in err
    assert err.endswith("kubetrain: internal error: ZeroDivisionError: division by zero\n")


def test_any_kubetrain_error_is_its_message_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fail_with(monkeypatch, JobNotFound("0b5c2c7e"))
    code = main(["why", "--from-file", DUMP])
    err = capsys.readouterr().err
    assert (code, err) == (1, "kubetrain: error: job 0b5c2c7e not found\n")


def test_importing_the_cli_imports_no_server_side_library() -> None:
    script = "import json, sys\nimport kubetrain.cli.main\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    loaded = {name.split(".")[0] for name in json.loads(done.stdout)}
    assert loaded & {"fastapi", "sqlalchemy", "lightkube", "httpx2", "pydantic"} == set()


def test_the_client_commands_load_no_pydantic_httpx_or_yaml(tmp_path: Path) -> None:
    # What `kubetrain get jobs` and its kin import, and the settings and the client they
    # make (bench/cli_start.py times it): the standard library's HTTP and TOML only.
    script = (
        "import json, sys\n"
        "from kubetrain.cli import _client, datasets, jobs, logs, usage, webhooks\n"
        "_client.connect(__import__('argparse').Namespace()).close()\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    config = tmp_path / "config.toml"
    config.write_text('[client]\nproject = "ai-training"\n')  # the file is read, too
    env = {
        **os.environ,
        "KUBETRAIN_CONFIG": str(config),
        "KUBETRAIN_TOKEN": "kt_x",
        "KUBETRAIN_URL": "https://kubetrain.example",
    }
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    loaded = {name.split(".")[0] for name in json.loads(done.stdout)}
    heavy = {"pydantic", "pydantic_core", "pydantic_settings", "httpx2", "httpcore2", "yaml"}
    assert loaded & (heavy | {"fastapi", "sqlalchemy", "lightkube"}) == set()


def test_serve_refuses_a_service_links_port_in_one_line_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # What the kubelet gives a Pod for a Service named `kubetrain` when service links
    # are on (deploy/base turns them off): it said "internal error: ValidationError".
    monkeypatch.setenv("KUBETRAIN_PORT", "tcp://10.96.0.9:80")
    code = main(["serve", "--database-url", "sqlite://"])
    _, err = capsys.readouterr()
    assert code == 1
    assert err.count("\n") == 1
    assert "server settings are not valid: port:" in err
