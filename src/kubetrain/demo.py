"""`make demo`: the whole product on the embedded defaults.

Starts (or reuses) a local testbed, runs `kubetrain serve` on a fresh SQLite
database, submits four training jobs that end in different states, waits for
Kubernetes to decide each, and prints what kubetrain says about them. The
server keeps running afterwards, and the demo ends with the dashboard's URL and
a token to sign in with; a later demo stops it before starting afresh.

`--real` (`make demo-real`) shows the other half of the chain instead: on the
real-node pool (real kubelets and containerd), one small real training run (torch
on CPU) that reports its steps, checkpoints to a volume and succeeds; its output is
what `kubetrain logs` and `kubectl logs` print.
"""

from __future__ import annotations

import os
import shlex
import shutil
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
from kubetrain.testbed.images import TRAINER_IMAGE

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


REAL_PROJECT = "demo-real"
REAL_JOB = "tiny-mlp"
# 60 steps, a checkpoint every 10: a few seconds of real torch on a shared CPU.
REAL_ARGS = ["python", "-m", "kubetrain.testbed.tiny_training", "--steps", "60", "--every", "10"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--real"]):
        print("usage: python -m kubetrain.demo [--real]", file=sys.stderr)
        return 2
    if args == ["--real"]:
        return _real_demo()
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
    server.extra_env["KUBETRAIN_STATUS_URL"] = server.url  # Pods report with a projected token
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


def _real_demo() -> int:
    home = state_root().parent / "demo-real"
    home.mkdir(parents=True, exist_ok=True)
    try:
        testbed = _testbed("demo-real", "real")
    except TestbedError as exc:
        print(f"kubetrain demo: {exc}", file=sys.stderr)
        return 1
    print(node_table(testbed), end="\n\n")
    network = testbed.state().network
    if network is None:
        print("kubetrain demo: the demo-real testbed has no Pod network", file=sys.stderr)
        return 1
    pid_file = home / "serve.pid"
    _stop_previous(pid_file)
    for leftover in home.glob("kubetrain.db*"):
        leftover.unlink()
    # The Pods report to kubetrain serve at the Pod network's gateway (their loopback
    # is their own).
    server = LocalServer(
        f"sqlite:///{home / 'kubetrain.db'}",
        home / "serve.log",
        kubeconfig=testbed.kubeconfig,
        host=network.gateway,
    )
    server.extra_env["KUBETRAIN_STATUS_URL"] = server.url
    checkpoints = _checkpoint_volume(testbed, home)
    try:
        server.start()
        assert server.proc is not None
        pid_file.write_text(str(server.proc.pid))
        env = {**server.env, "KUBETRAIN_URL": server.url, "KUBETRAIN_TOKEN": server.token}
        print(f"kubetrain serve is up at {server.url} (log: {server.log})")
        body = {
            "apiVersion": "kubetrain.io/v1",
            "kind": "TrainingJob",
            "metadata": {"name": REAL_JOB, "project": REAL_PROJECT},
            "spec": {
                "image": TRAINER_IMAGE,
                "args": REAL_ARGS,
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                "checkpoints": {"claim": "checkpoints"},
            },
        }
        with server.client() as http:
            resp = http.post(f"/api/v1/projects/{REAL_PROJECT}/jobs", json=body)
            resp.raise_for_status()
            job_id = resp.json()["id"]
            print(f"submitted {REAL_PROJECT}/{REAL_JOB}: {' '.join(REAL_ARGS)}")
            job = _wait_for(http, REAL_PROJECT, job_id, ("SUCCEEDED", "COMPLETED"), 300)
        succeeded = (job.get("business_status"), job.get("reason")) == ("SUCCEEDED", "COMPLETED")
        for argv in (
            ["get", "job", REAL_JOB, "-p", REAL_PROJECT],
            ["logs", REAL_JOB, "-p", REAL_PROJECT, "--tail", "4"],
        ):
            print(f"\n$ kubetrain {' '.join(argv)}")
            subprocess.run([*CLI, *argv], env=env, check=False)
        dashboard_token = server.create_token("*", "submitter", "demo-dashboard")
    except BaseException:
        server.stop()
        pid_file.unlink(missing_ok=True)
        raise
    print(f"\nCheckpoints written by the run: {checkpoints}")
    print("The same lines from the kubelet itself:")
    print(
        f"  kubectl --kubeconfig={shlex.quote(str(testbed.kubeconfig))} logs -n {REAL_PROJECT} "
        f"job/kt-{job_id}"
    )
    print(f"\nThe dashboard: {server.url}/ui/   token: {dashboard_token}")
    print(f"Stop the server with: kill {server.proc.pid}")
    print("Stop the testbed with: .venv/bin/kubetrain testbed down --name demo-real")
    return 0 if succeeded else 1


def _checkpoint_volume(testbed: Testbed, home: Path) -> Path:
    """The claim `checkpoints` in the demo's namespace, bound to a fresh directory of
    this machine (a hostPath PersistentVolume: both real nodes run here)."""
    from lightkube import ApiError, Client
    from lightkube.codecs import from_dict
    from lightkube.config.kubeconfig import KubeConfig
    from lightkube.resources.core_v1 import PersistentVolume, PersistentVolumeClaim

    client = Client(config=KubeConfig.from_file(testbed.kubeconfig), field_manager="demo")
    volume = f"{REAL_PROJECT}-checkpoints"
    try:  # an earlier demo's claim and volume
        client.delete(PersistentVolumeClaim, "checkpoints", namespace=REAL_PROJECT)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
    try:
        client.delete(PersistentVolume, volume)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
    _until_gone(client, PersistentVolume, volume)
    directory = home / "checkpoints"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir()
    manifests: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": REAL_PROJECT}},
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(directory), "type": "Directory"},
                "claimRef": {"namespace": REAL_PROJECT, "name": "checkpoints"},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "checkpoints", "namespace": REAL_PROJECT},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    ]
    for manifest in manifests:
        obj: Any = from_dict(manifest)
        try:
            client.create(obj)
        except ApiError as exc:
            if exc.status.code != 409:
                raise
    return directory


def _until_gone(client: Any, kind: Any, name: str, timeout: float = 60) -> None:
    from lightkube import ApiError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.get(kind, name)
        except ApiError as exc:
            if exc.status.code == 404:
                return
            raise
        time.sleep(0.5)


def _wait_for(
    http: httpx.Client, project: str, job_id: str, want: tuple[str, str], timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        job = http.get(f"/api/v1/projects/{project}/jobs/{job_id}").json()
        if (job["business_status"], job["reason"]) == want or job["business_status"] in (
            "FAILED",
            "CANCELLED",
        ):
            break
        time.sleep(0.5)
    print(f"{project}/{REAL_JOB}: {job.get('business_status')}/{job.get('reason')}")
    return job


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


def _testbed(name: str = "demo", pool: str = "default") -> Testbed:
    testbed = Testbed(state_root() / name)
    if testbed.state_file.exists() and all(testbed.running().values()):
        print(f"reusing the {name} testbed in {testbed.state_dir}")
        return testbed
    testbed.down()
    testbed = Testbed.up(testbed.state_dir, pool)
    print(f"{name} testbed up in {testbed.status()['ready_seconds']} s: {testbed.server}")
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
