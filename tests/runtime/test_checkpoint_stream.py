"""StateFile and save_state: the CRC-32 is zlib's over the file, however torch.save wrote it."""

from __future__ import annotations

import random
import zipfile
import zlib
from pathlib import Path

import pytest
import torch
import torch.serialization

from kubetrain.runtime import checkpoint_stream
from kubetrain.runtime.checkpoint_stream import DIRECT_MIN, StateFile, save_state

pytestmark = pytest.mark.runtime


def _mixed_state() -> dict[str, object]:
    """Large tensors (checksummed beside the write), small ones (gathered), empty, views."""
    generator = torch.Generator().manual_seed(1)
    big = torch.randn(1024, 700, generator=generator)  # 2.7 MiB: one direct write
    return {
        "big": big,
        "big_view": big[:, ::2],  # saves the whole storage
        "exactly_direct": torch.ones(DIRECT_MIN // 4),
        "just_below": torch.ones(DIRECT_MIN // 4 - 1),
        "bf16": torch.randn(600, 1000, generator=generator).to(torch.bfloat16),
        "int": torch.arange(300_000),
        "empty": torch.zeros(0),
        "small": [torch.tensor([1.0, 2.0]), {"n": 3, "s": "x"}],
    }


def _save(path: Path, state: object) -> tuple[StateFile, int, bool]:
    writer = StateFile(path)
    without_torch_crc = save_state(state, writer)
    return writer, writer.finish(), without_torch_crc


def _assert_loads_back(path: Path) -> None:
    loaded = torch.load(path, weights_only=True)
    for key, value in _mixed_state().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(loaded[key], value), key
    assert loaded["small"][1] == {"n": 3, "s": "x"}


def test_save_state_checksums_the_file_itself_and_torch_does_not(tmp_path):
    path = tmp_path / "state.pt"
    writer, crc, without_torch_crc = _save(path, _mixed_state())
    data = path.read_bytes()
    assert crc == zlib.crc32(data)
    assert writer.size == len(data)
    # This torch's private writer is used: torch computed no CRC of its own (a
    # torch whose names changed makes this fail, not the saves silently slower).
    assert without_torch_crc
    with zipfile.ZipFile(path) as archive:
        assert all(info.CRC == 0 for info in archive.infolist() if info.file_size)
    _assert_loads_back(path)


def test_on_a_torch_whose_private_save_differs_it_is_torch_save(tmp_path, monkeypatch):
    # As if this torch's _save took other parameters than the ones save_state passes.
    monkeypatch.setattr(checkpoint_stream, "_SAVE_PARAMETERS", ("obj", "zip_file"))
    path = tmp_path / "state.pt"
    _, crc, without_torch_crc = _save(path, _mixed_state())
    assert not without_torch_crc
    assert crc == zlib.crc32(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None  # torch.save's own record CRCs, all right
    _assert_loads_back(path)


def test_a_large_write_is_checksummed_before_it_returns(tmp_path):
    """The caller may reuse or free its buffer once write returns (torch frees the
    host copy of a GPU tensor): the checksum must already have been taken."""
    path = tmp_path / "blob"
    writer = StateFile(path)
    body = bytearray(random.Random(3).randbytes(3 * DIRECT_MIN))  # noqa: S311 - test data
    original = bytes(body)
    writer.write(b"header")
    writer.write(body)
    body[:] = bytes(len(body))  # the caller's buffer, reused
    writer.write(b"tail")
    assert writer.finish() == zlib.crc32(b"header" + original + b"tail")
    assert path.read_bytes() == b"header" + original + b"tail"
