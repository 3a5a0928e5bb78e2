"""Where one kind of call spends its time: the median, then cProfile's top functions.

Run: ./dev python bench/profile_calls.py {core,file,python} [--calls N] [--keep-resident BYTES]
- core: a trivial core call (echo.wat); file: fsprobe `read` (one WASI file opened, read and
  closed); python: `run_python("sum(range(100))")` back to back.
- --keep-resident sets `EngineSettings.pool_keep_resident` (the Python call's memory reset).
cProfile sees only the calling thread: for Python calls, spare instances prepared and stores
freed on the housekeeper thread are missing from it (they still take CPU).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import wasmbox
from wasmbox._wasmtime.engine import EngineSettings

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("kind", choices=["core", "file", "python"])
    parser.add_argument("--calls", type=int, default=0, help="default: 20,000 core, 2,000 otherwise")
    parser.add_argument("--keep-resident", type=int, default=EngineSettings.pool_keep_resident)
    parser.add_argument("--top", type=int, default=15)
    options = parser.parse_args()
    calls = options.calls or (20_000 if options.kind == "core" else 2_000)
    with wasmbox.Sandbox(settings=EngineSettings(pool_keep_resident=options.keep_resident)) as box:
        call: Callable[[], object]
        if options.kind == "core":
            echo = box.load({"name": "echo", "module": str(ROOT / "runtimes/examples/wat/echo.wat")})
            call = lambda: echo.call({"n": 1})
        elif options.kind == "file":
            probe = box.load(ROOT / "capabilities/fsprobe.toml")
            call = lambda: probe.call(argv=["read", "/data/sample.txt"])
        else:
            call = lambda: box.run_python("sum(range(100))")
        for _ in range(calls // 10):
            call()
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        print(f"{options.kind}: median {statistics.median(times) * 1e6:.1f} µs over {calls:,} calls "
              f"(pool_keep_resident {options.keep_resident:,} bytes)")  # fmt: skip
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(calls):
            call()
        profile.disable()
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(options.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
