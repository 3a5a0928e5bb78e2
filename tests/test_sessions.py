"""Sessions (`Sandbox.session`): runs that share one CPython instance, their limits and totals,
the failure rule, expiry, the cap on live sessions, and sessions through dispatch and MCP."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind, SessionEndedError, SessionError, SessionLimits
from wasmbox._backends.python.session import PythonKernel

SCRATCH = {"name": "nb", "runtime": "python", "scratch": "1MiB"}


class Clock:
    """A clock the test moves by hand (`SessionTable.clock`)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def box(cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir) as sandbox:
        yield sandbox


def test_a_variable_is_kept_across_three_runs(box: wasmbox.Sandbox) -> None:
    session = box.session()
    first, second, third = session.run("x = 1"), session.run("x += 1\nprint(x)"), session.run("x * 10")
    assert (first.ok, second.stdout, third.value) == (True, "2\n", 20)
    assert session.calls == 3
    assert session.fuel_used == first.fuel_used + second.fuel_used + third.fuel_used > 0
    assert session.time_used > 0 and not session.closed
    assert box.run_python("'x' in globals()").value is False  # a fresh call sees none of it


def test_imports_functions_and_scratch_files_persist(box: wasmbox.Sandbox) -> None:
    session = box.session(SCRATCH)
    made = session.run(
        "import fractions\ndef half(n):\n    return fractions.Fraction(n, 2) / 0 if n < 0 else fractions.Fraction(n, 2)\n"
        "open('/tmp/note.txt', 'w').write('kept')"
    )
    assert made.ok, made.error
    assert session.run("half(1)").value == "1/2"
    assert session.run("open('/tmp/note.txt').read()").value == "kept"
    failed = session.run("half(-1)")  # a traceback through run 1's function shows run 1's line
    assert failed.error is not None and failed.error.kind is ErrorKind.GUEST_ERROR
    assert 'File "<run 1>", line 3, in half' in failed.error.message
    assert "fractions.Fraction(n, 2) / 0" in failed.error.message


def test_randomness_goes_on_across_runs(box: wasmbox.Sandbox) -> None:
    """A session is one instance: like a REPL, a seed set in one run holds in the next, and
    runs of an unseeded session draw from one stream."""
    session = box.session()
    session.run("import random\nrandom.seed(1)")
    expected = random.Random(1)
    assert session.run("random.random()").value == expected.random()
    assert session.run("random.random()").value == expected.random()
    other = box.session()
    assert (
        other.run("import random\nrandom.random()").value
        != box.session().run("import random\nrandom.random()").value
    )


def test_a_python_exception_keeps_the_session(box: wasmbox.Sandbox) -> None:
    session = box.session()
    assert session.run("x = 7").ok
    failed = session.run("x = 8\nraise ValueError('no')")
    assert failed.error is not None and failed.error.kind is ErrorKind.GUEST_ERROR
    assert "session has ended" not in failed.error.message
    assert session.run("x").value == 8  # what the failed run did before raising stays
    denied = session.run("import wasmbox_guest\nwasmbox_guest.call_host('kv.get', key='a')")
    assert denied.error is not None and denied.error.kind is ErrorKind.CAPABILITY_DENIED
    assert session.run("x").value == 8 and not session.closed


@pytest.mark.parametrize(
    ("code", "limits", "kind"),
    [
        ("while True: pass", {"fuel": 20_000_000}, ErrorKind.OUT_OF_FUEL),
        ("while True: pass", {"fuel": 10**13, "timeout": "300ms"}, ErrorKind.TIMEOUT),
        ("b = bytearray(200 * 1024 * 1024)", {}, ErrorKind.MEMORY_LIMIT),
        ("print('x' * 100_000)", {}, ErrorKind.OUTPUT_LIMIT),
        ("import os\nos._exit(3)", {}, ErrorKind.TRAP),
    ],
    ids=["out_of_fuel", "timeout", "memory", "output", "trap"],
)
def test_a_run_stopped_by_a_limit_or_trap_ends_the_session(
    box: wasmbox.Sandbox, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    session = box.session({"name": "nb", "runtime": "python", "limits": limits, "scratch": "1MiB"}, name="s")
    assert session.run("x = 1").ok
    scratch = session._kernel.scratch.path  # type: ignore[union-attr]
    assert scratch.is_dir()
    failed = session.run(code)
    assert failed.error is not None and failed.error.kind is kind
    assert "the session has ended" in failed.error.message
    assert session.closed and session.end_reason == f"a run failed with {kind.value}"
    assert not scratch.exists()  # freed at once
    with pytest.raises(SessionEndedError, match=f"session 's' has ended: a run failed with {kind.value}"):
        session.run("x")
    again = box.session(SCRATCH, name="s")  # the name is free: a new session, empty
    assert again is not session and again.run("'x' in globals()").value is False


def test_a_session_cannot_run_inside_its_own_run(box: wasmbox.Sandbox) -> None:
    holder: list[wasmbox.Session] = []

    @box.host_function("nb.again")
    def again() -> str:
        try:
            holder[0].run("1")
        except wasmbox.WasmboxError as exc:
            return str(exc)
        return "ran"

    holder.append(box.session({"name": "nb", "runtime": "python", "host_functions": ["nb.again"]}))
    result = holder[0].run("import wasmbox_guest\nwasmbox_guest.call_host('nb.again')")
    assert result.value == "a session cannot run inside its own run (a host function)"
    assert holder[0].run("2").value == 2


def test_the_total_fuel_is_shared_by_the_runs(box: wasmbox.Sandbox) -> None:
    per_run, total = 50_000_000, 30_000_000
    session = box.session(
        {"name": "nb", "runtime": "python", "limits": {"fuel": per_run}}, limits=SessionLimits(fuel=total)
    )
    first = session.run("x = 0\nfor i in range(10): x += i")
    assert first.ok and first.fuel_used < total
    spin = session.run("while True: pass")  # gets what is left, less than a run's fuel
    assert spin.error is not None and spin.error.kind is ErrorKind.OUT_OF_FUEL
    left = total - first.fuel_used
    assert spin.fuel_used == left and f"used all {left:,} units of fuel" in spin.error.message
    assert session.fuel_used == total and session.closed


def test_the_total_calls_and_time_end_the_session(box: wasmbox.Sandbox) -> None:
    counted = box.session(limits=SessionLimits(calls=2))
    assert counted.run("1").ok and counted.run("2").ok
    with pytest.raises(SessionEndedError, match=r"it ran its 2 runs \(SessionLimits.calls\)"):
        counted.run("3")
    assert counted.calls == 2 and counted.closed
    timed = box.session({"name": "nb", "runtime": "python", "limits": {"fuel": 10**13, "timeout": "60s"}},
                        limits=SessionLimits(time="400ms"))  # fmt: skip
    spin = timed.run("while True: pass")  # its deadline is what is left of the session's time
    assert spin.error is not None and spin.error.kind is ErrorKind.TIMEOUT
    assert "exceeded the 0.4s deadline" in spin.error.message and timed.closed
    with pytest.raises(ValueError, match="calls"):
        SessionLimits(calls=0)
    assert SessionLimits(time="5m", idle="90s").time == 300
    with pytest.raises(TypeError, match="SessionLimits"):
        box.session(limits={"calls": 3})  # type: ignore[arg-type]


def test_idle_and_lifetime_end_a_session_lazily(box: wasmbox.Sandbox) -> None:
    clock = box._sessions.clock = Clock()
    session = box.session(name="a", limits=SessionLimits(idle=10, lifetime=25))
    assert session.run("x = 1").ok
    clock.now += 9.5
    assert session.run("x").value == 1  # each run restarts the idle time
    clock.now += 9.5
    assert session.run("x").value == 1
    clock.now += 10
    with pytest.raises(SessionEndedError, match=r"idle for more than 10 s \(SessionLimits.idle\)"):
        session.run("x")
    old = box.session(name="b", limits=SessionLimits(idle=10, lifetime=25))
    for _ in range(2):
        clock.now += 9
        assert old.run("1").ok
    clock.now += 9  # 27 s after it opened, 9 s after its last run
    with pytest.raises(SessionEndedError, match=r"open for more than 25 s"):
        old.run("1")
    idle = box.session(name="c", limits=SessionLimits(idle=10))
    clock.now += 11
    box.session(name="d")  # opening a session frees the idle ones, unasked
    assert idle.closed and idle.end_reason is not None and "idle" in idle.end_reason


def test_max_sessions_is_a_clear_error_and_an_ended_session_frees_its_place(cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, max_sessions=2) as box:
        # b's runs stop by fuel, whatever the machine's speed (the Python default is sized to the deadline)
        few = {"name": "few", "runtime": "python", "limits": {"fuel": 50_000_000, "timeout": "60s"}}
        first, second = box.session(name="a"), box.session(few, name="b")
        assert box.session(name="a") is first  # by name: the live one, not a third
        with pytest.raises(
            SessionError, match=r"2 sessions are open, the most this Sandbox allows \(max_sessions=2\)"
        ):
            box.session(name="c")
        first.close()
        third = box.session(name="c")
        with pytest.raises(SessionError, match="max_sessions"):
            box.session()
        assert second.run("while True: pass").error.kind is ErrorKind.OUT_OF_FUEL  # type: ignore[union-attr]
        assert box.session().run("1").value == 1 and third.run("2").value == 2
    assert third.closed  # closing the Sandbox closes its sessions
    with pytest.raises(SessionEndedError, match="closed"):
        third.run("1")
    with pytest.raises(ValueError, match="max_sessions"):
        wasmbox.Sandbox(cache_dir=cache_dir, max_sessions=-1)


def test_sessions_of_different_grant_sets_never_share_state(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    one = {"name": "one", "runtime": "python", "scratch": "1MiB", "env": {"WHO": "one"}}
    two = {"name": "two", "runtime": "python", "scratch": "1MiB", "env": {"WHO": "two"}}
    first = box.session(one, name="conv")
    assert first.run("import builtins, os\nbuiltins.LEFT = secret = os.environ['WHO']\n"
                     "open('/tmp/left.txt', 'w').write(secret)").ok  # fmt: skip
    with pytest.raises(SessionError, match="never shared between grant sets"):
        box.session(two, name="conv")
    other = box.session(two)
    seen = other.run("import builtins, os\n[hasattr(builtins, 'LEFT'), 'secret' in globals(), os.listdir('/tmp'), "
                     "os.environ['WHO']]")  # fmt: skip
    assert seen.value == [False, False, [], "two"]
    same_grants = box.session(one)  # another session under the same grants is as separate
    assert same_grants.run("import builtins, os\n[hasattr(builtins, 'LEFT'), os.listdir('/tmp')]").value == [
        False,
        [],
    ]
    assert first.run("secret").value == "one"
    assert first.manifest_digest == wasmbox.Manifest.load(one).digest() != other.manifest_digest


def test_close_frees_the_instance_and_scratch_at_once(box: wasmbox.Sandbox) -> None:
    with box.session(SCRATCH) as session:
        assert session.run("open('/tmp/a', 'w').write('x' * 1000)").ok
        assert isinstance(session._kernel, PythonKernel)
        spare = session._kernel._spare
        assert spare.scratch is not None
        folder = spare.scratch.path
        assert (folder / "a").stat().st_size == 1000
    assert session.closed and session.end_reason == "closed" and session._kernel is None
    assert not folder.exists()
    with pytest.raises(ValueError, match="closed"):
        spare.store._context()  # the Store is freed
    session.close()  # again: nothing
    with pytest.raises(SessionEndedError, match="session .* has ended: closed"):
        session.run("1")


def test_each_run_is_audited_with_the_session(cache_dir: Path) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        session = box.session(name="conv-7")
        session.run("x = 1")
        session.run("1/0")
        box.run_python("2")
    assert [(r.session, r.error_kind) for r in records] == [
        ("conv-7", None),
        ("conv-7", "guest_error"),
        (None, None),
    ]
    assert records[0].session_id == records[1].session_id == session.id and records[2].session_id is None
    assert records[0].as_dict()["session"] == "conv-7"


def test_sessions_from_asyncio(box: wasmbox.Sandbox) -> None:
    async def main() -> list[Any]:
        async with await box.asession() as session:
            await session.arun("import math\nr = 2")
            value = (await session.arun("round(math.pi * r * r, 2)")).value
        return [value, session.closed]

    assert asyncio.run(main()) == [12.57, True]


def _openai_calls(*codes: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"c{i}",
            "type": "function",
            "function": {"name": "run_python", "arguments": json.dumps({"code": code})},
        }
        for i, code in enumerate(codes)
    ]


def test_dispatch_routes_a_conversation_to_its_session(box: wasmbox.Sandbox) -> None:
    def turn(conversation: str, *codes: str) -> list[str]:
        replies = box.dispatch(_openai_calls(*codes), format="openai", python=True, session=conversation)
        return [reply["content"] for reply in replies]

    assert turn("conv-1", "x = 5") == ["null"]
    assert turn("conv-1", "x * 2") == ["10"]
    assert "NameError" in turn("conv-2", "x")[0]  # another conversation: another session
    # the calls of one turn run one after another, in the order sent
    assert turn("conv-1", "x += 1", "x += 1", "x") == ["null", "null", "7"]
    with pytest.raises(ValueError, match="give python= or javascript= too"):
        box.dispatch(_openai_calls("1"), format="openai", session="conv-1")


def test_dispatch_says_once_that_a_session_ended(cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, session_limits=SessionLimits(calls=1)) as box:

        async def turn(code: str) -> str:
            replies = await box.adispatch(_openai_calls(code), format="openai", python=True, session="c")
            return str(replies[0]["content"])

        assert asyncio.run(turn("x = 1")) == "null"
        ended = asyncio.run(turn("x"))
        assert "not run: the session ended (it ran its 1 runs" in ended and "starts a new session" in ended
        assert "NameError" in asyncio.run(turn("x"))  # a new session


def test_mcp_sessions_are_named_by_the_server(box: wasmbox.Sandbox) -> None:
    """Over the real MCP client: a run_python call without `session` opens one and names it;
    calls that pass the name share its interpreter; a name the server never issued is refused."""
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    server = wasmbox_mcp.build_server(box, python=True, sessions=True)

    async def main() -> None:
        async with Client(server) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert "session" in listed["run_python"].input_schema["properties"]
            assert "keeps its variables" in (listed["run_python"].description or "")
            opened = await client.call_tool("run_python", {"code": "x = 3"})
            texts = [block.text for block in opened.content]  # type: ignore[union-attr]
            assert texts[0] == "null" and texts[-1].startswith("session: mcp-")
            name = texts[-1].removeprefix("session: ")
            again = await client.call_tool("run_python", {"code": "x + 1", "session": name})
            assert [block.text for block in again.content] == ["4", f"session: {name}"]  # type: ignore[union-attr]
            other = await client.call_tool("run_python", {"code": "'x' in globals()"})
            assert other.content[0].text == "false"  # type: ignore[union-attr]
            made_up = await client.call_tool("run_python", {"code": "x", "session": "mcp-guessed"})
            assert made_up.is_error and "unknown session" in made_up.content[0].text  # type: ignore[union-attr]
        async with Client(server) as client:  # another client, told the name, reaches it
            told = await client.call_tool("run_python", {"code": "x", "session": name})
            assert told.content[0].text == "3"  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(main(), 60))
    with pytest.raises(ValueError, match="give python= or javascript= too"):
        wasmbox_mcp.build_server(box, sessions=True)


def test_mcp_serve_sessions_over_stdio(cache_dir: Path) -> None:
    """`wasmbox mcp serve --python --sessions`, driven by the real MCP client over stdio."""
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    import os
    import sys

    from mcp import ClientSession, StdioServerParameters, stdio_client

    with wasmbox.Sandbox(cache_dir=cache_dir) as warm:
        warm.prepare_python()  # (built in this cache already: the server only loads it)
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "wasmbox", "mcp", "serve", "--python", "--sessions"],
        env={"WASMBOX_CACHE_DIR": str(cache_dir), "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip

    async def run() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            first = await client.call_tool("run_python", {"code": "import math\nr = 3"})
            name = first.content[-1].text.removeprefix("session: ")  # type: ignore[union-attr]
            area = await client.call_tool(
                "run_python", {"code": "round(math.pi * r * r, 1)", "session": name}
            )
            assert area.content[0].text == "28.3"  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(run(), 300))
