"""The typed client against the testbed's API server: the connections a dispatch round
opens (its creates at once) are kept for the next round, not closed and opened again
with a TLS handshake each."""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

import pytest
from lightkube.resources.core_v1 import Namespace

from kubetrain.cluster.client import load_config, typed_client
from kubetrain.testbed.cluster import Testbed

pytestmark = pytest.mark.testbed

ROUND = 50  # `Dispatcher.dispatch_once`'s batch: its creates are sent at once
HTTPX_KEEPS = 20  # httpx's own limit of connections kept open between requests


def established_to(port: int) -> set[int]:
    """The local ports of this process's established TCP connections to `port`."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            next(lines)  # the header
            for line in lines:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
                if state == "01" and inode in inodes and int(remote.rsplit(":", 1)[1], 16) == port:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def test_a_rounds_connections_are_kept_for_the_next_round(testbed: Testbed) -> None:
    port = urlsplit(testbed.server).port
    assert port is not None
    client = typed_client(load_config(testbed.kubeconfig))

    async def round_of_requests() -> set[int]:
        await asyncio.gather(*(client.get(Namespace, "default") for _ in range(ROUND)))
        return established_to(port)

    async def run() -> tuple[set[int], set[int], set[int]]:
        before = established_to(port)
        try:
            return before, await round_of_requests(), await round_of_requests()
        finally:
            await client.close()

    before, first, second = asyncio.run(run())
    opened = first - before
    assert len(opened) > HTTPX_KEEPS, f"only {len(opened)} connections kept after a round"
    # The second round went over the first's connections: none opened again.
    assert not (second - first), f"{len(second - first)} connections opened again"
