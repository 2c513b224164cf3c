"""HTTP/1.1 for the SDK and the client commands, on the standard library (http.client).

httpx took longer to import (about 60 ms) than a command that asks the server one
question may take to answer in all (bench/cli_start.py). What the commands had
from it, they have here: one connection kept across requests (a new one when the
server has closed it, or while a stream still holds it), a timeout on connecting
and on every read (a stream may drop the read timeout), TLS verified against the
system's certificates (SSL_CERT_FILE and SSL_CERT_DIR honoured) with a context made
only for https, the environment's HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY, and bodies read
whole or streamed. No redirect is followed (nor was one with httpx). An idempotent
request (GET, HEAD, OPTIONS) whose kept connection drops before any answer is sent
once more on a new one: the server closed it meanwhile (a replica restarting behind
a Service, a rolling update), as urllib3 and browsers do for a stale keep-alive.

```
* TransportError        no answer came; the message is one line
  x Unreachable         the connection could not be made (refused, DNS, TLS, proxy)
  x TimedOut            connecting or a read took longer than the timeout
```
"""

from __future__ import annotations

import codecs
import http.client
import json as jsonlib
import os
import select
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

__all__ = ["Client", "Response", "Stream", "TimedOut", "TransportError", "Unreachable"]

_CHUNK = 64 * 1024
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
# A kept connection the server dropped: reset, closed with no answer, or a broken pipe.
_DROPPED = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)


class TransportError(Exception):
    """No answer came (the message is one line)."""


class Unreachable(TransportError):
    pass


class TimedOut(TransportError):
    pass


class Response:
    """An answer read whole (a plain class: importing `dataclasses` costs start-up)."""

    __slots__ = ("content", "status_code")

    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError if it is not."""
        return jsonlib.loads(self.content)


class Stream:
    """An answer whose body is read as it arrives."""

    def __init__(self, answer: http.client.HTTPResponse) -> None:
        self._answer = answer
        self.status_code = answer.status

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def read(self) -> Response:
        """The rest of the body, at once."""
        with _failures():
            return Response(self.status_code, self._answer.read())

    def iter_text(self) -> Iterator[str]:
        """The body as UTF-8 text, each piece as soon as it arrived."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            with _failures():
                chunk = self._answer.read1(_CHUNK)
            if not chunk:
                break
            if text := decoder.decode(chunk):
                yield text
        if tail := decoder.decode(b"", final=True):
            yield tail


class Client:
    """Requests to one server; `base_url`'s path is the prefix of every request's."""

    def __init__(self, base_url: str, *, timeout: float, headers: Mapping[str, str]) -> None:
        parts = urlsplit(base_url)
        try:
            port = parts.port
        except ValueError:  # not a number, or out of range
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise ValueError(f"{base_url!r} is not an http:// or https:// URL")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = port or (443 if self._https else 80)
        self._origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        self._prefix = parts.path.rstrip("/")
        self._timeout = timeout
        self._headers = dict(headers)
        self._connection: http.client.HTTPConnection | None = None
        self._proxy_headers: dict[str, str] = {}
        self._via_proxy = False  # a plain-http proxy: requests name the whole URL

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        with self.stream(method, path, params=params, json=json, headers=headers) as answer:
            return answer.read()

    @contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        endless: bool = False,
    ) -> Iterator[Stream]:
        """The answer, its body not yet read; `endless`: no read timeout (connecting
        still has one)."""
        all_headers = _merged(self._headers, headers or {})
        body = None
        if json is not None:
            body = jsonlib.dumps(
                json, ensure_ascii=False, separators=(",", ":"), allow_nan=False
            ).encode()
            all_headers = _merged(all_headers, {"Content-Type": "application/json"})
        kept = self._connection
        connection = self._connect()
        reused = kept is not None and connection is kept
        # The answer's while it is read: a request made meanwhile (a notebook asking for
        # a job between two lines of a followed log) opens a connection of its own.
        self._connection = None
        target = self._prefix + path + ("?" + _query(params) if params else "")
        if self._via_proxy:
            target = self._origin + target
            all_headers = _merged(all_headers, self._proxy_headers)
        finished = False
        try:
            try:
                answer = self._send(connection, method, target, body, all_headers, endless)
            except TransportError as exc:
                if not (reused and method in _IDEMPOTENT and isinstance(exc.__cause__, _DROPPED)):
                    raise
                connection.close()
                connection = self._connect()
                self._connection = None
                answer = self._send(connection, method, target, body, all_headers, endless)
            yield Stream(answer)
            finished = answer.isclosed()  # read to its end: the connection may serve again
        finally:
            if finished and self._connection is None:
                self._connection = connection
            else:
                connection.close()

    def _send(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        endless: bool,
    ) -> http.client.HTTPResponse:
        with _failures():
            if connection.sock is not None:
                connection.sock.settimeout(None if endless else self._timeout)
            connection.request(method, target, body=body, headers=headers)
            return connection.getresponse()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connect(self) -> http.client.HTTPConnection:
        connection = self._connection
        if connection is not None and connection.sock is not None and not _closed(connection.sock):
            return connection
        connection = None
        self.close()
        try:
            with _failures(Unreachable):
                connection = self._new_connection()
                connection.connect()
        except TransportError:
            if connection is not None:
                connection.close()
            raise
        self._connection = connection
        return connection

    def _new_connection(self) -> http.client.HTTPConnection:
        proxy = _proxy_for("https" if self._https else "http", self._host)
        if proxy is None:
            host, port = self._host, self._port
        else:
            parts = urlsplit(proxy if "://" in proxy else "http://" + proxy)
            if parts.scheme != "http" or not parts.hostname:
                raise Unreachable(f"unsupported proxy {parts.scheme}://{parts.hostname}")
            host, port = parts.hostname, parts.port or 80
            if parts.username is not None:
                import base64

                credentials = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
                self._proxy_headers = {
                    "Proxy-Authorization": "Basic "
                    + base64.b64encode(credentials.encode()).decode()
                }
        connection: http.client.HTTPConnection
        if self._https:
            import ssl

            context = ssl.create_default_context()
            connection = http.client.HTTPSConnection(
                host, port, timeout=self._timeout, context=context
            )
            if proxy is not None:
                connection.set_tunnel(self._host, self._port, headers=self._proxy_headers)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=self._timeout)
            self._via_proxy = proxy is not None
        return connection


@contextmanager
def _failures(kind: type[TransportError] = TransportError) -> Iterator[None]:
    """The standard library's failures as TransportErrors of one line."""
    try:
        yield
    except TimeoutError as exc:
        raise TimedOut(_line(exc)) from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a header
        raise kind(_line(exc)) from exc


def _line(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0]


def _closed(sock: Any) -> bool:
    """An idle connection the server has closed reads as ready (its end of file)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _merged(headers: Mapping[str, str], more: Mapping[str, str]) -> dict[str, str]:
    """`headers` with `more` in place of any of the same name (names are not case-sensitive)."""
    names = {name.lower() for name in more}
    return {
        **{name: value for name, value in headers.items() if name.lower() not in names},
        **more,
    }


def _query(params: Mapping[str, Any]) -> str:
    """As httpx writes it: a list repeats its key, True is `true`, None is empty."""
    pairs = []
    for key, value in params.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            text = "" if item is None else str(item).lower() if isinstance(item, bool) else item
            pairs.append((key, text))
    return urlencode(pairs)


def _proxy_for(scheme: str, host: str) -> str | None:
    """The proxy the environment names for `scheme` and `host`, if any."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return None
    import urllib.request  # only when a proxy is configured: it costs an import

    proxies = urllib.request.getproxies_environment()
    if urllib.request.proxy_bypass(host):  # NO_PROXY
        return None
    return proxies.get(scheme) or proxies.get("all")
