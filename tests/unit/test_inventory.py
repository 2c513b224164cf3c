"""domain/inventory (the `kubetrain nodes` table) on recorded testbed dumps, and its text."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kubetrain.cli.nodes import render
from kubetrain.domain.inventory import Inventory, inventory
from kubetrain.domain.snapshot import Snapshot
from tests.unit.diagnosis_helpers import dump

pytestmark = pytest.mark.unit


def of(name: str) -> Inventory:
    return inventory(Snapshot.from_list(dump(name)))


def test_gpu_nodes_show_capacity_allocatable_requested_and_free() -> None:
    found = of("gpu-busy")  # two other-team Pods hold 8 GPUs each
    rows = {n.name: n for n in found.nodes}
    assert sorted(rows) == ["cpu-0", "cpu-1", "gpu-h100-0", "gpu-h100-1"]
    for name in ("gpu-h100-0", "gpu-h100-1"):
        row = rows[name]
        assert row.accelerator == "nvidia-h100"
        assert row.gpu_resource == "nvidia.com/gpu"
        assert (row.gpu.capacity, row.gpu.allocatable, row.gpu.requested, row.gpu.free) == (
            Decimal(8),
            Decimal(8),
            Decimal(8),
            Decimal(0),
        )
        assert row.cpu.allocatable == Decimal(96)
        assert row.taints == ("nvidia.com/gpu=present:NoSchedule",)
        assert dict(row.conditions) == {
            "Ready": "True",
            "DiskPressure": "False",
            "MemoryPressure": "False",
        }
        assert (row.cordoned, row.pods) == (False, 1)
    assert rows["cpu-0"].gpu_resource is None
    assert rows["cpu-0"].gpu.to_json() == {
        "capacity": "0",
        "allocatable": "0",
        "requested": "0",
        "free": "0",
    }


def test_a_pending_job_that_fits_once_gpus_free_up() -> None:
    [pending] = of("gpu-busy").pending
    assert pending.job == "kt-gpu-busy"
    assert pending.requests == "4 nvidia.com/gpu, 2 cpu, 8Gi memory"
    assert pending.fits_now == ()
    assert pending.fits_later == ("gpu-h100-0", "gpu-h100-1")
    assert "once running work there finishes" in pending.verdict
    assert "nvidia.com/gpu 8/8 used, needs 4" in pending.verdict


def test_a_pending_job_too_big_for_any_node() -> None:
    [pending] = of("insufficient-gpu").pending
    assert (pending.fits_now, pending.fits_later) == ((), ())
    assert pending.verdict == (
        "fits on no node as it is: needs 16 nvidia.com/gpu on one node; the largest node has 8"
    )


def test_a_pending_job_kept_out_by_a_taint_and_by_a_cordon() -> None:
    [tainted] = of("untolerated-taint").pending
    assert "taint nvidia.com/gpu=present:NoSchedule not tolerated" in tainted.verdict
    cordoned = of("cordoned")
    assert all(n.cordoned for n in cordoned.nodes if n.gpu_resource)
    [pending] = cordoned.pending
    assert "cordoned" in pending.verdict


def test_finished_and_running_jobs_are_not_pending() -> None:
    assert of("succeeded").pending == ()
    running = of("running")
    assert running.pending == ()
    assert sum(n.gpu.requested for n in running.nodes) == Decimal(8)


def test_the_text_view_reads_in_plain_words() -> None:
    out = render(of("gpu-busy"))
    assert out.startswith("4 nodes; 0 of 16 GPUs free on nodes that take new Pods.")
    header, *rows = out.splitlines()[2:7]
    assert header.split()[:3] == ["NODE", "ACCELERATOR", "GPUS"]
    gpu = next(r for r in rows if r.startswith("gpu-h100-0"))
    for shown in ("nvidia-h100", "8/8, 0 free", "ready"):
        assert shown in gpu
    assert "Waiting to be placed (1):" in out
    assert "kt-gpu-busy (pod " in out
    cordoned = render(of("cordoned"))
    assert "cordoned (no new Pods)" in cordoned
    assert "No kubetrain job is waiting" in render(of("succeeded"))


def test_nodes_that_cannot_be_read_are_named_not_raised() -> None:
    data = dump("gpu-busy")
    for item in data["items"]:
        if item["kind"] == "Node" and item["metadata"]["name"] == "gpu-h100-0":
            item["status"]["capacity"]["nvidia.com/gpu"] = "lots"
            item["status"]["allocatable"] = "garbage"
    found = inventory(Snapshot.from_list(data))
    assert any("lots" in p for p in found.problems)
    assert "Could not read:" in render(found)
    assert inventory(Snapshot.from_list({"apiVersion": "v1", "kind": "List", "items": []})) == (
        Inventory(nodes=(), pending=(), problems=())
    )
    assert render(Inventory(nodes=(), pending=())).startswith("The cluster has no nodes.")
