"""Trivial core calls from one thread and from two: calls/s, the CPU the process used and its
context switches, with the two threads sharing a Sandbox and with a Sandbox each.

Run: ./dev python bench/threads.py [--seconds S] [--rounds N] [--hold-gil]
Each round times one thread, two threads on one Sandbox's tool, then two threads each on its
own Sandbox's tool (so no lock of wasmbox's is shared), `--seconds` each, and prints calls/s,
the cores' worth of CPU the process used (`getrusage`, user and system), and its voluntary
context switches per second and per call (a thread waiting for the GIL or a lock).
--hold-gil: the engine layer's short C calls (those that run no guest code: the store's making,
fuel, deadline, limits, export lookups, memory views) bound through `ctypes.PyDLL`, which keeps
the GIL, instead of releasing it for each: what handing the GIL over less often is worth.
"""

from __future__ import annotations

import argparse
import ctypes
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from wasmtime import _ffi as ffi

import wasmbox
from wasmbox import _bench
from wasmbox._wasmtime import capi, store

ARGS = {"text": "the quick brown fox", "n": 3}


def measure(call: Callable[[], object], threads: int, seconds: float) -> str:
    """`_bench.throughput` of `call` on `threads` threads, with the process's CPU and switches."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    rate = _bench.throughput(call, threads, seconds)
    after, elapsed = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    switches = after.ru_nvcsw - before.ru_nvcsw
    return (
        f"{rate:9,.0f} calls/s, CPU {(user + system) / elapsed:.2f} cores (system"
        f" {system / elapsed:.2f}), {switches / elapsed:8,.0f} voluntary switches/s"
        f" ({switches / max(rate * elapsed, 1):.1f} a call)"
    )


def each_its_own(calls: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """A call that runs, on each thread that makes it, the next of `calls` not yet taken."""
    taken = iter(calls)
    mine = threading.local()

    def call() -> object:
        own = getattr(mine, "call", None)
        if own is None:
            own = mine.call = next(taken)
        return own()

    return call


def hold_the_gil() -> None:
    """Rebind the engine layer's short C calls to keep the GIL (`--hold-gil`)."""
    held = ctypes.PyDLL(None, handle=ffi.dll._handle)
    short = {
        capi: ("_export_get", "_memory_data", "_memory_data_size"),
        store: (
            "_store_new",
            "_store_context",
            "_store_limiter",
            "_set_fuel",
            "_get_fuel",
            "_set_epoch_deadline",
        ),
    }
    for module, names in short.items():
        for name in names:
            bound = getattr(module, name)
            holding = held[bound.__name__]
            holding.argtypes, holding.restype = bound.argtypes, bound.restype
            setattr(module, name, holding)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hold-gil", action="store_true")
    options = parser.parse_args()
    if options.hold_gil:
        hold_the_gil()
    with tempfile.TemporaryDirectory() as folder, wasmbox.Sandbox() as one, wasmbox.Sandbox() as two:
        path = Path(folder) / "echo.wat"
        path.write_text(_bench.ECHO_WAT)
        first = one.load({"name": "echo", "module": str(path)})
        second = two.load({"name": "echo", "module": str(path)})
        a, b = (lambda: first.call(ARGS)), (lambda: second.call(ARGS))
        for _ in range(2000):
            a(), b()
        for round_ in range(options.rounds):
            print(f"round {round_ + 1}")
            print(f"  1 thread                 {measure(a, 1, options.seconds)}")
            print(f"  2 threads, one Sandbox   {measure(a, 2, options.seconds)}")
            print(f"  2 threads, two Sandboxes {measure(each_its_own([a, b]), 2, options.seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
