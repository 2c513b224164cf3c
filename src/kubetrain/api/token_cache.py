"""A short-lived, bounded memory of verified API tokens, so most requests skip the lookup.

Checking a bearer token is a read transaction on every request (about a fifth
of a submission's cost, measured in bench/submit.py). A token that was found
live is remembered here, under its SHA-256 (never the plaintext), for `ttl`
seconds from that lookup; then the next request looks it up again (and
records `last_used_at` if due).

What it costs: a revocation written elsewhere (`kubetrain token revoke`, which
writes the database directly, or another replica) takes effect within `ttl`,
not at once: a token revoked just after a request was verified keeps working
on that replica for at most `ttl` seconds. Tokens never change otherwise (the
role and scope are fixed at creation), so nothing else goes stale. Unknown or
revoked tokens are never remembered: a new token works at once, and a wrong
one costs a lookup every time. `ttl=0` turns the memory off.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

DEFAULT_TTL_S = 5.0  # a revocation is felt within seconds; a busy client hits ~all the time
DEFAULT_SIZE = 1024  # tokens in use at once per replica; beyond, the oldest go first

V = TypeVar("V")


class VerifiedTokens(Generic[V]):
    """token hash -> what its lookup found (the caller), for `ttl` seconds; thread-safe."""

    def __init__(
        self,
        ttl: float = DEFAULT_TTL_S,
        *,
        size: int = DEFAULT_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl < 0 or size < 1:
            raise ValueError(f"ttl must be >= 0 and size >= 1, not {ttl} and {size}")
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, token_hash: str) -> V | None:
        """The remembered value, or None when there is none or it is `ttl` old."""
        with self._lock:
            entry = self._entries.get(token_hash)
            if entry is None:
                return None
            expires, value = entry
            if self.clock() >= expires:
                del self._entries[token_hash]
                return None
            return value

    def put(self, token_hash: str, value: V) -> None:
        """Remember a token just found live; the oldest entry goes when full."""
        if self.ttl == 0:
            return
        with self._lock:
            self._entries[token_hash] = (self.clock() + self.ttl, value)
            self._entries.move_to_end(token_hash)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
