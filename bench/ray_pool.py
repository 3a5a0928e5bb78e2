"""Calls/s through a `RaySandboxPool` against in-process `Sandbox.acall`, in one run; and what
starting a pool costs.

    ./dev python bench/ray_pool.py [rounds] [actors]

Starts a local Ray cluster (dashboard off, on the loopback address). Each round runs a batch
of 200 concurrent calls in-process, then the same batch through the pool (all through
`acall`/`arun_python` and `asyncio.gather`, so both have the same number of calls in flight),
for three kinds of call: the trivial echo module, a core call that burns ~20 M fuel, and a
fresh Python interpreter (`run_python`). Figures are medians over rounds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on 127.0.0.1 (see tests/test_ray.py)
import wasmbox  # noqa: I001 - the integration before Ray (docs/ray.md)
from wasmbox.integrations import ray as ray_pool
from wasmbox.integrations.ray import RaySandboxPool
import ray

WAT = Path(__file__).resolve().parent.parent / "runtimes" / "examples" / "wat"
TOOLS = WAT.parent.parent.parent / "capabilities" / "tools"
BATCH = 200
# spin's loop stopped by fuel: a call that does ~20 M instructions of work, then fails out_of_fuel
MANIFESTS = [
    {"name": "echo", "module": str(WAT / "echo.wat")},
    {"name": "spin", "module": str(WAT / "spin.wat"), "limits": {"fuel": 20_000_000, "timeout": 30}},
]
CODE = "sum(range(1000))"


async def batch(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(call() for _ in range(BATCH)))
    return time.perf_counter() - started


async def compare(rounds: int, box: wasmbox.Sandbox, pool: RaySandboxPool) -> None:
    kinds: list[tuple[str, Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = [
        (
            "echo (trivial core call)",
            lambda: box.acall("echo", {"a": 1}),
            lambda: pool.acall("echo", {"a": 1}),
        ),
        ("spin, 20 M fuel", lambda: box.acall("spin"), lambda: pool.acall("spin")),
        ("run_python, fresh interpreter", lambda: box.arun_python(CODE), lambda: pool.arun_python(CODE)),
    ]
    for name, local, remote in kinds:
        await batch(local), await batch(remote)  # warm-up
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(rounds):
            ours.append(await batch(local))
            theirs.append(await batch(remote))
        a, b = BATCH / statistics.median(ours), BATCH / statistics.median(theirs)
        print(f"{name:32} in-process {a:8.0f} calls/s   pool {b:8.0f} calls/s   pool/in-process {b / a:5.2f}")


def main(rounds: int, actors: int) -> None:
    with tempfile.TemporaryDirectory(prefix="ray-", dir="/tmp") as temp:
        started = time.perf_counter()
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _temp_dir=temp, log_to_driver=False)
        print(f"ray.init (a local cluster): {time.perf_counter() - started:.1f} s")
        cache = os.environ.get("WASMBOX_CACHE_DIR") or str(Path.home() / ".cache" / "wasmbox")
        options = {"num_cpus": 0}
        python_tool = {"name": "csv_stats", "runtime": "python", "source": str(TOOLS / "csv_stats.py")}
        for label, manifests in (
            ("2 core tools", MANIFESTS),
            ("2 core tools + a Python tool", [*MANIFESTS, python_tool]),
        ):
            starts = []
            for _ in range(3):
                with RaySandboxPool(manifests, actors=actors, actor_options=options, cache_dir=cache) as pool:
                    starts.append(pool.start_s)
            print(
                f"pool start, {actors} actors, {label}: {statistics.median(starts):.2f} s (median of 3, warm cache)"
            )
        with (
            wasmbox.Sandbox(cache_dir=cache) as box,
            RaySandboxPool(MANIFESTS, actors=actors, actor_options=options, cache_dir=cache) as pool,
        ):
            for manifest in MANIFESTS:
                box.load(manifest)
            box.run_python("1"), pool.run_python("1")
            asyncio.run(compare(rounds, box, pool))
        ray_pool.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
