"""The typed client against the testbed's API server: the connections a dispatch round
opens (its creates at once) are kept for the next round, not closed and opened again
with a TLS handshake each; and its transport against a server that closes a kept
connection: the connection is not used again."""

from __future__ import annotations

import asyncio
import os
import ssl
from urllib.parse import urlsplit

import httpx2 as httpx
import pytest
from lightkube.resources.core_v1 import Namespace

from kubetrain.cluster.client import KEEP_ALIVE, _KeptTransport, load_config, typed_client
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


def test_a_kept_connection_the_server_closed_is_not_used_again() -> None:
    """The pool asks an idle connection whether it is readable (the server closed it)
    before sending on it; the transport answers that from the socket it keeps."""

    async def run() -> int:
        connections = 0
        closed = asyncio.Event()

        async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            connections += 1
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            writer.close()  # a kept connection closed, as an idle timeout closes it
            await writer.wait_closed()
            closed.set()

        server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        limits = httpx.Limits(max_keepalive_connections=KEEP_ALIVE)
        transport = _KeptTransport(ssl.create_default_context(), limits)
        async with server, httpx.AsyncClient(transport=transport) as http:
            assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
            await closed.wait()
            assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
        return connections

    assert asyncio.run(run()) == 2
