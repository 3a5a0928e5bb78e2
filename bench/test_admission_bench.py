"""What admission control costs a call (pytest-benchmark). Run:
./dev bench bench/test_admission_bench.py

The trivial echo call, in one run: on a Sandbox without `admission` (the baseline: one check),
with `AdmissionLimits(in_flight=...)` (a lock and a thread-local), with `resident` too (a pread
of /proc/self/statm), and under a `Budget` (its lock and deques) beside them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox

from .dispatch_overhead import ARGS, SCHEMA, WAT

ADMISSIONS = {
    "none": None,
    "in_flight": wasmbox.AdmissionLimits(in_flight=1024),
    "in_flight_and_resident": wasmbox.AdmissionLimits(in_flight=1024, resident="1000GiB"),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(params=list(ADMISSIONS))
def echo(request: pytest.FixtureRequest, cache: Path) -> Iterator[wasmbox.Tool]:
    with wasmbox.Sandbox(cache_dir=cache, admission=ADMISSIONS[request.param]) as box:
        yield box.load({"name": "echo", "module": str(WAT / "echo.wat"), "input_schema": SCHEMA})


def test_call_admission(benchmark: Any, echo: wasmbox.Tool) -> None:
    assert benchmark(echo.call, ARGS).ok


def test_call_budget(benchmark: Any, cache: Path) -> None:
    """No admission, a Budget with every cap (none reached)."""
    budget = wasmbox.Budget(
        calls=10**9, fuel=10**15, wall_s=10**9, output=10**12, concurrent=1024, window_s=3600
    )
    with wasmbox.Sandbox(cache_dir=cache) as box:
        echo = box.load({"name": "echo", "module": str(WAT / "echo.wat"), "input_schema": SCHEMA})
        assert benchmark(echo.call, ARGS, budget=budget).ok
