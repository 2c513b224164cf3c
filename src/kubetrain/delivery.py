"""HTTP to the outside world that is not Kubernetes: webhook receivers.

A receiver's URL is a tenant's choice, and the request leaves from inside the
platform, so each delivery is held on a short leash:

* the host is resolved here, each address checked against the closed networks
  (domain/networks.py, opened by `webhook_allowed_networks`), and the connection
  made to the very address that was checked: the URL's host is replaced by it
  (the `Host` header and TLS's server name and certificate check keep the name),
  so a second resolution cannot point elsewhere (DNS rebinding);
* one deadline for the whole exchange (resolve, connect, send, answer), not per
  read, so a receiver that trickles its answer is cut off;
* at most `ANSWER_CAP` bytes of the answer are read, the rest dropped with the
  connection; no redirect is followed (a receiver that moved must be updated,
  not followed wherever it points); no proxy or credentials from the environment;
  no connection kept alive (each one is to an address checked for it);
* what goes wrong is told in `DeliveryError`'s words, which say which rule
  refused an address and never what a server answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import httpx2 as httpx

from kubetrain.domain.networks import Address, Network, address_refusal, literal_address

TIMEOUT_SECONDS = 10.0
ANSWER_CAP = 64 * 1024  # bytes of a receiver's answer read; a 2xx needs none
MAX_CONNECTIONS = 64
RESOLVER_THREADS = 8
USER_AGENT = "kubetrain-webhooks/1"

# (url, body, headers) -> the receiver's HTTP status; raises DeliveryError when there is no answer.
Post = Callable[[str, bytes, dict[str, str]], Awaitable[int]]
# (host, port) -> the addresses the name resolves to, in the resolver's order.
Resolve = Callable[[str, int], Awaitable[list[Address]]]


class DeliveryError(Exception):
    """Why a delivery got no answer, in words fit for the webhook's `lastError`."""


def system_resolver(executor: Executor) -> Resolve:
    """The system resolver, on `executor`'s threads: a tenant's slow DNS server then
    holds up only webhooks, not the threads the other loops' database calls run on."""

    async def resolve(host: str, port: int) -> list[Address]:
        infos = await asyncio.get_running_loop().run_in_executor(
            executor, functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        )
        return addresses_of(infos)

    return resolve


def addresses_of(infos: Iterable[tuple[Any, ...]]) -> list[Address]:
    """The distinct addresses of getaddrinfo's answer, in its order."""
    found: list[Address] = []
    for *_, sockaddr in infos:
        address = literal_address(str(sockaddr[0]).split("%", 1)[0])  # no IPv6 zone
        if address is not None and address not in found:
            found.append(address)
    return found


async def checked_address(
    host: str, port: int, allowed: Iterable[Network], resolve: Resolve
) -> Address:
    """The first address of `host` a webhook may reach; DeliveryError naming the rule
    if it has none."""
    literal = literal_address(host)
    try:
        addresses = [literal] if literal is not None else await resolve(host, port)
    except OSError:
        raise DeliveryError(f"the receiver's host name {host!r} does not resolve") from None
    refusals = []
    for address in addresses:
        refusal = address_refusal(address, allowed)
        if refusal is None:
            return address
        refusals.append(refusal)
    if not refusals:
        raise DeliveryError(f"the receiver's host name {host!r} has no address")
    # The rule, not the address: where an internal name points is not the tenant's business.
    raise DeliveryError(f"the receiver's address is refused: {refusals[0]}")


@asynccontextmanager
async def webhook_poster(
    *,
    allowed_networks: Iterable[Network] = (),
    timeout: float = TIMEOUT_SECONDS,
    max_connections: int = MAX_CONNECTIONS,
    resolve: Resolve | None = None,
) -> AsyncIterator[Post]:
    """A `post(url, body, headers) -> status` for the notifier, closed on exit;
    `resolve` is the system resolver unless given."""
    allowed = tuple(allowed_networks)
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=0)
    with contextlib.ExitStack() as stack:
        if resolve is None:
            executor = ThreadPoolExecutor(RESOLVER_THREADS, thread_name_prefix="webhook-dns")
            # Not waiting for a resolution that outlived its deadline.
            stack.callback(executor.shutdown, wait=False, cancel_futures=True)
            resolve = system_resolver(executor)
        async with httpx.AsyncClient(
            timeout=timeout, follow_redirects=False, trust_env=False, limits=limits
        ) as client:
            yield _poster(client, allowed, timeout, resolve)


def _poster(
    client: httpx.AsyncClient, allowed: tuple[Network, ...], timeout: float, resolve: Resolve
) -> Post:
    """One delivery: resolved and checked, posted to the address checked, one deadline."""

    async def exchange(url: str, body: bytes, headers: dict[str, str]) -> int:
        target = httpx.URL(url)
        host = target.raw_host.decode("ascii")
        port = target.port or (443 if target.scheme == "https" else 80)
        address = await checked_address(host, port, allowed, resolve)
        extensions = {}
        if target.scheme == "https" and literal_address(host) is None:
            extensions["sni_hostname"] = host  # TLS checks the name, not the address
        request = client.build_request(
            "POST",
            target.copy_with(host=str(address)),
            content=body,
            headers={
                **headers,
                "host": target.netloc.decode("ascii"),
                "user-agent": USER_AGENT,
            },
            extensions=extensions,
        )
        response = await client.send(request, stream=True)
        try:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= ANSWER_CAP:
                    break  # the rest goes with the connection
        finally:
            await response.aclose()
        return response.status_code

    async def post(url: str, body: bytes, headers: dict[str, str]) -> int:
        try:
            async with asyncio.timeout(timeout):
                return await exchange(url, body, headers)
        except TimeoutError:
            raise DeliveryError(f"no complete answer within {timeout:g} s") from None
        except httpx.HTTPError as exc:
            # The class only: a message may quote what the server sent.
            raise DeliveryError(f"no answer ({type(exc).__name__})") from None

    return post
