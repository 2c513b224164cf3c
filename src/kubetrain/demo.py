"""`make demo`: the whole product on the embedded defaults.

Starts (or reuses) a local testbed, runs `kubetrain serve` on a fresh SQLite
database, submits four training jobs that end in different states, waits for
Kubernetes to decide each, and prints what kubetrain says about them. The
server keeps running afterwards, and the demo ends with the dashboard's URL and
a token to sign in with; a later demo stops it before starting afresh.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from kubetrain.local_server import CLI, LocalServer
from kubetrain.testbed import state_root
from kubetrain.testbed.cluster import Testbed, TestbedError, node_table

FATE = "testbed.kubetrain.io"
# (project, name, resources, annotations, the state and reason Kubernetes will lead to)
JOBS: list[tuple[str, str, dict[str, Any], dict[str, str], tuple[str, str]]] = [
    (
        "demo",
        "resnet50-baseline",
        {"gpus": 1, "gpuType": "nvidia-h100"},
        {f"{FATE}/run": "3s"},
        ("SUCCEEDED", "COMPLETED"),
    ),
    (
        "demo",
        "vit-finetune",
        {"gpus": 1},
        {
            f"{FATE}/run": "2s",
            f"{FATE}/exit-code": "1",
            f"{FATE}/termination-message": "RuntimeError: CUDA error: device-side assert triggered",
        },
        ("FAILED", "EXIT_NONZERO"),
    ),
    ("demo", "llm-pretrain-16gpu", {"gpus": 16}, {}, ("QUEUED", "INSUFFICIENT_GPU")),
    ("demo-quota", "sweep-trial-7", {"gpus": 2}, {}, ("QUEUED", "WAITING_FOR_QUOTA")),
]


def main() -> int:
    home = state_root().parent / "demo"
    home.mkdir(parents=True, exist_ok=True)
    try:
        testbed = _testbed()
    except TestbedError as exc:
        print(f"kubetrain demo: {exc}", file=sys.stderr)
        return 1
    print(node_table(testbed), end="\n\n")
    pid_file = home / "serve.pid"
    _stop_previous(pid_file)
    database = home / "kubetrain.db"
    for leftover in home.glob("kubetrain.db*"):
        leftover.unlink()
    server = LocalServer(f"sqlite:///{database}", home / "serve.log", kubeconfig=testbed.kubeconfig)
    server.extra_env["KUBETRAIN_STATUS_URL"] = server.url  # each Job gets a status-token Secret
    _quota(testbed)
    try:
        server.start()
        assert server.proc is not None
        pid_file.write_text(str(server.proc.pid))
        url = server.url
        env = {**server.env, "KUBETRAIN_URL": url, "KUBETRAIN_TOKEN": server.token}
        print(f"kubetrain serve is up at {url} (log: {server.log})")
        with server.client() as http:
            ids = {}
            for project, name, resources, annotations, _ in JOBS:
                body = {
                    "apiVersion": "kubetrain.io/v1",
                    "kind": "TrainingJob",
                    "metadata": {"name": name, "project": project, "annotations": annotations},
                    "spec": {
                        "image": "registry.example/trainer:2026-08",
                        "command": ["python", "train.py"],
                        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, **resources},
                    },
                }
                resp = http.post(
                    f"/api/v1/projects/{project}/jobs",
                    json=body,
                    headers={"Idempotency-Key": f"demo-{name}"},
                )
                resp.raise_for_status()
                ids[name] = (project, resp.json()["id"])
                print(f"submitted {project}/{name}")
            _wait_decided(http, ids)
        for project in ("demo", "demo-quota"):
            print(f"\n$ kubetrain get jobs -p {project}")
            subprocess.run([*CLI, "get", "jobs", "-p", project], env=env, check=False)
        print("\n$ kubetrain get job llm-pretrain-16gpu -p demo")
        subprocess.run(
            [*CLI, "get", "job", "llm-pretrain-16gpu", "-p", "demo"], env=env, check=False
        )
        # Submitter, not admin: enough to see and cancel every project's jobs in the browser.
        dashboard_token = server.create_token("*", "submitter", "demo-dashboard")
    except BaseException:
        server.stop()
        pid_file.unlink(missing_ok=True)
        raise
    print("\nThe testbed and kubetrain serve keep running. To explore from a shell:")
    print(f"  export KUBECONFIG={shlex.quote(str(testbed.kubeconfig))}")
    print(f"  export KUBETRAIN_URL={url} KUBETRAIN_TOKEN={dashboard_token}")
    print(f"Stop the server with: kill {server.proc.pid}")
    print("Stop the testbed with: .venv/bin/kubetrain testbed down --name demo")
    print("\nThe dashboard, with the four jobs on it:")
    print(f"  URL:   {url}/ui/")
    print(f"  token: {dashboard_token}   (paste it on the sign-in page)")
    return 0


def _stop_previous(pid_file: Path) -> None:
    """Stop the server an earlier demo left running (its database is about to go)."""
    try:
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        pid_file.unlink(missing_ok=True)
        return
    if b"kubetrain.cli.main" in cmdline and b"serve" in cmdline:  # not a reused pid
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        print(f"stopped the earlier demo's kubetrain serve (pid {pid})")
    pid_file.unlink(missing_ok=True)


def _testbed() -> Testbed:
    testbed = Testbed(state_root() / "demo")
    if testbed.state_file.exists() and all(testbed.running().values()):
        print(f"reusing the demo testbed in {testbed.state_dir}")
        return testbed
    testbed.down()
    testbed = Testbed.up(testbed.state_dir, "default")
    print(f"demo testbed up in {testbed.status()['ready_seconds']} s: {testbed.server}")
    return testbed


def _quota(testbed: Testbed) -> None:
    """Project demo-quota may hold one GPU at a time."""
    from lightkube import ApiError, Client
    from lightkube.codecs import from_dict
    from lightkube.config.kubeconfig import KubeConfig

    client = Client(config=KubeConfig.from_file(testbed.kubeconfig), field_manager="demo")
    for manifest in (
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "demo-quota"}},
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": "demo-quota"},
            "spec": {"hard": {"requests.nvidia.com/gpu": "1"}},
        },
    ):
        obj: Any = from_dict(manifest)
        try:
            client.create(obj)
        except ApiError as exc:
            if exc.status.code != 409:
                raise


def _wait_decided(
    http: httpx.Client, ids: dict[str, tuple[str, str]], timeout: float = 120
) -> None:
    expected = {name: want for _, name, _, _, want in JOBS}
    deadline = time.monotonic() + timeout
    pending = dict(ids)
    while pending and time.monotonic() < deadline:
        for name, (project, job_id) in list(pending.items()):
            job = http.get(f"/api/v1/projects/{project}/jobs/{job_id}").json()
            if (job["business_status"], job["reason"]) == expected[name]:
                del pending[name]
        time.sleep(0.5)
    if pending:
        print(f"(still waiting for Kubernetes on: {', '.join(pending)})")


if __name__ == "__main__":
    sys.exit(main())
