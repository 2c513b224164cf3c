"""The gpu tier: kubetrain.runtime on a real NVIDIA GPU, with the state in GPU memory.

Run by name on a machine with one (`pytest -m gpu`); `make test` leaves the tier
out, since CI has no GPU, and on a machine without one it fails, never skips.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kubetrain.runtime.checkpoint import CheckpointManager
from kubetrain.runtime.contract import PREFLIGHT_EXIT_CODE
from tests.runtime import tiny_training
from tests.runtime.conftest import base_env, kubetrain
from tests.runtime.test_kill_resume import kill_and_resume

pytestmark = [pytest.mark.runtime, pytest.mark.gpu]


@pytest.fixture(autouse=True)
def _cuda() -> None:
    assert torch.cuda.is_available(), "the gpu tier needs a CUDA GPU (it fails, never skips)"


def _losses(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("resumed")]


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_a_cuda_run_resumed_from_its_checkpoint_continues_bit_for_bit(tmp_path, blocking):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    whole.mkdir()
    halves.mkdir()
    tiny_training.train(whole, whole / "losses", steps=24, blocking=blocking, device="cuda")
    tiny_training.train(halves, halves / "losses", steps=12, blocking=blocking, device="cuda")
    # The dropout masks come from CUDA's generator: its state is in the checkpoint.
    state = torch.load(halves / "step-000000000012" / "state.pt", weights_only=True)
    assert len(state["rng"]["cuda"]) == torch.cuda.device_count()
    assert state["model"]["0.weight"].device.type == "cpu"  # saved from host memory
    tiny_training.train(halves, halves / "losses", steps=24, blocking=blocking, device="cuda")
    assert _losses(halves / "losses") == _losses(whole / "losses")
    a = torch.load(whole / "final.pt", weights_only=True)
    b = torch.load(halves / "final.pt", weights_only=True)
    assert all(b[k].is_cuda and torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_saves_of_gpu_state_refill_pinned_buffers_and_hold_the_state_of_their_call(
    tmp_path, blocking
):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8)).cuda()
    manager = CheckpointManager(tmp_path)
    pointers = []
    for step in (1, 2, 3):  # the later saves refill the pinned buffers of the first
        before = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        manager.save(step, model=model, blocking=blocking)
        weights = [b for place, b in manager._staging.items() if place[0] == "model"]
        assert weights
        assert all(b.is_pinned() for b in weights)  # the RNG states are host tensors already
        pointers.append({b.data_ptr() for b in manager._staging.values()})
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)  # training goes on, on the GPU, while the thread writes
        manager.wait()
        saved = torch.load(tmp_path / f"step-{step:012d}" / "state.pt", weights_only=True)
        assert all(torch.equal(saved["model"][k], v) for k, v in before.items())
    manager.close()
    assert pointers[0] == pointers[1] == pointers[2]


@pytest.mark.timeout(600)
def test_kills_mid_save_on_cuda_then_the_same_final_weights(tmp_path, volume):
    kill_and_resume(tmp_path, volume, kills=10, device="cuda")


def _preflight(tmp_path: Path, **env: str) -> tuple[int, dict[str, Any]]:
    log = str(tmp_path / "termination-log")
    done = kubetrain("run", "--preflight", env=base_env(KUBETRAIN_TERMINATION_LOG=log, **env))
    return done.returncode, json.loads(done.stdout)


def test_preflight_counts_the_gpus_from_every_source_within_two_seconds(tmp_path):
    count = torch.cuda.device_count()
    code, report = _preflight(tmp_path, KUBETRAIN_EXPECTED_GPUS=str(count))
    assert code == 0, report
    check = next(c for c in report["checks"] if c["name"] == "gpu-visible")
    assert check["status"] == "passed"
    for source in ("/dev/nvidia*", "nvidia-smi -L", "cuDeviceGetCount"):
        assert f"{source}: {count}" in check["detail"], check["detail"]
    assert check["seconds"] < 2.0


@pytest.mark.parametrize(
    ("env", "found"),
    [
        ({}, "found {count} "),  # one GPU more than the node gives
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, "found 0 "),  # the runtime hid them
        ({"CUDA_VISIBLE_DEVICES": ""}, "found 0 "),  # the process may use none
    ],
    ids=["too-many-expected", "runtime-hid-them", "cuda-visible-empty"],
)
def test_preflight_fails_when_the_container_sees_fewer_gpus_than_expected(tmp_path, env, found):
    count = torch.cuda.device_count()
    expected = count + 1 if not env else count
    code, report = _preflight(tmp_path, KUBETRAIN_EXPECTED_GPUS=str(expected), **env)
    assert code == PREFLIGHT_EXIT_CODE
    assert report["failedCheck"] == "gpu-visible"
    check = next(c for c in report["checks"] if c["name"] == "gpu-visible")
    assert f"expected {expected} GPU" in check["detail"]
    assert found.format(count=count) in check["detail"], check["detail"]
    line = (tmp_path / "termination-log").read_text()
    assert line.startswith(f"preflight failed: gpu-visible: expected {expected} GPU")
