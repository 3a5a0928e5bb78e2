"""Per-call cost of the CPython runtime (pytest-benchmark). Run: ./dev bench -k python

The first use builds and compiles the runtime into the benchmark's cache (tens of seconds);
the fixture does that before any timing starts. The wasmbox calls are timed by the plugin's
`wasmbox_bench` (their phases in each benchmark's extra_info, `--benchmark-json`), back to back
or 5 ms apart (`_spaced`: a spare instance is ready, the pause outside the timing).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import wasmtime

import wasmbox
from wasmbox import _abi
from wasmbox._backends.python.runner import encode_request
from wasmbox._bench import GREET_PY, plain_component
from wasmbox.testing import ToolBench

ROOT = Path(__file__).resolve().parent.parent
CAPABILITIES = ROOT / "capabilities"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Sandbox]:
    cache = Path.home() / ".cache" / "wasmbox-bench"
    with wasmbox.Sandbox(cache_dir=cache) as sandbox:

        @sandbox.host_function("host.fn")
        def host_fn(x: int) -> int:
            return x + 1

        sandbox.prepare_python()
        yield sandbox


def test_python_fresh_interpreter_sum(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """A fresh interpreter from the snapshot runs `sum(range(100))`, all limits on."""
    assert wasmbox_bench(box.interpreter(), {"code": "sum(range(100))"}).result.value == 4950


def test_python_fresh_interpreter_sum_spaced(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """The same, calls 5 ms apart: a spare instance is ready for each."""
    run = wasmbox_bench(box.interpreter(), {"code": "sum(range(100))"}, spacing="5ms", rounds=200)
    assert run.result.value == 4950


def test_python_run_python_as_a_user_times_it(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """`benchmark(box.run_python, "sum(range(100))")`, as a user's pytest-benchmark run calls it:
    back to back, nothing recorded; the tail (max and p99 against the median, p99 in
    extra_info) is what this row is for."""
    assert benchmark(box.run_python, "sum(range(100))").value == 4950
    data = sorted(benchmark.stats.stats.data)
    benchmark.extra_info["p99_s"] = data[min(len(data) - 1, int(len(data) * 0.99))]


def test_python_session_run_sum(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The baseline of a fresh call: the same snippet run again in one session's instance."""
    limits = wasmbox.SessionLimits(calls=10**9, fuel=2**62, time=10**9, idle=3600, lifetime=10**9)
    with box.session(limits=limits) as session:
        assert benchmark(session.run, "sum(range(100))").value == 4950


def test_python_plain_wasmtime_py_component_call(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The baseline: the same component and request, new Store + Linker.instantiate, no limits."""
    runtime = box._runtimes.python()._runtime
    engine, compiled, linker = plain_component(runtime.component)
    request = encode_request({"mode": "code", "code": "sum(range(100))"}, 64 * 1024)

    def call() -> object:
        store = wasmtime.Store(engine)
        wasi = wasmtime.WasiConfig()
        wasi.preopen_dir(str(runtime.stdlib), "/python", fs_mutable=False)
        store.set_wasi(wasi)
        run = linker.instantiate(store, compiled).get_func(store, "run")
        assert run is not None
        out = run(store, request)
        run.post_return(store)
        return _abi.unpack(out)["ok"]

    assert benchmark(call) == 4950


def test_python_tool_call_small_args(wasmbox_bench: ToolBench, box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "greet.py"
    source.write_text(GREET_PY)
    tool = box.load({"name": "greet", "runtime": "python", "source": str(source)})
    value = wasmbox_bench(tool, {"name": "ada", "times": 2}).result.unwrap()
    assert value == {"greeting": "hello ada! hello ada! "}


def test_python_host_round_trips_x100(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """100 guest -> host -> guest calls from Python code; subtract the x0 run, divide by 100."""
    code = "import wasmbox_guest\nfor i in range(100):\n    wasmbox_guest.call_host('host.fn', x=i)\n1"
    grants = {"name": "rt", "runtime": "python", "host_functions": ["host.fn"],
              "limits": {"host_calls": 100}}  # fmt: skip
    assert wasmbox_bench(box.interpreter(grants), {"code": code}).result.value == 1


def test_python_host_round_trips_x0(wasmbox_bench: ToolBench, box: wasmbox.Sandbox) -> None:
    """The same loop without the host call, for the subtraction."""
    code = "import wasmbox_guest\nfor i in range(100):\n    pass\n1"
    grants = {"name": "rt0", "runtime": "python", "host_functions": ["host.fn"]}
    assert wasmbox_bench(box.interpreter(grants), {"code": code}).result.value == 1
