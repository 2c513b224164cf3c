"""CheckpointManager on real files, real torch on CPU: validity, fallback, binding, retention."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from kubetrain.runtime import checkpoint_files
from kubetrain.runtime.checkpoint import CheckpointError, CheckpointManager, IncompatibleCheckpoint
from tests.runtime import tiny_training

pytestmark = pytest.mark.runtime

BINDING = tiny_training.BINDING


def _saved(root: Path, steps: list[int], **kwargs) -> CheckpointManager:
    model, optimizer, scheduler = tiny_training.build()
    manager = CheckpointManager(root, binding=BINDING, **kwargs)
    for step in steps:
        model[0].bias.data.fill_(step)  # each checkpoint tells which step it holds
        manager.save(step, model=model, optimizer=optimizer, scheduler=scheduler)
    return manager


def _resumed_bias(root: Path, **kwargs) -> tuple[int | None, float]:
    model, optimizer, scheduler = tiny_training.build()
    manager = CheckpointManager(root, binding=kwargs.pop("binding", BINDING))
    step = manager.resume(model=model, optimizer=optimizer, scheduler=scheduler, **kwargs)
    return step, float(model[0].bias[0].detach())


def test_resume_from_nothing_returns_none(tmp_path):
    assert CheckpointManager(tmp_path).latest_valid() is None
    assert _resumed_bias(tmp_path)[0] is None


def test_the_manifest_lists_sizes_checksums_binding_and_pod(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBETRAIN_POD_NAME", "job-abc-0-x7")
    _saved(tmp_path, [5])
    latest = CheckpointManager(tmp_path).latest_valid()
    assert latest == tmp_path / "step-000000000005"
    manifest = json.loads((latest / "MANIFEST.json").read_text())
    assert manifest["pod"] == "job-abc-0-x7"
    assert manifest["format"] == 2
    data = (latest / "state.pt").read_bytes()
    assert manifest["files"]["state.pt"] == {
        "size": len(data),
        "algorithm": "crc32",
        "checksum": f"{zlib.crc32(data):08x}",
    }
    assert manifest["binding"]["dataset_version"] == "v1"
    assert len(manifest["binding"]["params_sha256"]) == 64


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped", "no-manifest", "bad-manifest"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, damage):
    _saved(tmp_path, [4, 8])
    newest = tmp_path / "step-000000000008"
    state = newest / "state.pt"
    if damage == "truncated":
        state.write_bytes(state.read_bytes()[:-100])
    elif damage == "bit-flipped":
        raw = bytearray(state.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        state.write_bytes(bytes(raw))
    elif damage == "no-manifest":
        (newest / "MANIFEST.json").unlink()
    else:
        (newest / "MANIFEST.json").write_text("{")
    assert CheckpointManager(tmp_path).latest_valid() == tmp_path / "step-000000000004"
    assert _resumed_bias(tmp_path) == (4, 4.0)


def test_a_binding_mismatch_is_refused_unless_allowed_and_then_recorded(tmp_path):
    _saved(tmp_path, [3])
    other = {**BINDING, "dataset_version": "v2", "params": {"lr": 0.02}}
    with pytest.raises(IncompatibleCheckpoint, match="dataset_version 'v1' \\(this run: 'v2'\\)"):
        _resumed_bias(tmp_path, binding=other)
    model, optimizer, scheduler = tiny_training.build()
    manager = CheckpointManager(tmp_path, binding=other)
    allowed = ["dataset_version", "params_sha256"]
    assert manager.resume(model=model, optimizer=optimizer, allow_mismatch=allowed) == 3
    manager.save(6, model=model, optimizer=optimizer, scheduler=scheduler)
    manifest = json.loads((tmp_path / "step-000000000006" / "MANIFEST.json").read_text())
    assert manifest["resumedFrom"]["fromStep"] == 3
    assert manifest["resumedFrom"]["allowedMismatch"] == allowed


def test_retention_keeps_the_last_n_and_never_the_only_valid_one(tmp_path):
    _saved(tmp_path, [1, 2, 3, 4, 5], keep_last=2)
    assert [f.step for f in checkpoint_files.scan(tmp_path)] == [5, 4]
    # Corrupt both; the next save is then the only valid one and the rest is swept.
    for step in (4, 5):
        (tmp_path / checkpoint_files.step_dir_name(step) / "MANIFEST.json").unlink()
    _saved(tmp_path, [6], keep_last=2)
    found = checkpoint_files.scan(tmp_path)
    assert [(f.step, f.problem) for f in found] == [(6, None)]


def test_what_retention_drops_is_gone_once_the_manager_closes(tmp_path):
    manager = _saved(tmp_path, [1, 2, 3], keep_last=1)
    manager.close()  # the deletions run in a thread; close waits for them
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_files.step_dir_name(3)]


def test_a_save_returns_before_what_retention_drops_is_deleted(tmp_path, monkeypatch):
    # Unlinking a 1 GiB checkpoint costs a save ~0.25 s: the deletion must run beside it.
    release, real_rmtree = threading.Event(), shutil.rmtree

    def held_rmtree(path, *args, **kwargs):
        if "deleted-" in Path(path).name and not release.wait(10):
            raise AssertionError("the deletion of a dropped checkpoint was waited for")
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", held_rmtree)
    manager = _saved(tmp_path, [1, 2], keep_last=1)  # returns while step 1 is being deleted
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-1] == checkpoint_files.step_dir_name(2)
    assert [n for n in names[:-1] if "deleted-" in n], names  # set aside, not yet gone
    assert manager.latest_valid() == tmp_path / checkpoint_files.step_dir_name(2)
    release.set()
    manager.close()
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_files.step_dir_name(2)]


def test_a_staging_directory_left_by_a_kill_is_swept_and_never_read(tmp_path):
    _saved(tmp_path, [2])
    staging = tmp_path / ".staging-step-000000000004-deadbeef"
    staging.mkdir()
    (staging / "state.pt").write_bytes(b"partial")
    assert CheckpointManager(tmp_path).latest_valid() == tmp_path / "step-000000000002"
    assert not staging.exists()


def test_a_failed_async_save_surfaces_on_the_next_call(tmp_path):
    model, optimizer, _ = tiny_training.build()
    manager = CheckpointManager(tmp_path / "ckpt")
    manager.save(1, model=model, blocking=False)
    manager.wait()
    # The background writer cannot stage: the root is gone.
    (tmp_path / "ckpt" / "step-000000000001" / "state.pt").unlink()
    for entry in (tmp_path / "ckpt").iterdir():
        for child in entry.iterdir():
            child.unlink()
        entry.rmdir()
    (tmp_path / "ckpt").rmdir()
    manager.save(2, model=model, optimizer=optimizer, blocking=False)
    with pytest.raises(CheckpointError, match="a background checkpoint save failed"):
        manager.save(3, model=model, blocking=False)
    manager.close()


def test_async_save_writes_the_state_as_it_was_when_save_returned(tmp_path):
    model, _, _ = tiny_training.build()
    manager = CheckpointManager(tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    manager.save(1, model=model, blocking=False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)  # training goes on while the thread writes
    manager.close()
    saved = torch.load(tmp_path / "step-000000000001" / "state.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], v) for k, v in before.items())


def test_a_resumed_run_continues_bit_for_bit(tmp_path):
    whole, halves = tmp_path / "whole", tmp_path / "halves"
    whole.mkdir()
    halves.mkdir()
    tiny_training.train(whole, whole / "losses", steps=24)
    tiny_training.train(halves, halves / "losses", steps=12)
    tiny_training.train(halves, halves / "losses", steps=24)
    expected = [line for line in (whole / "losses").read_text().splitlines()[1:]]
    got = [line for line in (halves / "losses").read_text().splitlines() if "resumed" not in line]
    assert got == expected
    a = torch.load(whole / "final.pt", weights_only=True)
    b = torch.load(halves / "final.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _big_model_saved(root: Path, steps: list[int]) -> torch.nn.Module:
    """A model whose weight (2 MiB) torch.save writes in one piece, which the save never hashes."""
    model = torch.nn.Linear(1024, 512)
    manager = CheckpointManager(root)
    for step in steps:
        with torch.no_grad():
            model.weight.fill_(step)
        manager.save(step, model=model, blocking=step % 2 == 0)
    manager.close()
    return model


def test_a_bit_flipped_in_a_tensor_written_unhashed_is_still_refused(tmp_path):
    _big_model_saved(tmp_path, [1, 2])
    state = tmp_path / "step-000000000002" / "state.pt"
    with zipfile.ZipFile(state) as archive:
        weight = max(archive.infolist(), key=lambda info: info.file_size)
    assert weight.file_size == 1024 * 512 * 4
    raw = bytearray(state.read_bytes())
    raw[weight.header_offset + 4096 + weight.file_size // 2] ^= 0x10
    state.write_bytes(bytes(raw))
    assert CheckpointManager(tmp_path).latest_valid() == tmp_path / "step-000000000001"
    model = torch.nn.Linear(1024, 512)
    assert CheckpointManager(tmp_path).resume(model=model) == 1
    assert float(model.weight.detach()[0, 0]) == 1.0


def test_format_1_checkpoints_with_sha256_are_still_read_and_verified(tmp_path):
    """What the runtime wrote before format 2: {"size", "sha256"} per file."""
    _saved(tmp_path, [3, 6])
    for step in (3, 6):
        path = tmp_path / checkpoint_files.step_dir_name(step)
        manifest = json.loads((path / "MANIFEST.json").read_text())
        data = (path / "state.pt").read_bytes()
        manifest["format"] = 1
        manifest["files"] = {
            "state.pt": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        }
        (path / "MANIFEST.json").write_text(json.dumps(manifest))
    assert CheckpointManager(tmp_path).latest_valid() == tmp_path / "step-000000000006"
    newest = tmp_path / "step-000000000006" / "state.pt"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    newest.write_bytes(bytes(raw))
    found = checkpoint_files.scan(tmp_path, checksums=True)
    assert [(f.step, f.problem) for f in found] == [
        (6, "state.pt does not match its sha256"),
        (3, None),
    ]
    assert _resumed_bias(tmp_path) == (3, 3.0)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"algorithm": "md4", "checksum": "00"}, "manifest entry 'state.pt' has no known checksum"),
        ({"algorithm": "crc32"}, "manifest entry 'state.pt' has no known checksum"),
        ({"format": 3}, "manifest is not format 1 or 2"),
    ],
)
def test_a_manifest_without_a_known_checksum_is_refused(tmp_path, entry, problem):
    _saved(tmp_path, [2])
    path = tmp_path / "step-000000000002"
    manifest = json.loads((path / "MANIFEST.json").read_text())
    if "format" in entry:
        manifest["format"] = entry["format"]
    else:
        manifest["files"]["state.pt"] = {"size": manifest["files"]["state.pt"]["size"], **entry}
    (path / "MANIFEST.json").write_text(json.dumps(manifest))
    assert [(f.step, f.problem) for f in checkpoint_files.scan(tmp_path)] == [(2, problem)]


def test_async_saves_refill_the_same_host_buffers_and_each_keeps_its_own_state(tmp_path):
    model, optimizer, _ = tiny_training.build()
    manager = CheckpointManager(tmp_path, keep_last=3)
    weights: list[dict[str, torch.Tensor]] = []
    pointers: list[set[int]] = []
    for step in (1, 2, 3):
        weights.append({k: v.clone() for k, v in model.state_dict().items()})
        manager.save(step, model=model, optimizer=optimizer, blocking=False)
        pointers.append({buffer.data_ptr() for buffer in manager._staging.values()})
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
    manager.close()
    assert pointers[0]
    assert pointers[0] == pointers[1] == pointers[2]  # no new allocation
    for step, expected in zip((1, 2, 3), weights, strict=True):
        saved = torch.load(tmp_path / f"step-{step:012d}" / "state.pt", weights_only=True)
        assert all(torch.equal(saved["model"][k], v) for k, v in expected.items())


def test_an_async_save_of_a_changed_shape_gets_a_new_buffer(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, model=torch.nn.Linear(4, 2), blocking=False)
    manager.wait()
    manager.save(2, model=torch.nn.Linear(8, 2), blocking=False)
    manager.close()
    saved = torch.load(tmp_path / "step-000000000002" / "state.pt", weights_only=True)
    assert saved["model"]["weight"].shape == (2, 8)


def test_a_blocking_save_of_a_cpu_state_copies_nothing_and_keeps_the_async_buffers(tmp_path):
    model, optimizer, _ = tiny_training.build()
    manager = CheckpointManager(tmp_path)
    manager.save(1, model=model, optimizer=optimizer, blocking=False)
    manager.wait()
    held = {buffer.data_ptr() for buffer in manager._staging.values()}
    manager.save(2, model=model, optimizer=optimizer)
    assert {buffer.data_ptr() for buffer in manager._staging.values()} == held
    manager.close()


def test_a_checkpoint_of_another_world_size_is_refused_even_when_mismatches_are_allowed(
    tmp_path,
):
    """A gang's checkpoint (here: its manifest) is one shard per rank: no single process
    may take it up, whatever it allows."""
    _saved(tmp_path, [2])
    path = tmp_path / "step-000000000002" / "MANIFEST.json"
    manifest = json.loads(path.read_text())
    assert "world_size" not in manifest["binding"]  # a single process's: as before gangs
    manifest["binding"]["world_size"] = 2
    path.write_text(json.dumps(manifest))
    everything = ["dataset_version", "code_version", "params_sha256"]
    with pytest.raises(IncompatibleCheckpoint, match="saved by 2 ranks, this run has 1 process"):
        _resumed_bias(tmp_path, allow_mismatch=everything)


def test_distributed_true_without_torch_distributed_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"distributed=True needs torch\.distributed initialised"):
        CheckpointManager(tmp_path, distributed=True)
