"""JavaScript sessions (`Sandbox.session(runtime="javascript")`): runs that share one QuickJS
instance, the same limits, totals and failure rule as Python sessions, and their routing
through dispatch and MCP."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind, SessionEndedError, SessionError, SessionLimits

JS = {"name": "nb", "runtime": "javascript", "scratch": "1MiB"}


@pytest.fixture
def box(cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir) as sandbox:
        sandbox.prepare_javascript()
        yield sandbox


def test_globals_functions_and_bindings_are_kept_across_runs(box: wasmbox.Sandbox) -> None:
    session = box.session(runtime="javascript")
    runs = [
        "var a = 1; let b = 2; const c = 3; function sum() { return a + b + c; } sum()",
        "a += 10; console.log(sum()); globalThis.g = 'kept'; b",
        "await Promise.resolve(0); var d = a * 2; d",  # an async run's vars are the scope's too
        "[d, g, typeof sum]",
    ]
    results = [session.run(code) for code in runs]
    assert [r.value for r in results] == [6, 2, 22, [22, "kept", "function"]], [r.error for r in results]
    assert results[1].stdout == "16\n"
    assert session.runtime == "javascript" and session.calls == 4
    assert session.fuel_used == sum(r.fuel_used for r in results) > 0
    assert box.run_javascript("typeof a + typeof g").value == "undefinedundefined"  # a fresh call: none


def test_a_script_error_keeps_the_session(box: wasmbox.Sandbox) -> None:
    session = box.session(runtime="javascript")
    assert session.run("var x = 7").ok
    failed = session.run("x = 8; throw new RangeError('no')")
    assert failed.error is not None and failed.error.kind is ErrorKind.GUEST_ERROR
    assert "RangeError: no" in failed.error.message and "session has ended" not in failed.error.message
    assert session.run("x").value == 8  # what the failed run did before throwing stays
    twice = session.run("let x = 1")  # a binding declared again: a SyntaxError, the session goes on
    assert twice.error is not None and "redeclaration of 'x'" in twice.error.message
    denied = session.run("wasmbox.callHost('kv.get', {key: 'a'})")
    assert denied.error is not None and denied.error.kind is ErrorKind.CAPABILITY_DENIED
    never = session.run("await new Promise(() => {})")
    assert never.error is not None and "nothing is left to settle" in never.error.message
    assert session.run("x").value == 8 and not session.closed


@pytest.mark.parametrize(
    ("code", "limits", "kind"),
    [
        ("for (;;) {}", {"fuel": 20_000_000}, ErrorKind.OUT_OF_FUEL),
        ("for (;;) {}", {"fuel": 10**13, "timeout": "300ms"}, ErrorKind.TIMEOUT),
        ("await new Promise((r) => setTimeout(r, 60_000))", {"timeout": "300ms"}, ErrorKind.TIMEOUT),
        ("new ArrayBuffer(1e9).byteLength", {}, ErrorKind.MEMORY_LIMIT),
        ("console.log('x'.repeat(100_000))", {}, ErrorKind.OUTPUT_LIMIT),
        ("'x'.repeat(100_000)", {"output": "16KiB"}, ErrorKind.OUTPUT_LIMIT),
        ("std.exit(3)", {}, ErrorKind.GUEST_ERROR),
    ],
    ids=["out_of_fuel", "timeout", "timer_past_deadline", "memory", "stdout", "result", "exit"],
)  # fmt: skip
def test_a_run_stopped_by_a_limit_or_an_exit_ends_the_session(
    box: wasmbox.Sandbox, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    session = box.session({**JS, "limits": limits}, name="s", runtime="javascript")
    assert session.run("var x = 1").ok
    assert session._kernel is not None and session._kernel.scratch is not None
    scratch = session._kernel.scratch.path
    assert scratch.is_dir()
    failed = session.run(code)
    assert failed.error is not None and failed.error.kind is kind, failed.error
    assert "the session has ended" in failed.error.message
    assert session.closed and session.end_reason == f"a run failed with {kind.value}"
    assert not scratch.exists()  # freed at once
    with pytest.raises(SessionEndedError, match=f"session 's' has ended: a run failed with {kind.value}"):
        session.run("x")
    again = box.session(JS, name="s", runtime="javascript")  # the name is free: a new session, empty
    assert again is not session and again.run("typeof x").value == "undefined"


def test_a_stack_overflow_ends_the_session(box: wasmbox.Sandbox) -> None:
    """Frames past the end of C's stack: the guard below it is found changed after the run."""
    session = box.session(
        {"name": "nb", "runtime": "javascript", "limits": {"fuel": 10**10}}, runtime="javascript"
    )
    assert session.run("var x = 1").ok
    big = (
        "function h(n) { "
        + "".join(f"let v{i} = n + {i}; " for i in range(1000))
        + "return n ? h(n - 1) + 1 : v0 }\nh(300)"
    )
    failed = session.run(big)
    assert failed.error is not None and failed.error.kind is ErrorKind.TRAP, failed.error
    assert "call stack exhausted" in failed.error.message and session.closed


def test_timers_an_earlier_run_left_never_fire_in_a_later_one(box: wasmbox.Sandbox) -> None:
    session = box.session(runtime="javascript")
    left = session.run(
        "globalThis.fired = []; setTimeout(() => fired.push('late'), 0);"
        "setInterval(() => fired.push('tick'), 1); setTimeout(() => { throw new Error('boom'); }, 0); 1"
    )
    assert left.ok, left.error
    waited = session.run("await new Promise((r) => setTimeout(r, 30)); fired")
    assert waited.ok and waited.value == [], waited.error  # not the earlier run's, not its throw
    thrown = session.run(
        "setTimeout(() => { throw new Error('boom'); }, 0); await new Promise((r) => setTimeout(r, 5))"
    )
    assert thrown.error is not None and "boom" in thrown.error.message
    assert session.run("await new Promise((r) => setTimeout(r, 5)); 'clean'").value == "clean"


def test_scratch_files_persist_and_each_session_has_its_own(box: wasmbox.Sandbox) -> None:
    one = box.session(JS, runtime="javascript")
    two = box.session(JS, runtime="javascript")
    made = one.run("const f = std.open('/tmp/note.txt', 'w'); f.puts('kept'); f.close(); 1")
    assert made.ok, made.error
    assert one.run("std.loadFile('/tmp/note.txt')").value == "kept"
    assert two.run("std.loadFile('/tmp/note.txt')").value is None
    assert box.run_javascript("std.loadFile('/tmp/note.txt')", JS).value is None


def test_files_kept_open_between_runs_are_capped(box: wasmbox.Sandbox) -> None:
    session = box.session(JS, runtime="javascript", limits=SessionLimits(files=20))
    keep = "globalThis.kept ??= []; for (let i = 0; i < {}; i++) kept.push(std.open('/tmp/f' + i, 'w')); kept.length"
    assert [session.run(keep.format(8)).value for _ in range(2)] == [8, 16]
    over = session.run(keep.format(8))
    assert over.error is not None and over.error.kind is ErrorKind.HOST_ERROR, over.error
    assert "files open between runs, more than its 20 (SessionLimits.files)" in over.error.message
    assert session.closed


def test_totals_are_shared_by_the_runs(box: wasmbox.Sandbox) -> None:
    session = box.session(
        {"name": "nb", "runtime": "javascript", "limits": {"fuel": 50_000_000}},
        runtime="javascript", limits=SessionLimits(fuel=30_000_000, calls=50),
    )  # fmt: skip
    assert session.run("var n = 0").ok
    spent = session.run("for (;;) n++")  # clipped to what is left of the total
    assert spent.error is not None and spent.error.kind is ErrorKind.OUT_OF_FUEL
    assert session.fuel_used <= 30_000_000 and session.closed


def test_a_session_name_is_never_shared_between_runtimes(box: wasmbox.Sandbox) -> None:
    box.session(name="conv")
    with pytest.raises(SessionError, match="runs under other grants"):
        box.session(name="conv", runtime="javascript")
    with pytest.raises(
        wasmbox.ManifestError, match='run_javascript takes a manifest with runtime = "javascript"'
    ):
        box.session({"name": "py", "runtime": "python"}, runtime="javascript")
    with pytest.raises(ValueError, match='runtime must be "python" or "javascript"'):
        box.session(runtime="scientific")  # type: ignore[arg-type]


def test_javascript_sessions_from_asyncio(box: wasmbox.Sandbox) -> None:
    async def main() -> list[Any]:
        async with await box.asession(runtime="javascript") as session:
            await session.arun("var k = 41")
            return [(await session.arun("k + 1")).value, session.runtime]

    assert asyncio.run(main()) == [42, "javascript"]


def _calls(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps({"code": code})},
        }
        for i, (tool, code) in enumerate(pairs)
    ]


def test_dispatch_routes_run_javascript_to_the_conversations_session(box: wasmbox.Sandbox) -> None:
    def turn(conversation: str, *pairs: tuple[str, str]) -> list[str]:
        replies = box.dispatch(
            _calls(*pairs), format="openai", python=True, javascript=True, session=conversation
        )
        return [reply["content"] for reply in replies]

    js, py = "run_javascript", "run_python"
    assert turn("c1", (js, "var x = 5"), (py, "x = 'py'")) == ["null", "null"]
    assert turn("c1", (js, "x * 2"), (py, "x")) == ["10", "py"]  # one session per runtime
    assert "ReferenceError" in turn("c2", (js, "x"))[0]  # another conversation: another session
    assert turn("c1", (js, "x += 1"), (js, "x += 1"), (js, "x")) == ["6", "7", "7"]  # in the order sent
    only_js = box.dispatch(_calls((js, "x")), format="openai", javascript=True, session="c1")
    assert only_js[0]["content"] == "7"
    specs = {s["function"]["name"]: s for s in box.specs("openai", javascript=True, session=True)}
    assert "keeps its global variables" in specs[js]["function"]["description"]


def test_dispatch_says_once_that_a_javascript_session_ended(cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, session_limits=SessionLimits(calls=1)) as box:

        def turn(code: str) -> str:
            return str(box.dispatch(_calls(("run_javascript", code)), format="openai", javascript=True,
                                    session="c")[0]["content"])  # fmt: skip

        assert turn("var x = 1") == "null"
        ended = turn("x")
        assert "not run: the session ended (it ran its 1 runs" in ended
        assert "the next run_javascript call starts a new session" in ended
        assert "ReferenceError" in turn("x")  # a new session


def test_mcp_serves_javascript_sessions(box: wasmbox.Sandbox) -> None:
    """Over the real MCP client: run_javascript takes `session` as run_python does."""
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    server = wasmbox_mcp.build_server(box, javascript=True, sessions=True)

    async def main() -> None:
        async with Client(server) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert "session" in listed["run_javascript"].input_schema["properties"]
            opened = await client.call_tool("run_javascript", {"code": "var x = 3"})
            texts = [block.text for block in opened.content]  # type: ignore[union-attr]
            assert texts[0] == "null" and texts[-1].startswith("session: mcp-")
            name = texts[-1].removeprefix("session: ")
            again = await client.call_tool("run_javascript", {"code": "x + 1", "session": name})
            assert [block.text for block in again.content] == ["4", f"session: {name}"]  # type: ignore[union-attr]
            other = await client.call_tool("run_javascript", {"code": "typeof x"})
            assert other.content[0].text == "undefined"  # type: ignore[union-attr]
            made_up = await client.call_tool("run_javascript", {"code": "x", "session": "mcp-guessed"})
            assert made_up.is_error and "unknown session" in made_up.content[0].text  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(main(), 60))
