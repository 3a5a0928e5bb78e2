"""A trivial call through the MCP server against `Tool.acall`, in one run.

    ./dev python bench/mcp_overhead.py [rounds]

Three ways of making the same call (the echo module), one after the other in each round of
200 calls each, so a noisy machine slows them alike: `acall` directly; the mcp SDK's client
talking to `build_server(box)` in-process (the SDK's request handling, no transport); and
`wasmbox mcp serve` over stdio (a subprocess: JSON-RPC lines through pipes). Prints the
median per call and its ratio to `acall`.
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

from mcp import Client, ClientSession, StdioServerParameters, stdio_client

import wasmbox
from wasmbox.integrations.mcp import build_server

WAT = Path(__file__).resolve().parent.parent / "runtimes" / "examples" / "wat"
ARGS = {"text": "the quick brown fox", "n": 3}
CALLS = 200


async def per_call(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    for _ in range(CALLS):
        await call()
    return (time.perf_counter() - started) / CALLS


async def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as folder, wasmbox.Sandbox(cache_dir=folder) as box:
        manifest = Path(folder) / "echo.json"
        manifest.write_text(json.dumps({"name": "echo", "module": str(WAT / "echo.wat")}))
        tool = box.load(manifest)
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "wasmbox", "mcp", "serve", str(manifest)],
            env={"WASMBOX_CACHE_DIR": folder},
        )  # fmt: skip
        times: dict[str, list[float]] = {"acall": [], "mcp in-process": [], "mcp stdio": []}
        async with (
            Client(build_server(box)) as local,
            stdio_client(params) as (read, write),
            ClientSession(read, write) as remote,
        ):
            await remote.initialize()
            for _ in range(rounds):
                times["acall"].append(await per_call(lambda: tool.acall(ARGS)))
                times["mcp in-process"].append(await per_call(lambda: local.call_tool("echo", ARGS)))
                times["mcp stdio"].append(await per_call(lambda: remote.call_tool("echo", ARGS)))
    base = statistics.median(times["acall"])
    print(f"{'path':<16} {'median µs/call':>15} {'vs acall':>9}   ({rounds} rounds of {CALLS} calls)")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<16} {median * 1e6:>15.0f} {median / base:>8.1f}x")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
