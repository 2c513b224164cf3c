"""DatasetCache on a real directory: fetched once, atomically, LRU-evicted, under its cap."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import threading
from pathlib import Path

import pytest

from kubetrain.runtime.cache import DatasetCache
from kubetrain.runtime.errors import CacheError

pytestmark = pytest.mark.runtime

KIB = 1024


def _sources(root: Path, count: int, size: int) -> list[Path]:
    root.mkdir()
    paths = []
    for index in range(count):
        path = root / f"shard-{index:03d}"
        path.write_bytes(bytes([index % 256]) * size)
        paths.append(path)
    return paths


def _disk_bytes(root: Path) -> int:
    """What the directory holds now, as the kubelet's emptyDir accounting would see it."""
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            try:
                total += os.stat(os.path.join(directory, name)).st_size
            except FileNotFoundError:  # evicted or renamed while we looked
                continue
    return total


def test_a_file_is_fetched_once_then_served_from_disk(tmp_path):
    (source,) = _sources(tmp_path / "src", 1, 10 * KIB)
    cache = DatasetCache(tmp_path / "cache", max_bytes=100 * KIB)
    first = cache.fetch("a/shard", source)
    source.write_bytes(b"changed")  # a hit does not read the source again
    assert cache.fetch("a/shard", source) == first
    assert first.read_bytes() == bytes([0]) * 10 * KIB


def test_least_recently_used_files_are_evicted_to_stay_under_the_cap(tmp_path):
    sources = _sources(tmp_path / "src", 4, 40 * KIB)
    cache = DatasetCache(tmp_path / "cache", max_bytes=100 * KIB)
    a = cache.fetch("0", sources[0])
    cache.fetch("1", sources[1])
    os.utime(a, (0, 0))  # 0 used longest ago
    cache.fetch("2", sources[2])
    assert not a.exists()
    assert cache.used_bytes() <= 100 * KIB


def test_bad_keys_and_oversized_files_are_refused(tmp_path):
    (source,) = _sources(tmp_path / "src", 1, 10 * KIB)
    cache = DatasetCache(tmp_path / "cache", max_bytes=5 * KIB)
    with pytest.raises(CacheError, match="more than the cache's"):
        cache.fetch("big", source)
    with pytest.raises(CacheError, match="must be a relative path"):
        cache.fetch("../escape", source)
    with pytest.raises(CacheError, match="8 bytes written, 4 announced"):
        cache.fetch_with("short", 4, lambda out: out.write(b"12345678"))
    assert _disk_bytes(tmp_path / "cache") == 0  # nothing half-written is left


def _fill(root: str, sources: list[str], cap: int) -> None:
    cache = DatasetCache(root, max_bytes=cap)
    for source in sources:
        cache.fetch(Path(source).name, source)


def test_concurrent_fills_from_threads_and_processes_stay_under_the_cap(tmp_path):
    cap = 200 * KIB
    sources = [str(p) for p in _sources(tmp_path / "src", 40, 30 * KIB)]
    root = str(tmp_path / "cache")
    DatasetCache(root, max_bytes=cap)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_fill, args=(root, sources[i::2], cap)) for i in range(2)]
    threads = [
        threading.Thread(target=_fill, args=(root, sources[::-1][i::3], cap)) for i in range(3)
    ]
    workers: list[multiprocessing.process.BaseProcess | threading.Thread] = [*processes, *threads]
    for worker in workers:
        worker.start()
    watched = []  # what the disk holds, sampled all along
    while any(p.is_alive() for p in processes) or any(t.is_alive() for t in threads):
        # Under the cache's lock (ROOT/.lock), so that a file renamed while the walk
        # goes is not counted twice.
        with (tmp_path / "cache" / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            watched.append(_disk_bytes(tmp_path / "cache"))
    for worker in workers:
        worker.join()
    assert all(p.exitcode == 0 for p in processes)
    assert len(watched) > 10
    assert max(watched) <= cap
    cache = DatasetCache(root, max_bytes=cap)
    for path in (tmp_path / "cache" / "files").iterdir():
        assert path.read_bytes() == Path(tmp_path / "src" / path.name).read_bytes()
    assert cache.used_bytes() <= cap
