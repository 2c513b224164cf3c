"""How many never-ending streams (`logs?follow=true`) each API token holds open.

Each follow stream is an open connection from this process through the API server to
a kubelet, for as long as the container runs: unbounded, one token could hold
thousands. The count is this process's (each replica bounds its own), kept on the
event loop's thread, where requests start and streams end, so it needs no lock.
"""

from __future__ import annotations


class StreamSlots:
    """At most `limit` streams held at once per key (an API token's id)."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def take(self, key: str, limit: int) -> bool:
        """One more stream for `key`, unless it holds `limit` already."""
        held = self._held.get(key, 0)
        if held >= limit:
            return False
        self._held[key] = held + 1
        return True

    def give_back(self, key: str) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def total(self) -> int:
        """Streams held by every key together."""
        return sum(self._held.values())
