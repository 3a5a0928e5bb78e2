"""Hostile guests against a narrow `[network]` rule and the secret it attaches.

One rule allows GET and POST on a few paths of a loopback server, two query names, two
headers, a 1 KiB body and 5 requests per call, and attaches `Authorization: Bearer TOKEN` from
`Sandbox(secrets=...)`. Guests try every method, path, query, header and body trick against it,
redirects out of it, and hunting for the token. The server (`egress_server.py`, in a process
of its own) logs every request it gets, so "refused before anything is sent" is checked on the
server's side, and so is the token's arrival.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox

from ..conftest import wat
from .conftest import Guarded

TOKEN = "wasmbox-egress-token-5c1e9b7a40d2"  # the secret: never in a guest's code or args
SERVER = Path(__file__).with_name("egress_server.py")
LIMITS = {"fuel": 5_000_000_000, "timeout": "60s"}


class Server:
    """The loopback server's port and the requests it has logged."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def mark(self) -> int:
        return len(self.requests())

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.requests()[mark:]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("egress") / "requests.jsonl"
    process = subprocess.Popen(
        [sys.executable, str(SERVER), str(log)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "EGRESS_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield Server(port, log)
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


@pytest.fixture
def sandbox_options() -> dict[str, Any]:
    return {"secrets": {"api": TOKEN}}


def rule(server: Server, **changes: Any) -> dict[str, Any]:
    narrow = {
        "host": f"127.0.0.1:{server.port}",
        "methods": ["GET", "POST"],
        "paths": ["/v1/items", "/v1/items/*", "/v1/public/**"],
        "query": ["page", "go", "code"],
        "headers": ["Accept", "Content-Type"],
        "max_body": "1KiB",
        "max_calls": 5,
        "secret": {"header": "Authorization", "prefix": "Bearer ", "sandbox": "api"},
    }
    return {**narrow, **changes}


def fetch_tool(guarded: Guarded, *allow: Any) -> wasmbox.Tool:
    """The core fetch tool (its args are http.fetch's, its value the reply) under `allow`."""
    return guarded.box.load({"name": "fetch", "module": wat("fetch"), "host_functions": ["http.fetch"],
                             "limits": LIMITS, "network": {"allow": list(allow)}}, replace=True)  # fmt: skip


def denied(result: wasmbox.CallResult, *words: str) -> str:
    """The call was refused as capability_denied, its record naming the rule and `words`."""
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.CAPABILITY_DENIED, result
    (record,) = result.host_calls
    assert record.verdict == "denied", record
    detail = record.detail or ""
    for word in ("network.allow[0]", *words):
        assert word in detail, (word, detail)
    return detail


def url(server: Server, target: str) -> str:
    return f"http://127.0.0.1:{server.port}{target}"


def test_a_request_inside_the_rule_arrives_with_the_secret(guarded: Guarded, server: Server) -> None:
    tool = fetch_tool(guarded, rule(server))
    mark = server.mark()
    value = tool.call({"url": url(server, "/v1/items?page=2"), "headers": {"Accept": "x/y"}}).unwrap()
    assert json.loads(value["body"]) == {"method": "GET", "target": "/v1/items?page=2", "authorized": True}
    (arrived,) = server.since(mark)
    assert ["Authorization", f"Bearer {TOKEN}"] in arrived["headers"]
    post = tool.call({"url": url(server, "/v1/items/7"), "method": "post", "body": "x" * 1024}).unwrap()
    assert json.loads(post["body"])["method"] == "POST" and server.since(mark)[-1]["body"] == 1024
    del tool
    guarded.assert_untouched()


METHODS = ["DELETE", "PUT", "PATCH", "HEAD", "OPTIONS", "TRACE", "CONNECT", "PROPFIND", "delete"]


def test_methods_outside_the_rule_are_refused_before_anything_is_sent(
    guarded: Guarded, server: Server
) -> None:
    tool = fetch_tool(guarded, rule(server))
    mark = server.mark()
    for method in METHODS:
        denied(tool.call({"url": url(server, "/v1/items"), "method": method}), f"method {method.upper()}")
        for override in ("X-HTTP-Method-Override", "x-http-method", "X-Method-Override"):
            args = {"url": url(server, "/v1/items"), "headers": {override: method}}
            denied(tool.call(args), f"header {override!r} may not be set")
    assert server.since(mark) == []
    del tool
    guarded.assert_untouched()


PATH_TRICKS = [
    "/v1/items/../admin",
    "/v1/items/%2e%2e/admin",
    "/v1/items/%2E%2E/admin",
    "/v1/items/.%2e/admin",
    "/v1/public/./../../admin",
    "/v1/public/..%2fadmin",
    "/v1/items%2f..%2fadmin",
    "/v1/public/%252e%252e/admin",  # double encoding
    "/v1/public/%25",
    "/v1/public/%zz",
    "//v1/items",
    "/v1//items",
    "/v1/public//admin",
    "/v1/items;jsessionid=1",
    "/v1/public;/../admin",
    "/v1/public/a;b",
    "/v1/public/\\..\\admin",
    "/v1/public/%5c..%5cadmin",
    "/v1/public/%00",
    "/v1/public/%0d%0aX-Injected:%201",
    "/v1/public/%ef%bc%8e%ef%bc%8e/admin",  # fullwidth dots: '..' once NFKC-normalized
    "/v1/public/%c0%ae%c0%ae/admin",  # overlong UTF-8 dots
    "/V1/items",
    "/v1/ITEMS",
    "/v1/item",
    "/v1/items.json",
    "/v1/items/",
    "/v1/items/7/delete",
    "/v1/publicity",
    "/admin",
    "/admin#/v1/items",
    "",
]


def test_path_tricks_are_refused_before_anything_is_sent(guarded: Guarded, server: Server) -> None:
    tool = fetch_tool(guarded, rule(server))
    mark = server.mark()
    for path in PATH_TRICKS:
        denied(tool.call({"url": url(server, path)}), "path")
    assert server.since(mark) == []
    del tool
    guarded.assert_untouched()


def test_allowed_paths_are_sent_as_they_were_checked(guarded: Guarded, server: Server) -> None:
    """The path sent is the one checked: decoded once and encoded again; a fragment is never sent."""
    tool = fetch_tool(guarded, rule(server))
    for given, sent in [
        ("/v1/items#/../../admin", "/v1/items"),
        ("/v1/items/%37", "/v1/items/7"),
        ("/v1/public/a%20b/c", "/v1/public/a%20b/c"),
        ("/v1/public/caf%C3%A9", "/v1/public/caf%C3%A9"),
        ("/v1/public/x?", "/v1/public/x"),
        ("/v1/public", "/v1/public"),
    ]:
        value = tool.call({"url": url(server, given)}).unwrap()
        assert json.loads(value["body"])["target"] == sent, given
    del tool
    guarded.assert_untouched()


QUERY_TRICKS = [("admin=1", "'admin'"), ("page=1&admin=1", "'admin'"), ("%61dmin=1", "'admin'"),
                ("page=1&PAGE=2", "'PAGE'"), ("pag%65%00=1", "'page\\x00'"), ("=1", "''"), ("%ff=1", "UTF-8")]  # fmt: skip


def test_query_names_outside_the_rule_are_refused(guarded: Guarded, server: Server) -> None:
    tool = fetch_tool(guarded, rule(server))
    mark = server.mark()
    for query, word in QUERY_TRICKS:
        denied(tool.call({"url": url(server, f"/v1/items?{query}")}), word)
    assert server.since(mark) == []
    del tool
    guarded.assert_untouched()


def test_allowed_queries_are_sent_re_encoded(guarded: Guarded, server: Server) -> None:
    """A `;` or an encoded name cannot smuggle a parameter: the query is decoded, checked and
    encoded again, so the server reads the names that were checked."""
    tool = fetch_tool(guarded, rule(server))
    for given, sent in [("page=1;admin=1", "page=1%3Badmin%3D1"), ("pa%67e=3", "page=3"),
                        ("page=1&page=2", "page=1&page=2"), ("page=a+b", "page=a%20b"),
                        ("page=%26admin%3D1", "page=%26admin%3D1")]:  # fmt: skip
        value = tool.call({"url": url(server, f"/v1/items?{given}")}).unwrap()
        assert json.loads(value["body"])["target"] == f"/v1/items?{sent}", given
    del tool
    guarded.assert_untouched()


HEADER_TRICKS = [
    ({"Authorization": "Bearer mine"}, "set by the host"),
    ({"authorization": "Bearer mine"}, "set by the host"),
    ({"AUTHORIZATION": "Bearer mine"}, "set by the host"),
    ({"Accept": "a", "aUtHoRiZaTiOn": "x"}, "set by the host"),
    ({"X-Api-Key": "k"}, "not one of its headers"),
    ({"Proxy-Authorization": "Basic eA=="}, "not one of its headers"),
    ({"Cookie": "session=1"}, "not one of its headers"),
    ({"X-Forwarded-For": "10.0.0.1"}, "not one of its headers"),
]
MALFORMED_HEADERS = [
    ({"Accept": "a", "accept": "b"}, "given twice"),
    ({"Accept": "a\r\nAuthorization: Bearer mine"}, "invalid header"),
    ({"Accept": "a\nb"}, "invalid header"),
    ({"Accept\r\nAuthorization": "x"}, "invalid header"),
    ({"Accept": "\u2028"}, "invalid header"),
    ({"Host": "evil.test"}, "set by the host"),
    ({"Content-Length": "0"}, "set by the host"),
    ({"Transfer-Encoding": "chunked"}, "set by the host"),
    ({"Content_Length": "0"}, "set by the host"),  # what CGI and WSGI servers read as Content-Length
    ({"X-A": "1", "x_a": "2"}, "given twice"),
]


def test_headers_outside_the_rule_are_refused(guarded: Guarded, server: Server) -> None:
    """The secret's header in any case or with '_' for '-', headers off the rule's list: refused
    by the rule; duplicates, CR/LF, text outside Latin-1 and the host's own headers: invalid
    arguments."""
    tool = fetch_tool(guarded, rule(server))
    mark = server.mark()
    for headers, word in HEADER_TRICKS:
        denied(tool.call({"url": url(server, "/v1/items"), "headers": headers}), word)
    for headers, word in MALFORMED_HEADERS:
        result = tool.call({"url": url(server, "/v1/items"), "headers": headers})
        (record,) = result.host_calls
        assert record.verdict == "invalid_arguments" and word in (record.detail or ""), (headers, record)
    del tool
    keyed = fetch_tool(guarded, rule(server, headers=None, secret={"header": "X-Api-Key", "sandbox": "api"}))
    for name in ("X-Api-Key", "x_api_key", "X_API-KEY"):  # '_' is '-' to CGI and WSGI servers
        denied(keyed.call({"url": url(server, "/v1/items"), "headers": {name: "mine"}}), "set by the host")
    assert server.since(mark) == []
    del keyed
    guarded.assert_untouched()


BODIES = [("x" * 1024, True), ("x" * 1025, False), ("é" * 513, False), (b"\0" * 2048, False), ("", True)]


def test_bodies_over_the_rules_cap_are_refused(guarded: Guarded, server: Server) -> None:
    """The cap counts bytes as sent (text as UTF-8: 513 'é' are 1026 bytes)."""
    tool = fetch_tool(guarded, rule(server))
    for body, ok in BODIES:
        mark = server.mark()
        result = tool.call({"url": url(server, "/v1/items"), "method": "POST", "body": body})
        if ok:
            assert result.ok and server.since(mark)[-1]["body"] == len(body.encode()), result
        else:
            denied(result, "larger than its max_body (1KiB)")
            assert server.since(mark) == []
    del tool
    guarded.assert_untouched()


def test_a_rules_requests_are_capped_per_call(guarded: Guarded, server: Server) -> None:
    grants = {"name": "py", "runtime": "python", "limits": LIMITS, "host_functions": ["http.fetch"],
              "network": {"allow": [rule(server)]}}  # fmt: skip
    code = f"""
from wasmbox_guest import call_host, HostCallError
got = []
for n in range(7):
    try:
        got.append(call_host("http.fetch", url="{url(server, "/v1/items")}")["status"])
    except HostCallError as exc:
        got.append(str(exc))
got
"""
    for _ in range(2):  # a new call has its own count
        mark = server.mark()
        value = guarded.box.run_python(code, grants).unwrap()
        assert value[:5] == [200] * 5 and all("allows 5 request(s) per call" in v for v in value[5:]), value
        assert len(server.since(mark)) == 5
    guarded.assert_untouched()


def test_redirects_are_checked_against_the_rules_and_carry_no_secret_out(
    guarded: Guarded, server: Server
) -> None:
    """A redirect out of the narrow rule is refused before it is followed; one to another rule
    (here a plain rule for the same server's other paths) is sent without the secret; one back
    into the rule carries it again."""
    other = {"host": f"127.0.0.1:{server.port}", "paths": ["/elsewhere"], "methods": ["GET"]}
    tool = fetch_tool(guarded, rule(server), other)
    mark = server.mark()
    out = tool.call({"url": url(server, f"/v1/items?go={url(server, '/admin')}")})
    assert "refused" in (out.host_calls[0].detail or "") and "path '/admin' matches none" in (
        out.host_calls[0].detail or ""
    )
    (sent,) = server.since(mark)  # the first hop only
    assert sent["target"].startswith("/v1/items?go=")
    mark = server.mark()
    value = tool.call({"url": url(server, f"/v1/items?go={url(server, '/elsewhere')}")}).unwrap()
    assert json.loads(value["body"]) == {"method": "GET", "target": "/elsewhere", "authorized": False}
    first, second = server.since(mark)
    assert ["Authorization", f"Bearer {TOKEN}"] in first["headers"]
    assert not any(name.lower() == "authorization" for name, _ in second["headers"])
    mark = server.mark()
    back = tool.call({"url": url(server, f"/v1/items?go={url(server, '/v1/items/2')}")}).unwrap()
    assert json.loads(back["body"])["authorized"] is True
    # 307 keeps the method and body: the body is checked against the hop's rule too
    post = tool.call({"url": url(server, f"/v1/items?code=307&go={url(server, '/elsewhere')}"),
                      "method": "POST", "body": "x"})  # fmt: skip
    assert "method POST is not one of its methods (GET)" in (post.host_calls[0].detail or "")
    del tool
    guarded.assert_untouched()


HUNT = """
import gc, json, os, sys
from wasmbox_guest import call_host, HostCallError
found = {"env": dict(os.environ), "argv": sys.argv}
for path in ("/proc/self/environ", "/proc/1/environ", "/etc/environment"):
    try:
        found[path] = open(path).read()
    except OSError as exc:
        found[path] = repr(exc)
replies = []
for args in [
    {"url": "URL/v1/items"},
    {"url": "URL/v1/public/echo"},
    {"url": "URL/v1/items", "headers": {"Authorization": "Bearer mine"}},
    {"url": "URL/v1/items?go=URL/admin"},
    {"url": "URL/v1/items?go=URL/v1/public/echo"},
    {"url": "URL/v1/public/x%0d%0a"},
    {"url": "http://127.0.0.1:1/v1/items"},
]:
    try:
        replies.append(call_host("http.fetch", **args))
    except HostCallError as exc:
        replies.append(repr(exc))
heap = []
for obj in gc.get_objects():
    if isinstance(obj, dict):
        heap += [v for v in obj.values() if isinstance(v, (str, bytes))]
    elif isinstance(obj, (list, tuple)):
        heap += [v for v in obj if isinstance(v, (str, bytes))]
found["replies"] = repr(replies)
found["heap"] = repr(heap)
print(found["replies"])
found
"""


HUNT_RECORDS: list[wasmbox.AuditRecord] = []


@pytest.mark.parametrize("sandbox_options", [{"secrets": {"api": TOKEN}, "audit": HUNT_RECORDS.append}])
def test_a_guest_hunting_for_the_secret_finds_nothing(guarded: Guarded, server: Server) -> None:
    """The token arrives at the server, yet the guest finds it nowhere it can look: its
    environment, files, every reply and error of its host calls (a redirect, a server echoing
    the header back: cut out), its own heap; nor is it in the CallResult or the audit record."""
    grants = {"name": "hunt", "runtime": "python", "limits": LIMITS, "host_functions": ["http.fetch"],
              "network": {"allow": [rule(server, max_calls=None)]}}  # fmt: skip
    mark = server.mark()
    result = guarded.box.run_python(HUNT.replace("URL", url(server, "")), grants)
    assert result.ok, result
    arrived = server.since(mark)
    assert sum(["Authorization", f"Bearer {TOKEN}"] in r["headers"] for r in arrived) >= 4, arrived
    dumped = json.dumps(result.model_dump(mode="json"), default=str)
    assert TOKEN not in dumped and TOKEN[:16] not in dumped
    assert "[redacted]" in result.value["replies"]  # the echo came back without it
    guarded.assert_untouched()
    assert any(record.tool == "hunt" for record in HUNT_RECORDS)
    assert not any(TOKEN in json.dumps(record.as_dict(), default=str) for record in HUNT_RECORDS)


JS_HUNT = """
const out = {env: std.getenviron ? std.getenviron() : null, replies: []};
for (const args of [{url: "URL/v1/public/echo"}, {url: "URL/v1/items?go=URL/v1/public/echo"},
                    {url: "URL/v1/items", headers: {authorization: "Bearer mine"}}]) {
  try { out.replies.push(wasmbox.callHost("http.fetch", args)); }
  catch (e) { out.replies.push(e.name + ": " + e.message); }
}
out
"""


@pytest.mark.usefixtures("javascript_runtime")
def test_a_javascript_guest_hunting_for_the_secret_finds_nothing(guarded: Guarded, server: Server) -> None:
    """The same hunt from the JavaScript runtime: its environment, an echoing server (directly
    and through a redirect), setting the header itself."""
    grants = {"name": "hunt_js", "runtime": "javascript", "limits": LIMITS, "host_functions": ["http.fetch"],
              "network": {"allow": [rule(server)]}}  # fmt: skip
    mark = server.mark()
    result = guarded.box.run_javascript(JS_HUNT.replace("URL", url(server, "")), grants)
    assert result.ok, result
    assert sum(["Authorization", f"Bearer {TOKEN}"] in r["headers"] for r in server.since(mark)) == 3
    echoed = [base64.b64decode(reply["body"]) for reply in result.value["replies"][:2]]
    assert all(b"Bearer [redacted]" in body for body in echoed), echoed
    assert "set by the host" in result.value["replies"][2]
    assert TOKEN not in json.dumps(result.model_dump(mode="json"), default=str)
    guarded.assert_untouched()


def test_a_missing_or_unusable_secret_is_a_clear_error(
    guarded: Guarded, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_env = rule(
        server, secret={"header": "Authorization", "prefix": "Bearer ", "env": "EGRESS_TEST_TOKEN"}
    )
    tool = fetch_tool(guarded, from_env)
    monkeypatch.delenv("EGRESS_TEST_TOKEN", raising=False)
    mark = server.mark()
    missing = tool.call({"url": url(server, "/v1/items")})
    assert missing.error is not None and missing.error.kind is wasmbox.ErrorKind.HOST_ERROR
    assert "the host's environment has no EGRESS_TEST_TOKEN" in (missing.host_calls[0].detail or "")
    monkeypatch.setenv("EGRESS_TEST_TOKEN", TOKEN)
    assert json.loads(tool.call({"url": url(server, "/v1/items")}).unwrap()["body"])["authorized"] is True
    monkeypatch.setenv("EGRESS_TEST_TOKEN", f"{TOKEN}\r\nX-Injected: 1")
    broken = tool.call({"url": url(server, "/v1/items")})
    assert "cannot be sent in a header" in (broken.host_calls[0].detail or "")
    assert TOKEN not in json.dumps(broken.model_dump(mode="json"), default=str)
    assert len(server.since(mark)) == 1  # only the call with a usable secret sent anything
    del tool
    guarded.assert_untouched()


def test_a_secret_callable_that_fails_does_not_leak_its_message(cache_dir: Path, server: Server) -> None:
    def failing() -> str:
        raise RuntimeError(f"vault said no to {TOKEN}")

    with wasmbox.Sandbox(cache_dir=cache_dir, secrets={"api": failing}) as box:
        tool = box.load({"name": "fetch", "module": wat("fetch"), "host_functions": ["http.fetch"],
                         "network": {"allow": [rule(server)]}})  # fmt: skip
        result = tool.call({"url": url(server, "/v1/items")})
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.HOST_ERROR
    assert "reading secret 'api' failed (RuntimeError)" in (result.host_calls[0].detail or "")
    assert TOKEN not in json.dumps(result.model_dump(mode="json"), default=str)


def test_a_secret_goes_over_https_or_to_loopback_only(cache_dir: Path) -> None:
    """Plain http to a public address would put the secret on the wire in clear: refused
    before any connection."""
    with wasmbox.Sandbox(cache_dir=cache_dir, secrets={"api": TOKEN},
                         resolver=lambda host, port: ["93.184.216.34"]) as box:  # fmt: skip
        narrow = {"host": "api.example.com:443", "methods": ["GET"], "paths": ["/**"],
                  "secret": {"header": "Authorization", "sandbox": "api"}}  # fmt: skip
        tool = box.load({"name": "fetch", "module": wat("fetch"), "host_functions": ["http.fetch"],
                         "network": {"allow": [narrow]}})  # fmt: skip
        result = tool.call({"url": "http://api.example.com:443/x"})
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.CAPABILITY_DENIED
    assert "its secret is sent over https only" in (result.host_calls[0].detail or "")


def test_a_secret_the_sandbox_was_not_given_is_refused_at_load(cache_dir: Path, server: Server) -> None:
    with (
        wasmbox.Sandbox(cache_dir=cache_dir) as box,
        pytest.raises(wasmbox.CapabilityError, match="secrets="),
    ):
        box.load({"name": "fetch", "module": wat("fetch"), "host_functions": ["http.fetch"],
                  "network": {"allow": [rule(server)]}})  # fmt: skip
