"""Per-call cost of the JavaScript runtime (pytest-benchmark). Run: ./dev bench -k javascript

Every call is a fresh instance of the QuickJS-NG snapshot. Two baselines run in the same
pytest run, so ratios survive a noisy machine: the trivial core call (the echo module of
`test_core_bench`) and `run_python("1 + 2")` (a fresh CPython interpreter). The goal: a
fresh-context `run_javascript("1 + 2")` at ≤ 0.3 ms median on the dev machine (figures in
bench/README.md, "JavaScript").

The first use builds both runtimes into the benchmark's cache (seconds for JavaScript, a
minute or more for Python); the fixture does that before any timing starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox

ROOT = Path(__file__).resolve().parent.parent
WAT = ROOT / "runtimes" / "examples" / "wat"
ARGS = {"text": "the quick brown fox", "n": 3}

# A small realistic snippet: 1000 objects built, sorted by a key, through a JSON round trip.
REALISTIC = """
const rows = [];
for (let i = 0; i < 1000; i++) rows.push({ id: i, name: `item-${i}`, score: (i * 7919) % 1000 });
rows.sort((a, b) => a.score - b.score || a.id - b.id);
const back = JSON.parse(JSON.stringify(rows));
({ n: back.length, first: back[0].score, last: back[999].score, name: back[999].name })
"""
REALISTIC_VALUE = {"n": 1000, "first": 0, "last": 999, "name": "item-321"}  # 321 * 7919 % 1000 == 999

GREET_JS = """
function main({ name, times = 1 }) {
  return { greeting: `hello ${name}! `.repeat(times) };
}
"""

HOST_CALL = "wasmbox.callHost('host.fn', { x: 41 })"


@pytest.fixture(scope="module")
def box() -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=Path.home() / ".cache" / "wasmbox-bench") as sandbox:

        @sandbox.host_function("host.fn")
        def host_fn(x: int) -> int:
            return x + 1

        sandbox.prepare_javascript()
        sandbox.prepare_python()
        assert sandbox.run_javascript("1").value == 1
        assert sandbox.run_python("1").value == 1
        yield sandbox


def test_javascript_fresh_context(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A fresh QuickJS context from the snapshot evaluates `1 + 2`, all limits on."""
    assert benchmark(box.run_javascript, "1 + 2").value == 3


def test_javascript_realistic_snippet(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """1000 objects built, sorted and sent through JSON.stringify/parse."""
    assert benchmark(box.run_javascript, REALISTIC).value == REALISTIC_VALUE


def test_javascript_tool_call_small_args(benchmark, box: wasmbox.Sandbox, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A JavaScript tool (its source evaluated in each call, then main(args))."""
    source = tmp_path / "greet.js"
    source.write_text(GREET_JS)
    tool = box.load({"name": "greet_js", "runtime": "javascript", "source": str(source)})
    value = benchmark(tool.call, {"name": "ada", "times": 2}).unwrap()
    assert value == {"greeting": "hello ada! hello ada! "}


def test_javascript_host_call(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A snippet making one wasmbox.callHost round trip, through a grant set (the grant set's
    Tool made once, as `run_javascript(code, grants)` would make it on each call)."""
    grants = {"name": "js_host", "runtime": "javascript", "host_functions": ["host.fn"]}
    tool = box.interpreter(grants, runtime="javascript")
    assert benchmark(tool.call, {"code": HOST_CALL}).value == 42


def test_javascript_host_call_manifest_per_call(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The same, as callers write it: `run_javascript(code, grants)`, the grant set read,
    checked and wrapped in a Tool on every call."""
    grants = {"name": "js_host", "runtime": "javascript", "host_functions": ["host.fn"]}
    assert benchmark(box.run_javascript, HOST_CALL, grants).value == 42


def test_javascript_baseline_core_trivial_call(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """Baseline: test_core_bench's trivial call (echo module, msgpack in and out, all limits)."""
    tool = box.load({"name": "echo", "module": str(WAT / "echo.wat")})
    assert benchmark(tool.call, ARGS).unwrap() == ARGS


def test_javascript_baseline_run_python(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """Baseline: a fresh CPython interpreter from its snapshot evaluates `1 + 2`."""
    assert benchmark(box.run_python, "1 + 2").value == 3
