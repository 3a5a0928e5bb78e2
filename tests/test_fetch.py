"""`http.fetch`: egress by resolved address against the manifest's allow list.

A real HTTP server runs on 127.0.0.1; manifests allow it explicitly (loopback is refused
otherwise). Name lookups go through a resolver the test controls, so DNS answers can be hostile.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import re
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Self

import pytest

import wasmbox
from wasmbox._capabilities.allowlist import forbidden_reason, parse_rule, verdict

from .conftest import wat


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/to/"):  # /to/<url>: a redirect there
            self.send_response(302)
            self.send_header("Location", self.path[4:])
            self.end_headers()
            return
        if self.path == "/big":
            body = b"x" * (2 * 1024 * 1024)
        else:
            body = json.dumps({"path": self.path, "host": self.headers["Host"]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Test", "yes")
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()


class Resolver:
    """Answers from a table; counts lookups (a second lookup would be a rebinding window)."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.lookups: list[str] = []

    def __call__(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        queue = self.answers.get(host)
        if queue is None:
            return wasmbox._capabilities.fetch.default_resolver(host, port)  # numeric hosts
        return queue.pop(0) if len(queue) > 1 else queue[0]


@pytest.fixture
def resolver() -> Resolver:
    return Resolver({})


@pytest.fixture
def fbox(cache_dir: Any, resolver: Resolver) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir, resolver=resolver) as sandbox:
        yield sandbox


def core_tool(box: wasmbox.Sandbox, allow: list[str], **network: Any) -> wasmbox.Tool:
    """The core-module fetch tool, (re)loaded with this allow list."""
    return box.load({"name": "fetch", "module": wat("fetch"), "host_functions": ["http.fetch"],
                     "network": {"allow": allow, **network}}, replace=True)  # fmt: skip


def fetch(box: wasmbox.Sandbox, allow: list[str], url: str, **network: Any) -> wasmbox.CallResult:
    """One fetch from a core module under this allow list."""
    return core_tool(box, allow, **network).call({"url": url})


def refused(result: wasmbox.CallResult) -> str:
    """The refusal's message (the guest saw it as its host call's error)."""
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.CAPABILITY_DENIED, result
    (record,) = result.host_calls
    assert record.name == "http.fetch" and record.verdict == "denied"
    return record.detail or ""


def test_allowed_fetch_from_a_core_module(fbox: wasmbox.Sandbox, server: int) -> None:
    value = fetch(fbox, [f"127.0.0.1:{server}"], f"http://127.0.0.1:{server}/a?b=1").unwrap()
    assert value["status"] == 200 and value["headers"]["x-test"] == "yes"
    assert json.loads(value["body"]) == {"path": "/a?b=1", "host": f"127.0.0.1:{server}"}


def test_allowed_fetch_from_python_with_post(fbox: wasmbox.Sandbox, server: int) -> None:
    grants = {"name": "py", "runtime": "python", "host_functions": ["http.fetch"],
              "network": {"allow": [f"127.0.0.1:{server}"]}}  # fmt: skip
    code = (f"from wasmbox_guest import call_host\n"
            f"r = call_host('http.fetch', url='http://127.0.0.1:{server}/', method='POST', body=b'hi')\n"
            f"(r['status'], r['body'])")  # fmt: skip
    assert fbox.run_python(code, grants).unwrap() == [201, b"hi"]


def test_name_is_resolved_once_and_the_checked_address_is_used(
    fbox: wasmbox.Sandbox, resolver: Resolver, server: int
) -> None:
    # first answer: the allowed test server; any later answer: the metadata endpoint
    resolver.answers["api.example.test"] = [["127.0.0.1"], ["169.254.169.254"]]
    value = fetch(fbox, [f"127.0.0.1:{server}"], f"http://api.example.test:{server}/x").unwrap()
    assert json.loads(value["body"])["host"] == f"api.example.test:{server}"  # Host header kept
    assert resolver.lookups == ["api.example.test"]  # no second lookup to rebind
    assert "169.254.169.254" in refused(
        fetch(fbox, [f"127.0.0.1:{server}"], f"http://api.example.test:{server}/x")
    )


def test_every_resolved_address_is_checked(fbox: wasmbox.Sandbox, resolver: Resolver, server: int) -> None:
    resolver.answers["mixed.example.test"] = [["127.0.0.1", "10.0.0.7"]]
    detail = refused(fetch(fbox, [f"127.0.0.1:{server}"], f"http://mixed.example.test:{server}/"))
    assert "10.0.0.7 is private" in detail


def test_a_name_rule_never_reaches_internal_addresses(fbox: wasmbox.Sandbox, resolver: Resolver) -> None:
    resolver.answers["api.weather.test"] = [["10.1.2.3"]]
    assert "10.1.2.3 is private" in refused(fetch(fbox, ["api.weather.test:80"], "http://api.weather.test/"))


def test_redirect_to_a_forbidden_host_is_refused(fbox: wasmbox.Sandbox, server: int) -> None:
    allow = [f"127.0.0.1:{server}"]
    ok = fetch(fbox, allow, f"http://127.0.0.1:{server}/to/http://127.0.0.1:{server}/landed").unwrap()
    assert json.loads(ok["body"])["path"] == "/landed" and ok["url"].endswith("/landed")
    detail = refused(
        fetch(fbox, allow, f"http://127.0.0.1:{server}/to/http://169.254.169.254/latest/meta-data/")
    )
    assert "169.254.169.254 is link-local" in detail
    other_port = refused(fetch(fbox, allow, f"http://127.0.0.1:{server}/to/http://127.0.0.1:1/"))
    assert "127.0.0.1 is loopback" in other_port


@pytest.mark.parametrize(
    "url, reason",
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://127.0.0.1:{port}/", "loopback"),  # allowed only on the server's own port below
        ("http://[::1]/", "loopback"),
        ("http://10.0.0.1/", "private"),
        ("http://172.16.0.1/", "private"),
        ("http://192.168.1.1/", "private"),
        ("http://[fd00::1]/", "private"),
        ("http://100.64.0.1/", "not globally routable"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://[::ffff:10.0.0.1]/", "private"),
        ("http://[64:ff9b::a9fe:a9fe]/", "link-local"),  # NAT64 form of 169.254.169.254
        ("http://[2002:a9fe:a9fe::1]/", "link-local"),  # 6to4 form
        ("http://[2001:0:4136:e378:8000:63bf:5601:5601]/", "link-local"),  # Teredo form
        ("http://2852039166/", "link-local"),  # 169.254.169.254 as one decimal number
        ("http://0251.0376.0251.0376/", "link-local"),  # octal
        ("http://0xa9.0xfe.0xa9.0xfe/", "link-local"),  # hex
        ("http://169.254.43518/", "link-local"),  # short form
        ("http://127.1/", "loopback"),
        ("http://0x7f000001/", "loopback"),
    ],
)
def test_forbidden_addresses_are_refused_in_any_spelling(
    fbox: wasmbox.Sandbox, server: int, url: str, reason: str
) -> None:
    allow = [f"127.0.0.1:{server + 1 if server < 65535 else server - 1}", "93.184.216.34"]
    assert reason in refused(fetch(fbox, allow, url.format(port=server)))


@pytest.mark.parametrize("address, reason", [("fec0::1", "site-local"), ("3fff::1", "documentation"),
                                              ("192.88.99.1", "6to4 relay")])  # fmt: skip
def test_a_name_rule_never_reaches_ranges_ipaddress_calls_global(
    fbox: wasmbox.Sandbox, resolver: Resolver, address: str, reason: str
) -> None:
    resolver.answers["api.weather.test"] = [[address]]
    assert reason in refused(fetch(fbox, ["api.weather.test:80"], "http://api.weather.test/"))


@pytest.mark.parametrize(
    "address, reason",
    [
        # IPv4 special-purpose registry
        ("0.1.2.3", "'this network'"),
        ("100.127.255.254", "shared address space"),
        ("192.0.0.8", "IETF protocol assignments"),  # the IPv4 dummy address: ipaddress says global
        ("192.0.0.9", "IETF protocol assignments"),  # PCP anycast: IANA says global, no fetch target
        ("192.0.2.1", "documentation"),
        ("192.88.99.1", "deprecated 6to4 relay anycast"),  # ipaddress says global
        ("198.19.255.255", "benchmarking"),
        ("198.51.100.1", "documentation"),
        ("203.0.113.1", "documentation"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.31.196.1", None),  # AS112: globally reachable
        ("192.52.193.1", None),  # AMT: globally reachable
        ("192.175.48.1", None),  # direct-delegation AS112
        ("8.8.8.8", None),
        # IPv6 special-purpose registry and deprecated ranges
        ("fec0::1", "site-local (deprecated)"),  # ipaddress says global
        ("feff:ffff::1", "site-local (deprecated)"),
        ("3ffe:831f::1", "former 6bone"),  # ipaddress says global
        ("3fff::1", "documentation"),  # ipaddress (3.11) says global
        ("2001:db8::1", "documentation"),
        ("::1.2.3.4", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),
        ("100::1", "discard-only"),
        ("100:0:0:1::1", "outside the IPv6 global unicast space"),  # the dummy prefix
        ("64:ff9b:1::808:808", "local-use NAT64"),
        ("5f00::1", "SRv6"),
        ("2001:4:112::1", "IETF protocol assignments"),  # AS112-v6 (anycast DNS sink)
        ("2001:20::1", "IETF protocol assignments"),  # ORCHIDv2: identifiers, not locators
        ("::ffff:0:808:808", "outside the IPv6 global unicast space"),  # SIIT
        ("4000::1", "outside the IPv6 global unicast space"),
        ("fc00::1", "private"),
        ("fe80::1", "link-local"),
        ("ff0e::1", "multicast"),
        # IPv6 forms that embed an IPv4 address get its verdict
        ("2002:c058:6301::1", "embeds 192.88.99.1"),  # 6to4 of the 6to4 relay anycast prefix
        ("64:ff9b::c000:208", "embeds 192.0.2.8"),  # NAT64 of a documentation address
        ("::ffff:192.0.0.8", "embeds 192.0.0.8"),
        ("2002:808:808::1", None),  # 6to4 of 8.8.8.8
        ("64:ff9b::808:808", None),
        ("::ffff:8.8.8.8", None),
        ("2001:200::1", None),  # the first allocation past 2001::/23
        ("2620:4f:8000::1", None),  # direct-delegation AS112-v6
        ("2606:4700::1111", None),
        ("2a00:1450:4001::1", None),
    ],
)
def test_special_purpose_ranges_are_refused_for_name_rules(address: str, reason: str | None) -> None:
    ip = ipaddress.ip_address(address)
    got = forbidden_reason(ip)
    assert got is None if reason is None else reason in (got or ""), got
    by_name = verdict([parse_rule("api.example.com:443")], "api.example.com", 443, ip)
    assert (by_name is None) is (reason is None), by_name
    explicit = parse_rule(f"{address}/{ip.max_prefixlen}")  # an address entry still allows it
    assert verdict([explicit], "api.example.com", 443, ip) is None


def test_odd_spellings_get_the_canonical_verdict_when_allowed(fbox: wasmbox.Sandbox, server: int) -> None:
    allow = [f"127.0.0.1:{server}"]
    for host in ("127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]"):
        assert fetch(fbox, allow, f"http://{host}:{server}/").unwrap()["status"] == 200, host


def test_a_cidr_entry_allows_internal_addresses_explicitly(fbox: wasmbox.Sandbox, server: int) -> None:
    assert fetch(fbox, ["127.0.0.0/8"], f"http://127.0.0.1:{server}/").unwrap()["status"] == 200
    assert "not in the allow list" in refused(fetch(fbox, ["203.0.113.0/24"], "http://8.8.8.8/"))


@pytest.mark.parametrize(
    "url, message",
    [
        ("file:///etc/passwd", "scheme 'file' is refused"),
        ("ftp://127.0.0.1/", "scheme 'ftp' is refused"),
        ("gopher://127.0.0.1:70/", "scheme 'gopher' is refused"),
        ("http://user:pw@127.0.0.1/", "user info"),
    ],
)
def test_other_schemes_and_user_info_are_refused(
    fbox: wasmbox.Sandbox, server: int, url: str, message: str
) -> None:
    assert message in refused(fetch(fbox, [f"127.0.0.1:{server}"], url))


def test_response_size_and_time_are_capped(fbox: wasmbox.Sandbox, server: int) -> None:
    allow = [f"127.0.0.1:{server}"]
    big = fetch(fbox, allow, f"http://127.0.0.1:{server}/big", max_response="64KiB")
    assert big.error is not None and big.error.kind is wasmbox.ErrorKind.OUTPUT_LIMIT
    assert "max_response" in big.error.message
    silent = __import__("socket").create_server(("127.0.0.1", 0))  # accepts, never answers
    try:
        port = silent.getsockname()[1]
        slow = fetch(fbox, [f"127.0.0.1:{port}"], f"http://127.0.0.1:{port}/", timeout="200ms")
        assert slow.error is not None and slow.error.kind is wasmbox.ErrorKind.TIMEOUT
    finally:
        silent.close()
    assert fetch(fbox, allow, f"http://127.0.0.1:{server}/again").ok  # and the Sandbox serves on


@pytest.mark.parametrize(
    "args, message",
    [
        ({"url": "http://127.0.0.1/", "headers": {"Host": "evil.test"}}, "set by the host"),
        ({"url": "http://127.0.0.1/", "headers": {"X-A": "b\r\nX-Injected: 1"}}, "invalid header"),
        ({"url": "http://127.0.0.1/", "method": "GET /x HTTP/1.1\r\n"}, "invalid method"),
        ({"url": 5}, "valid string"),
    ],
)
def test_request_injection_is_refused(
    fbox: wasmbox.Sandbox, server: int, args: dict[str, Any], message: str
) -> None:
    tool = core_tool(fbox, [f"127.0.0.1:{server}"])
    result = tool.call(args)
    assert not result.ok and result.host_calls[0].verdict == "invalid_arguments"
    assert message in (result.host_calls[0].detail or "")


def test_refusals_reach_the_audit_trail(cache_dir: Any, server: int) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        fetch(box, [f"127.0.0.1:{server}"], "http://169.254.169.254/latest/meta-data/")
    (record,) = records
    (attempt,) = record.refused
    assert attempt.name == "http.fetch" and "169.254.169.254" in (attempt.detail or "")


@pytest.mark.parametrize(
    "network, message",
    [
        ({"allow": ["api.example.com"]}, "needs its port"),
        ({"allow": ["0177.0.0.1:80"]}, "canonical form"),
        ({"allow": ["10.0.0.1/8"]}, "has host bits set"),
        ({"allow": ["exa mple.com:80"]}, "not a host name"),
        ({"allow": ["example.com:99999"]}, "not a port number"),
        ({"allow": []}, "at least 1 item"),
    ],
)
def test_bad_allow_entries_are_manifest_errors(network: dict[str, Any], message: str) -> None:
    with pytest.raises(wasmbox.ManifestError, match=message):
        wasmbox.Manifest.load(
            {"name": "n", "runtime": "python", "host_functions": ["http.fetch"], "network": network}
        )


def test_network_and_fetch_go_together() -> None:
    with pytest.raises(wasmbox.ManifestError, match="go together"):
        wasmbox.Manifest.load({"name": "n", "runtime": "python", "host_functions": ["http.fetch"]})
    with pytest.raises(wasmbox.ManifestError, match="go together"):
        wasmbox.Manifest.load({"name": "n", "runtime": "python", "network": {"allow": ["1.2.3.4"]}})


def test_fetch_cannot_be_registered_over(fbox: wasmbox.Sandbox) -> None:
    with pytest.raises(ValueError, match="already registered"):
        fbox.register_host_function("http.fetch", lambda url: url)


def test_verdicts_of_the_allow_list() -> None:
    rules = [parse_rule(e) for e in ("api.example.com:443", "203.0.113.0/24", "[2001:db8::1]:8443")]
    ip = ipaddress.ip_address
    assert verdict(rules, "api.example.com", 443, ip("93.184.216.34")) is None
    assert verdict(rules, "api.example.com", 80, ip("93.184.216.34")) is not None  # other port
    assert verdict(rules, "other.example.com", 443, ip("93.184.216.34")) is not None
    assert verdict(rules, "x", 1, ip("203.0.113.9")) is None  # CIDR: any name, any port
    assert verdict(rules, "x", 8443, ip("2001:db8::1")) is None
    assert verdict(rules, "x", 8443, ip("::ffff:203.0.113.9")) is None  # mapped form of an allowed one
    assert verdict(rules, "api.example.com", 443, ip("::ffff:127.0.0.1")) is not None


# --- One deadline over the whole exchange, against servers that stall or dribble -----------------

SLACK = 3.0  # how long after its deadline a call may end: generous, for a loaded machine
LIFETIME = 15.0  # a hostile server stops itself after this long (well past deadline + SLACK)


class Hostile:
    """A server on 127.0.0.1 (or `host`, ::1) that sends `first` to each connection (after reading the request),
    then `unit` every `every` seconds (b"": nothing), until the client goes, the test ends, or
    LIFETIME.
    With `tls`, it speaks TLS first; with `read_request` False, it does not wait for one."""

    def __init__(self, first: bytes, unit: bytes = b"", every: float = 0.05, *,
                 tls: ssl.SSLContext | None = None, read_request: bool = True, host: str = "127.0.0.1") -> None:  # fmt: skip
        self.first, self.unit, self.every, self.tls, self.read_request = first, unit, every, tls, read_request
        self.listener = socket.create_server(
            (host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> Self:
        self._end = time.monotonic() + LIFETIME
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.listener.close()

    def _over(self) -> bool:
        return self._stop.is_set() or time.monotonic() > self._end

    def _serve(self) -> None:
        while not self._over():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted.set()
            with contextlib.suppress(OSError), conn:
                conn.settimeout(1.0)
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                if self.read_request:
                    conn.recv(65536)
                conn.sendall(self.first)
                conn.settimeout(self.every)
                while not self._over():
                    if self.unit:
                        conn.sendall(self.unit)
                        self._stop.wait(self.every)
                    else:  # silence, until the client goes
                        with contextlib.suppress(TimeoutError):
                            if not conn.recv(1):
                                break
                conn.close()


_CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
DRIBBLES = {  # what a server on the allow list may do to hold a fetch
    "status line": (b"HTTP/1.1 200 ", b"K"),
    "header lines": (b"HTTP/1.1 200 OK\r\nX-Drip: ", b"a"),
    "interim responses": (b"", b"HTTP/1.1 100 Continue\r\n\r\n", 0.3),  # slower than the cap
    "chunk-size line": (_CHUNKED, b"0"),  # leading zeros: a size line that never ends
    "chunk data": (_CHUNKED + b"ffff\r\n", b"a"),
    "chunk stall": (_CHUNKED + b"ffff\r\nabc", b""),  # then silence
    "body without length": (b"HTTP/1.1 200 OK\r\n\r\n", b"a"),
}


def timed_out(result: wasmbox.CallResult, started: float, call_timeout: float = 2.0) -> None:
    """The call ended as `timeout`, and within SLACK of the call's deadline."""
    elapsed = time.perf_counter() - started
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.TIMEOUT, result
    assert elapsed < call_timeout + SLACK, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("pattern", list(DRIBBLES))
def test_a_hostile_server_cannot_hold_a_fetch_past_its_deadline(fbox: wasmbox.Sandbox, pattern: str) -> None:
    with Hostile(*DRIBBLES[pattern]) as server:  # type: ignore[arg-type]
        started = time.perf_counter()
        result = fetch(fbox, [f"127.0.0.1:{server.port}"], f"http://127.0.0.1:{server.port}/", timeout="1s")
        timed_out(result, started)
        assert result.host_calls[0].name == "http.fetch"


def test_the_deadline_holds_over_ipv6_loopback_too(fbox: wasmbox.Sandbox) -> None:
    try:
        server = Hostile(*DRIBBLES["header lines"], host="::1")  # type: ignore[arg-type]
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with server:
        started = time.perf_counter()
        timed_out(
            fetch(fbox, [f"[::1]:{server.port}"], f"http://[::1]:{server.port}/", timeout="1s"), started
        )
    with Hostile(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", host="::1") as server:
        assert fetch(fbox, [f"[::1]:{server.port}"], f"http://[::1]:{server.port}/").unwrap()["body"] == b"ok"


def test_a_fetch_timeout_in_a_python_guest_is_a_timeout(fbox: wasmbox.Sandbox) -> None:
    assert fbox.run_python("0").ok  # the runtime is built and loaded before the clock starts
    with Hostile(*DRIBBLES["header lines"]) as server:  # type: ignore[arg-type]
        grants = {"name": "py", "runtime": "python", "host_functions": ["http.fetch"],
                  "network": {"allow": [f"127.0.0.1:{server.port}"], "timeout": "1s"}}  # fmt: skip
        code = f"from wasmbox_guest import call_host\ncall_host('http.fetch', url='http://127.0.0.1:{server.port}/')"
        started = time.perf_counter()
        timed_out(fbox.run_python(code, grants), started)


def test_interim_responses_are_capped(fbox: wasmbox.Sandbox) -> None:
    flood = b"HTTP/1.1 100 Continue\r\n\r\n" * 64
    with Hostile(flood, flood, 0.01) as server:
        started = time.perf_counter()
        result = fetch(fbox, [f"127.0.0.1:{server.port}"], f"http://127.0.0.1:{server.port}/")
        assert time.perf_counter() - started < 2.0 + SLACK
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.HOST_ERROR, result
    assert "more than 8 interim (1xx) responses" in (result.host_calls[0].detail or "")


def test_other_interim_responses_are_skipped_and_101_is_refused(fbox: wasmbox.Sandbox) -> None:
    hints = (b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
             b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # fmt: skip
    with Hostile(hints) as server:
        value = fetch(fbox, [f"127.0.0.1:{server.port}"], f"http://127.0.0.1:{server.port}/").unwrap()
    assert value["status"] == 200 and value["body"] == b"ok" and "link" not in value["headers"]
    with Hostile(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n") as server:
        result = fetch(fbox, [f"127.0.0.1:{server.port}"], f"http://127.0.0.1:{server.port}/")
    assert result.error is not None and "no upgrade was asked for" in (result.host_calls[0].detail or "")


def test_a_slow_resolver_cannot_hold_a_fetch(cache_dir: Any) -> None:
    release = threading.Event()

    def stalling(host: str, port: int) -> list[str]:
        release.wait(LIFETIME)  # a lookup that does not answer (until the test ends)
        return ["127.0.0.1"]

    try:
        with wasmbox.Sandbox(cache_dir=cache_dir, resolver=stalling) as box:
            started = time.perf_counter()
            timed_out(fetch(box, ["127.0.0.1/32"], "http://slow-dns.example.test/", timeout="1s"), started)
            assert "name lookup" in (
                box.tool("fetch").call({"url": "http://x.test/"}).host_calls[0].detail or ""
            )
    finally:
        release.set()


def test_lookups_that_do_not_answer_are_capped(cache_dir: Any, server: int) -> None:
    release = threading.Event()

    def stalling(host: str, port: int) -> list[str]:
        if host == "stuck.example.test":
            release.wait(LIFETIME)
        return ["127.0.0.1"]

    allow = [f"127.0.0.1:{server}", "stuck.example.test:80"]
    try:
        with wasmbox.Sandbox(cache_dir=cache_dir, resolver=stalling) as box:
            tool = core_tool(box, allow, timeout="50ms")
            details = [
                tool.call({"url": "http://stuck.example.test/"}).host_calls[0].detail or "" for _ in range(40)
            ]
            assert any("too many earlier lookups" in d for d in details), details  # 32 left behind at most
            assert "name lookup did not answer" in details[0]
            release.set()  # the lookups left behind finish, and give their places back
            waited = time.monotonic() + 10
            while (
                not (ok := tool.call({"url": f"http://ok.example.test:{server}/"})).ok
                and time.monotonic() < waited
            ):
                time.sleep(0.05)
            assert ok.ok, ok
    finally:
        release.set()


def test_a_slow_connect_cannot_hold_a_fetch(fbox: wasmbox.Sandbox) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)  # never accepted: once its queue is full, a connect waits for an answer
    port = listener.getsockname()[1]
    filler, probe = socket.socket(), socket.socket()
    try:
        filler.connect(("127.0.0.1", port))
        probe.settimeout(0.2)
        try:
            probe.connect(("127.0.0.1", port))
        except TimeoutError:
            pass
        else:
            pytest.skip("this system answers a connect to a full listen queue at once")
        started = time.perf_counter()
        timed_out(fetch(fbox, [f"127.0.0.1:{port}"], f"http://127.0.0.1:{port}/", timeout="1s"), started)
    finally:
        for sock in (filler, probe, listener):
            sock.close()


def test_a_slow_tls_handshake_cannot_hold_a_fetch(fbox: wasmbox.Sandbox) -> None:
    # a TLS record header announcing a 16 KiB handshake message, then one byte at a time
    with Hostile(b"\x16\x03\x03\x40\x00", b"\x00", read_request=False) as server:
        started = time.perf_counter()
        result = fetch(fbox, [f"127.0.0.1:{server.port}"], f"https://127.0.0.1:{server.port}/", timeout="1s")
        timed_out(result, started)


@pytest.fixture(scope="module")
def tls_server_context(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, str]:
    """A server context for tls.example.test (a self-signed certificate made here with the
    openssl command) and the certificate's path, for SSL_CERT_FILE."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=tls.example.test",
         "-addext", "subjectAltName=DNS:tls.example.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, str(cert)


def test_tls_fetches_are_verified_and_bounded_by_the_deadline(
    cache_dir: Any, monkeypatch: pytest.MonkeyPatch, tls_server_context: tuple[ssl.SSLContext, str]
) -> None:
    context, cert = tls_server_context
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # read when a Sandbox's first https fetch loads the CAs
    resolver = Resolver({"tls.example.test": [["127.0.0.1"]], "other.example.test": [["127.0.0.1"]]})
    with wasmbox.Sandbox(cache_dir=cache_dir, resolver=resolver) as box:
        reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        with Hostile(reply, tls=context) as server:
            allow = [f"127.0.0.1:{server.port}"]
            value = fetch(box, allow, f"https://tls.example.test:{server.port}/").unwrap()
            assert value["status"] == 200 and value["body"] == b"ok"
            wrong_name = fetch(box, allow, f"https://other.example.test:{server.port}/")
            assert wrong_name.error is not None and "CERTIFICATE_VERIFY_FAILED" in wrong_name.error.message
        with Hostile(*DRIBBLES["header lines"], tls=context) as server:  # type: ignore[misc]
            started = time.perf_counter()
            url = f"https://tls.example.test:{server.port}/"
            timed_out(fetch(box, [f"127.0.0.1:{server.port}"], url, timeout="1s"), started)


def test_close_is_not_held_by_a_fetch_past_the_call_deadline(cache_dir: Any) -> None:
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    with Hostile(*DRIBBLES["header lines"]) as server:  # type: ignore[arg-type]
        allow = [f"127.0.0.1:{server.port}"]
        tool = box.load({"name": "fetch", "module": wat("fetch"), "host_functions": ["http.fetch"],
                         "limits": {"timeout": "2s"}, "network": {"allow": allow, "timeout": "60s"}})  # fmt: skip
        results: list[wasmbox.CallResult] = []
        started = time.perf_counter()
        caller = threading.Thread(
            target=lambda: results.append(tool.call({"url": f"http://127.0.0.1:{server.port}/"}))
        )
        caller.start()
        assert server.accepted.wait(2.0 + SLACK)
        box.close()  # waits for the call in flight, which its deadline ends
        closed = time.perf_counter() - started
        caller.join()
    assert closed < 2.0 + SLACK, f"close() returned {closed:.1f} s after the call started"
    timed_out(results[0], started)


def test_a_name_nobody_allowed_is_never_looked_up(fbox: wasmbox.Sandbox, resolver: Resolver) -> None:
    """With name rules only, a host:port outside them is refused before any lookup, so a guest
    cannot make the host resolve names of its choosing (a stalling name server, or data sent
    out in the names)."""
    resolver.answers["api.weather.test"] = [["93.184.216.34"]]
    for url in ("http://secret-data.attacker.test/", "http://api.weather.test:8080/"):
        assert "is not in the allow list" in refused(fetch(fbox, ["api.weather.test:80"], url))
    assert resolver.lookups == []
    # an address rule for the port may match whatever a name resolves to: then it is looked up
    resolver.answers["elsewhere.test"] = [["8.8.8.8"]]
    assert "is not in the allow list" in refused(fetch(fbox, ["203.0.113.0/24"], "http://elsewhere.test/"))
    assert resolver.lookups == ["elsewhere.test"]


# --- Narrow rules: their checks at load, and how plain and narrow entries combine ----------------

_API = "api.example.com:443"


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"host": _API, "methods": ["get"]}, "in upper case"),
        ({"host": _API, "methods": []}, "at least 1 item"),
        ({"host": _API, "paths": ["v1"]}, "must start with '/'"),
        ({"host": _API, "paths": ["/v1/../admin"]}, "'..' segment"),
        ({"host": _API, "paths": ["/v1//x"]}, "empty segment"),
        ({"host": _API, "paths": ["/v1/**/x"]}, "only be the last segment"),
        ({"host": _API, "paths": ["/v1/a**"]}, "whole segment"),
        ({"host": _API, "paths": ["/v1/%41"]}, "canonical form"),
        ({"host": _API, "headers": ["Host"]}, "set by the host"),
        ({"host": _API, "forbid_headers": ["bad header"]}, "not a header name"),
        ({"host": _API, "query": ["a=b"]}, "not a parameter name"),
        ({"host": _API, "max_calls": 0}, "greater than or equal to 1"),
        ({"host": _API, "max_body": "lots"}, "size"),
        ({"host": _API, "colour": "red"}, "Extra inputs"),
        ({"host": "api.example.com", "methods": ["GET"]}, "needs its port"),
        ({"host": _API, "secret": {"header": "Authorization"}}, "the secret's source"),
        ({"host": _API, "secret": {"header": "Authorization", "env": "T", "sandbox": "t"}}, "the secret's source"),
        ({"host": _API, "secret": {"header": "Host", "env": "T"}}, "set by the host"),
        ({"host": _API, "secret": {"header": "Authorization", "env": "T", "prefix": "a\r\n"}}, "control characters"),
        ({"host": _API, "headers": ["Authorization"], "secret": {"header": "authorization", "env": "T"}},
         "the secret's header"),
    ],
)  # fmt: skip
def test_bad_rules_are_manifest_errors(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(wasmbox.ManifestError, match=re.escape(message)):
        wasmbox.Manifest.load({"name": "n", "runtime": "python", "host_functions": ["http.fetch"],
                               "network": {"allow": [entry]}})  # fmt: skip


def test_plain_and_narrow_entries_mix_in_toml(tmp_path: Any) -> None:
    path = tmp_path / "m.toml"
    path.write_text(
        'name = "n"\nruntime = "python"\nhost_functions = ["http.fetch"]\n[network]\n'
        'allow = ["203.0.113.0/24", { host = "api.example.com:443", methods = ["GET"], paths = ["/v1/**"] }]\n'
    )
    allow = wasmbox.Manifest.load(path).network.allow  # type: ignore[union-attr]
    assert allow[0] == "203.0.113.0/24"
    assert isinstance(allow[1], wasmbox.EgressRule) and allow[1].paths == ("/v1/**",)


def test_a_request_is_sent_under_the_first_rule_that_admits_it(fbox: wasmbox.Sandbox, server: int) -> None:
    """Rules for one host:port are alternatives: a request one refuses another may admit, and
    a request none admits is refused naming each."""
    narrow = {"host": f"127.0.0.1:{server}", "methods": ["GET"], "paths": ["/a"]}
    other = {"host": f"127.0.0.1:{server}", "methods": ["POST"], "paths": ["/b"]}
    tool = core_tool(fbox, [narrow, other])
    assert json.loads(tool.call({"url": f"http://127.0.0.1:{server}/a"}).unwrap()["body"])["path"] == "/a"
    assert (
        tool.call({"url": f"http://127.0.0.1:{server}/b", "method": "POST", "body": "x"}).unwrap()["status"]
        == 201
    )
    detail = refused(tool.call({"url": f"http://127.0.0.1:{server}/b"}))
    assert "network.allow[0]" in detail and "network.allow[1]" in detail and "method GET" in detail
    anything = core_tool(fbox, [narrow, f"127.0.0.1:{server}"])  # a plain entry beside it: no limits
    assert anything.call({"url": f"http://127.0.0.1:{server}/c"}).unwrap()["status"] == 200


def test_sandbox_secrets_are_checked(cache_dir: Any) -> None:
    """Refused before the Sandbox starts anything (no thread left behind)."""
    threads = threading.active_count()
    with pytest.raises(ValueError, match="not a secret name"):
        wasmbox.Sandbox(cache_dir=cache_dir, secrets={"bad name": "x"})
    with pytest.raises(TypeError, match="a string or a callable"):
        wasmbox.Sandbox(cache_dir=cache_dir, secrets={"api": 42})  # type: ignore[dict-item]
    assert threading.active_count() == threads


def test_a_name_whose_addresses_fall_under_different_rules(
    fbox: wasmbox.Sandbox, resolver: Resolver, server: int
) -> None:
    """Plain entries allow a name's addresses between them, as they always have; a narrow rule
    must allow every address itself, so its limits and secret are never mixed with another's."""
    resolver.answers["split.example.test"] = [["127.0.0.1", "10.0.0.7"]]
    target = f"http://split.example.test:{server}/a"
    plain = core_tool(fbox, [f"127.0.0.1:{server}", "10.0.0.0/8"])
    assert plain.call({"url": target}).unwrap()["status"] == 200
    narrow = {"host": f"127.0.0.1:{server}", "methods": ["GET"], "paths": ["/a"]}
    mixed = core_tool(fbox, [narrow, "10.0.0.0/8"])
    assert "not all within one rule" in refused(mixed.call({"url": target}))
