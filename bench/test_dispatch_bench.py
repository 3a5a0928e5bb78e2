"""What `adispatch` adds on top of `acall` (pytest-benchmark). Run: ./dev bench -k dispatch

Each dispatch figure sits beside the same calls made with `acall` in the same run, on the same
Sandbox and event loop, so the ratio survives a noisy machine. The tool is the trivial echo
module (~40 µs a call), the worst case for the relative overhead. The dispatch side does all of
a model round: the tool call as OpenAI sends it (arguments a JSON string), parsing, the null
stripping of strict mode, the call, and the tool message with its content as JSON.
`bench/dispatch_overhead.py` prints the ratio directly (alternating rounds).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

import wasmbox

from .dispatch_overhead import ARGS, SCHEMA, WAT

CALL = {"id": "call_1", "type": "function", "function": {"name": "echo", "arguments": json.dumps(ARGS)}}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache")) as sandbox:
        sandbox.load({"name": "echo", "module": str(WAT / "echo.wat"), "input_schema": SCHEMA})
        yield sandbox


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_acall_x1(benchmark: Any, box: wasmbox.Sandbox, loop: asyncio.AbstractEventLoop) -> None:
    """The baseline: one `await box.acall(name, args)`."""
    result = benchmark(lambda: loop.run_until_complete(box.acall("echo", ARGS)))
    assert result.unwrap() == ARGS


def test_adispatch_x1(benchmark: Any, box: wasmbox.Sandbox, loop: asyncio.AbstractEventLoop) -> None:
    """One OpenAI tool call through `adispatch`, to its tool message."""
    (reply,) = benchmark(lambda: loop.run_until_complete(box.adispatch([CALL], format="openai")))
    assert json.loads(reply["content"]) == ARGS


def test_acall_x10_gathered(benchmark: Any, box: wasmbox.Sandbox, loop: asyncio.AbstractEventLoop) -> None:
    """The baseline for a parallel turn: ten `acall`s under `asyncio.gather`."""

    async def ten() -> list[wasmbox.CallResult]:
        return await asyncio.gather(*(box.acall("echo", ARGS) for _ in range(10)))

    assert all(r.ok for r in benchmark(lambda: loop.run_until_complete(ten())))


def test_adispatch_x10(benchmark: Any, box: wasmbox.Sandbox, loop: asyncio.AbstractEventLoop) -> None:
    """Ten parallel OpenAI tool calls in one `adispatch`."""
    calls = [{**CALL, "id": f"call_{i}"} for i in range(10)]
    replies = benchmark(lambda: loop.run_until_complete(box.adispatch(calls, format="openai")))
    assert len(replies) == 10
