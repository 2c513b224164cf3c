"""The leader's renew deadline bounds each renewal: a stalled request cannot keep it acting."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from kubetrain.cluster.leader import LeaderElector

pytestmark = pytest.mark.unit


class StallingClient:
    """A Lease store whose requests hang forever once `stall` is set (a connection
    that stopped forwarding, with the client's own timeout far away)."""

    def __init__(self) -> None:
        self.lease: Lease | None = None
        self.version = 0
        self.stall = asyncio.Event()
        self.renewals: list[float] = []  # when each successful write began

    async def _maybe_hang(self) -> None:
        if self.stall.is_set():
            await asyncio.Event().wait()

    async def get(self, _kind: Any, name: str, namespace: str) -> Lease:
        began = time.monotonic()
        await self._maybe_hang()
        assert self.lease is not None
        self._began = began
        return Lease(metadata=self.lease.metadata, spec=self.lease.spec)

    async def create(self, lease: Lease) -> Lease:
        self.renewals.append(time.monotonic())
        return self._store(lease)

    async def replace(self, lease: Lease) -> Lease:
        await self._maybe_hang()
        self.renewals.append(self._began)
        return self._store(lease)

    def _store(self, lease: Lease) -> Lease:
        self.version += 1
        meta = lease.metadata or ObjectMeta()
        self.lease = Lease(
            metadata=ObjectMeta(
                name=meta.name, namespace=meta.namespace, resourceVersion=str(self.version)
            ),
            spec=lease.spec or LeaseSpec(),
        )
        return self.lease

    async def watch(self, *_args: Any, **_kwargs: Any) -> AsyncIterator[tuple[str, Lease]]:
        await asyncio.Event().wait()
        yield "", Lease()  # never reached


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def test_a_stalled_renewal_stops_the_leader_by_the_renew_deadline() -> None:
    async def scenario() -> tuple[list[float], float]:
        client = StallingClient()
        # A first get answers 404 by ApiError in real life; here the Lease exists, ours.
        client.lease = Lease(
            metadata=ObjectMeta(name="l", namespace="ns", resourceVersion="0"),
            spec=LeaseSpec(holderIdentity="a", leaseDurationSeconds=2),
        )
        elector = LeaderElector(
            client,  # a stand-in for lightkube.AsyncClient
            identity="a",
            name="l",
            namespace="ns",
            lease_duration=2.0,
            renew_deadline=0.8,
            retry_period=0.1,
            release_on_cancel=False,
        )
        acting: list[float] = []

        async def work() -> None:
            while True:
                acting.append(time.monotonic())
                await asyncio.sleep(0.01)

        runner = asyncio.create_task(elector.run(work))
        await asyncio.wait_for(elector.leading.wait(), 2)
        await asyncio.wait_for(_until(lambda: len(client.renewals) >= 2), 5)  # a renewal held
        client.stall.set()
        stalled = time.monotonic()
        # Every request now hangs: the leader must stop on its own.
        await asyncio.wait_for(_until(lambda: not elector.leading.is_set()), 5)
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return [a for a in acting if a >= stalled], client.renewals[-1]

    after_stall, last_renewal = asyncio.run(scenario())
    assert after_stall, "the leader acted after the stall began"
    # It acted no later than the renew deadline after the last renewal began, long
    # before the Lease (2 s from that renewal's write) lets a standby take over.
    assert max(after_stall) <= last_renewal + 0.8 + 0.05
