"""The `kubetrain` client commands against a real server: submit, get, history, cancel,
datasets, tokens, and what a user reads when something is wrong."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import func, select

from kubetrain.api import create_app
from kubetrain.cli.main import main
from kubetrain.domain.states import BusinessState, ReasonCode
from kubetrain.store import Job, PodObservation, find_token, list_tokens
from kubetrain.store.sync import SyncedJob, record_synced
from tests.api.builders import (
    NEVER_FITS_NAMESPACE,
    WAITING_NAMESPACE,
    FakeLogs,
    kueue_cluster,
    own,
)
from tests.cli.conftest import PROJECT, Server

pytestmark = pytest.mark.db

KUBETRAIN = Path(sys.executable).parent / "kubetrain"

JOB_YAML = """\
apiVersion: kubetrain.io/v1
kind: TrainingJob
metadata: {name: train-policy-v12, labels: {team: rl}}
spec:
  image: registry.example/trainer:2026-08
  command: [python, train.py]
  env: [{name: EPOCHS, value: "10"}]
  resources: {requests: {cpu: "4", memory: 16Gi}, gpus: 1}
  maxRuntime: 24h
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def job_file(tmp_path: Path, text: str = JOB_YAML, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def job_count(server: Server) -> int:
    with server.db.read_only() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


def test_submit_get_history_cancel(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "submit", "-f", job_file(tmp_path))
    assert (code, err) == (0, "")
    assert out.startswith("job train-policy-v12 submitted: ")
    job_id = out.split()[3]

    code, out, _ = run(capsys, "get", "jobs", "-o", "json")
    assert code == 0
    [listed] = json.loads(out)
    for key in (
        "name",
        "project",
        "business_status",
        "reason",
        "raw_reason",
        "raw_message",
        "node",
        "exit_code",
        "attempt",
        "workers",
        "gpus",
    ):
        assert key in listed
    assert (listed["workers"], listed["gpus"]) == (1, 1)
    assert (listed["id"], listed["name"], listed["project"]) == (
        job_id,
        "train-policy-v12",
        PROJECT,
    )
    assert (listed["business_status"], listed["reason"]) == ("CREATED", "JOB_NOT_CREATED")

    code, out, _ = run(capsys, "get", "jobs")
    header, row = out.splitlines()
    assert header.split() == ["NAME", "STATE", "REASON", "GPUS", "NODE", "AGE"]
    assert row.split()[:5] == ["train-policy-v12", "CREATED", "JOB_NOT_CREATED", "1", "-"]

    code, out, _ = run(capsys, "get", "job", "train-policy-v12", "-o", "yaml")
    shown = yaml.safe_load(out)
    assert shown["id"] == job_id
    assert shown["spec"]["metadata"]["labels"] == {"team": "rl"}
    code, out, _ = run(capsys, "get", "job", job_id)
    assert "Reason:" in out
    assert "JOB_NOT_CREATED (link: control-plane)" in out
    assert "[platform]" in out  # who must act
    assert "GPUs:" in out

    code, out, _ = run(capsys, "history", "train-policy-v12")
    assert code == 0
    assert "(new) -> CREATED/JOB_NOT_CREATED" in out

    code, out, _ = run(capsys, "cancel", "train-policy-v12")
    assert (code, out) == (0, f"job train-policy-v12 ({job_id}) cancelled\n")
    code, out, _ = run(capsys, "cancel", job_id)
    assert out == f"job train-policy-v12 ({job_id}) was already cancelled\n"
    code, out, _ = run(capsys, "history", job_id, "-o", "json")
    rows = json.loads(out)
    assert [row["to_state"] for row in rows] == ["CREATED", "CANCELLED"]
    code, out, _ = run(capsys, "get", "jobs", "--state", "cancelled", "-o", "json")
    assert [job["id"] for job in json.loads(out)] == [job_id]
    code, out, err = run(capsys, "get", "jobs", "--state", "RUNNING")
    assert (code, out) == (0, "")
    assert "no jobs" in err


def test_a_bad_file_is_refused_here_with_the_field_named(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = JOB_YAML.replace('{requests: {cpu: "4", memory: 16Gi}, gpus: 1}', "{gpus: 0.5}")
    code, out, err = run(capsys, "submit", "-f", job_file(tmp_path, bad))
    assert code == 1
    assert out == ""
    assert "spec.resources.requests" in err
    assert "spec.resources.gpus" in err
    assert "Traceback" not in err
    assert server.requests == []  # refused before any request
    duplicate = JOB_YAML + "kind: TrainingJob\n"
    code, _, err = run(capsys, "submit", "-f", job_file(tmp_path, duplicate))
    assert code == 1
    assert "duplicate key 'kind'" in err
    assert server.requests == []
    assert job_count(server) == 0


def test_the_project_comes_from_the_flag_the_environment_or_the_file(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    use(project=None)
    code, _, err = run(capsys, "submit", "-f", job_file(tmp_path))
    assert code == 1
    assert "metadata.project" in err
    assert server.requests == []
    in_file = JOB_YAML.replace(
        "name: train-policy-v12,", f"name: train-policy-v12, project: {PROJECT},"
    )
    code, _, _ = run(capsys, "submit", "-f", job_file(tmp_path, in_file))
    assert code == 0
    code, _, err = run(capsys, "submit", "-f", job_file(tmp_path, in_file), "--project", "other")
    assert code == 1
    assert "metadata.project" in err
    code, out, _ = run(capsys, "get", "jobs", "-p", PROJECT, "-o", "json")
    assert len(json.loads(out)) == 1


def test_an_idempotency_key_makes_one_job(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job_file(tmp_path)
    first = run(capsys, "submit", "-f", path, "--idempotency-key", "k-1")
    second = run(capsys, "submit", "-f", path, "--idempotency-key", "k-1")
    assert (first[0], second[0]) == (0, 0)
    assert "submitted before with this key" in second[1]
    assert job_count(server) == 1
    other = JOB_YAML.replace("train-policy-v12", "train-policy-v13")
    code, _, err = run(
        capsys, "submit", "-f", job_file(tmp_path, other), "--idempotency-key", "k-1"
    )
    assert code == 1
    assert "HTTP 409" in err


def test_refusals_read_as_a_few_lines(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(capsys, "submit", "-f", job_file(tmp_path))
    use(token="viewer@" + PROJECT)
    code, _, err = run(capsys, "cancel", "train-policy-v12")
    assert code == 1
    assert err.startswith("kubetrain: error: Forbidden (HTTP 403): a viewer token may not cancel")
    use(token="kt_not-a-token")
    code, _, err = run(capsys, "get", "jobs")
    assert code == 1
    assert "Unauthorized (HTTP 401)" in err
    assert "KUBETRAIN_TOKEN" in err
    assert "kt_not-a-token" not in err
    use(token=None)
    requests = len(server.requests)
    code, _, err = run(capsys, "get", "jobs")
    assert code == 1
    assert "no API token" in err
    assert len(server.requests) == requests
    use()
    code, _, err = run(capsys, "get", "job", "no-such-job")
    assert code == 1
    assert "no job named 'no-such-job'" in err
    unknown = JOB_YAML.replace("maxRuntime: 24h", "dataset: {name: imagenet, version: v9}")
    code, _, err = run(capsys, "submit", "-f", job_file(tmp_path, unknown))
    assert code == 1
    assert "spec.dataset.name: unknown dataset 'imagenet'" in err
    for output in (err,):
        assert "Traceback" not in output


def test_an_unreachable_server_is_named(
    use, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("KUBETRAIN_URL", f"http://127.0.0.1:{port}")
    code, out, err = run(capsys, "get", "jobs")
    assert code == 1
    assert out == ""
    assert f"cannot reach the kubetrain server at http://127.0.0.1:{port}" in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_datasets_are_registered_and_used(
    server: Server, use, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    use(token="admin@" + PROJECT)  # a project's admin does not write the shared registry
    register = ("dataset", "register", "imagenet", "v3", "--claim", "dataset-imagenet")
    code, _, err = run(capsys, *register, "--sub-path", "v3")
    assert code == 1
    assert "HTTP 403" in err
    use(token="admin@*")
    code, out, _ = run(capsys, *register, "--sub-path", "v3")
    assert (code, out) == (0, "dataset imagenet@v3 registered (dataset-imagenet:v3)\n")
    code, out, _ = run(capsys, *register, "--sub-path", "v3")
    assert out == "dataset imagenet@v3 was registered already (dataset-imagenet:v3)\n"
    code, _, err = run(capsys, "dataset", "register", "imagenet", "v4", "--claim", "Bad Claim")
    assert code == 1
    assert "claim:" in err
    code, out, _ = run(capsys, "dataset", "list")
    assert out.splitlines()[1].split()[:4] == ["imagenet", "v3", "dataset-imagenet", "v3"]
    code, out, _ = run(capsys, "dataset", "list", "-o", "json")
    assert json.loads(out)[0]["dataset"]["claim"] == "dataset-imagenet"

    use()
    with_dataset = JOB_YAML.replace("maxRuntime: 24h", "dataset: {name: imagenet, version: v3}")
    code, _, _ = run(capsys, "submit", "-f", job_file(tmp_path, with_dataset))
    assert code == 0


def _cli(server: Server, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBETRAIN_DATABASE_URL": server.database_url,
        "KUBETRAIN_CONFIG": os.environ["KUBETRAIN_CONFIG"],
    }
    return subprocess.run(
        [str(KUBETRAIN), *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_token_create_prints_only_the_token(server: Server) -> None:
    made = _cli(server, "token", "create", "--project", PROJECT, "--role", "viewer", "--name", "ci")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert made.stdout == token + "\n"
    assert token.startswith("kt_")
    assert token not in made.stderr
    assert "ci (viewer on ai-training" in made.stderr
    with server.db.read_only() as session:
        found = find_token(session, token)
        assert found is not None
        assert (found.name, found.role, found.project) == ("ci", "viewer", PROJECT)

    listed = _cli(server, "token", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert token not in listed.stdout
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["ci"]["prefix"] == token[: len(rows["ci"]["prefix"])]

    revoked = _cli(server, "token", "revoke", rows["ci"]["id"])
    assert revoked.returncode == 0, revoked.stderr
    again = _cli(server, "token", "revoke", rows["ci"]["id"])
    assert again.returncode == 1
    assert "no live token" in again.stderr
    with server.db.read_only() as session:
        assert "ci" not in {t.name for t in list_tokens(session)}


def test_token_create_refuses_bad_input_and_a_bad_database(server: Server, tmp_path: Path) -> None:
    bad_role = _cli(server, "token", "create", "--project", PROJECT, "--role", "root")
    assert bad_role.returncode == 2
    bad_project = _cli(server, "token", "create", "--project", "Not A Project", "--role", "admin")
    assert bad_project.returncode == 1
    assert "--project" in bad_project.stderr
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = _cli(
        server,
        "token",
        "create",
        "--project",
        "*",
        "--role",
        "admin",
        "--database-url",
        f"postgresql://kubetrain:s3cret@127.0.0.1:{port}/kubetrain",
    )
    assert down.returncode == 1
    assert down.stdout == ""
    assert "cannot use the database" in down.stderr
    assert "s3cret" not in down.stderr
    assert "Traceback" not in down.stderr


def test_webhook_create_prints_the_secret_alone_then_list_and_delete(
    server: Server, use, capsys: pytest.CaptureFixture[str]
) -> None:
    use(f"admin@{PROJECT}")
    code, out, err = run(
        capsys,
        "webhook",
        "create",
        "--url",
        "https://hooks.example.org/kubetrain",
        "--events",
        "io.kubetrain.job.state_changed",
    )
    assert code == 0, err
    secret = out.strip()
    assert secret.startswith("whsec_")
    assert out.count("\n") == 1
    assert "shown only now" in err
    webhook_id = err.split()[1]
    code, out, _ = run(capsys, "webhook", "list")
    assert code == 0
    assert webhook_id in out
    assert "state_changed" in out
    assert secret not in out
    code, out, _ = run(capsys, "webhook", "delete", webhook_id)
    assert (code, out.strip()) == (0, f"webhook {webhook_id} deleted")
    code, _, err = run(capsys, "webhook", "delete", webhook_id)
    assert code == 1
    assert "not found" in err.lower()
    use(f"submitter@{PROJECT}")
    code, _, err = run(capsys, "webhook", "list")
    assert code == 1
    assert "403" in err or "may not" in err


def test_usage_prints_gpu_hours_per_project_and_type(
    server: Server, use, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = run(capsys, "submit", "-f", job_file(tmp_path), "-o", "json")
    assert code == 0, err
    job_id = json.loads(out)["id"]
    start = datetime.now(UTC) - timedelta(hours=3)
    pod = PodObservation(
        pod_name="kt-a",
        pod_uid="uid-a",
        pod_phase="Succeeded",
        bound_at=start,
        started_at=start + timedelta(minutes=30),
        finished_at=start + timedelta(hours=2, minutes=30),
    )
    synced = SyncedJob(
        job_id, [pod], BusinessState.RUNNING, ReasonCode.TRAINING, None, None, None, 1, None, {}
    )
    with server.db.transaction() as session:
        record_synced(session, [synced], now=start)
    use("admin@*", project=None)
    code, out, err = run(capsys, "usage")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("GPU-hours since the start, until ")
    assert lines[1].split() == [
        "PROJECT",
        "GPU",
        "TYPE",
        "JOBS",
        "BEFORE",
        "TRAINING",
        "TRAINING",
        "GPU-HOURS",
    ]
    assert lines[2].split() == [PROJECT, "any", "1", "0.50", "2.00", "2.50"]
    code, out, err = run(capsys, "usage", "-p", PROJECT, "--since", "1h", "-o", "json")
    assert code == 0, err
    (item,) = json.loads(out)["items"]
    assert item["before_training"] == 0
    assert item["training"] == pytest.approx(1800, abs=5)  # the last half hour of its training
    code, _, err = run(capsys, "usage", "--since", "yesterday")
    assert code == 1
    assert "--since 'yesterday': give a duration" in err
    use(f"viewer@{PROJECT}", project=PROJECT)
    code, _, err = run(capsys, "usage")  # every project at once is for admins
    assert code == 1
    assert "403" in err or "may not" in err


@pytest.fixture
def fake_logs() -> FakeLogs:
    logs = FakeLogs()
    logs.output["kt-b"] = ["step 1 loss 2.3\n", "step 2 loss 2.1\n"]
    return logs


@pytest.fixture
def with_logs(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, fake_logs: FakeLogs
) -> Server:
    """The server, with FakeLogs (tests/api/builders.py) as its cluster side."""
    monkeypatch.setattr(
        "tests.cli.conftest.create_app",
        lambda settings, db: create_app(settings, db, pod_logs=fake_logs),
    )
    server: Server = request.getfixturevalue("server")
    return server


def test_logs_prints_the_newest_attempts_output_and_says_when_a_pod_is_gone(
    with_logs: Server,
    fake_logs: FakeLogs,
    use,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    code, out, err = run(capsys, "submit", "-f", job_file(tmp_path), "-o", "json")
    assert code == 0, err
    job_id = json.loads(out)["id"]
    pods = [
        PodObservation("kt-a", "uid-a", node="n1", pod_phase="Failed", termination_message="NaN"),
        PodObservation("kt-b", "uid-b", node="n1", pod_phase="Running"),
    ]
    synced = SyncedJob(
        job_id, pods, BusinessState.RUNNING, ReasonCode.TRAINING, None, None, None, 2, None, {}
    )
    with with_logs.db.transaction() as session:
        record_synced(session, [synced], now=datetime.now(UTC))
    use(f"viewer@{PROJECT}")
    code, out, err = run(
        capsys, "logs", "train-policy-v12", "--tail", "5", "--since", "10m", "-f", "--timestamps"
    )
    assert (code, out, err) == (0, "step 1 loss 2.3\nstep 2 loss 2.1\n", "")
    (asked,) = fake_logs.asked
    assert (asked.tail, asked.since_seconds, asked.follow, asked.timestamps) == (5, 600, True, True)
    code, out, err = run(capsys, "logs", job_id, "--attempt", "1")
    assert code == 1
    assert "Pod kt-a (attempt 1) is gone" in err
    assert "NaN" in err
    code, _, err = run(capsys, "logs", job_id, "--since", "2d")
    assert code == 1
    assert "--since: '2d' is not a duration" in err


@pytest.fixture
def kueue_listing() -> dict[str, Any]:
    return kueue_cluster()


@pytest.fixture
def with_queues(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, kueue_listing: dict[str, Any]
) -> Server:
    """The server, its caches holding the dumps recorded from the real Kueue, PROJECT's
    namespace the one where a job waits."""
    monkeypatch.setattr(
        "tests.cli.conftest.create_app",
        lambda settings, db: create_app(
            settings.model_copy(update={"namespaces": {PROJECT: WAITING_NAMESPACE}}),
            db,
            cluster=lambda: kueue_listing,
        ),
    )
    server: Server = request.getfixturevalue("server")
    return server


def test_queues_prints_each_cluster_queues_quota_and_pending_jobs_in_order(
    with_queues: Server,
    kueue_listing: dict[str, Any],
    use,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    code, out, err = run(capsys, "submit", "-f", job_file(tmp_path), "-o", "json")
    assert code == 0, err
    own(kueue_listing, WAITING_NAMESPACE, "kt-kueue-waiting", json.loads(out)["id"])
    use("viewer@*", project=None)
    code, out, err = run(capsys, "queues")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "ClusterQueue gpus (active): 1 admitted, 2 pending"
    assert lines[1].split() == [
        "FLAVOR",
        "RESOURCE",
        "RESERVED",
        "NOMINAL",
        "BORROWING",
        "LIMIT",
        "BORROWED",
    ]
    assert ["default-flavor", "nvidia.com/gpu", "8", "8", "-", "0"] in [
        line.split() for line in lines
    ]
    pending = [line.split()[:2] for line in lines if line.split()[:1] in (["1"], ["2"])]
    assert pending[:2] == [
        ["1", f"{PROJECT}/train-policy-v12"],
        ["2", f"{NEVER_FITS_NAMESPACE}/kt-kueue-never-fits"],
    ]
    assert "ClusterQueue stopped (INACTIVE: Can't admit new workloads: is stopped.)" in out
    use(f"viewer@{PROJECT}")
    code, out, err = run(capsys, "queues", "-o", "json")
    assert code == 0, err
    gpus = json.loads(out)["cluster_queues"][0]
    assert [(p["position"], p["job_name"]) for p in gpus["pending"]] == [(1, "train-policy-v12")]
    code, out, _ = run(capsys, "queues")
    assert "(1 pending jobs of other projects not shown)" in out
    assert "kt-kueue-never-fits" not in out


def test_queues_on_a_server_without_control_loops_says_why(
    server: Server, use, capsys: pytest.CaptureFixture[str]
) -> None:
    use(f"viewer@{PROJECT}")
    code, out, err = run(capsys, "queues")
    assert (code, out) == (1, "")
    assert "HTTP 503" in err
    assert "runs no control loops" in err
