"""A backlog of jobs to create goes first: the syncer's rounds wait for the dispatcher
to be through it, for a bounded time. Without a database or a cluster: the rounds'
and the backlog's own signals (the flow that sets them is tested on the testbed, in
tests/testbed/test_dispatcher.py)."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest

from kubetrain.cluster.cache import ClusterCache
from kubetrain.cluster.client import ClusterConfig, HttpClient, TypedClient
from kubetrain.control import runner
from kubetrain.control.dispatcher import Dispatcher
from kubetrain.control.runner import ControlLoops
from kubetrain.control.syncer import Syncer
from kubetrain.store.db import Database

pytestmark = pytest.mark.unit


def dispatcher() -> Dispatcher:
    return Dispatcher(cast(Database, None), cast(TypedClient, None), http=cast(HttpClient, None))


def test_no_backlog_lets_a_round_go_at_once():
    async def run() -> None:
        # A bound of an hour: returning at all says it did not wait.
        await asyncio.wait_for(dispatcher().backlog_through(3600), 5)

    asyncio.run(run())


def test_a_backlog_holds_a_round_until_it_is_through():
    async def run() -> list[str]:
        seen: list[str] = []
        subject = dispatcher()
        subject.caught_up.clear()  # a flow's last claim was full

        async def round_() -> None:
            await subject.backlog_through(3600)
            seen.append("round")

        waiting = asyncio.ensure_future(round_())
        for _ in range(5):  # the loop turns; the round stays held
            await asyncio.sleep(0)
        seen.append("through")
        subject.caught_up.set()
        await asyncio.wait_for(waiting, 5)
        return seen

    assert asyncio.run(run()) == ["through", "round"]


def test_a_backlog_holds_a_round_no_longer_than_its_bound():
    async def run() -> float:
        subject = dispatcher()
        subject.caught_up.clear()  # and never through
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(subject.backlog_through(0.05), 5)
        return loop.time() - began

    assert 0.04 <= asyncio.run(run()) < 5


def test_the_syncer_waits_for_what_goes_first_before_each_round(monkeypatch):
    async def run() -> list[str]:
        seen: list[str] = []
        gate = asyncio.Event()

        async def first() -> None:
            seen.append("waits")
            await gate.wait()

        syncer = Syncer(cast(Database, None), ClusterCache(http=None), yield_to=first)

        async def sync_batch(batch: dict[str, float]) -> list[str]:
            seen.append(f"round of {sorted(batch)}")
            gate.clear()  # the next round waits again
            return []

        monkeypatch.setattr(syncer, "sync_batch", sync_batch)
        work = asyncio.ensure_future(syncer._work())
        syncer.mark("a")
        for _ in range(5):
            await asyncio.sleep(0)
        seen.append("let go")
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0)
        syncer.mark("b")
        for _ in range(5):
            await asyncio.sleep(0)
        work.cancel()
        return seen

    assert asyncio.run(run()) == ["waits", "let go", "round of ['a']", "waits"]


def test_the_control_loops_put_the_dispatchers_backlog_first(monkeypatch):
    monkeypatch.setattr(runner, "BACKLOG_FIRST", 0.05)

    async def run() -> tuple[bool, float]:
        loops = ControlLoops(db=cast(Database, None), config=cast(ClusterConfig, None))
        _, syncer, dispatcher = loops._term(
            cast(HttpClient, None), cast(TypedClient, None), cast(HttpClient, None)
        )
        dispatcher.caught_up.clear()  # a backlog, never through
        assert syncer.yield_to is not None
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(syncer.yield_to(), 5)
        return syncer.yield_to == loops._dispatch_first, loop.time() - began

    wired, waited = asyncio.run(run())
    assert wired
    assert 0.04 <= waited < 5  # it waited for the term's own dispatcher, to the bound
