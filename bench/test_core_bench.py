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
    tool = box.load({"name": "forward", "module": str(WAT / "forward.wat"), "host_functions": ["host.fn"]})
    assert benchmark(tool.call, {"x": 1}).unwrap() == 2


@pytest.mark.parametrize("sink", ["audit_log", "callable"])
def test_trivial_call_audited(benchmark, tmp_path: Path, sink: str) -> None:  # type: ignore[no-untyped-def]
    """test_trivial_call with every call audited: to a hash-chained JSONL file (written on
    its own thread), or to a callable. Compare with test_trivial_call in the same run."""
    records: list[wasmbox.AuditRecord] = []
    log = wasmbox.AuditLog(tmp_path / "audit.jsonl")
    with wasmbox.Sandbox(
        cache_dir=tmp_path / "cache", audit=log if sink == "audit_log" else records.append
    ) as box:
        tool = box.load({"name": "echo", "module": str(WAT / "echo.wat")})
        assert benchmark(tool.call, ARGS).unwrap() == ARGS
    log.close()
    assert wasmbox.verify_audit_log(tmp_path / "audit.jsonl").ok


def test_trivial_call_with_scratch(benchmark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A WASI command with a 1 MiB scratch /tmp made, watched and removed on every call."""
    probe = ROOT / "runtimes" / "examples" / "build" / "fsprobe.wasm"
    with wasmbox.Sandbox(cache_dir=tmp_path / "cache") as box:
        plain = box.load({"name": "plain", "module": str(probe)})
        scratch = box.load({"name": "scratch", "module": str(probe), "scratch": "1MiB"})
        assert plain.call(argv=["exit", "0"]).ok
        assert benchmark(scratch.call, argv=["write", "/tmp/a", "x"]).value == {"exit_code": 0}


def test_wasi_command_without_files(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """fsprobe `exit 0`: a WASI command that touches no file (no forwarder is made)."""
    probe = box.load(ROOT / "capabilities" / "fsprobe.toml", replace=True)
    assert benchmark(probe.call, argv=["exit", "0"]).value == {"exit_code": 0}


def test_wasi_command_reading_a_file(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """fsprobe `read`: one open, read and close through the open-file guard (`_wasi_files`)."""
    probe = box.load(ROOT / "capabilities" / "fsprobe.toml", replace=True)
    assert benchmark(probe.call, argv=["read", "/data/sample.txt"]).ok
