"""Per-call cost of core-module tools (pytest-benchmark). Run: ./dev bench

Each wasmbox figure sits beside the same work done the plain way with wasmtime-py in the same
run (new Store, Linker.instantiate, no limits), so the ratio survives a noisy machine. The
wasmbox calls are timed by the plugin's `wasmbox_bench`, which puts each benchmark's phases
(instantiate, run, teardown, host functions, fuel) in its extra_info (`--benchmark-json`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox
from wasmbox import _bench
from wasmbox.testing import ToolBench

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


def test_trivial_call(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """Fresh instance, fuel + memory + deadline + output caps, msgpack in and out."""
    tool = box.load({"name": "echo", "module": str(WAT / "echo.wat")})
    assert wasmbox_bench(tool, ARGS).result.unwrap() == ARGS


def test_plain_wasmtime_py_call(benchmark) -> None:  # type: ignore[no-untyped-def]
    """The baseline: the same module and payload, new Store + Linker.instantiate, no limits."""
    call = _bench.plain_core_call(WAT / "echo.wat", ARGS)
    assert benchmark(call)[1] == ARGS


def test_host_function_round_trips_x1000(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """One call making 1000 guest -> host -> guest round trips; divide the time by 1000."""
    tool = box.load(
        {
            "name": "forward_loop",
            "module": str(WAT / "forward_loop.wat"),
            "host_functions": ["host.fn"],
            "limits": {"host_calls": 1000, "timeout": "10s"},
        }
    )
    run = wasmbox_bench(tool, {"x": 41})
    assert run.result.unwrap() == 42 and run.phases["host_calls"] == 1000


def test_single_host_round_trip_call(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """A whole call whose guest makes one host call (compare with test_trivial_call)."""
    tool = box.load({"name": "forward", "module": str(WAT / "forward.wat"), "host_functions": ["host.fn"]})
    assert wasmbox_bench(tool, {"x": 1}).result.unwrap() == 2


@pytest.mark.parametrize("sink", ["audit_log", "callable"])
def test_trivial_call_audited(wasmbox_bench: ToolBench, tmp_path: Path, sink: str) -> None:
    """test_trivial_call with every call audited: to a hash-chained JSONL file (written on
    its own thread), or to a callable. Compare with test_trivial_call in the same run."""
    records: list[wasmbox.AuditRecord] = []
    log = wasmbox.AuditLog(tmp_path / "audit.jsonl")
    with wasmbox.Sandbox(
        cache_dir=tmp_path / "cache", audit=log if sink == "audit_log" else records.append
    ) as box:
        tool = box.load({"name": "echo", "module": str(WAT / "echo.wat")})
        assert wasmbox_bench(tool, ARGS).result.unwrap() == ARGS
    log.close()
    assert wasmbox.verify_audit_log(tmp_path / "audit.jsonl").ok


def test_trivial_call_with_scratch(wasmbox_bench: ToolBench, tmp_path: Path) -> None:
    """A WASI command with a 1 MiB scratch /tmp made, watched and removed on every call."""
    probe = ROOT / "runtimes" / "examples" / "build" / "fsprobe.wasm"
    with wasmbox.Sandbox(cache_dir=tmp_path / "cache") as box:
        plain = box.load({"name": "plain", "module": str(probe)})
        scratch = box.load({"name": "scratch", "module": str(probe), "scratch": "1MiB"})
        assert plain.call(argv=["exit", "0"]).ok
        assert wasmbox_bench(scratch, argv=["write", "/tmp/a", "x"]).result.value == {"exit_code": 0}


def test_wasi_command_without_files(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """fsprobe `exit 0`: a WASI command that touches no file (no forwarder is made)."""
    probe = box.load(ROOT / "capabilities" / "fsprobe.toml", replace=True)
    assert wasmbox_bench(probe, argv=["exit", "0"]).result.value == {"exit_code": 0}


def test_wasi_command_reading_a_file(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """fsprobe `read`: one open, read and close through the open-file guard (`_wasi_files`)."""
    probe = box.load(ROOT / "capabilities" / "fsprobe.toml", replace=True)
    assert wasmbox_bench(probe, argv=["read", "/data/sample.txt"]).result.ok
