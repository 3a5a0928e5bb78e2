"""A new process: `import wasmbox`, load a Python tool, first result, with a warm disk cache.

Run: ./dev python bench/cold_start.py [RUNS] [TREE ...]
Prints the median wall time of whole processes (interpreter start included), the split
measured inside them, and the rest (the interpreter's start and its exit). The children may write bytecode (to a cache of their own, not the source
tree: `_timing.bytecode_cache`). With TREEs (checkouts whose `wasmbox/` is timed,
e.g. `git worktree add /tmp/before <rev>`), the trees take turns, one process each per run,
in alternating order.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from _timing import bytecode_cache, processes

ROOT = Path(__file__).resolve().parent.parent
CHILD = f"""
import sys, time
from pathlib import Path
if len(sys.argv) > 1:  # a checkout's wasmbox, not the installed one
    sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
import wasmbox
t1 = time.perf_counter()
box = wasmbox.Sandbox()
tool = box.load({str(ROOT / "capabilities" / "csv_stats.toml")!r})
t2 = time.perf_counter()
value = tool.call({{"path": "/data/sales.csv"}}).unwrap()
t3 = time.perf_counter()
assert value["rows"] == 8
assert len(sys.argv) == 1 or Path(wasmbox.__file__).is_relative_to(sys.argv[1]), wasmbox.__file__
print(f"{{(t1 - t0) * 1e3:.1f}} {{(t2 - t1) * 1e3:.1f}} {{(t3 - t2) * 1e3:.1f}}")
"""


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    trees = [str(Path(tree).resolve()) for tree in sys.argv[2:]] or [""]
    with bytecode_cache() as env:
        timed = processes({tree: _child(tree) for tree in trees}, runs, env)
    for tree, samples in timed.items():
        median = statistics.median(wall for wall, _ in samples) * 1e3
        splits = [[float(x) for x in out.split()] for _, out in samples]
        parts = [statistics.median(s[i] for s in splits) for i in range(3)]
        rest = statistics.median(wall * 1e3 - sum(s) for (wall, _), s in zip(samples, splits, strict=True))
        print(f"{tree + ': ' if tree else ''}new process to first Python tool result: {median:.0f} ms "
              f"median of {runs} (import wasmbox {parts[0]:.0f} ms, load {parts[1]:.0f} ms, "
              f"first call {parts[2]:.0f} ms, the rest: the interpreter's start and exit {rest:.0f} ms)")  # fmt: skip
    return 0


def _child(tree: str) -> list[str]:
    return [sys.executable, "-c", CHILD, *([tree] if tree else [])]


if __name__ == "__main__":
    sys.exit(main())
