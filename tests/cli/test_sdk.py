"""`kubetrain.Client` against a real server (no cluster: jobs stay CREATED until the
test cancels them), on SQLite and PostgreSQL: submit, get, jobs, cancel, history,
usage, wait's two ways to stop short, and every refusal as kubetrain's error with
the server's RFC 9457 problem in it. The path through a cluster (wait until
SUCCEEDED, why, logs) is tests/e2e/test_sdk.py's."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from kubetrain import Client
from kubetrain.client import (
    ApiError,
    ClientError,
    HistoryEntry,
    Job,
    JobEnded,
    NotFound,
    Usage,
    WaitTimeout,
)
from kubetrain.domain.spec import SpecError
from tests.cli.conftest import PROJECT, Server
from tests.cli.test_cli import JOB_YAML

pytestmark = pytest.mark.db


def client(server: Server, role: str = "submitter", project: str = PROJECT) -> Client:
    return Client(server.url, server.tokens[f"{role}@{project}"], project=PROJECT)


def test_submit_get_jobs_cancel_history_and_usage(server: Server, tmp_path: Path) -> None:
    sdk = client(server)
    document = yaml.safe_load(JOB_YAML)
    job = sdk.submit(document, idempotency_key="first")
    assert isinstance(job, Job)
    assert (job.name, job.project, job.state, job.reason) == (
        "train-policy-v12",
        PROJECT,
        "CREATED",
        "JOB_NOT_CREATED",
    )
    assert (job.reason_detail.link, job.reason_detail.actor) == ("control-plane", "platform")
    assert job.created_at.tzinfo is not None
    assert not job.done
    assert repr(job).startswith(f"Job(name='train-policy-v12', id='{job.id}', ")
    assert "state='CREATED'" in repr(job)
    assert "<th style='text-align:left'>state</th>" in job._repr_html_()
    assert sdk.submit(document, idempotency_key="first").id == job.id  # a retry, not a job
    path = tmp_path / "job.yaml"
    path.write_text(JOB_YAML.replace("train-policy-v12", "from-a-file"))
    from_file = sdk.submit(path)
    from_text = sdk.submit(JOB_YAML.replace("train-policy-v12", "from-text"))
    assert len({job.id, from_file.id, from_text.id}) == 3

    by_name = sdk.get("train-policy-v12")
    assert by_name == sdk.get(job.id)
    assert by_name.spec is not None
    assert by_name.spec["metadata"]["labels"] == {"team": "rl"}
    assert by_name.diagnosis is None  # no syncer here has made one
    assert [j.name for j in sdk.jobs()] == ["from-text", "from-a-file", "train-policy-v12"]
    assert sdk.jobs(limit=1)[0].spec is None  # a listing's entries are summaries
    assert sdk.jobs(state="RUNNING") == []

    cancelled = sdk.cancel("train-policy-v12")
    assert (cancelled.state, cancelled.done) == ("CANCELLED", True)
    assert sdk.cancel(job.id).state == "CANCELLED"  # again: unchanged
    assert [j.id for j in sdk.jobs(state=["cancelled", "FAILED"])] == [job.id]
    history = sdk.history(job.id)
    assert all(isinstance(entry, HistoryEntry) for entry in history)
    assert [(e.kind, e.from_state, e.to_state) for e in history] == [
        ("business", None, "CREATED"),
        ("business", "CREATED", "CANCELLED"),
    ]
    assert history[0].at <= history[1].at

    usage = sdk.usage(PROJECT, since=datetime.now(UTC) - timedelta(days=1))
    assert isinstance(usage, Usage)
    assert (usage.items, usage.total.total) == ([], 0)  # nothing ever ran
    assert usage.since is not None
    assert usage.since < usage.until


def test_wait_stops_at_its_state_at_an_end_it_was_not_waiting_for_or_in_time(
    server: Server,
) -> None:
    sdk = client(server)
    waiting = sdk.submit(yaml.safe_load(JOB_YAML))
    with pytest.raises(WaitTimeout) as late:
        sdk.wait(waiting.id, timeout=0.2, poll_interval=0.05)
    assert isinstance(late.value, TimeoutError)
    assert late.value.job.state == "CREATED"
    assert "is still CREATED/JOB_NOT_CREATED after 0.2 s" in str(late.value)
    assert sdk.wait(waiting.id, until="CREATED").id == waiting.id
    sdk.cancel(waiting.id)
    with pytest.raises(JobEnded) as ended:
        sdk.wait("train-policy-v12")  # until SUCCEEDED or FAILED: it never will now
    assert ended.value.job.state == "CANCELLED"
    assert "ended CANCELLED/CANCELLED, not FAILED or SUCCEEDED" in str(ended.value)
    assert sdk.wait("train-policy-v12", until=("CANCELLED",), timeout=None).done


def test_refusals_are_kubetrains_errors_with_the_servers_problem(
    server: Server, tmp_path: Path
) -> None:
    sdk = client(server)
    requests = len(server.requests)
    with pytest.raises(SpecError) as bad:  # checked here: no request made
        sdk.submit(JOB_YAML.replace("gpus: 1}", "gpus: 0.5}"))
    assert [p.field for p in bad.value.problems] == ["spec.resources.gpus"]
    with pytest.raises(ClientError, match="cannot read"):
        sdk.submit(tmp_path / "missing.yaml")
    assert len(server.requests) == requests

    unknown = JOB_YAML.replace("maxRuntime: 24h", "dataset: {name: imagenet, version: v9}")
    with pytest.raises(ApiError) as refused:  # only the server knows its datasets
        sdk.submit(unknown)
    assert refused.value.status == 422
    assert refused.value.problem["status"] == 422
    assert refused.value.errors == [
        {"field": "spec.dataset.name", "message": refused.value.errors[0]["message"]}
    ]
    assert "unknown dataset 'imagenet'" in str(refused.value)

    job = sdk.submit(JOB_YAML)
    with pytest.raises(ApiError) as forbidden:
        client(server, "viewer").cancel(job.id)
    assert (forbidden.value.status, forbidden.value.title) == (403, "Forbidden")
    assert "a viewer token may not cancel" in (forbidden.value.detail or "")
    with pytest.raises(ApiError) as unknown_token:
        Client(server.url, "kt_not-a-token", project=PROJECT).jobs()
    assert unknown_token.value.status == 401
    assert "kt_not-a-token" not in str(unknown_token.value)
    with pytest.raises(ApiError) as admin_only:
        sdk.usage()  # every project: an admin's question
    assert admin_only.value.status == 403

    with pytest.raises(NotFound, match="no job named 'no-such-job'") as missing:
        sdk.get("no-such-job")
    assert missing.value.problem["status"] == 404
    with pytest.raises(NotFound) as missing_id:
        sdk.get("00000000-0000-4000-8000-000000000000")
    assert missing_id.value.problem["title"] == "Not Found"
    with pytest.raises(NotFound) as undiagnosed:
        sdk.why(job.id)  # no syncer here has diagnosed it
    assert undiagnosed.value.status == 404
    with pytest.raises(NotFound) as no_pod:
        sdk.logs(job.id)  # refused at the call, not at the first line
    assert "has no Pod yet" in (no_pod.value.detail or "")
    for error in (refused, forbidden, unknown_token, missing, no_pod):
        assert "Traceback" not in str(error.value)


def test_settings_come_from_the_environment_like_the_clis(
    server: Server, use, monkeypatch: pytest.MonkeyPatch
) -> None:
    use()  # KUBETRAIN_URL, KUBETRAIN_TOKEN, KUBETRAIN_PROJECT
    sdk = Client()
    assert (sdk.url, sdk.project) == (server.url, PROJECT)
    sdk.submit(JOB_YAML)
    assert [j.name for j in sdk.jobs()] == ["train-policy-v12"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("KUBETRAIN_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(ClientError, match=f"cannot reach the kubetrain server at .*:{port}"):
        Client().jobs()
    monkeypatch.delenv("KUBETRAIN_PROJECT")
    with pytest.raises(ClientError, match="no project"):
        Client(server.url).jobs()
    use(token=None)
    with pytest.raises(ClientError, match="no API token"):
        Client(server.url)
