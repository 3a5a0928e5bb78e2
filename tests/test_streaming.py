"""Streamed output (`on_output`): stdout and stderr reach the caller as the guest writes them,
still capped, the final CallResult unchanged; a call stopped part way has already delivered
what it printed; async callers get it on the event loop; the MCP server sends it as progress
notifications to a client that asks."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind


class Heard:
    """A listener that keeps what it was told, and each chunk's thread."""

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str]] = []
        self.threads: set[int] = set()

    def __call__(self, stream: str, text: str) -> None:
        self.chunks.append((stream, text))
        self.threads.add(threading.get_ident())

    def text(self, stream: str = "stdout") -> str:
        return "".join(text for name, text in self.chunks if name == stream)


PRINTS = "import sys\nfor i in range(3):\n    print('line', i)\nprint('oops', file=sys.stderr)\n'done'"


def test_python_output_arrives_as_written_and_the_result_is_unchanged(box: wasmbox.Sandbox) -> None:
    heard = Heard()
    streamed = box.run_python(PRINTS, on_output=heard)
    plain = box.run_python(PRINTS)
    assert heard.chunks == [("stdout", "line 0\n"), ("stdout", "line 1\n"), ("stdout", "line 2\n"),
                            ("stderr", "oops\n")]  # fmt: skip
    assert streamed.value == plain.value == "done"
    assert (
        (streamed.stdout, streamed.stderr)
        == (plain.stdout, plain.stderr)
        == (heard.text(), heard.text("stderr"))
    )
    # the guest does the same work (to within what a fresh instance's hash seed moves)
    assert abs(streamed.fuel_used - plain.fuel_used) <= plain.fuel_used // 100


@pytest.mark.parametrize(
    ("runtime", "code", "limits", "kind"),
    [
        ("python", "for i in range(3):\n    print('step', i)\nwhile True: pass", {"fuel": 200_000_000},
         ErrorKind.OUT_OF_FUEL),
        ("python", "for i in range(3):\n    print('step', i)\nwhile True: pass", {"fuel": 10**13, "timeout": "500ms"},
         ErrorKind.TIMEOUT),
        ("javascript", "for (let i = 0; i < 3; i++) console.log('step', i); for (;;) {}", {}, ErrorKind.OUT_OF_FUEL),
        ("javascript", "for (let i = 0; i < 3; i++) console.log('step', i); for (;;) {}",
         {"fuel": 10**13, "timeout": "500ms"}, ErrorKind.TIMEOUT),
    ],
    ids=["python-fuel", "python-deadline", "javascript-fuel", "javascript-deadline"],
)  # fmt: skip
def test_lines_of_a_call_stopped_mid_stream_have_arrived(
    box: wasmbox.Sandbox, runtime: str, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    heard = Heard()
    grants = {"name": "s", "runtime": runtime, "limits": limits}
    if runtime == "python":
        result = box.run_python(code, grants, on_output=heard)
    else:
        result = box.run_javascript(code, grants, on_output=heard)
    assert result.error is not None and result.error.kind is kind, result.error
    assert heard.text() == "step 0\nstep 1\nstep 2\n" == result.stdout


def test_streamed_output_is_capped_like_the_result(box: wasmbox.Sandbox) -> None:
    heard = Heard()
    grants = {"name": "s", "runtime": "python", "limits": {"output": "4KiB"}}
    result = box.run_python("for i in range(1000):\n    print('x' * 99)", grants, on_output=heard)
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT and result.truncated
    assert heard.text() == result.stdout and len(heard.text().encode()) <= 4096


def test_a_listener_that_raises_is_dropped_and_the_call_goes_on(
    box: wasmbox.Sandbox, caplog: pytest.LogCaptureFixture
) -> None:
    told: list[str] = []

    def fails(stream: str, text: str) -> None:
        told.append(text)
        raise RuntimeError("listener bug")

    result = box.run_python("print(1)\nprint(2)\n3", on_output=fails)
    assert result.ok and result.value == 3 and result.stdout == "1\n2\n"
    assert told == ["1\n"] and "an on_output listener raised" in caplog.text


def test_async_callers_hear_it_on_the_event_loop(box: wasmbox.Sandbox) -> None:
    box.prepare_javascript()

    async def main() -> tuple[Heard, Heard, int]:
        python, javascript = Heard(), Heard()
        result = await box.arun_python("print('a')\nprint('b')", on_output=python)
        assert result.ok
        done = await box.arun_javascript("console.log('c')", on_output=javascript)
        assert done.ok
        await asyncio.sleep(0)  # (the last callbacks, scheduled before the result)
        return python, javascript, threading.get_ident()

    python, javascript, loop_thread = asyncio.run(main())
    assert python.text() == "a\nb\n" and javascript.text() == "c\n"
    assert python.threads == javascript.threads == {loop_thread}


def test_session_runs_stream_too(box: wasmbox.Sandbox) -> None:
    for session in (box.session(), box.session(runtime="javascript")):
        heard = Heard()
        code = "print('kept')" if session.runtime == "python" else "console.log('kept')"
        assert session.run(code, on_output=heard).ok
        assert heard.text() == "kept\n"
        quiet = Heard()
        assert session.run(code).stdout == "kept\n" and quiet.chunks == []  # a run without one: none
        session.close()


def test_a_tool_called_by_code_streams_nothing_of_its_own(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Only the call the listener was given for is heard: what a tool its code calls prints is
    that tool's output (in its result), not the caller's."""
    source = tmp_path / "inner.py"
    source.write_text("def main() -> int:\n    print('inner speaks')\n    return 1\n")
    box.load({"name": "inner", "runtime": "python", "source": str(source)})
    heard = Heard()
    grants = {"name": "outer", "runtime": "python", "tools": ["inner"]}
    result = box.run_python("print('outer speaks')\ntools.inner()", grants, on_output=heard)
    assert result.ok and result.value == 1, result.error
    assert heard.text() == "outer speaks\n"


def test_the_mcp_server_sends_progress_to_a_client_that_asks(box: wasmbox.Sandbox) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    assert box.run_python("1").ok  # (the runtime made before the clock starts)
    server = wasmbox_mcp.build_server(box, python=True)
    got: list[tuple[float, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        got.append((value, message))

    async def main() -> tuple[Any, Any]:
        async with Client(server) as client:
            asked = await client.call_tool("run_python", {"code": PRINTS}, progress_callback=progress)
            silent = await client.call_tool("run_python", {"code": PRINTS})
            return asked, silent

    asked, silent = asyncio.run(asyncio.wait_for(main(), 60))
    assert got == [(1, "line 0\n"), (2, "line 1\n"), (3, "line 2\n"), (4, "stderr: oops\n")]
    assert asked.content[0].text == silent.content[0].text  # the result as without it
