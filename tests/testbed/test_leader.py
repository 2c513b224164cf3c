"""Leader election on a real Lease: one leader at a time, takeover after it dies."""

from __future__ import annotations

import asyncio
import time

import pytest

from kubetrain.cluster.client import load_config, typed_client
from kubetrain.cluster.leader import LeaderElector
from kubetrain.testbed.cluster import Testbed

pytestmark = pytest.mark.testbed


def test_one_leader_and_takeover_within_the_lease(testbed: Testbed, namespace: str):
    async def scenario() -> float:
        config = load_config(testbed.kubeconfig)
        acting: list[str] = []
        overlap: list[bool] = []

        def elector(identity: str) -> LeaderElector:
            return LeaderElector(
                typed_client(config),
                identity=identity,
                namespace=namespace,
                lease_duration=4,
                renew_deadline=3,
                retry_period=0.5,
                # Cancelling stands for SIGKILL here: nothing is handed over.
                release_on_cancel=False,
            )

        def work(identity: str):
            async def loop() -> None:
                acting.append(identity)
                try:
                    while True:
                        overlap.append(len(set(acting)) > 1)
                        await asyncio.sleep(0.1)
                finally:
                    acting.remove(identity)

            return loop

        a, b = elector("replica-a"), elector("replica-b")
        task_a = asyncio.create_task(a.run(work("replica-a")))
        await asyncio.wait_for(a.leading.wait(), 10)
        task_b = asyncio.create_task(b.run(work("replica-b")))
        await asyncio.sleep(3)  # b keeps trying while a renews
        assert acting == ["replica-a"]
        assert not b.leading.is_set()
        # a dies without releasing the Lease (as a SIGKILL would leave it).
        task_a.cancel()
        await asyncio.gather(task_a, return_exceptions=True)
        died = time.monotonic()
        await asyncio.wait_for(b.leading.wait(), 15)
        takeover = time.monotonic() - died
        await asyncio.sleep(0.3)
        assert acting == ["replica-b"]
        assert not any(overlap)
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)
        return takeover

    takeover = asyncio.run(scenario())
    # b must wait for the Lease to expire (4 s, judged by its own clock, from when its
    # watch saw a's last renewal, at most one retry period before a died) and wakes
    # then, not at its next poll.
    assert 3.5 <= takeover <= 4 + 0.5


def test_a_replica_that_shuts_down_hands_the_lease_over_at_once(testbed: Testbed, namespace: str):
    async def scenario() -> float:
        config = load_config(testbed.kubeconfig)

        def elector(identity: str) -> LeaderElector:
            return LeaderElector(
                typed_client(config),
                identity=identity,
                namespace=namespace,
                lease_duration=15,
                renew_deadline=10,
                retry_period=0.5,
            )

        async def idle() -> None:
            await asyncio.sleep(3600)

        a, b = elector("replica-a"), elector("replica-b")
        task_a = asyncio.create_task(a.run(idle))
        await asyncio.wait_for(a.leading.wait(), 10)
        task_b = asyncio.create_task(b.run(idle))
        await asyncio.sleep(1)
        task_a.cancel()  # a graceful shutdown (SIGTERM) cancels the loops
        await asyncio.gather(task_a, return_exceptions=True)
        stopped = time.monotonic()
        await asyncio.wait_for(b.leading.wait(), 10)
        takeover = time.monotonic() - stopped
        task_b.cancel()
        await asyncio.gather(task_b, return_exceptions=True)
        return takeover

    # Far inside the 15 s the Lease would otherwise have to expire.
    assert asyncio.run(scenario()) < 5
