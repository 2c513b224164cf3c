"""Which addresses a webhook may reach: none of the platform's own networks by default.

A webhook URL is chosen by a project's admin, but the request leaves from the
control plane, inside the cluster's network: without a rule, a URL such as
`http://169.254.169.254/` (the cloud's metadata service), `http://10.0.0.7/` or
`http://127.0.0.1:…` would make kubetrain a probe of the network it runs in.
So loopback, link-local, private, unspecified, multicast and reserved addresses
are refused, unless the platform opens a range (`webhook_allowed_networks`).

The table names each range with the rule that closes it, so that a refusal can
say which rule applied and nothing else (never what a server there answered).
"""

from __future__ import annotations

from collections.abc import Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

__all__ = ["BLOCKED", "Address", "Network", "address_refusal", "literal_address", "networks"]

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

# The IANA special-purpose registries' ranges a receiver on the Internet is never in.
BLOCKED: tuple[tuple[Network, str], ...] = tuple(
    (ip_network(cidr), rule)
    for cidr, rule in (
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private, RFC 1918"),
        ("100.64.0.0/10", "shared address space, RFC 6598"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local, where cloud metadata services answer"),
        ("172.16.0.0/12", "private, RFC 1918"),
        ("192.0.0.0/24", "reserved, IETF protocol assignments"),
        ("192.0.2.0/24", "reserved, documentation"),
        ("192.168.0.0/16", "private, RFC 1918"),
        ("198.18.0.0/15", "reserved, benchmarking"),
        ("198.51.100.0/24", "reserved, documentation"),
        ("203.0.113.0/24", "reserved, documentation"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # with 255.255.255.255, broadcast
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("64:ff9b:1::/48", "reserved, local-use IPv4/IPv6 translation"),
        ("100::/64", "reserved, discard-only"),
        ("2001::/23", "reserved, IETF protocol assignments"),
        ("2001:db8::/32", "reserved, documentation"),
        ("fc00::/7", "private, unique local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "reserved, deprecated site-local"),
        ("ff00::/8", "multicast"),
    )
)

# IPv6 forms that carry an IPv4 address, which is what the connection reaches.
_NAT64 = IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR = IPv6Network("2002::/16")


def networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """The CIDRs as networks; ValueError naming the first that is none."""
    found = []
    for cidr in cidrs:
        try:
            found.append(ip_network(cidr))
        except ValueError as exc:
            raise ValueError(f"{cidr!r} is not a CIDR network ({exc})") from None
    return tuple(found)


def literal_address(host: str) -> Address | None:
    """The host as an IP address, if it is written as one (brackets of IPv6 removed)."""
    try:
        return ip_address(host.strip("[]"))
    except ValueError:
        return None


def _reached(address: Address) -> Address:
    """The address a connection to `address` reaches: IPv4 for the IPv6 forms of one."""
    if isinstance(address, IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def address_refusal(address: Address, allowed: Iterable[Network] = ()) -> str | None:
    """Why a webhook may not reach `address`, naming the closed network and its rule;
    None if it may (a public address, or one in an `allowed` network)."""
    for candidate in {address, _reached(address)}:
        if any(candidate.version == net.version and candidate in net for net in allowed):
            return None
    reached = _reached(address)
    for net, rule in BLOCKED:
        if reached.version == net.version and reached in net:
            return f"{net} is closed to webhooks ({rule})"
    if not reached.is_global:
        return "the address is not globally routable (IANA special-purpose) and closed to webhooks"
    return None
