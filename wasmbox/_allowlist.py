"""Egress allow lists: parsing `[network] allow` entries and judging one resolved address.

Addresses that are not globally routable (loopback, private, link-local such as the cloud
metadata endpoint 169.254.169.254, shared, reserved, multicast, unspecified, and the IPv6
forms that embed them) are refused unless an address or CIDR entry names them. A host name
entry allows that name and port, at global addresses only.
"""

from __future__ import annotations

import functools
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


@dataclass(frozen=True)
class NameRule:
    host: str  # lower case, no trailing dot
    port: int


@dataclass(frozen=True)
class AddressRule:
    network: IPNetwork
    port: int | None  # None: any port


Rule = NameRule | AddressRule


@functools.lru_cache(maxsize=256)
def parse_rules(allow: tuple[str, ...]) -> tuple[Rule, ...]:
    """The rules of an allow list (parsed once per distinct list)."""
    return tuple(parse_rule(entry) for entry in allow)


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
    for test, what in (
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


def verdict(rules: Sequence[Rule], host: str, port: int, address: IPAddress) -> str | None:
    """Why connecting to `address` for `host:port` is refused, or None if it is allowed."""
    candidates = [address]
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        candidates.append(embedded)
    for rule in rules:
        if isinstance(rule, AddressRule) and rule.port in (None, port):
            if any(a.version == rule.network.version and a in rule.network for a in candidates):
                return None  # named explicitly
    reason = forbidden_reason(address)
    if reason is not None:
        return f"{address} {reason}"
    if NameRule(host, port) in rules:
        return None
    return f"{host}:{port} ({address}) is not in the allow list"


