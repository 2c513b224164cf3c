"""The seed's two recoveries, on real kubelets: a lost node's training resumes from its
last checkpoint on the other node, bit for bit; a dataset of the wrong version fails the
preflight, and with it the Job, at once.

Volumes: the real pool has no dynamic provisioner, so each test binds a static
PersistentVolume of type hostPath on a directory of this machine (ReadWriteMany, no
node affinity) to a claim in the job's namespace. Both nodes run on this machine, so
both mount the same directory: what a shared filesystem is on a real cluster.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, PersistentVolume, PersistentVolumeClaim

from kubetrain.local_server import CLI
from kubetrain.runtime import checkpoint_files
from kubetrain.testbed.cluster import Testbed
from tests.e2e.conftest import Server
from tests.e2e.test_lifecycle import assert_valid_path, business_path, get
from tests.kube import create, eventually
from tests.realnode.test_real_pool import job, kubectl, project, submit, wait_for

pytestmark = pytest.mark.realnode

STEPS = 200
EVERY = 5
PACE = 0.2  # seconds per step: attempt 1 is killed ~2 s into a ~40 s run (slack for a busy CI)
TRAIN = ["--steps", str(STEPS), "--every", str(EVERY)]
# PodGC fails a vanished node's Pods 40-60 s after the Node went, then the
# replacement starts (torch's import on a shared 2-core machine) and finishes.
AFTER_LOSS = 240.0


def claim(kube: Client, namespace: str, name: str, path: Path, mode: str) -> None:
    """A static hostPath PersistentVolume on `path`, pre-bound to the claim `name`."""
    volume = f"{namespace}-{name}"
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": [mode],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {"namespace": namespace, "name": name},
            },
        },
    )
    create(
        kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": [mode],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        namespace,
    )
    eventually(
        lambda: kube.get(PersistentVolumeClaim, name, namespace=namespace).status.phase == "Bound",
        30,
        what=f"claim {name} bound",
    )


@pytest.fixture
def namespace(real_kube: Client, real_testbed: Testbed) -> Iterator[str]:
    """A project's namespace, made before its claims; deleted with its volumes after."""
    name = project()
    kubectl(real_testbed, "create", "namespace", name)
    eventually(
        lambda: "default" in kubectl(real_testbed, "get", "sa", "-n", name, "-o", "name"),
        30,
        what="the default ServiceAccount",
    )
    yield name
    kubectl(real_testbed, "delete", "namespace", name, "--wait=false")
    for volume in real_kube.list(PersistentVolume):
        if str(volume.metadata.name).startswith(f"{name}-"):
            real_kube.delete(PersistentVolume, volume.metadata.name)


def uninterrupted(tmp: Path) -> list[str]:
    """The same training, never interrupted, in this machine's environment (the one the
    trainer image mounts): its output lines."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETRAIN_", "PET_"))}
    env["KUBETRAIN_CHECKPOINT_DIR"] = str(tmp / "uninterrupted")
    done = subprocess.run(
        [sys.executable, "-m", "kubetrain.testbed.tiny_training", *TRAIN],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def assert_never_queued_once_running(path: list[tuple[str, str]]) -> None:
    """A real kubelet writes a container's end before the Pod's phase: that moment is
    the attempt finishing, not a job back in the queue."""
    running = next(i for i, (state, _) in enumerate(path) if state == "RUNNING")
    assert all(state != "QUEUED" for state, _ in path[running:]), path


def checkpoint_step(job_doc: dict[str, Any]) -> int:
    return int(((job_doc.get("progress") or {}).get("checkpoint") or {}).get("step") or 0)


def test_a_lost_node_s_training_resumes_on_the_other_node_bit_for_bit(
    real_server: Server, real_kube: Client, real_testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    p = namespace
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    claim(real_kube, p, "checkpoints", checkpoints, "ReadWriteMany")
    body = job(
        "resume",
        p,
        args=[
            "python",
            "-m",
            "kubetrain.testbed.tiny_training",
            *TRAIN,
            "--step-seconds",
            str(PACE),
        ],
        resources={"requests": {"cpu": "1", "memory": "1Gi"}},
        checkpoints={"claim": "checkpoints"},
        retries=0,
    )
    job_id = submit(real_server, body)
    began = time.monotonic()

    seen: dict[str, Any] = {}

    def checkpointed() -> dict[str, Any] | None:
        doc: dict[str, Any] = get(real_server, p, job_id)
        seen.update({k: doc.get(k) for k in ("business_status", "reason", "message", "node")})
        return doc if checkpoint_step(doc) >= 2 * EVERY else None

    first = eventually(
        checkpointed, 180, interval=0.1, what=lambda: f"attempt 1's second checkpoint ({seen})"
    )
    lost = str(first["node"])
    killed = time.monotonic()
    real_testbed.stop_real_node(lost)
    try:
        # What attempt 1 left: the newest checkpoint whose files all hold.
        valid = [f for f in checkpoint_files.scan(checkpoints, checksums=True) if not f.problem]
        newest = valid[0]
        assert 2 * EVERY <= newest.step < STEPS, [f.step for f in valid]
        real_kube.delete(Node, lost)
        reference = uninterrupted(tmp_path)  # while Pod garbage collection waits
        wait_for(real_server, p, job_id, "QUEUED", "NODE_LOST", timeout=60)
        node_lost = time.monotonic() - killed
        done = wait_for(real_server, p, job_id, "SUCCEEDED", "COMPLETED", timeout=AFTER_LOSS)
        succeeded = time.monotonic() - killed
        # Read while the node is still gone: attempt 1's last word is that it is.
        attempts = get(real_server, p, job_id, "/attempts")["items"]
    finally:
        real_testbed.start_real_node(lost)
    print(
        f"attempt 1 checkpointed step {newest.step} {killed - began:.0f} s after the submit; "
        f"NODE_LOST {node_lost:.0f} s after the kill, SUCCEEDED {succeeded:.0f} s after"
    )

    # Kubernetes replaced the Pod on the other node, and kept the retry: retries is 0.
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    one, two = attempts
    assert one["node"] == lost
    assert two["node"] not in (None, lost)
    assert one["raw_reason"] in ("DeletionByPodGC", "NotFound"), attempts
    k8s: Any = real_kube.get(Job, f"kt-{job_id}", namespace=p)
    assert not k8s.status.failed, k8s.status

    # kubetrain: NODE_LOST while attempt 1 was lost, then attempt 2 trained on.
    path = business_path(real_server, p, job_id)
    assert_valid_path(path)
    at = path.index(("QUEUED", "NODE_LOST"))
    assert ("RUNNING", "TRAINING") in path[:at]
    assert ("RUNNING", "TRAINING") in path[at:]
    assert path[-1] == ("SUCCEEDED", "COMPLETED")
    assert_never_queued_once_running(path[at:])
    history = get(real_server, p, job_id, "/history")["items"]
    node_lost_row = next(r for r in history if r["to_reason"] == "NODE_LOST")
    assert node_lost_row["attempt"] == 1, node_lost_row
    resumes = done["progress"]["resumes"]
    assert [(r["attempt"], r["from_step"], r["from_attempt"]) for r in resumes] == [
        (2, newest.step, 1)
    ], resumes
    assert resumes[0]["pod"] == two["pod"]
    assert resumes[0]["from_pod"] == one["pod"]
    # What was allowed to differ: the node did; the binding the runtime checked did not.
    verdicts = {c["field"]: c["verdict"] for c in resumes[0]["compared"]}
    assert verdicts["node"] == "differs, allowed", resumes[0]["compared"]
    assert verdicts["code version"] == verdicts["params digest"] == "same", verdicts
    assert verdicts["world size"] == "same"
    assert "differs, not allowed" not in verdicts.values()
    shown = real_server.cli("get", "job", job_id, "--project", p)
    assert shown.returncode == 0, shown.stderr
    assert f"attempt 2 from step {newest.step} of attempt 1" in shown.stdout, shown.stdout
    assert "SUCCEEDED" in shown.stdout

    # The new Pod's preflight passed, and it resumed from the last valid checkpoint.
    logs = kubectl(real_testbed, "logs", "-n", p, two["pod"]).splitlines()
    for check in ("checkpoint-readable", "status-reachable"):
        assert any(f"kubetrain preflight: {check} passed" in line for line in logs), logs
    assert f"resumed from step {newest.step} (written by {one['pod']})" in logs
    # From there on, the same losses, step by step, and the same final weights.
    trained = [line for line in logs if line.startswith(("step ", "final weights"))]
    expected = [line for line in reference if line.startswith(("step ", "final weights"))]
    assert trained == expected[newest.step :]
    assert trained[-1].startswith("final weights sha256 ")

    # The same binding: the final checkpoint is bound as attempt 1's was, and says
    # where it resumed from.
    final = checkpoint_files.scan(checkpoints, checksums=True)[0]
    assert (final.step, final.problem) == (STEPS, None)
    assert final.binding == newest.binding
    assert final.manifest["pod"] == two["pod"]
    assert final.manifest["resumedFrom"] == {
        "fromStep": newest.step,
        "fromPod": one["pod"],
        "allowedMismatch": [],
    }


def test_a_dataset_of_another_version_fails_the_preflight_and_the_job_at_once(
    real_server: Server, real_kube: Client, real_testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    p = namespace
    dataset = tmp_path / "dataset"
    (dataset / "train").mkdir(parents=True)
    (dataset / "train" / "part-0").write_bytes(b"0123456789" * 100)
    stamped = subprocess.run(
        [*CLI, "dataset", "stamp", str(dataset), "--name", "tiny", "--version", "v1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert stamped.returncode == 0, stamped.stderr
    claim(real_kube, p, "dataset", dataset, "ReadOnlyMany")
    # A credential the training would use: it must show up nowhere.
    secret = f"hf_{uuid.uuid4().hex}"
    kubectl(
        real_testbed,
        "create",
        "secret",
        "generic",
        "hub",
        "-n",
        p,
        f"--from-literal=token={secret}",
    )
    body = job(
        "stale",
        p,
        args=["python", "-c", "print('training on the wrong data')"],
        dataset={"name": "tiny", "version": "v2", "claim": "dataset"},
        env=[{"name": "HF_TOKEN", "secretRef": {"name": "hub", "key": "token"}}],
        retries=3,
    )
    job_id = submit(real_server, body)
    done = wait_for(real_server, p, job_id, "FAILED", "PREFLIGHT_FAILED")
    message = done["raw_message"]
    assert message.startswith("preflight failed: dataset-version: "), message
    assert "the volume holds dataset tiny@v1, the job asks for tiny@v2" in message, message

    path = business_path(real_server, p, job_id)
    assert_valid_path(path)
    assert_never_queued_once_running(path)

    # The podFailurePolicy failed the Job at once: one Pod, no retry used.
    attempts = get(real_server, p, job_id, "/attempts")["items"]
    assert len(attempts) == 1, attempts
    assert attempts[0]["exit_code"] == 86
    assert attempts[0]["termination_message"] == message

    def job_failed() -> Any:
        k8s: Any = real_kube.get(Job, f"kt-{job_id}", namespace=p)
        return next((c for c in k8s.status.conditions or [] if c.type == "Failed"), None)

    failed = eventually(job_failed, 30, what="the Job's Failed condition")
    assert failed.reason == "PodFailurePolicy", failed

    # No credential anywhere: the Pod's output, what kubetrain says, the CLI.
    token = kubectl(
        real_testbed,
        "get",
        "secret",
        "-n",
        p,
        f"kt-{job_id}-status",
        "-o",
        "jsonpath={.data.token}",
    )
    outputs = [
        kubectl(real_testbed, "logs", "-n", p, attempts[0]["pod"]),
        message,
        str(get(real_server, p, job_id)),
        str(get(real_server, p, job_id, "/history")),
        real_server.cli("get", "job", job_id, "--project", p).stdout,
    ]
    credentials = [secret, base64.b64decode(token).decode()]
    for output in outputs:
        for credential in credentials:
            assert credential not in output
    assert "training on the wrong data" not in outputs[0]
