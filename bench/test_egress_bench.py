"""The per-request cost of checking an `http.fetch` request against `[network]` rules
(pytest-benchmark).

    ./dev bench bench/test_egress_bench.py --benchmark-columns=median,ops

The steps `fetch.Fetcher._once` takes before it connects, for one request: the compiled rules
(cached per allow list), the host:port check, the request checked against each rule that
reaches it, the rule chosen for its (already resolved) address, and the request target. The
baseline is a plain "host:port" entry; beside it, in the same run, a narrow rule (methods,
paths, query names, headers, a body cap, a per-call cap and a secret), the narrow rule
refusing a request, and five narrow rules for the same host of which the last admits it. A
whole fetch from a core module to a server on loopback, under the plain and the narrow rule,
shows the check's share of a real request.
"""

from __future__ import annotations

import http.server
import ipaddress
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

import wasmbox
from wasmbox._capabilities import fetch
from wasmbox._capabilities.allowlist import unlisted
from wasmbox._capabilities.egress import Request, compile_rules
from wasmbox._errors import CapabilityDeniedError
from wasmbox._manifest import Network

from .test_core_bench import WAT  # the example guests' folder

HOST = "203.0.113.7:443"
ADDRESSES = [ipaddress.ip_address("203.0.113.7")]
NARROW = {
    "host": HOST, "methods": ["GET", "POST"], "paths": ["/v1/items", "/v1/items/*", "/v1/public/**"],
    "query": ["page", "q"], "headers": ["Accept", "Content-Type"], "max_body": "1KiB", "max_calls": 50,
    "secret": {"header": "Authorization", "prefix": "Bearer ", "sandbox": "api"},
}  # fmt: skip
URL = "https://203.0.113.7/v1/items/42?page=2&q=wasm"
HEADERS = {"Accept": "application/json"}


def _network(*allow: Any) -> Network:
    return Network.model_validate({"allow": list(allow)})


CASES = {
    "plain": (_network(HOST), URL),
    "narrow": (_network(NARROW), URL),
    "narrow_refused": (_network(NARROW), "https://203.0.113.7/v1/admin?page=2"),
    "five_narrow": (_network(*[{**NARROW, "paths": [f"/v{n}/**"]} for n in (2, 3, 4, 5)], NARROW), URL),
}


def check(network: Network, url: str) -> str | None:
    """What `_once` does with a request before it connects (the lookup aside): the target it
    would send, or None when a rule refuses it."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    rules = compile_rules(network.allow)
    if unlisted([rule.dest for rule in rules], host, port) is not None:
        return None
    request = Request("GET", parts.path, parts.query, HEADERS, None)
    try:
        admitting = fetch._admitting(rules, host, port, request)
        rule = fetch._rule_for(admitting, host, port, ADDRESSES)
    except CapabilityDeniedError:
        return None
    return request.target(rule)


@pytest.mark.parametrize("case", list(CASES))
def test_rule_check(benchmark: Any, case: str) -> None:
    network, url = CASES[case]
    target = benchmark(check, network, url)
    assert (target is None) == (case == "narrow_refused"), target


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


@pytest.mark.parametrize("case", ["plain", "narrow"])
def test_fetch(benchmark: Any, server: int, case: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    host = f"127.0.0.1:{server}"
    allow = host if case == "plain" else {**NARROW, "host": host, "max_calls": None}
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache"), secrets={"api": "t" * 32}) as box:
        tool = box.load({"name": "fetch", "module": str(WAT / "fetch.wat"), "host_functions": ["http.fetch"],
                         "network": {"allow": [allow]}})  # fmt: skip
        args = {"url": f"http://{host}/v1/items/42?page=2&q=wasm", "headers": HEADERS}
        assert tool.call(args).unwrap()["status"] == 200
        result = benchmark(tool.call, args)
    assert result.ok, result
