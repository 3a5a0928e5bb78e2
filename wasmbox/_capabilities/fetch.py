"""`http.fetch`: HTTP(S) egress by resolved address, never by name.

The host resolves the URL's host itself, checks every address against the manifest's
`[network] allow` list (`_allowlist`), and connects to a checked address, so a second lookup
cannot switch the target (no DNS rebinding), keeping the original Host header and TLS server
name. Each request is checked against the rules that reach its host:port before the lookup
(`egress.py`: methods, paths, query, headers, body) and sent under the first that admits it,
with that rule's secret added after every check. Every redirect hop is checked again; the
response's size is capped; a secret sent is cut out of everything the guest gets back.

One absolute deadline, min(the call's deadline, start + `network.timeout`), bounds the whole
exchange: the name lookup (run on a thread that is waited for until the deadline), the connect,
the TLS handshake, every send and every receive (each socket or TLS operation is given what is
left as its timeout, and CPython counts one such timeout over the whole operation), redirects
included. Interim (1xx) responses are capped. The protocol is the standard library's
`http.client`.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _call
from .._errors import (
    CapabilityDeniedError,
    HostError,
    InvalidArgumentsError,
    OutputLimitError,
    ToolError,
    ToolTimeoutError,
)
from .._manifest import Network
from .._units import format_size
from .allowlist import IPAddress, unlisted, verdict
from .egress import (
    HEADER_NAME,
    HOST_HEADERS,
    CompiledRule,
    Request,
    compile_rules,
    header_key,
    header_value_ok,
    refusal,
)

if TYPE_CHECKING:  # imported where a fetch runs: with their CA loading, they would slow start-up
    import http.client
    import ssl

Resolver = Callable[[str, int], Sequence[str]]
# A secret given to `Sandbox(secrets=...)`: the value, or a callable returning it at each request.
SecretValue = str | Callable[[], str]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECTS = {301, 302, 303, 307, 308}
_MAX_REDIRECTS = 5
_HEADER_NAME = re.compile(HEADER_NAME)
_REDACTED = "[redacted]"
_MIN_REDACTED = 8  # secrets at least this long are cut out of what the guest gets back
_MAX_INTERIM = 8  # interim (1xx) responses skipped before the final one; more is an error
# Name lookups still running after their fetch gave up (a resolver that does not answer cannot
# be interrupted, only left behind); past this many, a fetch is refused instead of adding one.
_LOOKUP_THREADS = threading.BoundedSemaphore(32)


def default_resolver(host: str, port: int) -> list[str]:
    """The system resolver's addresses for `host` (numeric hosts in any spelling included)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class Fetcher:
    """The `http.fetch` host function of one Sandbox. Each call reads its policy from the
    manifest of the call it serves."""

    def __init__(
        self, resolver: Resolver | None = None, secrets: Mapping[str, SecretValue] | None = None
    ) -> None:
        self._resolve = resolver or default_resolver
        self.secrets = dict(secrets or {})

    @functools.cached_property
    def _tls(self) -> ssl.SSLContext:
        import ssl

        context = ssl.create_default_context()
        context.sslsocket_class = _protocol().tls_socket
        return context

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
        seen: set[str] = set()
        for name, value in headers.items():
            if header_key(name) in HOST_HEADERS:
                raise InvalidArgumentsError(f"header {name!r} is set by the host")
            if not _HEADER_NAME.match(name) or not header_value_ok(value):
                raise InvalidArgumentsError(f"invalid header {name!r}")
            if header_key(name) in seen:
                raise InvalidArgumentsError(
                    f"header {name!r} is given twice (names are case-insensitive, '_' counts as '-')"
                )
            seen.add(header_key(name))
        data = body.encode() if isinstance(body, str) else body
        deadline = min(state.deadline, time.perf_counter() + network.timeout)
        sent: list[str] = []  # the secrets sent: cut out of everything the guest gets back
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                status, reply_headers, content, location = self._once(
                    state, network, method, url, headers, data, deadline, sent
                )
                if status not in _REDIRECTS or location is None:
                    reply = {"status": status, "headers": reply_headers, "body": content, "url": url}
                    return _redact_reply(reply, sent) if sent else reply
                url = urllib.parse.urljoin(url, location)
                if status == 303 or (status in (301, 302) and method != "HEAD"):
                    method, data = ("GET" if method != "HEAD" else "HEAD"), None
        except ToolError as exc:
            if sent:
                raise type(exc)(_redact(exc.message, sent)) from None
            raise
        raise HostError(f"more than {_MAX_REDIRECTS} redirects")

    def _once(
        self,
        state: _call.CallState,
        network: Network,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None,
        deadline: float,
        sent: list[str],
    ) -> tuple[int, dict[str, str], bytes, str | None]:
        """One request of a fetch (a redirect hop is another), checked against the rules."""
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
        rules = compile_rules(network.allow)
        reason = unlisted([rule.dest for rule in rules], host, port)
        if reason is not None:
            raise CapabilityDeniedError(f"refused: {reason}")
        request = Request(method, parts.path, parts.query, headers, body)
        admitting = _admitting(rules, host, port, request)
        addresses = self._addresses(host, port, deadline)
        rule = _rule_for(admitting, host, port, addresses)
        if (
            rule is not None
            and rule.max_calls is not None
            and state.requests.get(rule.index, 0) >= rule.max_calls
        ):
            raise CapabilityDeniedError(
                f"refused by {rule.label}: it allows {rule.max_calls} request(s) per call"
            )
        send = headers
        if rule is not None and rule.secret is not None:
            if scheme != "https" and not all(_loopback(address) for address in addresses):
                raise CapabilityDeniedError(
                    f"refused by {rule.label}: its secret is sent over https only (or to a loopback address)"
                )
            value = self._secret(rule)
            sent.append(value)
            send = {**headers, rule.secret.header: rule.secret.prefix + value}
        if rule is not None and rule.max_calls is not None:  # counted once it is to be sent
            state.requests[rule.index] = state.requests.get(rule.index, 0) + 1
        connection = self._connect(scheme, host, port, addresses, deadline)
        try:
            connection.request(method, request.target(rule), body=body, headers=send)
            response = connection.getresponse()
            content = self._read(response, network.max_response, deadline)
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

    def _secret(self, rule: CompiledRule) -> str:
        """The value of `rule`'s secret now; HostError (never with the value) when it is missing
        or cannot be sent."""
        source = rule.secret
        assert source is not None
        if source.env is not None:
            value: object = os.environ.get(source.env)
            if not value:
                raise HostError(
                    f"{rule.label}: its secret is missing: the host's environment has no {source.env}"
                )
        else:
            assert source.sandbox is not None
            given = self.secrets.get(source.sandbox)
            if given is None:
                raise HostError(f"{rule.label}: no secret {source.sandbox!r} in Sandbox(secrets=...)")
            try:
                value = given() if callable(given) else given
            except Exception as exc:  # noqa: BLE001 - its message may hold the secret: only its type is kept
                raise HostError(
                    f"{rule.label}: reading secret {source.sandbox!r} failed ({type(exc).__name__})"
                ) from None
        if not isinstance(value, str) or not value:
            raise HostError(f"{rule.label}: its secret ({source.describe()}) is not a non-empty string")
        if not header_value_ok(value):
            raise HostError(
                f"{rule.label}: its secret ({source.describe()}) cannot be sent in a header "
                "(control characters or text outside Latin-1)"
            )
        return value

    def _addresses(self, host: str, port: int, deadline: float) -> list[IPAddress]:
        try:
            found = self._lookup(host, port, deadline)
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

    def _lookup(self, host: str, port: int, deadline: float) -> list[str]:
        """The resolver's answer, waited for until `deadline` (ToolTimeoutError after it). The
        lookup runs on a daemon thread: neither getaddrinfo nor a resolver given to the Sandbox
        can be interrupted, so one that has not answered by then is left to finish alone."""
        if not _LOOKUP_THREADS.acquire(blocking=False):
            raise HostError(f"cannot resolve {host}: too many earlier lookups have not answered yet")
        answer: list[list[str]] = []
        failure: list[BaseException] = []
        done = threading.Event()

        def lookup() -> None:
            try:
                answer.append(list(self._resolve(host, port)))
            except BaseException as exc:  # noqa: BLE001 (handed to the fetch's own thread)
                failure.append(exc)
            finally:
                _LOOKUP_THREADS.release()
                done.set()

        try:
            threading.Thread(target=lookup, name=f"wasmbox-lookup-{host}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: the place is given back
            _LOOKUP_THREADS.release()
            raise HostError(f"cannot resolve {host}: {exc}") from None
        if not done.wait(max(0.0, deadline - time.perf_counter())):
            raise ToolTimeoutError(f"{host}: the name lookup did not answer in time")
        if failure:
            raise failure[0]
        return answer[0]

    def _connect(
        self, scheme: str, host: str, port: int, addresses: list[IPAddress], deadline: float
    ) -> http.client.HTTPConnection:
        """A connection to the first checked address that answers; the Host header and the TLS
        server name stay `host`."""
        import http.client
        import ssl

        protocol = _protocol()
        failure: Exception | None = None
        for address in addresses:
            if time.perf_counter() >= deadline:
                raise ToolTimeoutError(f"{host}: the fetch timed out")
            family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
            tcp = _DeadlineSocket(family, socket.SOCK_STREAM)
            tcp.deadline = deadline
            sock: socket.socket = tcp
            try:
                sock.connect((str(address), port))
                if scheme == "https":
                    tls = self._tls.wrap_socket(sock, server_hostname=host, do_handshake_on_connect=False)
                    sock = tls
                    tls.deadline = deadline  # type: ignore[attr-defined]  # a protocol.tls_socket
                    tls.do_handshake()
            except TimeoutError:
                sock.close()
                failure = ToolTimeoutError(f"{host}: connecting timed out")
                continue
            except ssl.SSLError as exc:
                sock.close()
                raise HostError(f"{host}: TLS failed: {exc.reason or exc}") from None
            except OSError as exc:
                sock.close()
                failure = HostError(f"{host} ({address}): {exc.strerror or exc}")
                continue
            connection = http.client.HTTPConnection(host, port)
            connection.response_class = protocol.response
            connection.sock = sock  # connected to the checked address; never looked up again
            return connection
        assert failure is not None
        raise failure

    @staticmethod
    def _read(response: http.client.HTTPResponse, cap: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            if time.perf_counter() >= deadline:
                raise ToolTimeoutError("the response did not arrive in time")
            chunk = response.read1(min(65536, cap + 1 - size)) if size <= cap else b""
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap:
                raise OutputLimitError(f"the response is larger than max_response ({format_size(cap)})")
            chunks.append(chunk)


def _admitting(rules: Sequence[CompiledRule], host: str, port: int, request: Request) -> list[CompiledRule]:
    """The rules that may reach `host:port` and admit `request`; CapabilityDeniedError naming
    each rule missed when some may reach it but none admits it."""
    admitting, missed = [], []
    for rule in rules:
        if not rule.reaches(host, port):
            continue
        reason = refusal(rule, request)
        if reason is None:
            admitting.append(rule)
        else:
            missed.append(f"{rule.label}: {reason}")
    if missed and not admitting:
        raise CapabilityDeniedError(
            f"refused: {request.method} {host}:{port} is outside " + "; ".join(missed)
        )
    return admitting


def _rule_for(
    admitting: Sequence[CompiledRule], host: str, port: int, addresses: Sequence[IPAddress]
) -> CompiledRule | None:
    """The rule a request is sent under: the first of `admitting` that allows every address.
    Plain entries also allow the addresses between them (each by some entry), as they always
    have; then no rule applies (None). CapabilityDeniedError when neither holds."""
    for rule in admitting:
        if rule.covers(host, port, addresses):
            return rule
    dests = [rule.dest for rule in admitting]
    for address in addresses:
        reason = verdict(dests, host, port, address)
        if reason is not None:
            raise CapabilityDeniedError(f"refused: {reason}")
    plain = [rule.dest for rule in admitting if rule.plain]
    if all(verdict(plain, host, port, address) is None for address in addresses):
        return None
    raise CapabilityDeniedError(f"refused: {host}'s addresses are not all within one rule of network.allow")


def _loopback(address: IPAddress) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if len(secret) >= _MIN_REDACTED:
            text = text.replace(secret, _REDACTED)
    return text


def _redact_reply(reply: dict[str, Any], secrets: Sequence[str]) -> dict[str, Any]:
    """`reply` with every secret sent cut out of its headers, body and URL (a server that
    echoes a request's headers back would otherwise hand it to the guest)."""
    body: bytes = reply["body"]
    for secret in secrets:
        if len(secret) >= _MIN_REDACTED:
            for encoded in {secret.encode("latin-1"), secret.encode()}:
                body = body.replace(encoded, _REDACTED.encode())
    headers = {name: _redact(value, secrets) for name, value in reply["headers"].items()}
    return {**reply, "headers": headers, "body": body, "url": _redact(reply["url"], secrets)}


def _left(deadline: float) -> float:
    """Seconds until `deadline`, as a socket timeout; TimeoutError once it has passed (a
    timeout of 0 would make the socket non-blocking instead)."""
    remaining = deadline - time.perf_counter()
    if remaining <= 0:
        raise TimeoutError("the fetch's deadline has passed")
    return remaining


class _DeadlineSocket(socket.socket):
    """A TCP socket whose every connect, send and receive may take only what is left until
    `deadline` (http.client sends with `sendall` and reads through `makefile`, which calls
    `recv_into`). Until `deadline` is set, every operation times out."""

    deadline = -float("inf")

    def connect(self, address: Any) -> None:
        self.settimeout(_left(self.deadline))
        super().connect(address)

    def send(self, data: Any, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().send(data, flags)

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.settimeout(_left(self.deadline))
        super().sendall(data, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self.settimeout(_left(self.deadline))
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self.settimeout(_left(self.deadline))
        return super().recv_into(buffer, nbytes, flags)


class _Protocol:
    """The TLS socket and response classes, defined where a fetch first needs them (ssl and
    http.client are imported then)."""

    def __init__(self) -> None:
        import http.client
        import ssl

        class TLSSocket(ssl.SSLSocket):
            """The TLS counterpart of `_DeadlineSocket`: the handshake, every record read
            (`recv`, `recv_into` and `makefile` go through `read`) and every write (`sendall`
            goes through `send`) may take only what is left. `deadline` is set right after
            `wrap_socket`, before the handshake; until then every operation times out."""

            deadline = -float("inf")

            def do_handshake(self, block: bool = False) -> None:
                self.settimeout(_left(self.deadline))
                super().do_handshake(block)

            def read(self, len: int = 1024, buffer: Any = None) -> Any:
                self.settimeout(_left(self.deadline))
                return super().read(len, buffer)

            def write(self, data: Any) -> int:
                self.settimeout(_left(self.deadline))
                return super().write(data)

            def send(self, data: Any, flags: int = 0) -> int:
                self.settimeout(_left(self.deadline))
                return super().send(data, flags)

        class Response(http.client.HTTPResponse):
            """`http.client`'s response, with interim (1xx) responses capped at _MAX_INTERIM:
            its own loop skips `100 Continue` without end and takes any other 1xx for the final
            response. 102 and 103 are skipped like 100 (RFC 9110: a client may ignore them);
            101 is refused, since no upgrade is ever asked for."""

            _interim = 0

            def _read_status(self) -> tuple[str, int, str]:
                version, status, reason = super()._read_status()  # type: ignore[misc]
                if not 100 <= status < 200:
                    return version, status, reason
                if status == http.client.SWITCHING_PROTOCOLS:
                    raise http.client.HTTPException("101 Switching Protocols, but no upgrade was asked for")
                self._interim += 1
                if self._interim > _MAX_INTERIM:
                    raise http.client.HTTPException(f"more than {_MAX_INTERIM} interim (1xx) responses")
                return version, http.client.CONTINUE, reason  # begin() skips its headers and reads on

        self.tls_socket = TLSSocket
        self.response = Response


@functools.cache
def _protocol() -> _Protocol:
    return _Protocol()
