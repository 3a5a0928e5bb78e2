"""`http.fetch`: HTTP(S) egress by resolved address, never by name.

The host resolves the URL's host itself, checks every address against the manifest's
`[network] allow` list (`_allowlist`), and connects to a checked address, so a second lookup
cannot switch the target (no DNS rebinding), keeping the original Host header and TLS server
name. Every redirect hop is checked again; the response's size and time are capped. The
protocol is the standard library's `http.client`.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _call
from ._allowlist import IPAddress, verdict
from ._errors import (
    CapabilityDeniedError,
    HostError,
    InvalidArgumentsError,
    OutputLimitError,
    ToolTimeoutError,
)
from ._manifest import Network
from ._units import format_size

if TYPE_CHECKING:  # imported where a fetch runs: with their CA loading they cost ~25 ms at start-up
    import http.client
    import ssl

Resolver = Callable[[str, int], Sequence[str]]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 5
_REFUSED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te"}


def default_resolver(host: str, port: int) -> list[str]:
    """The system resolver's addresses for `host` (numeric hosts in any spelling included)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class Fetcher:
    """The `http.fetch` host function of one Sandbox. Each call reads its policy from the
    manifest of the call it serves."""

    def __init__(self, resolver: Resolver | None = None) -> None:
        self._resolve = resolver or default_resolver

    @functools.cached_property
    def _tls(self) -> ssl.SSLContext:
        import ssl

        return ssl.create_default_context()

    def fetch(
        self,
        url: str,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        body: bytes | str | None = None,
    ) -> dict[str, Any]:
        """GET/POST/... `url`; returns `{"status", "headers", "body", "url"}` (the final URL)."""
        state = _call.current()
        network = state.manifest.network
        if network is None:  # a manifest that grants http.fetch must have [network]
            raise CapabilityDeniedError("no [network] grant")
        method = method.upper()
        if not re.fullmatch(r"[A-Z]{1,16}", method):
            raise InvalidArgumentsError(f"invalid method {method!r}")
        headers = dict(headers or {})
        for name, value in headers.items():
            if name.lower() in _REFUSED_HEADERS:
                raise InvalidArgumentsError(f"header {name!r} is set by the host")
            if re.search(r"[\r\n\0]", name + value) or not re.fullmatch(r"[!#-'*+.^-z|~0-9A-Za-z-]+", name):
                raise InvalidArgumentsError(f"invalid header {name!r}")
        data = body.encode() if isinstance(body, str) else body
        deadline = min(state.deadline, time.perf_counter() + network.timeout)
        for _ in range(_MAX_REDIRECTS + 1):
            status, reply_headers, content, location = self._once(
                network, method, url, headers, data, deadline
            )
            if status not in _REDIRECTS or location is None:
                return {"status": status, "headers": reply_headers, "body": content, "url": url}
            url = urllib.parse.urljoin(url, location)
            if status == 303 or (status in (301, 302) and method != "HEAD"):
                method, data = ("GET" if method != "HEAD" else "HEAD"), None
        raise HostError(f"more than {_MAX_REDIRECTS} redirects")

    def _once(
        self,
        network: Network,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None,
        deadline: float,
    ) -> tuple[int, dict[str, str], bytes, str | None]:
        import http.client

        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS:
            raise CapabilityDeniedError(f"scheme {scheme or '(none)'!r} is refused: only http and https")
        if parts.username is not None or parts.password is not None:
            raise CapabilityDeniedError("URLs with user info are refused")
        try:
            host = (parts.hostname or "").rstrip(".")
            port = parts.port or _DEFAULT_PORTS[scheme]
        except ValueError as exc:
            raise InvalidArgumentsError(f"invalid URL: {exc}") from None
        if not host:
            raise InvalidArgumentsError("the URL has no host")
        addresses = self._addresses(host, port)
        for address in addresses:
            reason = verdict(network.rules, host, port, address)
            if reason is not None:
                raise CapabilityDeniedError(f"refused: {reason}")
        path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        connection = self._connect(scheme, host, port, addresses, deadline)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            content = self._read(response, network.max_response, deadline, connection)
            reply_headers: dict[str, str] = {}
            for name, value in response.getheaders():
                key = name.lower()
                reply_headers[key] = f"{reply_headers[key]}, {value}" if key in reply_headers else value
            return response.status, reply_headers, content, response.getheader("location")
        except TimeoutError:
            raise ToolTimeoutError(f"{host}: no complete response in time") from None
        except (OSError, http.client.HTTPException) as exc:
            raise HostError(f"{host}: {type(exc).__name__}: {exc}") from None
        finally:
            connection.close()

    def _addresses(self, host: str, port: int) -> list[IPAddress]:
        try:
            found = list(self._resolve(host, port))
        except (OSError, UnicodeError) as exc:
            raise HostError(f"cannot resolve {host}: {exc}") from None
        addresses: list[IPAddress] = []
        for text in found:
            try:
                address = ipaddress.ip_address(text.split("%")[0])
            except ValueError:
                raise HostError(f"resolver returned {text!r}, not an address") from None
            if address not in addresses:
                addresses.append(address)
        if not addresses:
            raise HostError(f"{host} has no addresses")
        return addresses

    def _connect(
        self, scheme: str, host: str, port: int, addresses: list[IPAddress], deadline: float
    ) -> http.client.HTTPConnection:
        """A connection to the first checked address that answers; the Host header and the TLS
        server name stay `host`."""
        import http.client
        import ssl

        failure: Exception | None = None
        for address in addresses:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise ToolTimeoutError(f"{host}: the fetch timed out")
            connection = http.client.HTTPConnection(host, port, timeout=remaining)
            try:
                sock = socket.create_connection((str(address), port), timeout=remaining)
                if scheme == "https":
                    sock = self._tls.wrap_socket(sock, server_hostname=host)
            except TimeoutError:
                failure = ToolTimeoutError(f"{host}: connecting timed out")
                continue
            except ssl.SSLError as exc:
                raise HostError(f"{host}: TLS failed: {exc.reason or exc}") from None
            except OSError as exc:
                failure = HostError(f"{host} ({address}): {exc.strerror or exc}")
                continue
            connection.sock = sock  # connected to the checked address; never looked up again
            return connection
        assert failure is not None
        raise failure

    @staticmethod
    def _read(
        response: http.client.HTTPResponse, cap: int, deadline: float, connection: http.client.HTTPConnection
    ) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise ToolTimeoutError("the response did not arrive in time")
            if connection.sock is not None:
                connection.sock.settimeout(remaining)
            chunk = response.read1(min(65536, cap + 1 - size)) if size <= cap else b""
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap:
                raise OutputLimitError(f"the response is larger than max_response ({format_size(cap)})")
            chunks.append(chunk)
