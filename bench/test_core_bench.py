"""Per-call cost of core-module tools (pytest-benchmark). Run: ./dev bench

Each wasmbox figure sits beside the same work done the plain way with wasmtime-py in the same
run (new Store, Linker.instantiate, no limits), so the ratio survives a noisy machine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox
from wasmbox import _bench

ROOT = Path(__file__).resolve().parent.parent
WAT = ROOT / "runtimes" / "examples" / "wat"
ARGS = {"text": "the quick brown fox", "n": 3}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache")) as sandbox:

        @sandbox.host_function("host.fn")
        def host_fn(x: int) -> int:
            return x + 1

        yield sandbox


def test_trivial_call(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """Fresh instance, fuel + memory + deadline + output caps, msgpack in and out."""
    tool = box.load({"name": "echo", "module": str(WAT / "echo.wat")})
    assert benchmark(tool.call, ARGS).unwrap() == ARGS


def test_plain_wasmtime_py_call(benchmark) -> None:  # type: ignore[no-untyped-def]
    """The baseline: the same module and payload, new Store + Linker.instantiate, no limits."""
    call = _bench.plain_core_call(WAT / "echo.wat", ARGS)
    assert benchmark(call)[1] == ARGS


def test_host_function_round_trips_x1000(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """One call making 1000 guest -> host -> guest round trips; divide the time by 1000."""
    tool = box.load(
        {
            "name": "forward_loop",
            "module": str(WAT / "forward_loop.wat"),
            "host_functions": ["host.fn"],
            "limits": {"host_calls": 1000, "timeout": "10s"},
        }
    )
    assert benchmark(tool.call, {"x": 41}).unwrap() == 42


def test_single_host_round_trip_call(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A whole call whose guest makes one host call (compare with test_trivial_call)."""
    tool = box.load(
        {"name": "forward", "module": str(WAT / "forward.wat"), "host_functions": ["host.fn"]}
    )
    assert benchmark(tool.call, {"x": 1}).unwrap() == 2
