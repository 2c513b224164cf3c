"""The C allocator of a long-running `kubetrain serve`: glibc's malloc at two arenas.

glibc's malloc gives each thread that contends for memory an arena of its own,
up to 8 per core; the server's threads (the API's thread pool, the control
loops' database work) each take one, and what is freed in one arena is reused
only by the threads that allocate from it. The server held 13-14 arenas and
their free chunks; with two, the scale bench's server ran 4-11 MB smaller
(docs/benchmarks.md, "Memory per job: what the RSS slope was").

So `kubetrain serve` caps the arenas at start-up, before it makes any thread
(an arena made already stays). An operator's own MALLOC_ARENA_MAX wins; other
C libraries than glibc are left alone.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Mapping
from typing import Any

M_ARENA_MAX = -8  # mallopt's parameter (glibc's malloc.h)
ARENAS = 2


@functools.cache
def _glibc() -> Any | None:
    """The process's own C library if it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc's own symbol: musl's mallopt is a stub
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(environ: Mapping[str, str] = os.environ, libc: Any | None = None) -> bool:
    """Cap glibc's malloc at ARENAS arenas unless MALLOC_ARENA_MAX says otherwise.

    To be called before the process makes threads. True if the cap was set.
    """
    if "MALLOC_ARENA_MAX" in environ:
        return False  # glibc read the operator's own setting at start-up
    libc = libc if libc is not None else _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, ARENAS))
