"""`kubetrain serve`'s C allocator: glibc's malloc capped at two arenas at start-up."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import pytest

from kubetrain.cli import _allocator, serve

pytestmark = pytest.mark.unit

glibc = pytest.mark.skipif(_allocator._glibc() is None, reason="glibc's malloc only")


class _Libc:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []

    def mallopt(self, *args: int) -> int:
        self.calls.append(("mallopt", args))
        return 1


def test_the_arenas_are_capped_unless_the_operator_set_malloc_arena_max() -> None:
    libc = _Libc()
    assert _allocator.limit_arenas({}, libc)
    assert libc.calls == [("mallopt", (_allocator.M_ARENA_MAX, _allocator.ARENAS))]
    libc.calls.clear()
    assert not _allocator.limit_arenas({"MALLOC_ARENA_MAX": "4"}, libc)
    assert libc.calls == []


# Threads that allocate at once, each from malloc (bytearrays over pymalloc's 512 bytes),
# then the number of arenas malloc_info counts.
_THREADS = """
import ctypes, json, os, re, sys, tempfile, threading
from kubetrain.cli import _allocator
if sys.argv[1] == "capped":
    _allocator.limit_arenas({})
barrier = threading.Barrier(6)
kept = []
def work():
    barrier.wait()
    kept.append([bytearray(4096) for _ in range(200)])
    barrier.wait()
threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
path = os.path.join(tempfile.mkdtemp(), "info.xml")
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, f)
libc.fclose(f)
print(json.dumps(len(re.findall(r'<heap nr="', open(path).read()))))
"""


def _arenas(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", _THREADS, mode], capture_output=True, text=True, check=True, env=env
    )
    return int(json.loads(done.stdout))


@glibc
def test_capped_six_threads_allocating_at_once_share_two_arenas() -> None:
    assert _arenas("capped") <= _allocator.ARENAS
    assert _arenas("uncapped") > _allocator.ARENAS  # what the cap changes


def test_serve_caps_the_arenas_before_anything_else(monkeypatch: pytest.MonkeyPatch) -> None:
    class Capped(Exception):
        pass

    def limit_arenas(*_: Any) -> bool:
        raise Capped

    monkeypatch.setattr(_allocator, "limit_arenas", limit_arenas)
    with pytest.raises(Capped):
        serve._serve(argparse.Namespace())
