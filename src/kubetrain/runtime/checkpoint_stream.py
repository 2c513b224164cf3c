"""The file object torch.save writes a checkpoint through: durable, checksummed, one pass.

Where a 1 GiB save went before (bench/checkpoint.py): torch.save itself
(serialising is nearly free; it computes the CRC-32 of every record of its zip
archive, ~0.3 s, and copies the bytes into the page cache), then sha256 of
every byte in the same thread (~0.9 s), then an fsync that waited for the
whole gigabyte to reach the disk. Now:

* **No second pass over the tensors.** A tensor's bytes arrive in one write
  (a zip record), and torch has already put their CRC-32 in the archive's
  central directory. Those writes go straight to the kernel, unhashed; the
  other writes (pickle, zip headers, small tensors) are gathered and
  CRC-32'd here. Once torch is done, each large write is matched to its
  record (data offset from the local header, size, stored uncompressed) and
  the whole file's CRC-32 is assembled from the pieces' (`crc32_combine`).
  A write that matches no record, or torch's CRC turned off
  (`torch.serialization.set_crc32_options(False)`), is checksummed here: the
  result is always `zlib.crc32` of the file, which is what verification
  computes (`checkpoint_files.verify`): a mistake here, or bytes changed
  between torch's CRC and the disk, gets a checkpoint refused, never a
  damaged one accepted.
* **Writeback starts while torch is still writing.** Every `WRITEBACK_EVERY`
  bytes, `posix_fadvise(DONTNEED)` starts the kernel's asynchronous writeback
  of what was written so far, so the final fsync waits for the tail, not for
  the whole file (without it the dirty pages sit in memory until the fsync).
  The call runs on a thread of its own: starting writeback is work done in
  the caller (ext4 allocates the delayed blocks and builds the requests
  there), ~0.2 s per GiB that would otherwise be added to torch's own thread.
"""

from __future__ import annotations

import functools
import io
import os
import queue
import struct
import threading
import zipfile
import zlib
from pathlib import Path
from typing import Any

# Writes this large are a tensor's bytes, written as they are: copying them
# into a buffer costs as much as writing them.
DIRECT_MIN = 1 << 20
# Small writes (pickle, zip headers, small tensors) go to the kernel in chunks this size.
GATHER = 8 << 20
# How much is written before its writeback is started: large enough that the
# fadvise calls cost nothing, small enough that the disk starts early.
WRITEBACK_EVERY = 32 << 20
READ_CHUNK = 8 << 20

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile.structFileHeader
_LOCAL_MAGIC = b"PK\x03\x04"
_POLY = 0xEDB88320  # CRC-32 (zlib, zip), reflected


class StateFile(io.RawIOBase):
    """A new file that counts, checksums (CRC-32) and fsyncs what torch.save writes.

    `trust_records`: take the CRC-32 of large writes from the zip archive torch
    writes (torch.save computes them) instead of computing it again."""

    def __init__(self, path: Path, *, trust_records: bool) -> None:
        super().__init__()
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._trust = trust_records
        self._pending = bytearray()
        self._written = 0  # bytes handed to the kernel
        self._writeback_from = 0
        self._writeback: _Writeback | None = (
            _Writeback(self._fd) if hasattr(os, "posix_fadvise") else None
        )
        # (offset, length, crc32): the file, in order; crc None: the zip record's CRC
        self._pieces: list[tuple[int, int, int | None]] = []
        self.read_back = 0  # bytes whose CRC-32 had to be read back from the file (tests, bench)

    @property
    def size(self) -> int:
        return self._written + len(self._pending)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        with memoryview(data) as view, view.cast("B") as flat:
            if len(flat) >= DIRECT_MIN:
                self._flush_pending()
                crc = None if self._trust else zlib.crc32(flat)
                self._pieces.append((self._written, len(flat), crc))
                self._out(flat)
            else:
                self._pending += flat
                if len(self._pending) >= GATHER:
                    self._flush_pending()
            return len(flat)

    def finish(self) -> int:
        """Writes what is left, fsyncs and closes; returns the file's CRC-32."""
        self._flush_pending()
        crc = 0
        records = self._records() if any(c is None for _, _, c in self._pieces) else {}
        for offset, length, known in self._pieces:
            piece = known
            if piece is None:
                record = records.get(offset)
                piece = record[1] if record is not None and record[0] == length else None
            if piece is None:  # not a record torch checksummed: read it back
                piece = self._crc_of_range(offset, length)
            crc = crc32_combine(crc, piece, length)
        self._stop_writeback()
        os.fsync(self._fd)
        self.close()
        return crc

    def close(self) -> None:
        if not self.closed and hasattr(self, "_writeback"):  # not when os.open failed
            self._stop_writeback()
            os.close(self._fd)
        super().close()

    def _stop_writeback(self) -> None:
        if self._writeback is not None:
            self._writeback.stop()
            self._writeback = None

    def _flush_pending(self) -> None:
        if self._pending:
            with memoryview(self._pending) as view:
                self._pieces.append((self._written, len(view), zlib.crc32(view)))
                self._out(view)
            self._pending.clear()

    def _out(self, view: memoryview) -> None:
        for start in range(0, len(view), WRITEBACK_EVERY):
            with view[start : start + WRITEBACK_EVERY] as piece:
                done = 0
                while done < len(piece):
                    done += os.write(self._fd, piece[done:])
                self._written += done
            if self._written - self._writeback_from >= WRITEBACK_EVERY:
                self._start_writeback()

    def _start_writeback(self) -> None:
        if self._writeback is not None:
            self._writeback.start(self._writeback_from, self._written - self._writeback_from)
        self._writeback_from = self._written

    def _records(self) -> dict[int, tuple[int, int]]:
        """Data offset → (size, CRC-32) of every stored record of the zip archive written.

        Empty when the file is not a readable zip archive: every piece is then read back."""
        found: dict[int, tuple[int, int]] = {}
        try:
            with self.path.open("rb") as handle, zipfile.ZipFile(handle) as archive:
                for info in archive.infolist():
                    if info.compress_type != zipfile.ZIP_STORED or info.file_size == 0:
                        continue
                    header = os.pread(self._fd, _LOCAL_HEADER.size, info.header_offset)
                    if len(header) != _LOCAL_HEADER.size:
                        continue
                    fields = _LOCAL_HEADER.unpack(header)
                    if fields[0] != _LOCAL_MAGIC:
                        continue
                    data = info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]
                    # CRC 0 is what torch writes with its CRC turned off: not to be trusted.
                    if info.CRC != 0:
                        found[data] = (info.file_size, info.CRC)
        except (zipfile.BadZipFile, OSError, ValueError):
            return {}
        return found

    def _crc_of_range(self, offset: int, length: int) -> int:
        self.read_back += length
        crc = 0
        end = offset + length
        while offset < end:
            chunk = os.pread(self._fd, min(READ_CHUNK, end - offset), offset)
            if not chunk:
                raise OSError(f"{self.path}: short read at {offset}")
            crc = zlib.crc32(chunk, crc)
            offset += len(chunk)
        return crc


class _Writeback:
    """A thread that starts the kernel's writeback of the ranges it is given.

    Linux starts writeback of the dirty pages in a range (without waiting for
    it) and drops only pages already clean: the data stays, the disk starts.
    Advice only: where it is refused, the final fsync does it all."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._ranges: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="kubetrain-writeback", daemon=True)
        self._thread.start()

    def start(self, offset: int, length: int) -> None:
        self._ranges.put((offset, length))

    def stop(self) -> None:
        """Returns once every range given has been advised (the fd may then be closed)."""
        self._ranges.put(None)
        self._thread.join()

    def _run(self) -> None:
        advise = True
        while (item := self._ranges.get()) is not None:
            if advise:
                try:
                    os.posix_fadvise(self._fd, item[0], item[1], os.POSIX_FADV_DONTNEED)
                except OSError:
                    advise = False


def torch_computes_record_crcs() -> bool:
    """Whether torch.save computes the CRC-32 of its records (it may be turned off)."""
    import torch.serialization

    get = getattr(torch.serialization, "get_crc32_options", None)
    return True if get is None else bool(get())  # before the option, always


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A+B from crc32(A), crc32(B) and len(B): zlib's crc32_combine."""
    return _multmodp(_x8nmodp(length2), crc1) ^ crc2


def _multmodp(a: int, b: int) -> int:
    """a(x) * b(x) modulo the CRC-32 polynomial, bits reflected (zlib's multmodp); a != 0."""
    m = 1 << 31
    product = 0
    while True:
        if a & m:
            product ^= b
            if a & (m - 1) == 0:
                return product
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    p = 1 << 30  # x^1
    table = [p]
    for _ in range(31):
        p = _multmodp(p, p)
        table.append(p)
    return tuple(table)


_X2N = _x2n_table()  # x^(2^k) mod p


@functools.lru_cache(maxsize=4096)  # tensors come in a few sizes
def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial: appending n zero bytes to a CRC."""
    p = 1 << 31  # x^0
    k = 3
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return p
