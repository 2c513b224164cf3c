"""StateFile: the CRC-32 it assembles is zlib's over the file, however torch.save wrote it."""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from kubetrain.runtime.checkpoint_stream import DIRECT_MIN, StateFile, crc32_combine

pytestmark = pytest.mark.runtime


def _mixed_state() -> dict[str, object]:
    """Large tensors (written unhashed), small ones (gathered), empty, views, other dtypes."""
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


@pytest.fixture
def torch_crc_off() -> Iterator[None]:
    torch.serialization.set_crc32_options(False)
    yield
    torch.serialization.set_crc32_options(True)


def _save(path: Path, state: object, *, trust: bool) -> tuple[StateFile, int]:
    writer = StateFile(path, trust_records=trust)
    torch.save(state, writer)
    return writer, writer.finish()


def test_crc32_combine_agrees_with_zlib():
    rng = random.Random(7)  # noqa: S311 - test data, not secrets
    for _ in range(200):
        a = rng.randbytes(rng.choice([0, 1, 5, 1000, rng.randrange(1 << 16)]))
        b = rng.randbytes(rng.choice([0, 1, 3, 4096, rng.randrange(1 << 16)]))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    zeros = bytes(50 << 20)  # a length with many bits set in x^(8n)
    assert crc32_combine(zlib.crc32(b"head"), zlib.crc32(zeros), len(zeros)) == zlib.crc32(
        b"head" + zeros
    )


def test_the_crc_of_a_torch_save_comes_from_its_records_without_reading_back(tmp_path):
    path = tmp_path / "state.pt"
    writer, crc = _save(path, _mixed_state(), trust=True)
    data = path.read_bytes()
    assert crc == zlib.crc32(data)
    assert writer.size == len(data)
    assert writer.read_back == 0  # every large write was a record torch checksummed
    loaded = torch.load(path, weights_only=True)
    assert torch.equal(loaded["big_view"], _mixed_state()["big_view"])


def test_with_torch_crc_off_the_tensors_are_checksummed_here(tmp_path, torch_crc_off):
    trusted, trusted_crc = _save(tmp_path / "trusted.pt", _mixed_state(), trust=True)
    hashed, hashed_crc = _save(tmp_path / "hashed.pt", _mixed_state(), trust=False)
    # Told to trust, but the records' CRCs are 0: read back, still right.
    assert trusted_crc == zlib.crc32((tmp_path / "trusted.pt").read_bytes())
    assert trusted.read_back > 0
    assert hashed_crc == zlib.crc32((tmp_path / "hashed.pt").read_bytes())
    assert hashed.read_back == 0


def test_large_writes_that_are_no_zip_record_are_read_back(tmp_path):
    path = tmp_path / "blob"
    writer = StateFile(path, trust_records=True)
    body = random.Random(3).randbytes(3 * DIRECT_MIN)  # noqa: S311 - test data
    writer.write(b"header")
    writer.write(body)
    writer.write(b"tail")
    assert writer.finish() == zlib.crc32(b"header" + body + b"tail")
    assert writer.read_back == len(body)
