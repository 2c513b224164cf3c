"""kubetrain's HTTP/1.1 client for the creates (cluster/wire.py), against a socket on
loopback that plays back the API server's answers recorded off the wire
(tests/fixtures/wire, `python -m tests.fixtures.record_wire`): how an answer is framed,
which connections are kept, and what a connection lost, a silent server or a stranger
on the port become. Against the API server itself: tests/testbed/test_create_job.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from kubetrain.cluster.errors import ClusterUnreachable, refused, wrap
from kubetrain.cluster.wire import Answer, ClosedEarly, Connections, ProtocolError

pytestmark = pytest.mark.unit

WIRE = Path(__file__).parent.parent / "fixtures" / "wire"
CREATED = (WIRE / "create-201.http").read_bytes()  # chunked
EXISTS = (WIRE / "create-409.http").read_bytes()  # a Content-Length
T = TypeVar("T")
PATH = "/apis/batch/v1/namespaces/ns/jobs?fieldManager=kubetrain"

# What the socket does with each request, by connection: an answer's bytes to send, or
# None to close the connection without one. A connection's script running out: silence.
Script = list[bytes | None]


class Peer:
    """A TCP server on loopback answering each connection's requests from its script."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.requests: list[bytes] = []  # every request head it read, on any connection
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        script = self.scripts[self.connections]
        self.connections += 1
        try:
            for step in script:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.requests.append(head)
                if step is None:
                    break
                writer.write(step)
                await writer.drain()
            else:
                await reader.read()  # silence until the client leaves
        finally:
            writer.close()


def run(
    scripts: list[Script], go: Callable[[Connections], Awaitable[T]], **kw: float
) -> tuple[T, Peer]:
    async def main() -> tuple[T, Peer]:
        peer = Peer(scripts)
        async with peer as server:
            connections = Connections(server, None, None, **kw)
            try:
                return await go(connections), peer
            finally:
                await connections.aclose()

    return asyncio.run(main())


def body_of(recorded: bytes) -> dict[str, object]:
    """The JSON document in a recorded answer, its chunks joined."""
    head, _, framed = recorded.partition(b"\r\n\r\n")
    if b"Transfer-Encoding: chunked" not in head:
        return dict(json.loads(framed))
    data, rest = b"", framed
    while (size := int(rest.split(b"\r\n", 1)[0], 16)) > 0:
        start = rest.index(b"\r\n") + 2
        data += rest[start : start + size]
        rest = rest[start + size + 2 :]
    return dict(json.loads(data))


async def both(connections: Connections) -> list[Answer]:
    return [await connections.post(PATH, b"{}"), await connections.post(PATH, b"{}")]


def test_the_recorded_answers_are_read_whole_on_one_kept_connection() -> None:
    answers, peer = run([[CREATED, EXISTS]], both)
    created, exists = answers
    assert (created.status, exists.status) == (201, 409)
    assert json.loads(created.body) == body_of(CREATED)  # the chunks, joined
    assert json.loads(created.body)["kind"] == "Job"
    assert json.loads(exists.body) == body_of(EXISTS)  # by its Content-Length
    assert peer.connections == 1
    # A 409 reads as the API server's refusal, its words kept.
    error = refused(exists)
    assert (error.code, error.reason) == (409, "AlreadyExists")
    assert "already exists" in error.message


def test_each_request_carries_the_path_the_host_and_its_length() -> None:
    _, peer = run([[EXISTS]], lambda c: c.post(PATH, b'{"a":1}'))
    [head] = peer.requests
    lines = head.split(b"\r\n")
    assert lines[0] == f"POST {PATH} HTTP/1.1".encode()
    assert b"Content-Length: 7" in lines
    assert any(line.startswith(b"Host: 127.0.0.1:") for line in lines)
    assert b"Content-Type: application/json" in lines
    assert not any(line.lower().startswith(b"authorization") for line in lines)  # none given


def test_a_kept_connection_closed_unseen_is_asked_again_on_a_new_one() -> None:
    # The server closes the kept connection as the second request arrives (its idle
    # timeout, a restart): that request is sent again, once, on a new connection.
    answers, peer = run([[CREATED, None], [EXISTS]], both)
    assert [a.status for a in answers] == [201, 409]
    assert peer.connections == 2
    assert len(peer.requests) == 3


def test_a_new_connection_closed_before_its_answer_is_not_asked_again() -> None:
    with pytest.raises(ClosedEarly) as raised:
        run([[None], [EXISTS]], lambda c: c.post(PATH, b"{}"))
    assert "closed the connection" in str(raised.value)
    assert isinstance(wrap(raised.value), ClusterUnreachable)


def test_a_server_that_does_not_answer_in_time_is_a_timeout() -> None:
    with pytest.raises(TimeoutError) as raised:
        run([[]], lambda c: c.post(PATH, b"{}"), timeout_s=0.3)
    error = wrap(raised.value)
    assert isinstance(error, ClusterUnreachable)
    assert error.message == "no answer from the API server in 0.3 s"


def test_what_is_not_http_is_a_protocol_error_and_not_kept() -> None:
    stranger = b"SSH-2.0-OpenSSH_9.2\r\n\r\n"
    with pytest.raises(ProtocolError) as raised:
        run([[stranger]], lambda c: c.post(PATH, b"{}"))
    assert isinstance(wrap(raised.value), ClusterUnreachable)


def test_an_answer_that_says_connection_close_leaves_it_closed() -> None:
    head, _, framed = EXISTS.partition(b"\r\n\r\n")
    closing = head + b"\r\nConnection: close\r\n\r\n" + framed
    answers, peer = run([[closing], [CREATED]], both)
    assert [a.status for a in answers] == [409, 201]
    assert peer.connections == 2
    assert len(peer.requests) == 2  # a new connection, not a retry


def test_a_path_that_would_break_the_request_line_is_refused() -> None:
    with pytest.raises(ValueError, match="not a request path"):
        run([[]], lambda c: c.post("/api/v1/namespaces/a b/jobs", b"{}"))
    with pytest.raises(ValueError, match="not a request path"):
        run([[]], lambda c: c.post("/x\r\nHost: elsewhere", b"{}"))
