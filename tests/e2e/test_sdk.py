"""`kubetrain.Client` through a real `kubetrain serve` on the testbed: docs/sdk.md's worked
example runs as written and prints what the page says it prints, and a running job
is seen RUNNING with its typed diagnosis, then cancelled and waited for.

SQLite only: the client speaks HTTP, the server's database is the other tiers' matter
(tests/cli/test_sdk.py runs the client on both backends)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from kubetrain.client import Client, Diagnosis, JobEnded
from tests.e2e.conftest import Server, training_job
from tests.e2e.test_lifecycle import FATE

pytestmark = [
    pytest.mark.testbed,
    pytest.mark.parametrize("server", ["sqlite"], indirect=True),
]

GUIDE = Path(__file__).resolve().parents[2] / "docs/sdk.md"


def worked_example() -> tuple[str, str]:
    """The guide's example (its first python block after the heading) and the output
    block that follows it."""
    text = GUIDE.read_text(encoding="utf-8").split("## A worked example", 1)[1]
    found = re.search(r"```python\n(.*?)```.*?```\n(.*?)```", text, re.DOTALL)
    assert found, "docs/sdk.md: no python block and output block under 'A worked example'"
    return found.group(1), found.group(2)


def test_the_guides_worked_example_prints_what_the_guide_says(server: Server, project: str) -> None:
    code, output = worked_example()
    env = {
        **server.env,
        "KUBETRAIN_URL": server.url,
        "KUBETRAIN_TOKEN": server.token,
        "KUBETRAIN_PROJECT": project,
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == output


def test_a_running_job_is_seen_running_explained_then_cancelled(
    server: Server, project: str
) -> None:
    sdk = Client(server.url, server.token, project=project)
    body = training_job("long-run", project)
    body["metadata"]["annotations"] = {f"{FATE}/run": "600s"}
    submitted = sdk.submit(body)
    running = sdk.wait("long-run", until="RUNNING", timeout=120, poll_interval=0.5)
    assert (running.id, running.state, running.done) == (submitted.id, "RUNNING", False)
    assert running.node is not None
    assert isinstance(running.diagnosis, Diagnosis)
    assert running.diagnosis.state == "RUNNING"
    why = sdk.why(running.id)
    assert (why.state, why.job, why.job_id) == ("RUNNING", "long-run", running.id)
    assert [link["state"] for link in why.chain][:2] == ["passed", "passed"]
    sdk.cancel("long-run")
    with pytest.raises(JobEnded) as ended:
        sdk.wait("long-run", timeout=60, poll_interval=0.5)
    assert ended.value.job.state == "CANCELLED"
    assert [e.to_state for e in sdk.history(running.id) if e.kind == "business"][-1] == (
        "CANCELLED"
    )
