"""A new process: `import wasmbox`, load a Python tool, first result, with a warm disk cache.

Run: ./dev python bench/cold_start.py [RUNS]
Prints the median wall time of whole processes (interpreter start included) and the split
measured inside one of them. The children may write bytecode (to a cache of their own, not
the source tree), as an installed package has it: compiling wasmbox's sources again in every
process would add ~20 ms that no user pays.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = f"""
import time
t0 = time.perf_counter()
import wasmbox
t1 = time.perf_counter()
box = wasmbox.Sandbox()
tool = box.load({str(ROOT / "capabilities" / "csv_stats.toml")!r})
t2 = time.perf_counter()
value = tool.call({{"path": "/data/sales.csv"}}).unwrap()
t3 = time.perf_counter()
assert value["rows"] == 8
print(f"{{(t1 - t0) * 1e3:.1f}} {{(t2 - t1) * 1e3:.1f}} {{(t3 - t2) * 1e3:.1f}}")
"""


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    child = [sys.executable, "-c", CHILD]
    walls, splits = [], []
    with tempfile.TemporaryDirectory(prefix="wasmbox-pyc-") as bytecode:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = bytecode
        subprocess.run(child, check=True, capture_output=True, env=env)  # warm the caches
        for _ in range(runs):
            started = time.perf_counter()
            out = subprocess.run(child, check=True, capture_output=True, text=True, env=env)
            walls.append((time.perf_counter() - started) * 1e3)
            splits.append([float(x) for x in out.stdout.split()])
    median = statistics.median(walls)
    parts = [statistics.median(s[i] for s in splits) for i in range(3)]
    print(f"new process to first Python tool result: {median:.0f} ms median of {runs} "
          f"(import wasmbox {parts[0]:.0f} ms, load {parts[1]:.0f} ms, first call {parts[2]:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
