"""RSS, file descriptors and threads across many calls in one process.

Run: ./dev python bench/soak.py [CORE_CALLS] [PYTHON_CALLS]   (default 100,000 and 10,000)
Growth is measured after a warm-up, so caches and pools that fill once do not count.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import wasmbox
from wasmbox._bench import process_stats as snapshot

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    core_calls = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    python_calls = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    box = wasmbox.Sandbox()

    @box.host_function("kv.get")
    def kv_get(key: str) -> str | None:
        return {"a": "1"}.get(key)

    echo = box.load({"name": "echo", "module": str(ROOT / "runtimes/examples/wat/echo.wat")})
    kv = box.load(ROOT / "capabilities/kv_lookup.toml")
    trap = box.load({"name": "trap", "module": str(ROOT / "runtimes/examples/wat/trap.wat")})
    csv = box.load(ROOT / "capabilities/csv_stats.toml")
    for _ in range(2000):  # warm-up: pools, caches, first-touch pages
        echo.call({"n": 1}), kv.call({"key": "a"}), trap.call({})
    for _ in range(1000):  # enough for the pooled memories that spares and closing use to be touched
        box.run_python("sum(range(100))"), csv.call({"path": "/data/sales.csv"})
    before = snapshot()
    started = time.perf_counter()
    for i in range(core_calls):
        (echo.call({"n": i}) if i % 3 == 0 else kv.call({"key": "a"}) if i % 3 == 1 else trap.call({}))
    core_s = time.perf_counter() - started
    middle = snapshot()
    started = time.perf_counter()
    for i in range(python_calls):
        if i % 2:
            box.run_python(f"sum(range({i % 100}))")
        else:
            csv.call({"path": "/data/sales.csv"})
    python_s = time.perf_counter() - started
    after = snapshot()
    print(f"{'':28} {'RSS MiB':>8} {'fds':>5} {'threads':>8}")
    for label, (rss, fds, threads) in (("after warm-up", before), (f"after {core_calls:,} core calls", middle),
                                       (f"after {python_calls:,} Python calls", after)):  # fmt: skip
        print(f"{label:28} {rss:8.1f} {fds:5d} {threads:8d}")
    print(
        f"growth: RSS {after[0] - before[0]:+.1f} MiB, fds {after[1] - before[1]:+d}, "
        f"threads {after[2] - before[2]:+d}  "
        f"({core_calls / core_s:,.0f} core calls/s, {python_calls / python_s:,.0f} Python calls/s)"
    )
    box.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
