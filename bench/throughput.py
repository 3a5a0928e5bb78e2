"""Sustained calls per second with 1 and 2 threads, in one process. Run: ./dev python bench/throughput.py

Prints a table; the 2-thread/1-thread ratio is the figure to watch (the target is >= 1.7x).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import wasmbox
from wasmbox._bench import throughput

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    box = wasmbox.Sandbox()
    echo = box.load({"name": "echo", "module": str(ROOT / "runtimes/examples/wat/echo.wat")})
    spin = box.load({"name": "busy", "module": str(ROOT / "runtimes/examples/wat/spin.wat"),
                     "limits": {"fuel": 2_000_000}})  # fmt: skip
    box.prepare_python()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("trivial core call (echo)", lambda: echo.call({"n": 1})),
        ("core call burning 2M fuel", lambda: spin.call({})),
        ("fresh Python interpreter", lambda: box.run_python("sum(range(100))")),
    ]
    print(f"{'what':28} {'1 thread /s':>12} {'2 threads /s':>13} {'ratio':>6}")
    for label, call in cases:
        throughput(call, 1, 0.3)  # warm
        one = throughput(call, 1, seconds)
        two = throughput(call, 2, seconds)
        print(f"{label:28} {one:12,.0f} {two:13,.0f} {two / one:6.2f}")
    box.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
