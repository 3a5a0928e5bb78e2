"""Code that calls tools against dispatched calls (pytest-benchmark). Run:
./dev bench bench/test_code_tools_bench.py

Ten calls of the echo module made by one `run_python` snippet (`tools.echo(...)` in a loop),
beside the same ten calls as a model's tool calls through `dispatch` (OpenAI's format: JSON
arguments parsed, each call checked and run, ten tool messages), and beside one snippet that
calls no tool (what the snippet's own fresh interpreter costs). Per inner call, the snippet's
figure less the bare snippet's, divided by ten, is what `tools.name()` adds to a call; end to end,
one snippet saves the model nine round trips that dispatch needs, which no bench here measures.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import wasmbox

from .dispatch_overhead import ARGS, SCHEMA, WAT

CALLS = [
    {"id": f"call_{i}", "type": "function", "function": {"name": "echo", "arguments": json.dumps(ARGS)}}
    for i in range(10)
]
GRANTS = {"name": "snippet", "runtime": "python", "tools": ["echo"], "limits": {"host_calls": 10}}
SNIPPET = f"[tools.echo(**{ARGS!r}) for _ in range(10)]"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache")) as sandbox:
        sandbox.load({"name": "echo", "module": str(WAT / "echo.wat"), "input_schema": SCHEMA})
        sandbox.run_python("1", GRANTS)  # the runtime built and a spare made for the grant set
        yield sandbox


def test_snippet_alone(benchmark: Any, box: wasmbox.Sandbox) -> None:
    """The baseline: a snippet under the same grants that calls no tool."""
    assert benchmark(box.run_python, "[dict(ARGS) for ARGS in [{}] * 10]", GRANTS).ok


def test_snippet_x10_tool_calls(benchmark: Any, box: wasmbox.Sandbox) -> None:
    """One snippet making ten `tools.echo(...)` calls."""
    result = benchmark(box.run_python, SNIPPET, GRANTS)
    assert result.value == [ARGS] * 10, result.error


def test_dispatch_x10(benchmark: Any, box: wasmbox.Sandbox) -> None:
    """The same ten calls as a model's tool calls through `dispatch`."""
    replies = benchmark(box.dispatch, CALLS, format="openai")
    assert [json.loads(r["content"]) for r in replies] == [ARGS] * 10
