"""Egress allow lists: parsing where an `[network] allow` entry reaches and judging one resolved
address (what a request may ask there is `egress.py`'s).

Addresses that are not globally routable (loopback, private, link-local such as the cloud
metadata endpoint 169.254.169.254, shared, reserved, multicast, unspecified, documentation,
deprecated ranges such as IPv6 site-local, and the IPv6 forms that embed them) are refused
unless an address or CIDR entry names them. A host name entry allows that name and port, at
global addresses only.

Which ranges those are is decided by `_SPECIAL` below, from the IANA IPv4 and IPv6
special-purpose address registries, not by `ipaddress` alone: its `is_global` counts some of
them as global (e.g. fec0::/10, 3fff::/20, 192.88.99.0/24 on Python 3.11) and its answers
differ between Python releases. Its properties are still consulted after the table, so they
can only refuse more.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

FETCH = "http.fetch"  # the host function that uses these rules
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_NUMERIC_HOST = re.compile(r"^[0-9a-fx.]+$")  # looks like an address in some odd spelling
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")

# Ranges refused for name rules, with why; the first match names the reason. Ranges IANA marks
# globally reachable that a tool has no business fetching from (anycast service addresses in
# 192.0.0.0/24 and 2001::/23) are refused too. The IPv6 forms that embed an IPv4 address
# (IPv4-mapped, 6to4, Teredo, the well-known NAT64 prefix) are judged by that address first.
_SPECIAL: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(cidr), why)
    for cidr, why in (
        ("0.0.0.0/32", "is unspecified"),
        ("0.0.0.0/8", "is 'this network' (0.0.0.0/8)"),
        ("10.0.0.0/8", "is private"),
        ("100.64.0.0/10", "is shared address space (carrier-grade NAT), not globally routable"),
        ("127.0.0.0/8", "is loopback"),
        ("169.254.0.0/16", "is link-local (e.g. the cloud metadata endpoint)"),
        ("172.16.0.0/12", "is private"),
        ("192.0.0.0/24", "is reserved for IETF protocol assignments"),
        ("192.0.2.0/24", "is reserved for documentation"),
        ("192.88.99.0/24", "is the deprecated 6to4 relay anycast prefix"),
        ("192.168.0.0/16", "is private"),
        ("198.18.0.0/15", "is reserved for benchmarking"),
        ("198.51.100.0/24", "is reserved for documentation"),
        ("203.0.113.0/24", "is reserved for documentation"),
        ("224.0.0.0/4", "is multicast"),
        ("240.0.0.0/4", "is reserved"),  # 255.255.255.255 (broadcast) included
        ("::/128", "is unspecified"),
        ("::1/128", "is loopback"),
        ("::/96", "is IPv4-compatible (deprecated)"),
        ("64:ff9b:1::/48", "is local-use NAT64"),
        ("100::/64", "is discard-only"),
        ("2001::/23", "is reserved for IETF protocol assignments"),
        ("2001:db8::/32", "is reserved for documentation"),
        ("3fff::/20", "is reserved for documentation"),
        ("3ffe::/16", "is the former 6bone, returned and unrouted"),
        ("5f00::/16", "is reserved for SRv6 segment identifiers"),
        ("fc00::/7", "is private (unique local)"),
        ("fe80::/10", "is link-local (e.g. the cloud metadata endpoint)"),
        ("fec0::/10", "is site-local (deprecated), not globally routable"),
        ("ff00::/8", "is multicast"),
    )
)


@dataclass(frozen=True)
class NameRule:
    host: str  # lower case, no trailing dot
    port: int


@dataclass(frozen=True)
class AddressRule:
    network: IPNetwork
    port: int | None  # None: any port


Rule = NameRule | AddressRule


def parse_rule(entry: str) -> Rule:
    """One `allow` entry: `name:port`, `address[:port]`, `[v6]:port` or a CIDR. ValueError
    says what is wrong."""
    text = entry.strip().lower()
    if "/" in text:
        network, _, port_text = text.partition("]:") if text.startswith("[") else (text, "", "")
        return AddressRule(_network(network.strip("[]")), _port(port_text) if port_text else None)
    if text.startswith("["):
        address, sep, port_text = text[1:].partition("]")
        port = _port(port_text[1:]) if port_text.startswith(":") else None
        if port_text and port is None or not sep:
            raise ValueError(f"{entry!r}: write IPv6 as [address]:port")
        return AddressRule(_network(address), port)
    if text.count(":") > 1:  # a bare IPv6 address
        return AddressRule(_network(text), None)
    host, sep, port_text = text.partition(":")
    try:
        return AddressRule(_network(host), _port(port_text) if sep else None)
    except ValueError:
        pass
    if _NUMERIC_HOST.match(host):
        raise ValueError(f"{entry!r}: write addresses in their canonical form (e.g. 127.0.0.1)")
    host = host.rstrip(".")
    if not all(_HOST_LABEL.match(label) for label in host.split(".")):
        raise ValueError(f"{entry!r}: not a host name, address or CIDR")
    if not sep:
        raise ValueError(f"{entry!r}: a host name needs its port, e.g. {host}:443")
    return NameRule(host, _port(port_text))


def _network(text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"{text!r} is not a port number")
    return int(text)


def forbidden_reason(address: IPAddress) -> str | None:
    """Why `address` is refused unless allowed explicitly, or None for a global address."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        reason = forbidden_reason(embedded)
        return f"embeds {embedded}, which {reason}" if reason else None
    for network, why in _SPECIAL:
        if address.version == network.version and address in network:
            return why
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST:
        return "is outside the IPv6 global unicast space (2000::/3)"
    for test, what in (  # what ipaddress knows beyond the table (it only refuses more)
        ("is_loopback", "is loopback"),
        ("is_link_local", "is link-local (e.g. the cloud metadata endpoint)"),
        ("is_multicast", "is multicast"),
        ("is_unspecified", "is unspecified"),
        ("is_private", "is private"),
        ("is_reserved", "is reserved"),
    ):
        if getattr(address, test):
            return what
    if not address.is_global:
        return "is not globally routable"
    return None


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def unlisted(rules: Sequence[Rule], host: str, port: int) -> str | None:
    """Why `host:port` is refused whatever it resolves to (no address rule for the port and
    no name rule for it), or None: then it is looked up and each address judged by `verdict`.
    Checked before the lookup, so a guest cannot make the host resolve names nobody allowed
    (an address written as one needs no lookup, and `verdict` gives its reason)."""
    try:
        ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        pass
    else:
        return None
    if NameRule(host.lower(), port) in rules:
        return None
    if any(isinstance(rule, AddressRule) and rule.port in (None, port) for rule in rules):
        return None
    return f"{host}:{port} is not in the allow list"


def verdict(rules: Sequence[Rule], host: str, port: int, address: IPAddress) -> str | None:
    """Why connecting to `address` for `host:port` is refused, or None if it is allowed."""
    candidates = [address]
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        candidates.append(embedded)
    for rule in rules:
        if (
            isinstance(rule, AddressRule)
            and rule.port in (None, port)
            and any(a.version == rule.network.version and a in rule.network for a in candidates)
        ):
            return None  # named explicitly
    reason = forbidden_reason(address)
    if reason is not None:
        return f"{address} {reason}"
    if NameRule(host, port) in rules:
        return None
    return f"{host}:{port} ({address}) is not in the allow list"
