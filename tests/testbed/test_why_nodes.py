"""`kubetrain why NAME --kubeconfig` and `kubetrain nodes` against real Jobs on the testbed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from kubetrain.cli.main import main
from kubetrain.testbed.cluster import Testbed
from tests.fixtures.record import SCENARIOS, manifest
from tests.kube import create, eventually

pytestmark = pytest.mark.testbed

FATE = "testbed.kubetrain.io/fate"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def job(scenario: str, **changes: Any) -> dict[str, Any]:
    base = next(s for s in SCENARIOS if s.name == scenario)
    made = manifest(base)
    if changes.get("name"):
        made["metadata"]["name"] = changes["name"]
    if changes.get("annotations"):
        made["spec"]["template"]["metadata"]["annotations"] = changes["annotations"]
    return made


def pods_of(kube: Client, namespace: str, name: str) -> list[Any]:
    return list(kube.list(Pod, namespace=namespace, labels={"job-name": name}))


def unschedulable(kube: Client, namespace: str, name: str) -> bool:
    return any(
        c.type == "PodScheduled" and c.reason == "Unschedulable"
        for p in pods_of(kube, namespace, name)
        for c in (p.status and p.status.conditions) or []
    )


def running(kube: Client, namespace: str, name: str) -> Any:
    return next(
        (p for p in pods_of(kube, namespace, name) if p.status and p.status.phase == "Running"),
        None,
    )


def test_why_direct_says_16_gpus_never_fit(
    testbed: Testbed, kube: Client, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create(kube, job("insufficient-gpu"), namespace)
    eventually(lambda: unschedulable(kube, namespace, "kt-insufficient-gpu"), 60, what="verdict")
    argv = ["why", "kt-insufficient-gpu", "--kubeconfig", str(testbed.kubeconfig), "-n", namespace]
    code, out, err = cli(capsys, *argv, "-o", "json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["business_status"], data["reason"], data["waitable"]) == (
        "QUEUED",
        "INSUFFICIENT_GPU",
        False,
    )
    assert data["raw_reason"] == "Unschedulable"
    assert "the largest node has 8" in data["explanation"]
    assert {n["name"] for n in data["nodes"]} >= {"gpu-h100-0", "gpu-h100-1"}

    code, out, err = cli(capsys, *argv)
    assert (code, err) == (0, "")
    assert "QUEUED · INSUFFICIENT_GPU · waiting will not help" in out
    assert "[!!] scheduler" in out
    assert "  Nodes (" in out


def test_why_direct_says_the_gpu_taint_is_not_tolerated(
    testbed: Testbed, kube: Client, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    create(kube, job("untolerated-taint"), namespace)
    eventually(lambda: unschedulable(kube, namespace, "kt-untolerated-taint"), 60, what="verdict")
    code, out, err = cli(
        capsys,
        "why",
        "kt-untolerated-taint",
        "--kubeconfig",
        str(testbed.kubeconfig),
        "-n",
        namespace,
        "-o",
        "json",
    )
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert (data["reason"], data["waitable"], data["actor"]) == ("UNTOLERATED_TAINT", False, "user")
    assert any("nvidia.com/gpu=present:NoSchedule" in " ".join(n["why"]) for n in data["nodes"])


def test_why_direct_names_a_missing_job_in_one_line(
    testbed: Testbed, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        capsys, "why", "kt-nothing", "--kubeconfig", str(testbed.kubeconfig), "-n", namespace
    )
    assert (code, out) == (1, "")
    assert err.startswith("kubetrain: error: no Kubernetes Job 'kt-nothing'")
    assert len(err.strip().splitlines()) == 1


def test_nodes_shows_allocatable_requested_and_where_a_waiting_job_fits(
    testbed: Testbed, kube: Client, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A running Pod that holds a whole GPU node (8 GPUs) until deleted.
    holder = job("gpu-busy", name="kt-holder8", annotations={FATE: "hang"})
    container = holder["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["requests"]["nvidia.com/gpu"] = "8"
    container["resources"]["limits"]["nvidia.com/gpu"] = "8"
    create(kube, holder, namespace)
    create(kube, job("insufficient-gpu"), namespace)
    pod = eventually(lambda: running(kube, namespace, "kt-holder8"), 60, what="the 8-GPU Pod")
    eventually(lambda: unschedulable(kube, namespace, "kt-insufficient-gpu"), 60, what="verdict")
    node = pod.spec.nodeName

    code, out, err = cli(capsys, "nodes", "--kubeconfig", str(testbed.kubeconfig), "-o", "json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    rows = {n["name"]: n for n in data["nodes"]}
    gpu_nodes = [n for n in rows.values() if n["gpu_resource"] == "nvidia.com/gpu"]
    assert len(gpu_nodes) == 2
    for row in gpu_nodes:
        assert (row["gpu"]["capacity"], row["gpu"]["allocatable"]) == ("8", "8")
        assert row["accelerator"] == "nvidia-h100"
        assert row["conditions"]["Ready"] == "True"
        assert "nvidia.com/gpu=present:NoSchedule" in row["taints"]
    assert (rows[node]["gpu"]["requested"], rows[node]["gpu"]["free"]) == ("8", "0")
    ours = [p for p in data["pending"] if p["namespace"] == namespace]
    waiting = [p for p in ours if p["job"] == "kt-insufficient-gpu"]
    assert len(waiting) == 1
    assert (waiting[0]["fits_now"], waiting[0]["fits_later"]) == ([], [])
    assert "the largest node has 8" in waiting[0]["verdict"]
    assert not [p for p in ours if p["job"] == "kt-holder8"]

    code, out, err = cli(capsys, "nodes", "--kubeconfig", str(testbed.kubeconfig))
    assert (code, err) == (0, "")
    line = next(ln for ln in out.splitlines() if ln.startswith(node))
    assert "nvidia-h100" in line
    assert "8/8, 0 free" in line
    assert f"kt-insufficient-gpu (pod {namespace}/" in out
