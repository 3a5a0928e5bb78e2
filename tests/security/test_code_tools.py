"""Hostile code calling tools (`tools.name(**args)` through `wasmbox.call_tool`), hostile
values against `output_schema`, and a broken OpenTelemetry pipeline: what each tries, and
that the claim holds (a tool not listed is never reached, an inner call never outlives the
outer deadline nor its output cap, a value breaking the schema is a failed call, and a call
never fails because telemetry failed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ManifestError

from ..conftest import manifest

SCALE_PY = """
def main(x: float) -> float:
    return x * 2
"""
SPIN_PY = """
def main() -> int:
    while True:
        pass
"""
BIG_PY = """
def main() -> str:
    return "x" * 200_000
"""
SECRET_PY = """
def main() -> str:
    return "reached"
"""


@pytest.fixture
def tool_box(box: wasmbox.Sandbox, tmp_path: Path) -> wasmbox.Sandbox:
    for name, source in (("scale", SCALE_PY), ("spin", SPIN_PY), ("big", BIG_PY), ("hidden", SECRET_PY)):
        (tmp_path / f"{name}.py").write_text(source)
        # spin's own deadline is long and its fuel endless: only its caller's deadline ends it
        limits = {"timeout": "120s", "fuel": 10**14} if name == "spin" else {}
        box.load(
            {"name": name, "runtime": "python", "source": str(tmp_path / f"{name}.py"), "limits": limits}
        )
    return box


def grants(*tools: str, **fields: Any) -> dict[str, Any]:
    return {"name": "snippet", "runtime": "python", "tools": list(tools), **fields}


@pytest.mark.parametrize(
    "name",
    ["Hidden", "hidden\0", "hidden\x00scale", "scale\0hidden", "ｈidden", "h" * 100_000, "scale ", "",
     "wasmbox.call_tool", "snippet"],
)  # fmt: skip
def test_a_tool_not_listed_is_never_reached_whatever_the_name(tool_box: wasmbox.Sandbox, name: str) -> None:
    code = f"""
from wasmbox_guest import HostCallError, call_tool
try:
    call_tool({name!r})
    out = "reached"
except HostCallError as e:
    out = str(e)
out
"""
    result = tool_box.run_python(code, grants("scale"))
    assert result.error is None, result.error
    assert result.value != "reached"
    assert "not granted" in result.value and len(result.value) < 300
    assert [r.verdict for r in result.host_calls] == ["denied"]


def test_a_name_that_is_not_a_string_is_a_bad_request(tool_box: wasmbox.Sandbox) -> None:
    code = """
from wasmbox_guest import HostCallError, call_host
seen = []
for name in (["scale"], {"scale": 1}, 7, None, b"hidden", b"\\xff"):
    try:
        call_host("wasmbox.call_tool", name=name, args={"x": 1})
        seen.append("reached")
    except HostCallError as e:
        seen.append("refused")
seen
"""
    result = tool_box.run_python(code, grants("scale"))
    assert result.error is None, result.error
    assert result.value == ["refused"] * 6


@pytest.mark.parametrize("listed", [[], ["scale"]])
def test_call_tool_cannot_be_granted_by_name(
    tool_box: wasmbox.Sandbox, tmp_path: Path, listed: list[str]
) -> None:
    path = tmp_path / "m.json"
    fields = {
        "name": "snippet",
        "runtime": "python",
        "host_functions": ["wasmbox.call_tool"],
        "tools": listed,
    }
    import json

    path.write_text(json.dumps(fields))
    if listed:  # with tools listed, naming it too is harmless: it grants exactly `tools`
        result = tool_box.run_python("tools.hidden()", str(path))
        assert result.error is not None and result.error.kind.value == "capability_denied"
    else:
        with pytest.raises(ManifestError, match="granted by `tools`"):
            tool_box.run_python("1", str(path))


def test_an_inner_call_that_spins_ends_by_the_outer_deadline(tool_box: wasmbox.Sandbox) -> None:
    code = """
from wasmbox_guest import ToolCallError
try:
    tools.spin()
    out = "returned"
except ToolCallError as e:
    out = e.kind
out
"""
    result = tool_box.run_python(code, grants("spin", limits={"timeout": 1.0, "fuel": 10**14}))
    # the inner call is cut at the caller's deadline (its `ceiling`), and the caller stopped there
    # too (the bound is 60 times that deadline: only a missing ceiling reaches it)
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.TIMEOUT, result
    assert result.duration_s < 60


def test_an_inner_result_over_the_outer_output_cap_stops_the_caller(tool_box: wasmbox.Sandbox) -> None:
    result = tool_box.run_python("len(tools.big())", grants("big", limits={"output": "64KiB"}))
    assert result.error is not None and "output_limit" in result.error.message


def test_fan_out_is_bounded_by_host_calls(tool_box: wasmbox.Sandbox) -> None:
    code = """
n = 0
for _ in range(1000):
    tools.scale(x=1)
    n += 1
n
"""
    result = tool_box.run_python(code, grants("scale", limits={"host_calls": 5}))
    assert result.error is not None and result.error.kind.value == "host_error"
    assert "host-call limit" in result.error.message
    assert len(result.host_calls) == 6


def test_a_replaced_tool_is_called_under_its_new_grants(tool_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """`tools` names tools, not grant sets: what a listed name runs is what is loaded under
    that name when the code calls it (SECURITY.md, known gaps)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f.txt").write_text("broader")
    (tmp_path / "r.py").write_text('def main() -> str:\n    return open("/data/f.txt").read()\n')
    tool_box.load({"name": "scale", "runtime": "python", "source": str(tmp_path / "r.py"),
                   "preopens": [{"host": str(tmp_path / "data"), "guest": "/data"}]}, replace=True)  # fmt: skip
    result = tool_box.run_python("tools.scale()", grants("scale"))
    assert result.error is None, result.error
    assert result.value == "broader"


def test_inner_calls_are_fresh_instances(tool_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    (tmp_path / "counter.py").write_text(
        "import builtins\n\ndef main() -> int:\n"
        "    builtins.n = getattr(builtins, 'n', 0) + 1\n    return builtins.n\n"
    )
    tool_box.load({"name": "counter", "runtime": "python", "source": str(tmp_path / "counter.py")})
    result = tool_box.run_python("[tools.counter() for _ in range(3)]", grants("counter"))
    assert result.error is None, result.error
    assert result.value == [1, 1, 1]


def test_a_session_keeps_no_inner_state_and_cannot_replace_tools(tool_box: wasmbox.Sandbox) -> None:
    with tool_box.session(grants("scale")) as session:
        first = session.run("import builtins\nbuiltins.tools = None\n1")
        assert first.error is None, first.error
        again = session.run("tools.scale(x=2)")
    # the session's own builtins are the code's to break (its next run finds `tools` gone); the
    # host and every other call are untouched
    assert again.error is not None and again.error.kind is wasmbox.ErrorKind.GUEST_ERROR
    assert "'NoneType' object has no attribute 'scale'" in again.error.message
    assert tool_box.run_python("tools.scale(x=2)", grants("scale")).value == 4.0


# output_schema: hostile values


@pytest.mark.parametrize(
    ("schema", "body"),
    [
        ({"type": "number"}, "float('nan')"),
        ({"type": "number"}, "float('inf')"),
        ({"type": "integer", "maximum": 10}, "10**400"),
        ({"type": "integer"}, "b'bytes'"),  # bytes are checked as base64 text
        ({"type": "object", "additionalProperties": {"type": "string"}}, "{1: 2}"),  # keys as text
        ({"type": "array", "items": {"type": "array"}}, "eval('[' * 400 + ']' * 400)"),
    ],
)
def test_hostile_values_do_not_pass_output_schema(
    box: wasmbox.Sandbox, tmp_path: Path, schema: dict[str, Any], body: str
) -> None:
    (tmp_path / "t.py").write_text(f"def main():\n    return {body}\n")
    tool = box.load(
        {"name": "t", "runtime": "python", "source": str(tmp_path / "t.py"), "output_schema": schema}
    )
    result = tool.call({})
    assert result.error is not None, result.value
    assert result.value is None


def test_a_recursive_output_schema_checks_deep_values(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    schema = {
        "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"},
                                                          "v": {"type": "integer"}}}},
        "$ref": "#/$defs/node",
    }  # fmt: skip
    (tmp_path / "t.py").write_text(
        "def main(bad: bool):\n    n = {'v': 'x' if bad else 1}\n"
        "    for _ in range(50):\n        n = {'v': 1, 'next': n}\n    return n\n"
    )
    tool = box.load(
        {"name": "t", "runtime": "python", "source": str(tmp_path / "t.py"), "output_schema": schema}
    )
    assert tool.call({"bad": False}).error is None
    assert tool.call({"bad": True}).error is not None


# telemetry that fails


otel = pytest.importorskip("opentelemetry.sdk.trace")


class _Broken(otel.SpanProcessor):  # type: ignore[name-defined]
    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            raise RuntimeError("processor broke on start")

    def on_end(self, span: Any) -> None:
        if self.where == "end":
            raise RuntimeError("processor broke on end")


@pytest.fixture(params=["start", "end"])
def broken_telemetry(request: pytest.FixtureRequest) -> Iterator[None]:
    import wasmbox.telemetry

    provider = otel.TracerProvider()
    provider.add_span_processor(_Broken(request.param))
    wasmbox.telemetry.instrument(tracer_provider=provider)
    try:
        yield
    finally:
        wasmbox.telemetry.uninstrument()


@pytest.mark.usefixtures("broken_telemetry")
def test_a_call_never_fails_because_telemetry_failed(tool_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    scale = tool_box.tool("scale")
    ok = scale.call({"x": 2})
    assert ok.error is None and ok.value == 4.0
    bad = scale.call({"x": "two"})
    assert bad.error is not None and bad.error.kind.value == "invalid_arguments"
    nested = tool_box.run_python("tools.scale(x=3)", grants("scale"))  # host span and inner span
    assert nested.error is None and nested.value == 6.0
    refused = tool_box.run_python("tools.hidden()", grants("scale"))  # a refused host call's event
    assert refused.error is not None and refused.error.kind.value == "capability_denied"
    with tool_box.session(grants("scale")) as session:
        assert session.run("tools.scale(x=1)").value == 2.0


def test_a_broken_telemetry_runs_the_call_once(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    import wasmbox.telemetry

    provider = otel.TracerProvider()
    provider.add_span_processor(_Broken("end"))
    wasmbox.telemetry.instrument(tracer_provider=provider)
    try:
        tool = box.load(manifest("echo"))
        result = tool.call({"text": "x"})
    finally:
        wasmbox.telemetry.uninstrument()
    assert result.error is None
    assert box.tool("echo") is tool
