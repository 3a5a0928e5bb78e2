"""The per-call cost of a narrowed host-function grant (`host_function_args`), pytest-benchmark:

    ./dev bench bench/test_narrowed_bench.py --benchmark-columns=median,ops

forward_loop.wat makes 1000 guest -> host -> guest round trips to `host.fn` in one call; the
same module is loaded twice in the same run, its grant of `host.fn` unnarrowed (the baseline)
and narrowed to `x` an integer from 0 to 10**6 (one check of the args map per host call,
before the function runs). The difference of the medians, divided by 1000, is what one check
adds to a host call; `HostFunction.invoke` alone, with and without the check, gives the same
figure without the guest.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox
from wasmbox import _abi as abi
from wasmbox._capabilities.hostfuncs import HostFunction
from wasmbox._manifest import constraint_schema
from wasmbox._schema import compile as compile_schema

WAT = Path(__file__).resolve().parent.parent / "runtimes" / "examples" / "wat"
NARROW = {"x": {"type": "integer", "minimum": 0, "maximum": 10**6}}


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache")) as sandbox:

        @sandbox.host_function("host.fn")
        def host_fn(x: int) -> int:
            return x + 1

        yield sandbox


@pytest.mark.parametrize("narrowed", [False, True], ids=["unnarrowed", "narrowed"])
def test_host_calls_x1000(benchmark, box: wasmbox.Sandbox, narrowed: bool) -> None:  # type: ignore[no-untyped-def]
    manifest = {
        "name": f"loop_{'narrowed' if narrowed else 'plain'}",
        "module": str(WAT / "forward_loop.wat"),
        "host_functions": ["host.fn"],
        "limits": {"host_calls": 1000, "timeout": "60s"},
        **({"host_function_args": {"host.fn": NARROW}} if narrowed else {}),
    }
    tool = box.load(manifest)
    result = benchmark(tool.call, {"x": 41})
    assert result.unwrap() == 42 and len(result.host_calls) == 1000
    assert {r.verdict for r in result.host_calls} == {"ok"}


@pytest.mark.parametrize("narrowed", [False, True], ids=["unnarrowed", "narrowed"])
def test_invoke(benchmark, narrowed: bool) -> None:  # type: ignore[no-untyped-def]
    function = HostFunction("host.fn", lambda x: x + 1)
    check = compile_schema(constraint_schema(NARROW)) if narrowed else None
    request = abi.pack({"x": 41})
    reply = benchmark(function.invoke, request, check)
    assert reply.record.verdict == "ok"
