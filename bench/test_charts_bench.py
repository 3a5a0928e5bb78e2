"""What a chart costs in the scientific runtime (pytest-benchmark, 5 rounds each).
Run: ./dev bench bench/test_charts_bench.py (builds the scientific runtime first if the default
cache lacks it: minutes).

In one run: `1` (the baseline call), `import matplotlib.pyplot` alone, and a typical chart (a
4x3 in bar chart at 100 dpi, saved as PNG into /tmp/out and returned by `outputs`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import wasmbox

GRANTS = {
    "name": "charts", "runtime": "python", "python": "scientific", "scratch": "16MiB",
    "env": {"MPLCONFIGDIR": "/tmp/.matplotlib"}, "outputs": ["/tmp/out/*.png"],
    "limits": {"fuel": 50_000_000_000, "memory": "1GiB", "timeout": 120, "output": "4MiB"},
}  # fmt: skip
CHART = """
import os
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
ax.bar(["north", "south", "east"], [41, 22, 25])
ax.set_title("units by region")
os.makedirs("/tmp/out")
fig.savefig("/tmp/out/units.png")
"""
FUEL: dict[str, int] = {}


@pytest.fixture(scope="module")
def box() -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox() as sandbox:
        sandbox.prepare_scientific()
        sandbox.run_python("1", GRANTS)
        yield sandbox


def _run(box: wasmbox.Sandbox, name: str, code: str) -> wasmbox.CallResult:
    result = box.run_python(code, GRANTS)
    assert result.ok, result.error
    FUEL[name] = result.fuel_used
    return result


def test_charts_baseline(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(_run, (box, "baseline", "1"), rounds=5)
    print(f"\nfuel: baseline {FUEL['baseline']:,}")


def test_charts_import_pyplot(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    benchmark.pedantic(_run, (box, "import", "import matplotlib.pyplot"), rounds=5)
    print(f"\nfuel: import {FUEL['import']:,}")


def test_charts_bar_chart_png(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    result = benchmark.pedantic(_run, (box, "chart", CHART), rounds=5)
    assert result.files["/tmp/out/units.png"].startswith(b"\x89PNG")
    print(f"\nfuel: chart {FUEL['chart']:,}, png {len(result.files['/tmp/out/units.png']):,} bytes, "
          f"peak memory {result.peak_memory:,}")  # fmt: skip
