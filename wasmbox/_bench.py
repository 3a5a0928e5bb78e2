"""`wasmbox bench`: a short, self-contained benchmark that prints a table.

The full suites are in `bench/` (pytest-benchmark); this one needs nothing but wasmbox, so it
can be run wherever wasmbox is installed, to see what a machine does.
"""

from __future__ import annotations

import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wasmtime

from . import _abi
from ._sandbox import Sandbox

# {"ok": <args>}: the smallest ABI v1 tool.
ECHO_WAT = """(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (local $out i32)
    (local.set $out (call $alloc (i32.add (local.get $len) (i32.const 4))))
    (i32.store (local.get $out) (i32.const 0x6b6fa281))
    (memory.copy (i32.add (local.get $out) (i32.const 4)) (local.get $ptr) (local.get $len))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
            (i64.extend_i32_u (i32.add (local.get $len) (i32.const 4))))))"""

# Calls host function "bench.inc" 100 times and returns the last reply.
HOST_LOOP_WAT = """(module
  (import "wasmbox" "bench.inc" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (local $i i32) (local $r i64)
    (loop $again
      (local.set $r (call $host (local.get $ptr) (local.get $len)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const 100))))
    (local.get $r)))"""

GREET_PY = """def main(name: str, times: int = 1) -> dict:
    return {"greeting": ("hello " + name + "! ") * times}
"""


def process_stats() -> tuple[float, int, int]:
    """This process's (resident memory in MiB, open file descriptors, Python threads); Linux."""
    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * resource.getpagesize() / 2**20
    return rss, len(os.listdir("/proc/self/fd")), threading.active_count()


def latency(call: Callable[[], object], count: int, gap_s: float = 0.0) -> tuple[float, float]:
    """(median, p99) in seconds, after a short warm-up; `gap_s` of idle time before each call."""
    for _ in range(max(10, count // 10)):
        call()
    times = []
    for _ in range(count):
        if gap_s:
            time.sleep(gap_s)
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    times.sort()
    return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))]


def throughput(call: Callable[[], object], threads: int, seconds: float) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * threads

    def worker(i: int) -> None:
        while time.perf_counter() < stop:
            call()
            counts[i] += 1

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(counts) / (time.perf_counter() - started)


def run(seconds: float = 1.0, python: bool = True) -> list[tuple[str, str, str]]:
    """Rows of (what, figure, comparison)."""
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as folder, Sandbox() as box:
        echo_path = Path(folder) / "echo.wat"
        echo_path.write_text(ECHO_WAT)
        loop_path = Path(folder) / "loop.wat"
        loop_path.write_text(HOST_LOOP_WAT)
        box.register_host_function("bench.inc", lambda x: x + 1)
        echo = box.load({"name": "echo", "module": str(echo_path)})
        loop = box.load(
            {
                "name": "loop",
                "module": str(loop_path),
                "host_functions": ["bench.inc"],
                "limits": {"host_calls": 100},
            }
        )
        args = {"text": "the quick brown fox", "n": 3}
        ours = latency(lambda: echo.call(args), 5000)
        plain = latency(plain_core_call(echo_path, args), 5000)
        rows.append(("trivial core call (median / p99)", _us(ours), f"plain wasmtime-py {_us(plain)}"))
        round_trips = latency(lambda: loop.call({"x": 1}), 300)[0] - ours[0]
        rows.append(("host-function round trip (core)", f"{round_trips / 100 * 1e6:.1f} µs", ""))
        one = throughput(lambda: echo.call(args), 1, seconds)
        two = throughput(lambda: echo.call(args), 2, seconds)
        rows.append(("trivial core calls/s, 1 → 2 threads", f"{one:,.0f} → {two:,.0f}", f"{two / one:.2f}×"))
        if python:
            box.prepare_python()
            fresh = latency(lambda: box.run_python("sum(range(100))"), 300)
            rows.append(("fresh Python interpreter, sum(range(100))", _ms(fresh), "back to back"))
            spaced = latency(lambda: box.run_python("sum(range(100))"), 100, gap_s=0.005)
            rows.append(("  the same, calls 5 ms apart", _ms(spaced), "a spare instance is ready"))
            greet_path = Path(folder) / "greet.py"
            greet_path.write_text(GREET_PY)
            greet = box.load({"name": "greet", "runtime": "python", "source": str(greet_path)})
            greeting = {"name": "ada", "times": 2}
            tool = latency(lambda: greet.call(greeting), 300)
            rows.append(("Python tool call, small args dict", _ms(tool), "back to back"))
            spaced = latency(lambda: greet.call(greeting), 100, gap_s=0.005)
            rows.append(("  the same, calls 5 ms apart", _ms(spaced), "a spare instance is ready"))
            one = throughput(lambda: box.run_python("sum(range(100))"), 1, seconds)
            two = throughput(lambda: box.run_python("sum(range(100))"), 2, seconds)
            rows.append(("Python calls/s, 1 → 2 threads", f"{one:,.0f} → {two:,.0f}", f"{two / one:.2f}×"))
    return rows


def plain_core_call(path: Path, args: dict[str, object]) -> Callable[[], tuple[bool, object]]:
    """The same ABI v1 call done the plain way: new Store, Linker.instantiate, no limits."""
    engine = wasmtime.Engine()
    module = wasmtime.Module(engine, path.read_text())
    linker = wasmtime.Linker(engine)
    payload = _abi.pack(args)

    def call() -> tuple[bool, object]:
        store = wasmtime.Store(engine)
        exports = linker.instantiate(store, module).exports(store)
        memory = exports["memory"]
        ptr = exports["wasmbox_alloc"](store, len(payload))  # type: ignore[operator]
        memory.write(store, payload, ptr)  # type: ignore[union-attr]
        rptr, rlen = _abi.split(exports["wasmbox_call"](store, ptr, len(payload)))  # type: ignore[operator]
        return _abi.unpack_reply(memory.read(store, rptr, rptr + rlen))  # type: ignore[union-attr]

    return call


def plain_component(component_path: Path) -> tuple[wasmtime.Engine, Any, Any]:
    """The Python runtime component the plain way, for baselines: its own default Engine, the
    compiled component and a Linker with WASI p2 and a `call-host` that refuses every name."""
    from wasmtime import component

    engine = wasmtime.Engine()
    compiled = component.Component(engine, component_path.read_bytes())
    linker = component.Linker(engine)
    linker.add_wasip2()
    with linker.root() as root:
        root.add_func("call-host", lambda store, name, args: _abi.error("none"))
    return engine, compiled, linker


def _us(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 1e6:.1f} / {pair[1] * 1e6:.1f} µs"


def _ms(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 1e3:.2f} / {pair[1] * 1e3:.2f} ms"


def print_table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    for what, figure, comparison in rows:
        print(f"{what:{width}}  {figure:>24}  {comparison}")
