"""The file a checkpoint's state is written through: checksummed as written, durable, one pass.

Where a 1 GiB save went before (bench/checkpoint.py): torch.save itself, of
which half is the CRC-32 torch computes of every record of its zip archive
(miniz's, ~3.5 GB/s here, in torch's thread), then sha256 of every byte in the
same thread, then an fsync that waited for the whole gigabyte to reach the
disk. Now:

* **One checksum, zlib's, beside the write.** `save_state` runs torch's own
  serialisation with its record CRCs off (they are for unzip tools: torch.load
  does not check them) and `StateFile` computes the CRC-32 of the file, which
  is what the manifest records and verification computes. A tensor's bytes
  arrive in one large write: their CRC is computed on a second thread while
  this one hands the same bytes to the kernel (zlib releases the GIL; ~6 GB/s
  here), and both are done before the write returns, so nothing reads memory
  torch may free afterwards. Small writes (pickle, zip headers, small tensors)
  are gathered and checksummed inline.
* **Writeback starts while torch is still writing.** Every `WRITEBACK_EVERY`
  bytes, `posix_fadvise(DONTNEED)` starts the kernel's asynchronous writeback
  of what was written so far, so the final fsync waits for the tail, not for
  the whole file (without it the dirty pages sit in memory until the fsync).
  The call runs on a thread of its own: starting writeback is work done in
  the caller (ext4 allocates the delayed blocks and builds the requests
  there), ~0.2 s per GiB that would otherwise be added to torch's own thread.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import queue
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, cast

# Writes this large are a tensor's bytes, written as they are: copying them
# into a buffer costs as much as writing them.
DIRECT_MIN = 1 << 20
# Small writes (pickle, zip headers, small tensors) go to the kernel in chunks this size.
GATHER = 8 << 20
# How much is written before its writeback is started: large enough that the
# fadvise calls cost nothing, small enough that the disk starts early.
WRITEBACK_EVERY = 32 << 20


class StateFile(io.RawIOBase):
    """A new file that counts, checksums (CRC-32) and fsyncs what is written to it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._crc = 0
        self._pending = bytearray()
        self._written = 0  # bytes handed to the kernel
        self._writeback_from = 0
        self._checksummer = ThreadPoolExecutor(1, thread_name_prefix="kubetrain-crc32")
        self._writeback: _Writeback | None = (
            _Writeback(self._fd) if hasattr(os, "posix_fadvise") else None
        )

    @property
    def size(self) -> int:
        return self._written + len(self._pending)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        with memoryview(data) as view, view.cast("B") as flat:
            if len(flat) >= DIRECT_MIN:
                self._flush_pending()
                crc = self._checksummer.submit(zlib.crc32, flat, self._crc)
                try:
                    self._out(flat)
                finally:
                    self._crc = crc.result()  # `data` is the caller's again once we return
            else:
                self._pending += flat
                if len(self._pending) >= GATHER:
                    self._flush_pending()
            return len(flat)

    def finish(self) -> int:
        """Writes what is left, fsyncs and closes; returns the file's CRC-32."""
        self._flush_pending()
        self._stop_threads()
        os.fsync(self._fd)
        self.close()
        return self._crc

    def close(self) -> None:
        if not self.closed and hasattr(self, "_writeback"):  # not when os.open failed
            self._stop_threads()
            os.close(self._fd)
        super().close()

    def _stop_threads(self) -> None:
        self._checksummer.shutdown()
        if self._writeback is not None:
            self._writeback.stop()
            self._writeback = None

    def _flush_pending(self) -> None:
        if self._pending:
            with memoryview(self._pending) as view:
                self._crc = zlib.crc32(view, self._crc)
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


def save_state(state: Any, out: StateFile) -> bool:
    """torch.save of `state` into `out`, without torch's CRC-32 of each record where this
    torch allows it (the file's CRC-32 is computed by `out`); returns whether it did.

    torch offers that only as a process-wide option (`set_crc32_options`), which
    would also reach other threads' torch.save; its own writer takes it per
    file, so this builds one, as torch.save does. Private names: on a torch
    where they differ, this is plain torch.save (correct, slower)."""
    import torch
    import torch.serialization as serialization

    save = getattr(serialization, "_save", None)
    alignment = getattr(serialization, "_get_storage_alignment", None)
    if save is None or alignment is None or not _takes(save, _SAVE_PARAMETERS):
        torch.save(state, cast(IO[bytes], out))
        return False
    try:
        writer = torch._C.PyTorchFileWriter(
            cast(IO[bytes], out), compute_crc32=False, storage_alignment=alignment()
        )
    except TypeError:  # another constructor: nothing was written yet
        torch.save(state, cast(IO[bytes], out))
        return False
    save(state, writer, pickle, serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()
    return True


_SAVE_PARAMETERS = (
    "obj",
    "zip_file",
    "pickle_module",
    "pickle_protocol",
    "_disable_byteorder_record",
)


def _takes(function: Any, names: tuple[str, ...]) -> bool:
    try:
        return tuple(inspect.signature(function).parameters) == names
    except (TypeError, ValueError):
        return False
