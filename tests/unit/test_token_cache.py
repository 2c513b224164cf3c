"""The memory of verified tokens: what it keeps, for how long, and how much."""

from __future__ import annotations

import pytest

from kubetrain.api.token_cache import VerifiedTokens

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_entry_lives_for_the_ttl_from_its_lookup_and_no_longer() -> None:
    clock = Clock()
    tokens: VerifiedTokens[str] = VerifiedTokens(5.0, clock=clock)
    tokens.put("h", "alice")
    clock.now = 4.999
    assert tokens.get("h") == "alice"  # a hit does not extend it
    clock.now = 5.0
    assert tokens.get("h") is None
    assert len(tokens) == 0  # the expired entry is gone, not kept
    tokens.put("h", "alice")  # looked up again: a new TTL from now
    clock.now = 9.9
    assert tokens.get("h") == "alice"


def test_it_holds_at_most_size_entries_dropping_the_oldest_first() -> None:
    tokens: VerifiedTokens[int] = VerifiedTokens(60.0, size=3, clock=Clock())
    for n in range(3):
        tokens.put(f"h{n}", n)
    tokens.put("h0", 0)  # verified again: now the newest
    tokens.put("h3", 3)
    assert len(tokens) == 3
    assert tokens.get("h1") is None
    assert [tokens.get(f"h{n}") for n in (0, 2, 3)] == [0, 2, 3]


def test_a_ttl_of_zero_remembers_nothing() -> None:
    tokens: VerifiedTokens[str] = VerifiedTokens(0.0, clock=Clock())
    tokens.put("h", "alice")
    assert tokens.get("h") is None
    assert len(tokens) == 0


@pytest.mark.parametrize(("ttl", "size"), [(-1.0, 10), (5.0, 0)])
def test_a_negative_ttl_or_an_empty_size_is_refused(ttl: float, size: int) -> None:
    with pytest.raises(ValueError, match="ttl must be"):
        VerifiedTokens(ttl, size=size)
