"""The native engine-layer spike (native/, wasmbox._native) against today's path, in one run.

Run: bench/native_spike.sh (builds wasmbox/_native.abi3.so), then
     ./dev python bench/native_spike.py [--rounds N] [--calls N] [--seconds S] [--skip-python]

Each round times every contender once, taking turns, so a noisy machine hits them alike; the
table gives the median of the round medians and the worst round's p99. Contenders:
- trivial core call (wasmbox._bench.ECHO_WAT, the same args as `wasmbox bench`): today's
  `Tool.call`; the native `CoreTool.call` with the MessagePack packing and reply check done in
  Python as today's path does them ("native"), and the bare native call on packed args
  ("native raw"); plain wasmtime-py (`_bench.plain_core_call`: new Store, no limits).
- trivial core calls/s from 1 and 2 threads, today's and native.
- run_python("sum(range(100))") back to back and with calls 5 ms apart (today's path has a
  spare instance ready then), against the native `PythonRuntime.call` of the same request
  (a fresh instance every call, made inside the call), and with `spare=True` (the next call's
  instance made ahead and each Store dropped on a Rust thread, as today's housekeeper does).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wasmtime

import wasmbox
from wasmbox import _abi, _bench
from wasmbox._backends.python.runner import encode_request
from wasmbox._wasmtime.engine import WASMTIME_VERSION

try:
    from wasmbox import _native  # type: ignore[attr-defined]
except ImportError:
    sys.exit("wasmbox/_native.abi3.so is missing: build it with bench/native_spike.sh")

ARGS = {"text": "the quick brown fox", "n": 3}
SNIPPET = "sum(range(100))"
Figure = tuple[float, float, float]  # (median, p99, process CPU time per call) seconds


def timed(call: Callable[[], object], count: int, gap_s: float) -> Figure:
    """`_bench.latency`, plus the CPU time of the whole process (every thread) per call: what
    a call costs whoever does the work, which a loaded machine does not inflate as it does
    the wall-clock medians."""
    started = time.process_time()
    median, p99 = _bench.latency(call, count, gap_s)
    return median, p99, (time.process_time() - started) / (count + max(10, count // 10))


def native_python(box: wasmbox.Sandbox, engine: object, spare: bool) -> tuple[Any, Callable[[], object]]:
    """The native Python call of SNIPPET, checked once; its compiled form cached by digest.
    With `spare`, the next call's instance is made ahead on a Rust thread. Returns the
    `_native.PythonRuntime` and the call."""
    runner = box._runtimes.python()
    component = Path(runner.component_path)
    digest = hashlib.sha256(component.read_bytes()).hexdigest()[:16]
    compiled = (
        Path.home() / ".cache" / "wasmbox-native" / f"{digest}-wasmtime{_native.WASMTIME_VERSION}.cwasm"
    )
    compiled.parent.mkdir(parents=True, exist_ok=True)
    runtime = _native.PythonRuntime(
        engine,
        str(component),
        str(component.parent / "stdlib"),
        str(compiled),
        spare=spare,
    )
    request = encode_request({"mode": "code", "code": SNIPPET}, 64 * 1024)

    def call() -> object:
        response, _stdout, _stderr, _fuel = runtime.call(request)
        return _abi.unpack(response)["ok"]

    value = call()
    expected = box.run_python(SNIPPET).value
    assert value == expected, (value, expected)
    return runtime, call


def print_phases(engine: object, count: int) -> int:
    """Medians of the parts of a fresh native Python call, made, run and dropped in turn."""
    with wasmbox.Sandbox() as box:
        runtime, _ = native_python(box, engine, spare=False)
        request = encode_request({"mode": "code", "code": SNIPPET}, 64 * 1024)
        for _ in range(20):
            runtime.phases(request)
        started = time.process_time()
        parts = [runtime.phases(request) for _ in range(count)]
        cpu = (time.process_time() - started) / count
    names = ("store + WASI context", "instantiate", "run", "drop the Store")
    for i, name in enumerate(names):
        print(f"{name:22} {statistics.median(p[i] for p in parts) / 1e3:8.0f} µs")
    print(
        f"{'whole call':22} {statistics.median(sum(p) for p in parts) / 1e3:8.0f} µs"
        f" (process CPU {cpu * 1e6:.0f} µs a call)"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--calls",
        type=int,
        default=5000,
        help="trivial calls per round (Python: a tenth)",
    )
    parser.add_argument("--seconds", type=float, default=1.0, help="per throughput figure")
    parser.add_argument("--skip-python", action="store_true")
    parser.add_argument(
        "--phases",
        type=int,
        default=0,
        metavar="N",
        help="instead, time the parts of N fresh native Python calls on this thread "
        "(compare with bench/python_phases.py)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME=INT",
        help="a keyword for the native Engine, e.g. pool_table_keep_resident=1048576 or pagemap_scan=0",
    )
    parser.add_argument(
        "--only",
        default="",
        help="time only the contenders whose name has this in it "
        "(e.g. native, to profile it with perf); the ratios are then left out",
    )
    options = parser.parse_args()

    settings = dict(item.split("=", 1) for item in options.engine)
    engine = _native.Engine(
        **{k: bool(int(v)) if k in ("pooling", "pagemap_scan") else int(v) for k, v in settings.items()}
    )
    print(
        f"wasmtime-py {WASMTIME_VERSION}, "
        f"native wasmtime {_native.WASMTIME_VERSION}, PAGEMAP_SCAN in use: {engine.pagemap_scan}"
    )
    if options.phases:
        return print_phases(engine, options.phases)
    with tempfile.TemporaryDirectory() as folder, wasmbox.Sandbox() as box:
        echo_path = Path(folder) / "echo.wat"
        echo_path.write_text(_bench.ECHO_WAT)
        echo = box.load({"name": "echo", "module": str(echo_path)})
        native_tool = _native.CoreTool(engine, bytes(wasmtime.wat2wasm(_bench.ECHO_WAT)))
        payload = _abi.pack(ARGS)
        assert _abi.unpack_reply(native_tool.call(payload)[0]) == (True, ARGS)
        assert echo.call(ARGS).value == ARGS

        def native_core() -> object:
            is_ok, value = _abi.unpack_reply(native_tool.call(_abi.pack(ARGS))[0])
            assert is_ok
            return value

        latency: dict[str, tuple[Callable[[], object], int, float]] = {
            "core: wasmbox today": (lambda: echo.call(ARGS), options.calls, 0.0),
            "core: native": (native_core, options.calls, 0.0),
            "core: native raw": (lambda: native_tool.call(payload), options.calls, 0.0),
            "core: plain wasmtime-py": (
                _bench.plain_core_call(echo_path, ARGS),
                options.calls,
                0.0,
            ),
        }
        if not options.skip_python:
            native_snippet = native_python(box, engine, spare=False)[1]
            native_spare = native_python(box, engine, spare=True)[1]
            today = lambda: box.run_python(SNIPPET)
            n = max(20, options.calls // 10)
            latency |= {
                "python b2b: wasmbox today": (today, n, 0.0),
                "python b2b: native fresh": (native_snippet, n, 0.0),
                "python b2b: native + spare": (native_spare, n, 0.0),
                "python 5ms apart: wasmbox today": (today, n // 2, 0.005),
                "python 5ms apart: native fresh": (native_snippet, n // 2, 0.005),
                "python 5ms apart: native + spare": (native_spare, n // 2, 0.005),
            }
        rates: dict[str, tuple[Callable[[], object], int]] = {
            f"core calls/s {who}, {threads} thread{'s' * (threads > 1)}": (
                call,
                threads,
            )
            for who, call in (
                ("today", lambda: echo.call(ARGS)),
                ("native", native_core),
            )
            for threads in (1, 2)
        }
        latency = {name: entry for name, entry in latency.items() if options.only in name}
        rates = {name: entry for name, entry in rates.items() if options.only in name}
        results: dict[str, list[Figure]] = {name: [] for name in latency}
        throughput: dict[str, list[float]] = {name: [] for name in rates}
        for round_ in range(1, options.rounds + 1):
            for name, (call, count, gap) in latency.items():
                results[name].append(timed(call, count, gap))
            for name, (call, threads) in rates.items():
                throughput[name].append(_bench.throughput(call, threads, options.seconds))
            print(
                f"round {round_}: "
                + ", ".join(f"{name} {results[name][-1][0] * 1e6:.1f}" for name in results)
                + " (µs)",
                flush=True,
            )

    medians = {name: statistics.median(m for m, _, _ in figures) for name, figures in results.items()}
    width = max(map(len, [*results, *throughput]))
    cpu = {name: statistics.median(c for _, _, c in figures) for name, figures in results.items()}
    print(f"\n{'':{width}}  {'median µs':>10}  {'p99 µs (worst round)':>20}  {'CPU µs/call':>11}")
    for name, figures in results.items():
        print(
            f"{name:{width}}  {medians[name] * 1e6:10.1f}  {max(p for _, p, _ in figures) * 1e6:20.1f}"
            f"  {cpu[name] * 1e6:11.1f}"
        )
    rate = {name: statistics.median(values) for name, values in throughput.items()}
    for name, value in rate.items():
        print(f"{name:{width}}  {value:10,.0f}")

    if options.only:
        return 0

    def ratio(slow: str, fast: str) -> str:
        return f"{medians[slow] / medians[fast]:.2f}× (CPU per call {cpu[slow] / cpu[fast]:.2f}×)"

    print("\nratios (median of round medians):")
    print(
        f"  core call, today / native: {ratio('core: wasmbox today', 'core: native')}"
        f" (raw {ratio('core: wasmbox today', 'core: native raw')}); "
        f"plain wasmtime-py / native: {ratio('core: plain wasmtime-py', 'core: native')}"
    )
    for who in ("today", "native"):
        one, two = (
            rate[f"core calls/s {who}, 1 thread"],
            rate[f"core calls/s {who}, 2 threads"],
        )
        print(f"  core calls/s 2 threads / 1 thread, {who}: {two / one:.2f}×")
    if not options.skip_python:
        for way in ("b2b", "5ms apart"):
            for native in ("native fresh", "native + spare"):
                print(
                    f"  python {way}, today / {native}: "
                    f"{ratio(f'python {way}: wasmbox today', f'python {way}: {native}')}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
