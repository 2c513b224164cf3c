"""`kubetrain serve`'s log on a real start: JSON lines, and no credential in them."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from kubetrain.local_server import CLI
from kubetrain.testbed.processes import pick_free_ports

pytestmark = pytest.mark.db

PASSWORD = "pw-planted-5e1d"


def test_an_unreachable_database_is_one_json_line_without_its_password():
    (closed,) = pick_free_ports(1)  # nothing listens there
    env = {
        **os.environ,
        "KUBETRAIN_LOG_FORMAT": "json",
        "KUBETRAIN_DATABASE_URL": f"postgresql://kubetrain:{PASSWORD}@127.0.0.1:{closed}/kt",
    }
    result = subprocess.run(
        [*CLI, "serve", "--no-control", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert PASSWORD not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    (entry,) = [json.loads(line) for line in result.stderr.splitlines()]
    assert entry["level"] == "error"
    # The whole userinfo is masked: the one credential rule treats a URL's user as part of
    # its credential (https://TOKEN@host is a token).
    assert entry["message"].startswith("cannot use the database postgresql+psycopg://***@")
    assert "Connection refused" in entry["message"]
