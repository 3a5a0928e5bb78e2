"""Reactor modules (`[reactor]`): real modules from PyPI called through their own exports.
Graphviz's `graphviz_render` (strings in through `malloc`, a buffer out with its length in an
out-parameter) and QuickJS's `qjs_init_argv` (argv-style, exit code and stdout)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind, ManifestError
from wasmbox._lint import lint
from wasmbox._manifest import Manifest

from .conftest import wat
from .reactor_inputs import (
    GRAPHVIZ,
    QUICKJS,
    graphviz_manifest,
    pinned,
    quickjs_manifest,
)

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def graphviz() -> Path:
    return pinned(GRAPHVIZ)


@pytest.fixture(scope="module")
def quickjs() -> Path:
    return pinned(QUICKJS)


def svg_labels(svg: str) -> list[str]:
    """The text of every node label in an SVG Graphviz drew (parsed: it must be real SVG)."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return [
        "".join(text.itertext())
        for group in root.iter(f"{SVG}g") if group.get("class") == "node"
        for text in group.iter(f"{SVG}text")
    ]  # fmt: skip


# -- Graphviz ---------------------------------------------------------------------------------


def test_graphviz_renders_svg_from_json_args(box: wasmbox.Sandbox, graphviz: Path) -> None:
    tool = box.load(graphviz_manifest(graphviz))
    assert tool.kind is wasmbox.ToolKind.C_REACTOR
    result = tool.call({"dot": 'digraph G { hello -> "wörld"; hello -> again }'})
    assert result.ok, result.error
    assert sorted(svg_labels(result.value)) == ["again", "hello", "wörld"]
    assert result.value.startswith("<?xml")


def test_graphviz_through_a_models_tool_call(box: wasmbox.Sandbox, graphviz: Path) -> None:
    """What a model sees (the strict OpenAI spec) and what it sends back (JSON arguments) is
    all it takes: the format and engine are args like the graph."""
    tool = box.load(graphviz_manifest(graphviz))
    spec = tool.spec("openai", strict=True)
    assert spec["function"]["name"] == "graphviz"
    assert set(spec["function"]["parameters"]["properties"]) == {"dot", "format", "engine"}
    arguments = json.dumps({"dot": "graph { a -- b -- c }", "format": "json", "engine": "neato"})
    call = {"id": "call_1", "type": "function", "function": {"name": "graphviz", "arguments": arguments}}
    [reply] = box.dispatch([call], format="openai")
    drawn = json.loads(reply["content"])  # the value, Graphviz's JSON output, as the text
    assert drawn["directed"] is False
    assert sorted(node["name"] for node in drawn["objects"]) == ["a", "b", "c"]


def test_graphviz_syntax_error_is_a_guest_error_with_its_reason(box: wasmbox.Sandbox, graphviz: Path) -> None:
    tool = box.load(graphviz_manifest(graphviz))
    result = tool.call({"dot": "digraph G { a -> "})
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert result.error.message == "graphviz_render returned NULL: Failed to parse DOT source"
    assert svg_labels(tool.call({"dot": "digraph { ok }"}).unwrap()) == ["ok"]  # still serving


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({}, "missing required property 'dot'"),
        ({"dot": "digraph {}", "format": "exe"}, "args.format: must be one of"),
        ({"dot": "digraph {}", "extra": 1}, "extra"),
        ({"dot": 42}, "args.dot: expected string"),
        ({"dot": "digraph { a }\0 b"}, "NUL byte"),
    ],
)
def test_graphviz_bad_args_are_invalid_arguments(
    box: wasmbox.Sandbox, graphviz: Path, args: dict[str, Any], words: str
) -> None:
    result = box.load(graphviz_manifest(graphviz)).call(args)
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS, result
    assert words in result.error.message


def test_argv_and_stdin_keywords_are_refused(box: wasmbox.Sandbox, graphviz: Path) -> None:
    result = box.load(graphviz_manifest(graphviz)).call({"dot": "digraph {}"}, argv=["-Tsvg"])
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS


def test_graphviz_huge_graph_runs_out_of_fuel(box: wasmbox.Sandbox, graphviz: Path) -> None:
    edges = " ".join(f"n{i} -> n{(i * 7919) % 3000};" for i in range(3000))
    tool = box.load(graphviz_manifest(graphviz, limits={"fuel": 20_000_000, "timeout": "60s"}))
    result = tool.call({"dot": f"digraph {{ {edges} }}"})
    assert result.error is not None and result.error.kind is ErrorKind.OUT_OF_FUEL, result.error
    assert result.fuel_used == 20_000_000


def test_graphviz_under_a_small_memory_cap(box: wasmbox.Sandbox, graphviz: Path) -> None:
    """The module's memory starts at 35 pages (2.2 MiB); a 4 MiB cap leaves a small graph
    room and a big one none: the allocator's NULL, or a trap, is `memory_limit`."""
    tool = box.load(graphviz_manifest(graphviz, limits={"memory": "4MiB", "fuel": 10**10, "timeout": "60s"}))
    assert svg_labels(tool.call({"dot": "digraph { a -> b }"}).unwrap()) == ["a", "b"]
    labels = " ".join(f'n{i} [label="{"x" * 200}"];' for i in range(5000))
    result = tool.call({"dot": f"digraph {{ {labels} }}"})
    assert result.error is not None and result.error.kind is ErrorKind.MEMORY_LIMIT, result.error
    assert result.peak_memory is not None and result.peak_memory <= 4 * 1024**2


def test_graphviz_result_over_the_output_cap(box: wasmbox.Sandbox, graphviz: Path) -> None:
    tool = box.load(graphviz_manifest(graphviz, limits={"output": "4KiB", "fuel": 10**9}))
    nodes = " ".join(f"n{i};" for i in range(200))
    result = tool.call({"dot": f"digraph {{ {nodes} }}"})
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT
    assert "exceeds the 4KiB output cap" in result.error.message


def test_graphviz_as_a_command_is_flagged_by_lint(graphviz: Path) -> None:
    """Its `_start` is a stub that exits 0 with no output: loaded as a command, every call
    succeeds with nothing. Lint says so and names the C API; with `[reactor]` it is quiet."""
    box = wasmbox.Sandbox(cache_dir=None)
    try:
        as_command = box.load({"name": "gv_command", "module": str(graphviz)})
        result = as_command.call()
        assert result.ok and result.value == {"exit_code": 0} and result.stdout == result.stderr == ""
    finally:
        box.close()
    [warning] = lint(Manifest.load({"name": "gv_command", "module": str(graphviz)}))
    assert "graphviz_render" in warning and "[reactor]" in warning
    assert lint(Manifest.load(graphviz_manifest(graphviz))) == []


def test_inspect_notes_the_c_api_of_a_command(graphviz: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from wasmbox.cli import main

    assert main(["inspect", str(graphviz)]) == 0
    assert (
        "note: a WASI command that also exports ['graphviz_version', 'graphviz_last_error'"
        in capsys.readouterr().out
    )
    assert main(["inspect", "--json", str(graphviz)]) == 0
    assert "graphviz_render" in json.loads(capsys.readouterr().out)["command_exports_c_api"]


def test_reactor_calls_are_audited(tmp_path: Path, graphviz: Path) -> None:
    """Every call gets its record, as any call does: the module's digest, the args' digest,
    the outcome, the fuel; a refused call (bad args) too."""
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=tmp_path / "cache", audit=records.append) as box:
        tool = box.load(graphviz_manifest(graphviz))
        ok = tool.call({"dot": "digraph { a }"})
        tool.call({"dot": "digraph {"})
        tool.call({"format": "svg"})
    assert [(r.tool, r.ok, r.error_kind) for r in records] == [
        ("graphviz", True, None), ("graphviz", False, "guest_error"), ("graphviz", False, "invalid_arguments"),
    ]  # fmt: skip
    assert records[0].code_digest == GRAPHVIZ[2] and records[0].fuel_used == ok.fuel_used > 0
    assert records[0].args_digest != records[1].args_digest
    assert records[0].peak_memory == ok.peak_memory


# -- QuickJS ----------------------------------------------------------------------------------


def test_quickjs_evaluates_a_script_from_args(box: wasmbox.Sandbox, quickjs: Path) -> None:
    tool = box.load(quickjs_manifest(quickjs))
    result = tool.call({"code": "console.log(6 * 7, JSON.stringify(scriptArgs))", "args": ["x", "-y"]})
    assert result.ok, result.error
    assert result.value == {"exit_code": 0}
    assert result.stdout == '42 ["x","-y"]\n'


def test_quickjs_exception_is_a_guest_error_with_the_stack(box: wasmbox.Sandbox, quickjs: Path) -> None:
    tool = box.load(quickjs_manifest(quickjs))
    result = tool.call({"code": "function f() { throw new TypeError('bad input') }\nf()"})
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert "TypeError: bad input" in result.error.message and "at f (<cmdline>:1" in result.error.message


def test_quickjs_without_fail_on_exit_code_returns_it(box: wasmbox.Sandbox, quickjs: Path) -> None:
    manifest = quickjs_manifest(quickjs)
    manifest["command"] = {"argv": ["-e", "{code}"]}
    result = box.load(manifest).call({"code": "throw 1"})
    assert result.ok and result.value == {"exit_code": -1}
    assert "Uncaught 1" in result.stderr or "1" in result.stderr


@pytest.mark.parametrize(
    ("limits", "kind"),
    [
        ({"fuel": 30_000_000, "timeout": "60s"}, ErrorKind.OUT_OF_FUEL),
        ({"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT),
    ],
)
def test_quickjs_infinite_loop_is_stopped(
    box: wasmbox.Sandbox, quickjs: Path, limits: dict[str, Any], kind: ErrorKind
) -> None:
    result = box.load(quickjs_manifest(quickjs, limits=limits)).call({"code": "for (;;) {}"})
    assert result.error is not None and result.error.kind is kind, result.error


def test_quickjs_memory_cap(box: wasmbox.Sandbox, quickjs: Path) -> None:
    tool = box.load(quickjs_manifest(quickjs, limits={"memory": "16MiB", "fuel": 10**11, "timeout": "60s"}))
    result = tool.call({"code": "const keep = []; for (;;) keep.push(new Array(100000).fill(1.5))"})
    assert result.error is not None and result.error.kind is ErrorKind.MEMORY_LIMIT, result.error
    assert result.peak_memory is not None and result.peak_memory <= 16 * 1024**2


def test_quickjs_state_is_fresh_per_call(box: wasmbox.Sandbox, quickjs: Path) -> None:
    tool = box.load(quickjs_manifest(quickjs))
    code = "globalThis.seen = (globalThis.seen || 0) + 1; console.log(seen)"
    assert [tool.call({"code": code}).stdout for _ in range(3)] == ["1\n"] * 3


def test_graphviz_state_is_fresh_per_call(box: wasmbox.Sandbox, graphviz: Path) -> None:
    """A failed render leaves its error in a static; the next call's instance has none."""
    tool = box.load(graphviz_manifest(graphviz))
    first = tool.call({"dot": "digraph { a -> b }"})
    assert not tool.call({"dot": "digraph {"}).ok
    assert tool.call({"dot": "digraph { a -> b }"}).value == first.value


# -- checked at load, before compiling ---------------------------------------------------------


def _refused(box: wasmbox.Sandbox, manifest: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> str:
    """The load's ManifestError, with the compiler replaced by a failure: refused before it."""

    def compile_module(*args: object, **kwargs: object) -> None:
        raise AssertionError("the module was compiled before it was refused")

    monkeypatch.setattr(box._cache, "module", compile_module)
    with pytest.raises(ManifestError) as refused:
        box.load(manifest)
    return str(refused.value)


@pytest.mark.parametrize(
    ("reactor", "words"),
    [
        ({"entry": "graphviz_draw"}, "[reactor] entry: the module exports no 'graphviz_draw'"),
        ({"entry": "graphviz_version"}, "graphviz_version has type () -> i32, but its params"),
        ({"params": [{"cstring": "{dot}"}, {"cstring": "{format}"}, "out_len"]},
         "graphviz_render has type (i32, i32, i32, i32) -> i32"),
        ({"params": [{"cstring": "{dot}"}, {"cstring": "{format}"}, {"buffer": "{engine}"}, "out_len"]},
         "graphviz_render has type (i32, i32, i32, i32) -> i32"),
        ({"result": "ptr_len", "params": [{"cstring": "{dot}"}, {"cstring": "{format}"},
                                          {"cstring": "{engine}"}, {"integer": "0"}]}, "-> i64 or (i32, i32)"),
        ({"allocator": {"export": "free"}}, "allocator: free has type (i32) -> (), a malloc allocator is (i32) -> i32"),
        ({"allocator": {"export": "malloc", "signature": "realloc"}}, "a realloc allocator is (i32, i32) -> i32"),
        ({"allocator": {"export": "jemalloc"}}, "allocator: the module exports no 'jemalloc'"),
        ({"initialize": "_initialize"}, "initialize: the module exports no '_initialize'"),
        ({"initialize": "graphviz_version"}, "initialize: graphviz_version has type () -> i32"),
        ({"error": "graphviz_free"}, "error: graphviz_free has type (i32) -> ()"),
    ],
)  # fmt: skip
def test_wrong_declarations_are_refused_before_compiling(
    box: wasmbox.Sandbox, graphviz: Path, monkeypatch: pytest.MonkeyPatch, reactor: dict[str, Any], words: str
) -> None:
    assert words in _refused(box, graphviz_manifest(graphviz, reactor=reactor), monkeypatch)


def test_quickjs_without_reactor_is_refused_with_a_pointer_to_it(
    box: wasmbox.Sandbox, quickjs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "[reactor]" in _refused(box, {"name": "qjs", "module": str(quickjs)}, monkeypatch)


@pytest.mark.parametrize(
    ("reactor", "words"),
    [
        ({"entry": "f", "params": ["argc"], "result": "exit_code"}, "argc and argv go together"),
        ({"entry": "f", "params": [{"cstring": "{x}"}], "result": "cstring"}, "need an `allocator`"),
        ({"entry": "f", "allocator": {"export": "m"}, "params": [{"cstring": "{x}"}], "result": "out_len"},
         "needs an out_len param"),
        ({"entry": "f", "allocator": {"export": "m"}, "params": ["out_len"], "result": "cstring"},
         "out_len is only for result"),
        ({"entry": "f", "allocator": {"export": "m"}, "params": [{"cstring": "{y}"}], "result": "cstring"},
         "{y} is not a property of input_schema"),
        ({"entry": "f", "params": [{"cstring": "{x}", "integer": "{x}"}], "result": "none"},
         "exactly one of cstring, buffer, integer"),
        ({"entry": "f", "result": "pointer"}, "result"),
    ],
)  # fmt: skip
def test_malformed_reactor_tables_are_manifest_errors(reactor: dict[str, Any], words: str) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    with pytest.raises(ManifestError, match="reactor") as refused:
        Manifest.load({"name": "r", "module": wat("echo"), "reactor": reactor, "input_schema": schema})
    assert words in str(refused.value)


def test_fail_on_exit_code_needs_an_exit_code_result() -> None:
    reactor = {"entry": "f", "params": [{"integer": "{x}"}], "result": "none"}
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    with pytest.raises(ManifestError, match="fail_on_exit_code needs reactor.result"):
        Manifest.load({"name": "r", "module": wat("echo"), "reactor": reactor, "input_schema": schema,
                       "command": {"fail_on_exit_code": True}})  # fmt: skip


# -- the other shapes, on small modules written for them --------------------------------------

SHAPES = r"""
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 1024))
  (global $inits (mut i32) (i32.const 0))
  (func (export "_initialize") (global.set $inits (i32.add (global.get $inits) (i32.const 1))))
  (func $alloc (export "alloc") (param $old i32) (param $size i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $size)))
    (local.get $p))
  ;; char *upper(const char *s): in place, NULL for an empty string
  (func (export "upper") (param $s i32) (result i32)
    (local $p i32) (local $c i32)
    (if (i32.eqz (i32.load8_u (local.get $s))) (then (return (i32.const 0))))
    (local.set $p (local.get $s))
    (block $done (loop $next
      (local.set $c (i32.load8_u (local.get $p)))
      (br_if $done (i32.eqz (local.get $c)))
      (if (i32.and (i32.ge_u (local.get $c) (i32.const 97)) (i32.le_u (local.get $c) (i32.const 122)))
        (then (i32.store8 (local.get $p) (i32.sub (local.get $c) (i32.const 32)))))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (br $next)))
    (local.get $s))
  ;; (ptr, len) packed: the buffer as given, times the initializer ran
  (func (export "echo_packed") (param $p i32) (param $n i32) (param $k i64) (result i64)
    (i32.store8 (local.get $p) (i32.add (i32.const 48) (global.get $inits)))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $p)) (i64.const 32))
            (i64.extend_i32_u (i32.wrap_i64 (local.get $k)))))
  ;; (ptr, len) as two results
  (func (export "echo_pair") (param $p i32) (param $n i32) (result i32 i32)
    (local.get $p) (local.get $n))
  ;; int status; *out = buf, *out_len = its length: the JSON {"n":<n>} for n < 10, else 7
  (data (i32.const 0) "{\"n\":0}")
  (func (export "to_json") (param $n i32) (param $out i32) (param $out_len i32) (result i32)
    (if (i32.ge_u (local.get $n) (i32.const 10)) (then (return (i32.const 7))))
    (i32.store8 (i32.const 5) (i32.add (i32.const 48) (local.get $n)))
    (i32.store (local.get $out) (i32.const 0))
    (i32.store (local.get $out_len) (i32.const 7))
    (i32.const 0))
  ;; int main(int argc, char **argv): prints argv[1], returns argc
  (func (export "main2") (param $argc i32) (param $argv i32) (result i32)
    (local $s i32) (local $n i32)
    (local.set $s (i32.load offset=4 (local.get $argv)))
    (block $end (loop $len
      (br_if $end (i32.eqz (i32.load8_u (i32.add (local.get $s) (local.get $n)))))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $len)))
    (i32.store (i32.const 16) (local.get $s))
    (i32.store (i32.const 20) (local.get $n))
    (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))
    (local.get $argc))
  ;; a pointer past the memory's end
  (func (export "wild") (param $s i32) (result i32) (i32.const 0x7fff0000))
)
"""


@pytest.fixture
def shapes(tmp_path: Path) -> str:
    path = tmp_path / "shapes.wat"
    path.write_text(SHAPES)
    return str(path)


def _shape(module: str, reactor: dict[str, Any], properties: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "name": f"shape_{reactor['entry']}", "module": module,
        "reactor": {"allocator": {"export": "alloc", "signature": "realloc"}, **reactor},
        "input_schema": {"type": "object", "properties": properties}, **fields,
    }  # fmt: skip


def test_cstring_in_and_out(box: wasmbox.Sandbox, shapes: str) -> None:
    tool = box.load(_shape(shapes, {"entry": "upper", "params": [{"cstring": "{s}"}], "result": "cstring"},
                           {"s": {"type": "string"}}))  # fmt: skip
    assert tool.call({"s": "Hello, wörld"}).unwrap() == "HELLO, WöRLD"
    failed = tool.call({"s": ""})
    assert failed.error is not None and failed.error.kind is ErrorKind.GUEST_ERROR
    assert failed.error.message == "upper returned NULL"


def test_buffer_and_integer_params_and_a_packed_result(box: wasmbox.Sandbox, shapes: str) -> None:
    """`(ptr, len)` as one i64; the initializer ran once before the entry ('1' written)."""
    reactor = {
        "entry": "echo_packed",
        "params": [{"buffer": "{data}"}, {"integer": "{n}"}],
        "result": "ptr_len",
    }
    tool = box.load(_shape(shapes, reactor, {"data": {"type": "string"}, "n": {"type": "integer"}}))
    assert tool.call({"data": "xabcdef", "n": 4}).unwrap() == "1abc"
    assert tool.call({"data": "xabcdef", "n": 4}).unwrap() == "1abc"  # a fresh instance: once again
    past_the_end = tool.call({"data": "x", "n": 65_000})  # under the output cap, past the 64 KiB memory
    assert past_the_end.error is not None and past_the_end.error.kind is ErrorKind.BAD_RESPONSE
    over_the_cap = tool.call({"data": "x", "n": 2**31})
    assert over_the_cap.error is not None and over_the_cap.error.kind is ErrorKind.OUTPUT_LIMIT


def test_integer_params_are_checked(box: wasmbox.Sandbox, shapes: str) -> None:
    reactor = {"entry": "to_json", "params": [{"integer": "{n}"}, "out_ptr", "out_len"], "result": "out_ptr",
               "result_encoding": "json"}  # fmt: skip
    tool = box.load(_shape(shapes, reactor, {"n": {}}))
    assert tool.call({"n": 3}).unwrap() == {"n": 3}
    for bad, words in (
        (2**32, "does not fit in i32"),
        ("three", "'three' is not an integer"),
        (1.5, "not an integer"),
    ):
        result = tool.call({"n": bad})
        assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS, bad
        assert words in result.error.message
    failed = tool.call({"n": 12})
    assert failed.error is not None and failed.error.message == "to_json returned status 7"


def test_two_result_pair_and_bytes(box: wasmbox.Sandbox, shapes: str) -> None:
    reactor = {
        "entry": "echo_pair",
        "params": [{"buffer": "{data}"}],
        "result": "ptr_len",
        "result_encoding": "bytes",
    }
    tool = box.load(_shape(shapes, reactor, {"data": {"type": "string"}}))
    assert tool.call({"data": "é"}).unwrap() == "é".encode()
    assert tool.call({}).error is not None  # absent: (NULL, 0), a NULL result pointer


def test_argv_main_with_stdout(box: wasmbox.Sandbox, shapes: str) -> None:
    reactor = {"entry": "main2", "params": ["argc", "argv"], "result": "exit_code"}
    manifest = _shape(shapes, reactor, {"word": {"type": "string"}}, args=["fixed"],
                      command={"argv": ["{word}"]})  # fmt: skip
    result = box.load(manifest).call({"word": "ignored"})
    assert result.ok and result.value == {"exit_code": 3}  # [name, "fixed", "ignored"]
    assert result.stdout == "fixed"


def test_a_result_pointer_outside_memory_is_a_bad_response(box: wasmbox.Sandbox, shapes: str) -> None:
    tool = box.load(_shape(shapes, {"entry": "wild", "params": [{"cstring": "{s}"}], "result": "cstring"},
                           {"s": {"type": "string"}}))  # fmt: skip
    result = tool.call({"s": "x"})
    assert result.error is not None and result.error.kind is ErrorKind.BAD_RESPONSE
    assert "outside the module's memory" in result.error.message


def test_text_result_that_is_not_utf8(box: wasmbox.Sandbox, shapes: str) -> None:
    reactor = {"entry": "echo_pair", "params": [{"buffer": "{data}"}], "result": "ptr_len"}
    tool = box.load(_shape(shapes, reactor, {"data": {"type": "string"}}))
    assert tool.call({"data": "ok"}).unwrap() == "ok"
    # the module's own bytes are valid UTF-8 here; a JSON decode of text is refused instead
    as_json = box.load(_shape(shapes, {**reactor, "result_encoding": "json"}, {"data": {"type": "string"}}),
                       replace=True)  # fmt: skip
    result = as_json.call({"data": "{not json"})
    assert result.error is not None and result.error.kind is ErrorKind.BAD_RESPONSE
    assert "not JSON" in result.error.message
