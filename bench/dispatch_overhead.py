"""`adispatch` against `acall` in one run: the overhead per call, as a ratio of medians.

    ./dev python bench/dispatch_overhead.py [rounds]

Turns alternate between the two (100 pairs a round), so a noisy machine slows both alike. The tool is the trivial echo module; the calls are OpenAI tool calls with
JSON-string arguments (see bench/test_dispatch_bench.py).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import wasmbox

WAT = Path(__file__).resolve().parent.parent / "runtimes" / "examples" / "wat"
ARGS = {"text": "the quick brown fox", "n": 3}
SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["text"],
    "additionalProperties": False,
}


async def timed(turn: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await turn()
    return time.perf_counter() - started


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as cache, wasmbox.Sandbox(cache_dir=cache) as box:
        box.load({"name": "echo", "module": str(WAT / "echo.wat"), "input_schema": SCHEMA})
        for width in (1, 10):
            calls = [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": "echo", "arguments": json.dumps(ARGS)},
                }
                for i in range(width)
            ]

            async def acall_turn(width: int = width) -> Any:
                return await asyncio.gather(*(box.acall("echo", ARGS) for _ in range(width)))

            async def dispatch_turn(calls: list[dict[str, Any]] = calls) -> Any:
                return await box.adispatch(calls, format="openai")

            for _ in range(200):  # warm-up
                await acall_turn()
                await dispatch_turn()
            base: list[float] = []
            ours: list[float] = []
            for _ in range(rounds * 100):  # turn by turn, so a burst of load hits both alike
                base.append(await timed(acall_turn))
                ours.append(await timed(dispatch_turn))
            b, o = statistics.median(base), statistics.median(ours)
            print(
                f"{width:>2} call(s) a turn: acall {b * 1e6 / width:7.1f} µs/call, "
                f"adispatch {o * 1e6 / width:7.1f} µs/call, overhead {(o / b - 1) * 100:+5.1f} % "
                f"({(o - b) * 1e6 / width:+.1f} µs/call)"
            )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
