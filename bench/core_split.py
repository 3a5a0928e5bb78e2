"""A trivial core call split in two: Wasmtime's C API work, and wasmbox's Python around it.

Run: ./dev python bench/core_split.py [--rounds N] [--block N]
Three calls take turns in blocks (`_timing.taking_turns`), each timed call by call; medians:
- "Tool.call": `wasmbox bench`'s echo (`_bench.ECHO_WAT`) through `Tool.call`, as a user calls it;
- "C API only": the same call as the bare sequence of C API calls the call path makes, through
  ctypes with no wasmbox code around them, the same 18 C calls (a Store from the same engine
  with the same store limits, fuel and epoch deadline; the tool's own InstancePre
  instantiated; `memory`, `wasmbox_alloc` and `wasmbox_call` looked up; the args written,
  `wasmbox_call` called, the reply read and unpacked, the memory's size read; the fuel read;
  the Store deleted): what any Python binding of this engine pays, ctypes' own cost per C call
  included;
- "plain wasmtime-py": `_bench.plain_core_call` (new Store, `Linker.instantiate`, no limits).
"Python skeleton" is the Tool.call median less the C API median: what wasmbox's own Python
costs a call. The native layer (bench/README.md, "Native core spike") pays neither ctypes nor
the skeleton: its "native raw" figure is the C work without them.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from _timing import taking_turns
from wasmtime import _bindings as ffi

import wasmbox
from wasmbox import _abi, _bench
from wasmbox._backends.core import runner as core_runner

ARGS = {"text": "the quick brown fox", "n": 3}  # `wasmbox bench`'s trivial call
# the C functions, as ctypes calls them without wasmtime-py's Python wrappers
_C_FUNCTIONS = (
    "store_new", "store_context", "store_limiter", "context_set_fuel", "context_get_fuel",
    "context_set_epoch_deadline", "instance_pre_instantiate", "instance_export_get",
    "func_call_unchecked", "memory_data", "memory_data_size", "store_delete",
)  # fmt: skip


def c_api_call(tool: wasmbox.Tool) -> Callable[[], object]:
    """The tool's call as C API calls only (see the module's docstring)."""
    runner = tool._runner
    assert isinstance(runner, core_runner.ModuleRunner)
    engine = runner._engine.ptr()
    pre = runner._pre.ptr()
    limits = runner._manifest.limits
    store_limits = core_runner._STORE_LIMITS
    cells = (
        limits.memory,
        store_limits["table_elements"],
        store_limits["instances"],
        store_limits["tables"],
        store_limits["memories"],
    )
    names = [_abi.EXPORT_MEMORY.encode(), _abi.EXPORT_ALLOC.encode(), _abi.EXPORT_CALL.encode()]
    payload = _abi.pack(ARGS)
    no_finalizer = ctypes.cast(0, ctypes.CFUNCTYPE(None, ctypes.c_void_p))
    trap = ctypes.POINTER(ffi.wasm_trap_t)()
    fuel = ctypes.c_uint64(0)
    (
        store_new, store_context, limiter, set_fuel, get_fuel, deadline,
        instantiate, export_get, call, data, data_size, delete,
    ) = (getattr(ffi, f"_wasmtime_{name}") for name in _C_FUNCTIONS)  # fmt: skip
    byref, address = ctypes.byref, ctypes.addressof

    def once() -> object:
        store = store_new(engine, None, no_finalizer)
        context = store_context(store)
        limiter(store, *cells)
        set_fuel(context, limits.fuel)
        deadline(context, 100)
        instance = ffi.wasmtime_instance_t()
        error = instantiate(pre, context, byref(instance), byref(trap))
        assert not error and not trap
        memory, alloc, entry = ffi.wasmtime_extern_t(), ffi.wasmtime_extern_t(), ffi.wasmtime_extern_t()
        for name, item in zip(names, (memory, alloc, entry), strict=True):
            assert export_get(context, byref(instance), name, len(name), byref(item))
        values = (ffi.wasmtime_val_raw_t * 2)()
        values[0].i32 = len(payload)
        assert not call(context, byref(alloc.of.func), values, 2, byref(trap))
        ptr = values[0].i32
        base = address(data(context, byref(memory.of.memory)).contents)
        assert ptr + len(payload) <= data_size(context, byref(memory.of.memory))
        ctypes.memmove(base + ptr, payload, len(payload))
        values[0].i32, values[1].i32 = ptr, len(payload)
        assert not call(context, byref(entry.of.func), values, 2, byref(trap))
        rptr, rlen = _abi.split(values[0].i64)
        base = address(data(context, byref(memory.of.memory)).contents)
        assert rptr + rlen <= data_size(context, byref(memory.of.memory))
        reply = _abi.unpack_reply(ctypes.string_at(base + rptr, rlen))
        data_size(context, byref(memory.of.memory))  # (the peak memory)
        get_fuel(context, byref(fuel))
        delete(store)
        return reply

    return once


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--block", type=int, default=500)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, wasmbox.Sandbox() as box:
        path = Path(folder) / "echo.wat"
        path.write_text(_bench.ECHO_WAT)
        echo = box.load({"name": "echo", "module": str(path)})
        calls = {
            "Tool.call": lambda: echo.call(ARGS),
            "C API only": c_api_call(echo),
            "plain wasmtime-py": _bench.plain_core_call(path, ARGS),
        }
        for call in calls.values():  # warm up, and check they agree
            for _ in range(1000):
                reply = call()
            assert reply in ((True, ARGS),) or getattr(reply, "value", None) == ARGS, reply
        print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        times = taking_turns(calls, options.rounds, options.block)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    medians = {name: statistics.median(sample) * 1e6 for name, sample in times.items()}
    for name, median in medians.items():
        print(f"{name:<20} median {median:6.1f} µs  (min {min(times[name]) * 1e6:.1f} µs)")
    skeleton = medians["Tool.call"] - medians["C API only"]
    print(f"{'Python skeleton':<20} {skeleton:6.1f} µs  (Tool.call less the C API work)")
    print(f"plain wasmtime-py ÷ Tool.call: {medians['plain wasmtime-py'] / medians['Tool.call']:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
