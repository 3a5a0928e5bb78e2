"""`wasmbox mcp serve` and `wasmbox.integrations.mcp`, driven by the official mcp SDK's client
over stdio, over streamable HTTP on loopback, and in-process."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")

import httpx2
import mcp_types as types
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import wasmbox
from wasmbox.cli import main
from wasmbox.integrations import mcp as wasmbox_mcp

from .conftest import wat

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["text"],
    "additionalProperties": False,
}
CONCURRENT = 3  # calls the rendezvous tool holds in flight at once
# Each call makes a file named by its `key` in the shared folder, then polls until `n` files
# are there (the sandbox has no sleep): served one at a time, the first would spin until its
# deadline (an error result) instead of returning.
MEET_PY = """
import os

def main(key: str, n: int) -> int:
    open(f"/meet/{key}", "w").close()
    while len(os.listdir("/meet")) < n:
        pass
    return n
"""


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("mcp")
    (folder / "meet").mkdir()
    (folder / "meet.py").write_text(MEET_PY)
    found = {
        "echo": {"name": "echo", "description": "Echo the args", "module": wat("echo"),
                 "input_schema": ECHO_SCHEMA},
        "trap": {"name": "trap", "description": "Divide by zero", "module": wat("trap")},
        "meet": {"name": "meet", "description": "Wait for the others", "runtime": "python",
                 "source": str(folder / "meet.py"), "entry": "main",
                 "limits": {"timeout": "60s", "fuel": 10**11},  # spinning costs ~150M a second
                 "preopens": [{"host": str(folder / "meet"), "guest": "/meet", "writable": True}]},
    }  # fmt: skip
    paths = []
    for name, fields in found.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(fields))
        paths.append(path)
    return paths


def _serve_args(manifests: list[Path], *extra: str, python: bool = True) -> list[str]:
    return ["-m", "wasmbox", "mcp", "serve", *map(str, manifests), *(["--python"] if python else []),
            "--max-workers", str(CONCURRENT + 1), *extra]  # fmt: skip


def _env(cache_dir: Path) -> dict[str, str]:
    return {"WASMBOX_CACHE_DIR": str(cache_dir), "PYTHONPATH": os.pathsep.join(sys.path)}


def _text(result: types.CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    return result.content[0].text


async def _exercise(session: ClientSession, meet_dir: Path) -> None:
    """What every transport must do: list, succeed, fail as results, refuse unknown names,
    and serve calls concurrently."""
    listed = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert set(listed) == {"echo", "trap", "meet", "run_python"}
    assert listed["echo"].input_schema == ECHO_SCHEMA  # the manifest's schema, as is
    assert listed["echo"].description == "Echo the args"
    hints = listed["meet"].annotations  # from the grants: a writable preopen can change things
    assert hints is not None and hints.read_only_hint is False and hints.open_world_hint is False
    assert listed["echo"].annotations is not None and listed["echo"].annotations.read_only_hint is True
    assert listed["run_python"].input_schema["required"] == ["code"]

    ok = await session.call_tool("echo", {"text": "héllo", "n": 2})
    assert ok.is_error is False
    assert json.loads(_text(ok)) == {"text": "héllo", "n": 2}

    bad = await session.call_tool("echo", {"n": "two"})  # the model may read this and retry
    assert bad.is_error is True and json.loads(_text(bad))["error"]["kind"] == "invalid_arguments"
    trapped = await session.call_tool("trap", {})
    assert trapped.is_error is True and json.loads(_text(trapped))["error"]["kind"] == "trap"

    python = await session.call_tool("run_python", {"code": "print('hi')\n6 * 7"})
    assert python.is_error is False
    assert json.loads(_text(python)) == {"value": 42, "stdout": "hi\n"}
    no_code = await session.call_tool("run_python", {"source": "1"})
    assert no_code.is_error is True and "invalid_arguments" in _text(no_code)

    with pytest.raises(MCPError) as refused:  # a protocol error, not a result
        await session.call_tool("rm_rf", {})
    assert refused.value.code == types.INVALID_PARAMS and "rm_rf" in refused.value.message

    for old in meet_dir.iterdir():
        old.unlink()
    results = await asyncio.gather(*(
        session.call_tool("meet", {"key": f"k{i}", "n": CONCURRENT}) for i in range(CONCURRENT)
    ))  # fmt: skip
    assert [(r.is_error, _text(r)) for r in results] == [(False, str(CONCURRENT))] * CONCURRENT


def test_stdio_server(manifests: list[Path], cache_dir: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=_serve_args(manifests), env=_env(cache_dir))

    async def run() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await _exercise(session, manifests[0].parent / "meet")

    asyncio.run(asyncio.wait_for(run(), 300))


@contextmanager
def _http_server(manifests: list[Path], cache_dir: Path, *extra: str, python: bool = True) -> Iterator[str]:
    """`wasmbox mcp serve --transport http --port 0` in a subprocess; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, *_serve_args(manifests, "--transport", "http", "--port", "0", *extra, python=python)],
        env={**os.environ, **_env(cache_dir)}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stderr is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()  # type: ignore[union-attr]
    try:
        seen = []
        while True:  # (the first run may build the Python runtime first: progress lines)
            line = lines.get(timeout=300)
            seen.append(line)
            if "serving MCP on " in line:
                yield line.rsplit(" ", 1)[1].strip()
                break
            assert process.poll() is None, "".join(seen)
    finally:
        process.terminate()
        code = process.wait(timeout=60)
    assert code == 0  # SIGTERM stops uvicorn, then the Sandbox closes


TOKEN = "t0ken-" + "x" * 40


def _initialize() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "page", "version": "1"}}}  # fmt: skip


def test_streamable_http_server_on_loopback(manifests: list[Path], cache_dir: Path) -> None:
    with _http_server(manifests, cache_dir) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")

        async def run() -> None:
            async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                await _exercise(session, manifests[0].parent / "meet")

        asyncio.run(asyncio.wait_for(run(), 300))

        # DNS rebinding: a web page whose name resolves to 127.0.0.1 sends its own Host/Origin
        initialize = _initialize()
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        with httpx2.Client() as http:
            assert http.post(url, json=initialize, headers=headers).status_code == 200
            rebound = http.post(url, json=initialize, headers={**headers, "Host": "evil.example"})
            assert rebound.status_code == 421
            foreign = http.post(url, json=initialize, headers={**headers, "Origin": "http://evil.example"})
            assert foreign.status_code == 403


def test_http_with_a_token_serves_only_requests_that_carry_it(
    manifests: list[Path], cache_dir: Path, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    extra = ("--auth-token-file", str(token_file), "--allowed-host", "mcp.example.test")
    with _http_server(manifests[:1], cache_dir, *extra, python=False) as url:

        async def connect(headers: dict[str, str]) -> list[str]:
            from mcp.shared._httpx_utils import create_mcp_http_client

            async with (
                create_mcp_http_client(headers=headers) as http,
                streamable_http_client(url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return [tool.name for tool in (await session.list_tools()).tools]

        for refused in ({}, {"Authorization": "Bearer " + TOKEN[:-1] + "y"}, {"Authorization": TOKEN}):
            with pytest.raises(BaseException) as failed:  # the client's error, in exception groups
                asyncio.run(asyncio.wait_for(connect(refused), 60))
            assert failed.group_contains(MCPError, match="error response"), failed.value
        assert asyncio.run(asyncio.wait_for(connect({"Authorization": f"Bearer {TOKEN}"}), 60)) == ["echo"]

        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        right = {**headers, "Authorization": f"Bearer {TOKEN}"}
        with httpx2.Client() as http:
            for wrong in (None, (TOKEN + "x").encode(), TOKEN[:-1].encode(), "é".encode() * 23,
                          TOKEN.upper().encode(), b"\xff" * 46):  # fmt: skip
                sent = headers if wrong is None else {**headers, "Authorization": b"Bearer " + wrong}
                answer = http.post(url, json=_initialize(), headers=sent)
                assert answer.status_code == 401, (wrong, answer.status_code)
                assert answer.headers["WWW-Authenticate"].startswith("Bearer ")
                assert answer.json()["error"] == "invalid_token"
            assert http.post(url, json=_initialize(), headers=right).status_code == 200
            # DNS rebinding: with the token too, a Host or Origin not allowed is refused
            assert (
                http.post(url, json=_initialize(), headers={**right, "Host": "evil.example"}).status_code
                == 421
            )
            allowed = {**right, "Host": "mcp.example.test:8443"}
            assert http.post(url, json=_initialize(), headers=allowed).status_code == 200
            foreign = {**right, "Origin": "http://evil.example"}
            assert http.post(url, json=_initialize(), headers=foreign).status_code == 403


def test_serving_a_network_address_needs_a_token(
    manifests: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base = ["mcp", "serve", str(manifests[0]), "--transport", "http"]
    assert main([*base, "--host", "0.0.0.0", "--allow-remote"]) == 2
    assert "--auth-token-file" in capsys.readouterr().err
    with wasmbox.Sandbox(cache_dir=None) as box, pytest.raises(ValueError, match="auth_token"):
        asyncio.run(wasmbox_mcp.serve_http(box, host="10.1.2.3", port=0, allow_remote=True))
    short = tmp_path / "short"
    short.write_text("secret\n")
    assert main([*base, "--auth-token-file", str(short)]) == 2
    assert "at least 32" in capsys.readouterr().err
    assert main([*base, "--auth-token-env", "WASMBOX_TEST_NO_SUCH_TOKEN"]) == 2
    assert "not set" in capsys.readouterr().err
    assert main(["mcp", "serve", str(manifests[0]), "--auth-token-env", "X"]) == 2  # stdio has no tokens
    assert "--transport http" in capsys.readouterr().err
    assert main([*base, "--allowed-host", "https://x.example/"]) == 2
    assert "Host header value" in capsys.readouterr().err
    monkeypatch.setenv("WASMBOX_TEST_TOKEN", f"  {TOKEN}\n")
    assert wasmbox_mcp.read_token(env="WASMBOX_TEST_TOKEN") == TOKEN
    monkeypatch.setenv("WASMBOX_TEST_TOKEN", TOKEN + " more")
    with pytest.raises(ValueError, match="printable ASCII"):
        wasmbox_mcp.read_token(env="WASMBOX_TEST_TOKEN")
    with pytest.raises(ValueError, match="allowed hosts too"):
        wasmbox_mcp.transport_security("0.0.0.0", allowed_origins=["https://app.example"])
    assert wasmbox_mcp.transport_security("0.0.0.0") is None  # off loopback, no names given: the token guards


SERVE_PY = """
import asyncio, sys, wasmbox
from wasmbox.integrations import mcp
with wasmbox.Sandbox(cache_dir=None) as box:
    box.load({"name": "echo", "module": sys.argv[1]})
    asyncio.run(mcp.serve_http(box, host="127.0.0.2", port=0, on_listening=lambda url: print(url, flush=True)))
"""


def test_serve_http_on_any_loopback_address_refuses_rebinding() -> None:
    """The SDK guards Host and Origin only for 127.0.0.1, localhost and ::1; serve_http does
    for every loopback address."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_PY, wat("echo")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.2:"), url
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        with httpx2.Client() as http:
            assert http.post(url, json=body, headers={**headers, "Host": "evil.example"}).status_code == 421
            assert (
                http.post(url, json=body, headers={**headers, "Origin": "http://evil.example"}).status_code
                == 403
            )
            assert http.post(url, json=body, headers=headers).status_code != 421
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0


def test_http_refuses_a_network_address_unless_allowed(
    manifests: list[Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["mcp", "serve", str(manifests[0]), "--transport", "http", "--host", "0.0.0.0"]
    assert main(argv) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert main(["mcp", "serve"]) == 2 and "nothing to serve" in capsys.readouterr().err
    assert wasmbox_mcp.is_loopback("127.0.0.2") and wasmbox_mcp.is_loopback("::1")
    assert not wasmbox_mcp.is_loopback("0.0.0.0") and not wasmbox_mcp.is_loopback("example.com")
    with wasmbox.Sandbox(cache_dir=None) as box, pytest.raises(ValueError, match="allow_remote"):
        asyncio.run(wasmbox_mcp.serve_http(box, host="10.1.2.3", port=0))


def _in_process(box: wasmbox.Sandbox, body: Callable[[Any], Awaitable[None]], **kwargs: Any) -> None:
    from mcp import Client

    async def run() -> None:
        async with Client(wasmbox_mcp.build_server(box, **kwargs)) as client:
            await body(client)

    asyncio.run(asyncio.wait_for(run(), 60))


def test_build_server_calls_run_concurrently_through_the_sandbox(cache_dir: Path) -> None:
    """A host function that returns only once `CONCURRENT` calls are inside it: served one at
    a time, the barrier would break (an error result) instead of passing."""
    barrier = threading.Barrier(CONCURRENT, timeout=30)
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, max_workers=CONCURRENT, audit=records.append) as box:

        @box.host_function("host.fn")
        def meet(i: int) -> int:
            barrier.wait()
            return i

        box.load(
            {
                "name": "forward",
                "module": wat("forward"),
                "host_functions": ["host.fn"],
                "limits": {"timeout": "60s"},
            }
        )  # (the barrier, not the deadline, decides)

        async def body(client: Any) -> None:
            listed = await client.list_tools()
            assert [tool.name for tool in listed.tools] == ["forward"]  # no run_python unless asked
            results = await asyncio.gather(
                *(client.call_tool("forward", {"i": i}) for i in range(CONCURRENT))
            )
            assert [(r.is_error, _text(r)) for r in results] == [(False, str(i)) for i in range(CONCURRENT)]
            with pytest.raises(MCPError):
                await client.call_tool("run_python", {"code": "1"})

        _in_process(box, body)
    assert [record.tool for record in records] == ["forward"] * CONCURRENT  # audited as any call


def test_build_server_refuses_a_tool_named_run_python(cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        box.load({"name": "run_python", "module": wat("echo")})
        assert wasmbox_mcp.build_server(box) is not None
        with pytest.raises(ValueError, match="run_python"):
            wasmbox_mcp.build_server(box, python=True)


def test_serve_refuses_python_grants_run_python_cannot_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grants = tmp_path / "grants.json"
    grants.write_text(json.dumps({"name": "g", "runtime": "python", "host_functions": ["kv.get"]}))
    assert main(["mcp", "serve", "--python-grants", str(grants), "--no-cache"]) == 2
    assert "kv.get" in capsys.readouterr().err  # at start, not as every call's error


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_both_protocol_revisions_list_call_and_keep_sessions(cache_dir: Path, mode: str) -> None:
    """The real client in the handshake-era revision and in the stateless 2026-07-28 one: the
    same tools, typed results, and sessions reached through the name a result gave."""
    from mcp import Client

    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        box.load({"name": "echo", "module": wat("echo"), "input_schema": ECHO_SCHEMA,
                  "output_schema": {"type": "object", "properties": {"text": {"type": "string"}}}})  # fmt: skip

        async def run() -> None:
            async with Client(wasmbox_mcp.build_server(box, python=True, sessions=True), mode=mode) as client:
                assert (client.protocol_version == "2026-07-28") is (mode != "legacy")
                listed = await client.list_tools()
                assert [tool.name for tool in listed.tools] == ["echo", "run_python"]
                if mode != "legacy":  # tools can be loaded at any time: never fresh for long
                    assert listed.ttl_ms == 0 and listed.cache_scope == "private"
                echoed = await client.call_tool("echo", {"text": "hi"})
                assert echoed.structured_content == {"text": "hi"}
                first = await client.call_tool("run_python", {"code": "x = 41"})
                name = first.content[-1].text.removeprefix("session: ")  # type: ignore[union-attr]
                second = await client.call_tool("run_python", {"code": "x + 1", "session": name})
                assert _text_of(second) == "42"

        asyncio.run(asyncio.wait_for(run(), 120))


def _text_of(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text
