"""A node-local dataset cache: each file fetched onto local disk once, atomically, within a cap.

    cache = DatasetCache(os.environ["KUBETRAIN_CACHE_DIR"], max_bytes=cache_size)
    path = cache.fetch("train/00001.tar", Path("/data/train/00001.tar"))

The cap is the job's cache size, which the manifest also sets as the cache
emptyDir's sizeLimit: the kubelet evicts a Pod whose emptyDir grows beyond it,
so the cache stays under it, in-flight fetches included. A fetch first
reserves its size (a staging file whose name carries it), evicting the least
recently used files until entries plus reservations fit, then copies into the
staging file and renames it into place. The bookkeeping is the directory
itself, under an flock, so threads and processes (one per GPU) share one cache.

    ROOT/.lock                          flock'ed while accounting
    ROOT/.staging/<pid>-<id>-<bytes>    a reservation, then the file being fetched
    ROOT/files/<key>                    entries; mtime = last use (the LRU clock)
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from kubetrain.runtime.errors import CacheError

COPY_CHUNK = 4 << 20


class DatasetCache:
    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self._files = self.root / "files"
        self._staging = self.root / ".staging"
        self._files.mkdir(parents=True, exist_ok=True)
        self._staging.mkdir(exist_ok=True)

    def fetch(self, key: str, source: str | os.PathLike[str]) -> Path:
        """The local copy of `source` under `key`, copied on first use."""
        source = Path(source)

        def copy(out: BinaryIO) -> None:
            with source.open("rb") as src:
                shutil.copyfileobj(src, out, COPY_CHUNK)

        try:
            size = source.stat().st_size
        except OSError as exc:
            raise CacheError(f"cannot fetch {key}: {source}: {exc.strerror}") from None
        return self.fetch_with(key, size, copy)

    def fetch_with(self, key: str, size: int, write: Callable[[BinaryIO], None]) -> Path:
        """The local file under `key`; on a miss, `write` fills it with exactly `size` bytes."""
        target = self._files / _safe_key(key)
        if _touch(target):
            return target
        if size > self.max_bytes:
            raise CacheError(
                f"cannot cache {key}: {size} bytes is more than the cache's {self.max_bytes}"
            )
        with self._locked():
            if _touch(target):
                return target
            self._make_room(size)
            staging = self._staging / f"{os.getpid()}-{uuid.uuid4().hex[:12]}-{size}"
            staging.touch()
        try:
            with staging.open("wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            written = staging.stat().st_size
            if written != size:
                raise CacheError(f"cannot cache {key}: {written} bytes written, {size} announced")
            with self._locked():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging, target)
        finally:
            staging.unlink(missing_ok=True)
        return target

    def used_bytes(self) -> int:
        """Entries plus reservations: what the cache holds or has promised on disk."""
        with self._locked():
            return sum(size for _, size, _ in self._entries()) + self._reserved()

    # internals -------------------------------------------------------------

    def _make_room(self, size: int) -> None:
        entries = sorted(self._entries(), key=lambda e: e[2])  # least recently used first
        used = sum(s for _, s, _ in entries) + self._reserved()
        for path, entry_size, _ in entries:
            if used + size <= self.max_bytes:
                break
            path.unlink(missing_ok=True)
            used -= entry_size
        if used + size > self.max_bytes:
            raise CacheError(
                f"cannot cache {size} bytes: fetches in flight hold the rest of the "
                f"{self.max_bytes}-byte cache"
            )

    def _entries(self) -> Iterator[tuple[Path, int, float]]:
        for directory, _, names in os.walk(self._files):
            for name in names:
                path = Path(directory, name)
                try:
                    info = path.stat()
                except FileNotFoundError:
                    continue
                yield path, info.st_size, info.st_mtime

    def _reserved(self) -> int:
        total = 0
        for entry in self._staging.iterdir():
            pid, _, size = entry.name.split("-", 2)
            if not _alive(int(pid)):  # a fetch killed mid-way
                entry.unlink(missing_ok=True)
                continue
            try:
                total += max(int(size), entry.stat().st_size)
            except FileNotFoundError:  # renamed into place meanwhile
                continue
        return total

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with (self.root / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _safe_key(key: str) -> str:
    pure = PurePosixPath(key)
    if not key or pure.is_absolute() or ".." in pure.parts or "\\" in key:
        raise CacheError(f"cache key {key!r} must be a relative path without '..'")
    return pure.as_posix()


def _touch(path: Path) -> bool:
    """Marks a cached file used now; False when it is not cached."""
    try:
        now = time.time()
        os.utime(path, (now, now))
    except FileNotFoundError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
