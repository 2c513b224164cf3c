"""The client commands' HTTP (client/_http.py) against loopback stubs: what the API client
relies on — one connection kept while the server keeps it, queries written as httpx
wrote them, the base URL's path kept, streams read as they arrive with the read
timeout dropped only when asked, the environment's proxies, and failures of one line."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kubetrain.client import _http

pytestmark = pytest.mark.unit


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer: int  # the client's port: one per connection


@dataclass
class Stub:
    url: str
    seen: list[Seen] = field(default_factory=list)


Answer = Callable[[BaseHTTPRequestHandler, Seen], None]


def _json(handler: BaseHTTPRequestHandler, _: Seen, close: bool = False) -> None:
    body = b'{"ok": true}'
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    if close:
        handler.send_header("Connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)


def _serve(answer: Answer) -> Iterator[Stub]:
    seen: list[Seen] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, chunked

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            request = Seen(
                self.command,
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                self.rfile.read(length),
                self.client_address[1],
            )
            seen.append(request)
            answer(self, request)

        do_GET = do_POST = do_CONNECT = _any

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield Stub(f"http://127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def stub(no_proxy: None) -> Iterator[Stub]:
    yield from _serve(_json)


def _client(url: str, timeout: float = 5.0) -> _http.Client:
    return _http.Client(url, timeout=timeout, headers={"Authorization": "Bearer kt_x"})


def test_one_connection_serves_every_request_and_headers_and_bodies_go_out(stub: Stub) -> None:
    client = _client(stub.url + "/prefix/")
    first = client.request("GET", "/api/v1/a", params={"state": ["QUEUED", "RUNNING"], "n": 2})
    second = client.request(
        "POST", "/api/v1/b", json={"name": "ü"}, headers={"authorization": "Bearer other"}
    )
    client.close()
    assert (first.status_code, first.is_success, first.json()) == (200, True, {"ok": True})
    assert second.json() == {"ok": True}
    a, b = stub.seen
    assert a.path == "/prefix/api/v1/a?state=QUEUED&state=RUNNING&n=2"
    assert a.headers["authorization"] == "Bearer kt_x"
    assert a.peer == b.peer
    assert b.headers["authorization"] == "Bearer other"  # a request's header wins, any case
    assert b.headers["content-type"] == "application/json"
    assert b.body == '{"name":"ü"}'.encode()


def test_a_connection_the_server_closed_is_replaced(no_proxy: None) -> None:
    for stub in _serve(lambda handler, seen: _json(handler, seen, close=True)):
        client = _client(stub.url)
        for _ in range(3):
            assert client.request("GET", "/x").status_code == 200
        client.close()
        assert len({seen.peer for seen in stub.seen}) == 3


def test_queries_are_written_as_httpx_wrote_them(stub: Stub) -> None:
    client = _client(stub.url)
    client.request("GET", "/q", params={"follow": True, "tail": None, "since": "10m"})
    client.close()
    assert stub.seen[0].path == "/q?follow=true&tail=&since=10m"


def _slow_text(pause: float) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, _: Seen) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        text = "line one\nGrüße\n".encode()
        split = text.index("ü".encode()) + 1  # a character cut in two between chunks
        try:
            for piece in (text[:split], text[split:]):
                handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                handler.wfile.flush()
                time.sleep(pause)
            handler.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client that timed out has gone
            handler.close_connection = True

    return answer


def test_a_stream_arrives_piece_by_piece_and_endless_drops_only_the_read_timeout(
    no_proxy: None,
) -> None:
    for stub in _serve(_slow_text(0.3)):
        client = _client(stub.url, timeout=0.1)
        with client.stream("GET", "/logs", endless=True) as answer:
            pieces = list(answer.iter_text())
        assert "".join(pieces) == "line one\nGrüße\n"
        assert len(pieces) == 2
        with (
            pytest.raises(_http.TimedOut, match="timed out"),
            client.stream("GET", "/logs") as answer,
        ):
            list(answer.iter_text())
        client.close()


def test_a_request_while_a_stream_is_read_takes_another_connection(no_proxy: None) -> None:
    # A notebook reads a followed log and asks for the job between two lines.
    def answer(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
        if seen.path == "/logs":
            _slow_text(0.05)(handler, seen)
        else:
            _json(handler, seen)

    for stub in _serve(answer):
        client = _client(stub.url)
        with client.stream("GET", "/logs") as answer_:
            pieces = answer_.iter_text()
            first = next(pieces)
            assert client.request("GET", "/job").json() == {"ok": True}
            rest = "".join(pieces)
        assert first + rest == "line one\nGrüße\n"
        assert client.request("GET", "/job").status_code == 200
        client.close()
        logs, job, again = stub.seen
        assert logs.peer != job.peer  # the stream's connection was busy
        assert again.peer in (logs.peer, job.peer)  # and a finished one serves again


def test_failures_are_one_line_and_name_their_kind(no_proxy: None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(_http.Unreachable, match="Connection refused"):
        _client(f"http://127.0.0.1:{port}").request("GET", "/")
    with socket.socket() as silent:  # accepts (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(_http.TimedOut):
            _client(url, timeout=0.2).request("GET", "/")
    for bad in ("localhost:8080", "ftp://host", "http://host:port", "http://"):
        with pytest.raises(ValueError, match="is not an http:// or https:// URL"):
            _client(bad)


def test_https_is_tls_verified(stub: Stub) -> None:
    # The stub speaks plain HTTP: the TLS handshake fails, and says so.
    with pytest.raises(_http.Unreachable, match="SSL"):
        _client(stub.url.replace("http:", "https:")).request("GET", "/")


def test_the_environments_proxy_is_used_and_no_proxy_honoured(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = stub.url.replace("http://", "http://user:p%40ss@")
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    _client("http://kubetrain.example:8080/base").request("GET", "/api")
    plain = stub.seen[-1]
    assert plain.path == "http://kubetrain.example:8080/base/api"
    assert plain.headers["proxy-authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    # https goes through a tunnel; the stub answers CONNECT with 200 and then no TLS.
    with pytest.raises(_http.Unreachable):
        _client("https://kubetrain.example").request("GET", "/api")
    tunnel = stub.seen[-1]
    assert (tunnel.method, tunnel.path) == ("CONNECT", "kubetrain.example:443")
    assert tunnel.headers["proxy-authorization"] == "Basic dXNlcjpwQHNz"
    monkeypatch.setenv("NO_PROXY", "kubetrain.example")
    with pytest.raises(_http.Unreachable):  # straight to the (unresolvable) host
        _client("http://kubetrain.example:8080").request("GET", "/api")
    assert len(stub.seen) == 2


def _drop_the_second_request(handler: BaseHTTPRequestHandler, seen: Seen) -> None:
    """Answers the first request of a connection and drops the connection at the second
    (read, unanswered): a replica that went away with the client's kept connection."""
    served = getattr(handler, "served", 0)
    handler.served = served + 1  # type: ignore[attr-defined]
    if served == 0:
        _json(handler, seen)
    else:
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)


def test_an_idempotent_request_on_a_dropped_kept_connection_is_sent_again_once(
    no_proxy: None,
) -> None:
    for stub in _serve(_drop_the_second_request):
        client = _client(stub.url)
        assert client.request("GET", "/a").status_code == 200
        # The kept connection is dropped at the second request: sent again on a new one.
        assert client.request("GET", "/b").json() == {"ok": True}
        assert [s.path for s in stub.seen] == ["/a", "/b", "/b"]
        assert stub.seen[1].peer == stub.seen[0].peer != stub.seen[2].peer
        # Not a POST: it may have been taken; the caller decides (an Idempotency-Key).
        with pytest.raises(_http.TransportError):
            client.request("POST", "/c", json={})
        assert [s.path for s in stub.seen][3:] == ["/c"]
        client.close()
