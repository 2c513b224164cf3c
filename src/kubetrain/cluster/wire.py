"""Kept HTTP/1.1 connections to the API server for the call made once per Job (the
dispatcher's create): the request written as bytes, the answer read by its
Content-Length or its chunks, over asyncio's own TLS (uvloop's, in C, as `kubetrain
serve` runs).

Through a backlog, a create through httpx cost ~1.1 ms of the serve process's CPU,
nearly all of it httpx's and httpcore's layers and anyio's TLS in Python; here ~0.2 ms
(bench/create.py). The rest of kubetrain's calls, rare or long-lived, stay with
lightkube and httpx.

What it takes of the kubeconfig: the server's address (a path prefix too), its CA and
the client certificate (the `ssl.SSLContext` of lightkube's `verify_cluster`), and the
credentials through lightkube's own httpx `Auth` for the user: its flow is run once for
the header and again only after a 401, as its flows renew (a token file read again, an
exec plugin run again). A proxy is not spoken: where the environment names one for the
server, `cluster.client.creating_client` goes through httpx instead.

An answer lost with a connection kept from an earlier call is asked again, once, on a
new connection (the server may have closed it while it was idle): the calls made here
must be safe to repeat, as a create under a fixed name is (made already: 409).
"""

from __future__ import annotations

import asyncio
import http
import ssl
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx2 as httpx

KEEP_ALIVE = 64  # idle connections kept: at least the dispatcher's calls in flight (50)
MOST = 100  # connections at once
TIMEOUT_S = 10.0  # a whole call, connecting included (lightkube's default timeout)
MAX_BODY = 16 * 1024 * 1024  # an answer larger than this is not the API server's to a create


_NO_BODY = (204, 304)


class ProtocolError(ConnectionError):
    """The server's answer is not HTTP/1.1 as spoken here; the connection is dropped."""


class ClosedEarly(ConnectionError):
    """The connection closed before the answer's end."""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def reason(self) -> str:
        """The status' standard phrase ("Not Found"), or "" for a code without one."""
        try:
            return http.HTTPStatus(self.status).phrase
        except ValueError:
            return ""


class Poster(Protocol):
    """A client of the one call (`Connections`, or httpx where a proxy is in the way)."""

    async def post(self, path: str, body: bytes) -> Answer: ...

    async def aclose(self) -> None: ...


_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Connections:
    """The kept connections to one API server, shared by the calls in flight."""

    def __init__(
        self,
        server: str,
        context: ssl.SSLContext | None,
        auth: httpx.Auth | None,
        *,
        keep: int = KEEP_ALIVE,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError(f"not an http(s) server address: {server!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = context if url.scheme == "https" else None
        self._prefix = url.path.rstrip("/").encode()
        authority = url.netloc.rpartition("@")[2]
        self._head = (
            f"Host: {authority}\r\nUser-Agent: kubetrain\r\n"
            "Accept: application/json\r\nContent-Type: application/json\r\n"
        ).encode()
        self._auth = auth
        self._authorization: bytes | None = None  # the header line, once the flow ran
        self._idle: list[_Stream] = []
        self._keep = keep
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(MOST)
        self._closed = False

    async def post(self, path: str, body: bytes) -> Answer:
        """POST `body` (JSON) to `path` (absolute, with its query); the answer, whatever its
        status. Raises OSError (a `TimeoutError`, a `ConnectionError`, `ssl.SSLError`) when
        there is no answer."""
        if not path.startswith("/") or any(c in path for c in " \r\n"):
            raise ValueError(f"not a request path: {path!r}")
        target = self._prefix + path.encode()
        answer = await self._call(target, body, await self._credentials(renew=False))
        if answer.status == 401 and self._auth is not None:
            answer = await self._call(target, body, await self._credentials(renew=True))
        return answer

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        with suppress(Exception):
            async with asyncio.timeout(1):
                await asyncio.gather(*(w.wait_closed() for _, w in idle), return_exceptions=True)

    async def _credentials(self, *, renew: bool) -> bytes:
        """The Authorization header line from the user's httpx `Auth` (b"" without one):
        its flow's first request, or the one it sends again after a 401 (`renew`)."""
        if self._auth is None:
            return b""
        if self._authorization is not None and not renew:
            return self._authorization
        flow = self._auth.async_auth_flow(httpx.Request("POST", "https://kubernetes.invalid/"))
        try:
            request = await flow.__anext__()
            if renew:
                with suppress(StopAsyncIteration):  # a flow that does not renew: the same
                    request = await flow.asend(httpx.Response(401, request=request))
        finally:
            await flow.aclose()
        value = request.headers.get("Authorization")
        self._authorization = f"Authorization: {value}\r\n".encode() if value else b""
        return self._authorization

    async def _call(self, target: bytes, body: bytes, authorization: bytes) -> Answer:
        request = b"POST %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
            target,
            self._head,
            authorization,
            len(body),
            body,
        )
        async with self._slots:
            try:
                async with asyncio.timeout(self._timeout_s):
                    stream = self._kept()
                    if stream is not None:
                        try:
                            return await self._ask(stream, request)
                        except ConnectionError:
                            pass  # closed while idle, most likely: once more, anew
                    return await self._ask(await self._open(), request)
            except TimeoutError:
                raise TimeoutError(
                    f"no answer from the API server in {self._timeout_s:g} s"
                ) from None

    def _kept(self) -> _Stream | None:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _open(self) -> _Stream:
        return await asyncio.open_connection(
            self._host,
            self._port,
            ssl=self._ssl,
            server_hostname=self._host if self._ssl is not None else None,
        )

    async def _ask(self, stream: _Stream, request: bytes) -> Answer:
        """Send the request on `stream` and read its answer; the stream is kept for the next
        call when both sides may go on, closed otherwise (also on any error)."""
        reader, writer = stream
        keep = False
        try:
            writer.write(request)
            answer, keep = await _answer(reader)
            return answer
        except asyncio.IncompleteReadError as exc:
            raise ClosedEarly(
                f"the API server closed the connection after {len(exc.partial)} bytes of an answer"
            ) from None
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError("the answer's head is too long") from exc
        finally:
            if keep and not self._closed and len(self._idle) < self._keep:
                self._idle.append(stream)
            else:
                writer.close()


async def _answer(reader: asyncio.StreamReader) -> tuple[Answer, bool]:
    """The answer read whole, and whether its connection may carry the next call."""
    status, length, chunked, keep = _head(await reader.readuntil(b"\r\n\r\n"))
    if status in _NO_BODY or 100 <= status < 200:
        body = b""
    elif length is not None:
        if length > MAX_BODY:
            raise ProtocolError(f"an answer of {length} bytes")
        body = await reader.readexactly(length)
    elif chunked:
        body = await _chunks(reader)
    else:  # the body runs to the connection's end
        return Answer(status, await _to_end(reader)), False
    return Answer(status, body), keep


def _head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, Content-Length or None, chunked, connection kept) of an answer's head."""
    lines = head.split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    if not version.startswith(b"HTTP/1."):
        raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    try:
        status = int(rest[:3])
    except ValueError:
        raise ProtocolError(f"no status in {lines[0][:80]!r}") from None
    length: int | None = None
    chunked = False
    keep = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value)
            except ValueError:
                raise ProtocolError(f"Content-Length {value.strip()[:20]!r}") from None
        elif name == b"transfer-encoding":
            chunked = value.strip().lower().endswith(b"chunked")
        elif name == b"connection":
            tokens = {token.strip().lower() for token in value.split(b",")}
            keep = b"close" not in tokens and (keep or b"keep-alive" in tokens)
    if chunked:
        length = None  # RFC 9112 6.3: Transfer-Encoding overrides Content-Length
    return status, length, chunked, keep


async def _chunks(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            length = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise ProtocolError(f"a chunk's size {line[:20]!r}") from None
        if length == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields: none that matter here
            return b"".join(parts)
        size += length
        if size > MAX_BODY:
            raise ProtocolError(f"an answer of over {MAX_BODY} bytes")
        chunk = await reader.readexactly(length + 2)
        if not chunk.endswith(b"\r\n"):
            raise ProtocolError("a chunk without its line end")
        parts.append(chunk[:-2])


async def _to_end(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while part := await reader.read(65536):
        size += len(part)
        if size > MAX_BODY:
            raise ProtocolError(f"an answer of over {MAX_BODY} bytes")
        parts.append(part)
    return b"".join(parts)
