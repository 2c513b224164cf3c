"""Kubernetes client setup from a kubeconfig or the in-cluster ServiceAccount."""

from __future__ import annotations

import os
import select
import socket
import ssl
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpcore2 as httpcore
import httpx2 as httpx
from lightkube import AsyncClient
from lightkube.config.client_adapter import AsyncClient as adapter_async_client
from lightkube.config.client_adapter import ConnectionParams, user_auth, verify_cluster
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

from kubetrain.cluster.errors import ClusterConfigError
from kubetrain.cluster.wire import Answer, Connections, Poster

FIELD_MANAGER = "kubetrain"
# Connections the typed client keeps open between requests: at least the dispatcher's
# calls in flight (`dispatcher.BATCH`, 50). httpx keeps 20, so rounds of 50 creates
# closed 30 connections and opened 30 again, each with a TLS handshake on both sides (a
# client certificate's too), which the API server pays on the same cores as the creates.
KEEP_ALIVE = 64

# The client objects the rooms above hold and pass back in, named here so that they
# never import the client library themselves.
ClusterConfig = SingleConfig
TypedClient = AsyncClient  # lightkube's typed client: get, create, replace, patch, delete
HttpClient = httpx.AsyncClient  # raw list+watch of JSON (the reflectors)
CreatingClient = Poster  # the dispatcher's creates, as bytes (`creating_client`)


def load_config(kubeconfig: str | os.PathLike[str] | None = None) -> SingleConfig:
    """The explicit kubeconfig, else $KUBECONFIG, else ~/.kube/config, else in-cluster."""
    config = _load(kubeconfig)
    if config is None:
        raise ClusterConfigError("the kubeconfig names no current context")
    return config


def _load(kubeconfig: str | os.PathLike[str] | None) -> SingleConfig | None:
    candidates = [kubeconfig] if kubeconfig else []
    if not candidates and (env := os.environ.get("KUBECONFIG")):
        candidates = [env.split(os.pathsep)[0]]
    if not candidates:
        default = Path.home() / ".kube" / "config"
        if default.exists():
            candidates = [default]
    for path in candidates:
        try:
            return KubeConfig.from_file(path).get()
        except Exception as exc:  # missing, not YAML, not a kubeconfig: lightkube raises many kinds
            reason = (str(exc) or type(exc).__name__).splitlines()[0]
            if isinstance(exc, AttributeError | TypeError):
                reason = "the file is empty or is not a kubeconfig"
            elif isinstance(exc, KeyError):
                reason = f"it has no {exc.args[0]!r} entry"
            elif type(exc).__module__.startswith("yaml"):
                reason = f"not valid YAML ({reason})"
            raise ClusterConfigError(f"cannot use kubeconfig {path}: {reason}") from None
    try:
        return KubeConfig.from_service_account().get()
    except Exception as exc:  # lightkube raises several kinds here
        raise ClusterConfigError(
            "no cluster configured: set KUBECONFIG (or pass --kubeconfig), or run in a Pod "
            f"with a ServiceAccount ({exc})"
        ) from None


def typed_client(config: SingleConfig) -> AsyncClient:
    return AsyncClient(config=config, field_manager=FIELD_MANAGER, transport=_transport(config))


def _transport(config: SingleConfig) -> httpx.AsyncHTTPTransport | None:
    """The kubeconfig's TLS, as lightkube would set it, with connections kept for all
    the dispatcher's calls in flight (a transport given to the client brings its own TLS). None
    where the environment names a proxy for the server: httpx goes through it only
    without a transport of ours, with its own 20 connections kept."""
    if _httpx_only(config):
        return None
    assert config.user is not None  # `_httpx_only` without one
    context = verify_cluster(config.cluster, config.user, config.abs_file)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=KEEP_ALIVE)
    return _KeptTransport(context, limits)


def _httpx_only(config: SingleConfig) -> bool:
    """Whether the server is to be reached through httpx as lightkube sets it up, with
    nothing of ours: the environment names a proxy for it (which httpx honours only
    without a transport of ours), or the config has no user (lightkube refuses it in its
    own words)."""
    if config.user is None:
        return True
    server = urlsplit(str(config.cluster.server))
    proxies = urllib.request.getproxies_environment()
    return bool(proxies.get(server.scheme) or proxies.get("all")) and not (
        urllib.request.proxy_bypass(server.hostname or "")
    )


class _KeptTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over httpcore's pool as httpx makes it, with streams that keep
    their socket at hand (`_SocketAtHand`); httpx takes no network backend of its own."""

    def __init__(self, context: ssl.SSLContext, limits: httpx.Limits) -> None:
        super().__init__(verify=context, limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_SocketAtHand(),
        )


class _SocketAtHand(httpcore.AnyIOBackend):
    """Before each request and after each response the pool asks every idle connection
    whether the server has closed it; anyio answers by building a TLS stream's table of
    attributes anew to find the socket. With the dispatcher's 50 connections kept that
    was ~6 % of the serve process's interpreter through a backlog (profiled). The
    socket is looked up once, when the connection is made."""

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        return _StreamWithSocket(await super().connect_tcp(*args, **kwargs))


class _StreamWithSocket(httpcore.AsyncNetworkStream):
    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._socket: socket.socket | None = stream.get_extra_info("socket")

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        tls = await self._stream.start_tls(ssl_context, server_hostname, timeout)
        return _StreamWithSocket(tls)

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._socket
        if info == "is_readable":
            return _readable(self._socket)
        return self._stream.get_extra_info(info)


def _readable(sock: socket.socket | None) -> bool:
    """Whether a read would not block, as httpcore asks it: an idle connection that
    is readable has been closed by the server (or is about to be). No socket reads so."""
    if sock is None or sock.fileno() < 0:
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def creating_client(config: SingleConfig) -> Poster:
    """The client of the dispatcher's creates (cluster/jobs.py `create_job`): kept
    HTTP/1.1 connections of our own (cluster/wire.py) with the kubeconfig's TLS and
    credentials; httpx where the environment names a proxy for the server (as for the
    typed client, `_httpx_only`)."""
    if _httpx_only(config):
        return _ViaHttpx(httpx.AsyncClient(**ConnectionParams().httpx_params(config)))
    assert config.user is not None  # `_httpx_only` without one
    context = verify_cluster(config.cluster, config.user, config.abs_file)
    return Connections(str(config.cluster.server), context, user_auth(config.user))


class _ViaHttpx:
    """The creates through httpx, which speaks to a proxy."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def post(self, path: str, body: bytes) -> Answer:
        response = await self._client.post(
            path, content=body, headers={"Content-Type": "application/json"}
        )
        return Answer(response.status_code, response.content)

    async def aclose(self) -> None:
        await self._client.aclose()


def http_client(config: SingleConfig) -> httpx.AsyncClient:
    """A plain HTTP client with the kubeconfig's TLS and credentials, for list+watch
    of raw JSON (the diagnosis reads plain objects, not typed models)."""
    return adapter_async_client(config, ConnectionParams())
