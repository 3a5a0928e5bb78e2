"""Code that calls tools: a snippet (Python or JavaScript) calling the Sandbox's loaded tools
as functions, each inner call checked and run as that tool's own, counted as a host call of
the snippet, its failures raised as exceptions the code can catch, audited with a link to the
snippet's call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._inputs import InputUnavailable

from .conftest import CAPABILITIES, manifest

SCALE_PY = '''
def main(x: float, factor: float = 2.0) -> float:
    """Multiply x by factor."""
    return x * factor
'''
READ_PY = """
def main() -> str:
    return open("/secret/key.txt").read()
"""


@pytest.fixture
def tool_box(box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path) -> wasmbox.Sandbox:
    """word_count (C, with /data), echo (WAT), scale (Python), secret (Python, with /secret)."""
    box.load(CAPABILITIES / "word_count.toml")
    box.load(manifest("echo", input_schema={"type": "object", "properties": {"text": {"type": "string"}},
                                            "required": ["text"]}))  # fmt: skip
    (tmp_path / "scale.py").write_text(SCALE_PY)
    box.load({"name": "scale", "runtime": "python", "source": str(tmp_path / "scale.py")})
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.txt").write_text("hunter2")
    (tmp_path / "read.py").write_text(READ_PY)
    box.load({
        "name": "secret", "runtime": "python", "source": str(tmp_path / "read.py"),
        "preopens": [{"host": str(tmp_path / "secret"), "guest": "/secret"}],
    })  # fmt: skip
    return box


def grants(*tools: str, **fields: Any) -> dict[str, Any]:
    return {"name": "snippet", "runtime": "python", "tools": list(tools), **fields}


def test_a_snippet_calls_three_tools_and_returns_one_answer(tool_box: wasmbox.Sandbox) -> None:
    code = """
texts = ["the quick brown fox", "jumps over", "the lazy dog"]
words = [tools.word_count(text=t)["words"] for t in texts]
echoed = tools.echo(text="done")["text"]
{"total": tools.scale(x=sum(words), factor=10), "echo": echoed}
"""
    result = tool_box.run_python(code, grants("word_count", "echo", "scale"))
    assert result.error is None, result.error
    assert result.value == {"total": 90.0, "echo": "done"}
    assert [r.name for r in result.host_calls] == ["wasmbox.call_tool"] * 5
    assert all(r.verdict == "ok" for r in result.host_calls)


def test_inner_errors_reach_the_code_as_exceptions_with_their_kind(tool_box: wasmbox.Sandbox) -> None:
    code = """
from wasmbox_guest import ToolCallError
seen = []
for args in ({"x": "three"}, {"x": 1, "nope": 2}):
    try:
        tools.scale(**args)
    except ToolCallError as e:
        seen.append((e.tool, e.kind, e.message))
seen
"""
    result = tool_box.run_python(code, grants("scale"))
    assert result.error is None, result.error
    (tool, kind, message), (_, kind2, message2) = result.value
    assert (tool, kind, kind2) == ("scale", "invalid_arguments", "invalid_arguments")
    assert message == "args.x: expected number, got string" and "unexpected property 'nope'" in message2
    # uncaught, the snippet fails as any exception would: a guest_error naming the inner kind
    failed = tool_box.run_python("tools.scale(x='three')", grants("scale"))
    assert failed.error is not None and failed.error.kind is wasmbox.ErrorKind.GUEST_ERROR
    assert "ToolCallError: scale: invalid_arguments: args.x: expected number" in failed.error.message


def test_only_the_listed_tools_answer(tool_box: wasmbox.Sandbox) -> None:
    code = """
from wasmbox_guest import HostCallError
try:
    tools.secret()
except HostCallError as e:
    refused = str(e)
refused
"""
    result = tool_box.run_python(code, grants("scale"))
    assert result.value == "tool 'secret' is not granted to this code: add it to the manifest's tools"
    assert [r.verdict for r in result.host_calls] == ["denied"]
    # without `tools`, the host function itself is not granted
    bare = tool_box.run_python("tools.scale(x=1)")
    assert bare.error is not None and bare.error.kind is wasmbox.ErrorKind.CAPABILITY_DENIED
    assert "'wasmbox.call_tool' is not granted" in bare.error.message
    # nor can a manifest grant it by name, or list a tool that is not loaded
    with pytest.raises(wasmbox.ManifestError, match="granted by `tools`"):
        tool_box.run_python("1", {"name": "s", "runtime": "python", "host_functions": ["wasmbox.call_tool"]})
    with pytest.raises(
        wasmbox.CapabilityError, match=r"lists tools \['rm_rf'\] that this Sandbox has not loaded"
    ):
        tool_box.run_python("1", grants("rm_rf"))


def test_each_inner_call_runs_under_its_own_tools_grants(tool_box: wasmbox.Sandbox) -> None:
    """The snippet reaches the secret only through the tool that holds the grant, and that
    tool's grant does not leak into the snippet."""
    code = """
value = tools.secret()
try:
    open("/secret/key.txt").read()
    leaked = True
except OSError:
    leaked = False
(value, leaked)
"""
    result = tool_box.run_python(code, grants("secret"))
    assert result.error is None, result.error
    assert result.value == ["hunter2", False]
    # the tool's own limits hold: word_count's 4 KiB output cap and 1 s deadline are its own
    big = tool_box.run_python("tools.word_count(text='x ' * 10)['words']", grants("word_count"))
    assert big.value == 10


def test_inner_calls_count_against_the_callers_host_calls(tool_box: wasmbox.Sandbox) -> None:
    code = """
from wasmbox_guest import HostCallError
done = 0
try:
    for i in range(10):
        tools.scale(x=i)
        done += 1
except HostCallError:
    pass
done
"""
    result = tool_box.run_python(code, grants("scale", limits={"host_calls": 3}))
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.HOST_ERROR
    assert "host-call limit (3) exceeded" in result.error.message
    assert len(result.host_calls) == 4 and result.host_calls[-1].verdict == "limit"


def test_tools_calling_tools_are_bounded(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Two tools calling each other recurse until the nesting bound stops them, as a clear
    error; the Sandbox keeps serving."""
    (tmp_path / "ping.py").write_text("def main(n: int) -> int:\n    return tools.pong(n=n + 1)\n")
    (tmp_path / "pong.py").write_text("def main(n: int) -> int:\n    return tools.ping(n=n + 1)\n")
    limits = {"fuel": 10**10, "timeout": "60s"}
    box.load({"name": "pong", "runtime": "python", "source": str(tmp_path / "pong.py"), "limits": limits})
    ping = box.load({"name": "ping", "runtime": "python", "source": str(tmp_path / "ping.py"),
                     "tools": ["pong"], "limits": limits})  # fmt: skip
    box.load({"name": "pong", "runtime": "python", "source": str(tmp_path / "pong.py"), "tools": ["ping"],
              "limits": limits}, replace=True)  # fmt: skip
    result = ping.call({"n": 0})
    assert result.error is not None
    assert "calls nested more than 16 deep" in result.error.message
    assert box.run_python("1 + 1").value == 2
    with pytest.raises(wasmbox.ManifestError, match="lists itself"):
        box.load(
            {"name": "self", "runtime": "python", "source": str(tmp_path / "ping.py"), "tools": ["self"]}
        )


def test_inner_calls_are_audited_with_a_link_to_the_snippets_call(
    cache_dir: Path, built_examples: Path, tmp_path: Path
) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        (tmp_path / "scale.py").write_text(SCALE_PY)
        box.load({"name": "scale", "runtime": "python", "source": str(tmp_path / "scale.py")})
        assert box.run_python("[tools.scale(x=1), tools.scale(x=2)]", grants("scale")).value == [2.0, 4.0]
        box.tool("scale").call({"x": 3})
    inner1, inner2, outer, alone = records
    assert (inner1.tool, inner2.tool, outer.tool, alone.tool) == ("scale", "scale", "snippet", "scale")
    assert outer.call_id is not None and outer.parent_id is None
    assert inner1.parent_id == inner2.parent_id == outer.call_id
    assert len({inner1.call_id, inner2.call_id, outer.call_id, alone.call_id}) == 4
    assert alone.parent_id is None
    assert json.loads(json.dumps(outer.as_dict(), default=str))["call_id"] == outer.call_id


def test_a_command_tools_value_carries_its_output(box: wasmbox.Sandbox, built_examples: Path) -> None:
    box.load({
        "name": "probe", "module": str(built_examples / "fsprobe.wasm"),
        "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "command": {"argv": ["argv", "{text}"]},
    })  # fmt: skip
    result = box.run_python("tools.probe(text='héllo')", grants("probe"))
    assert result.value == {"exit_code": 0, "stdout": "probe\nargv\nhéllo\n", "stderr": ""}


def test_javascript_code_calls_tools(tool_box: wasmbox.Sandbox) -> None:
    try:
        tool_box.prepare_javascript()
    except InputUnavailable as exc:
        pytest.skip(f"the JavaScript runtime's wheel cannot be fetched: {exc}")
    code = """
const counts = [];
for (const text of ["a b", "c d e"]) counts.push((await tools.word_count({ text })).words);
let kind = null;
try { tools.scale({ x: "nope" }); } catch (e) { kind = e instanceof wasmbox.ToolCallError ? e.kind : "other"; }
({ counts, scaled: tools["scale"]({ x: 2, factor: 3 }), kind })
"""
    js = {"name": "snippet", "runtime": "javascript", "tools": ["word_count", "scale"]}
    result = tool_box.run_javascript(code, js)
    assert result.error is None, result.error
    assert result.value == {"counts": [2, 3], "scaled": 6.0, "kind": "invalid_arguments"}


def test_the_model_is_shown_the_tools_as_stubs(tool_box: wasmbox.Sandbox) -> None:
    from wasmbox._stubs import javascript_stubs, python_stubs

    scale = tool_box.tool("scale")
    assert python_stubs([scale]) == (
        'def scale(*, x: float, factor: float = 2.0) -> float:\n    """Multiply x by factor.\n    """\n    ...'
    )
    assert javascript_stubs([scale]) == (
        "/** Multiply x by factor. */\ntools.scale(args: { x: number; factor?: number }): number;"
    )
    counted = python_stubs([tool_box.tool("word_count")])
    assert counted.startswith("def word_count(*, path: str | None = None, text: str | None = None) -> Any:")
    assert "        text: The text to count, instead of a file" in counted
    # the stubs are real Python (a model may be shown them as code): they compile
    compile(f"{counted}\n{python_stubs([scale])}", "<stubs>", "exec")

    (run_python,) = [
        s for s in tool_box.specs("openai", python=grants("scale")) if s["function"]["name"] == "run_python"
    ]
    description = run_python["function"]["description"]
    assert "```python\ndef scale(*, x: float, factor: float = 2.0) -> float:" in description
    assert "ToolCallError" in description
    plain = [s for s in tool_box.specs("openai", python=True) if s["function"]["name"] == "run_python"]
    assert "tools" not in plain[0]["function"]["description"]
    (js,) = [s for s in tool_box.specs("anthropic", javascript={"name": "j", "runtime": "javascript",
                                                                "tools": ["scale"]}) if s["name"] == "run_javascript"]  # fmt: skip
    assert "tools.scale(args: { x: number; factor?: number }): number;" in js["description"]
    with pytest.raises(wasmbox.CapabilityError, match="not loaded"):
        tool_box.specs(python=grants("missing"))


def test_mcp_serves_code_that_calls_tools(tool_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    import asyncio

    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    async def run() -> None:
        server = wasmbox_mcp.build_server(tool_box, python=grants("word_count", "scale"))
        async with Client(server) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert "def word_count(" in (listed["run_python"].description or "")
            hints = listed["run_python"].annotations
            assert hints is not None and hints.read_only_hint is False and hints.destructive_hint is True
            code = "sum(tools.word_count(text=t)['words'] for t in ['a b', 'c'])"
            result = await client.call_tool("run_python", {"code": code})
            assert result.is_error is False and result.content[0].text == "3"  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(run(), 120))


def test_an_inner_call_ends_by_the_callers_deadline(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """A tool with a long deadline, called by code with a short one, is stopped at the code's
    deadline (the bound here is 60 times that deadline: only a missing clamp reaches it)."""
    (tmp_path / "spin.py").write_text("def main() -> int:\n    while True:\n        pass\n")
    box.load({"name": "spin", "runtime": "python", "source": str(tmp_path / "spin.py"),
              "limits": {"timeout": "120s", "fuel": 10**14}})  # fmt: skip
    code = """
from wasmbox_guest import ToolCallError
try:
    tools.spin()
except ToolCallError as e:
    print(e.kind)
"""
    result = box.run_python(code, grants("spin", limits={"timeout": "1s", "fuel": 10**14}))
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.TIMEOUT
    assert result.duration_s < 60, result.duration_s
    assert result.host_calls[0].name == "wasmbox.call_tool"


def test_a_tool_may_be_for_code_only_or_for_the_model_only(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    (tmp_path / "scale.py").write_text(SCALE_PY)
    source = str(tmp_path / "scale.py")
    box.load({"name": "inner", "runtime": "python", "source": source, "callers": ["code"]})
    box.load({"name": "direct", "runtime": "python", "source": source, "callers": ["model"]})
    names = [spec["name"] for spec in box.specs(python=grants("inner"))]
    assert names == ["direct", "run_python"]  # the code-only tool is shown only as a stub
    assert "def inner(*, x: float" in box.specs(python=grants("inner"))[-1]["description"]
    (refused,) = box.dispatch([{"id": "c", "type": "function", "function": {"name": "inner", "arguments": '{"x": 1}'}}],
                              format="openai")  # fmt: skip
    assert json.loads(refused["content"])["error"] == {
        "kind": "invalid_arguments",
        "message": "tool 'inner' is called from code only: call tools.inner(...) in run_python's code",
    }
    assert box.run_python("tools.inner(x=4)", grants("inner")).value == 8.0
    with pytest.raises(wasmbox.CapabilityError, match=r"\['direct'\] whose callers do not include code"):
        box.run_python("tools.direct(x=4)", grants("direct"))
    assert box.tool("inner").call({"x": 1}).value == 2.0  # the host's own code may call any tool
