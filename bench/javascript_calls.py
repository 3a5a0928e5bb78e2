"""Back-to-back `run_javascript` calls: min/median/p90, then where the time goes (cProfile).

Run: ./dev python bench/javascript_calls.py [--calls N] [--profile N] [--code JS] [--top N]
- times --calls calls (default 5,000) one after the other, after a tenth as many to warm up;
- then profiles --profile more (default 2,000; 0 skips it) with cProfile, as `python -m
  cProfile -s cumtime` would but around the calls only, and prints the top --top entries by
  cumulative time, then the call's phases read back from that same profile (nothing in the
  library is wrapped or patched: the phases are the cumulative times of the functions that
  do them).

cProfile does not see ctypes calls as functions of their own: the time a Wasmtime C call takes
(wasm included) is the `tottime` of the Python function that made it (e.g. `capi.call_typed`,
`InstancePre.instantiate`). Its own overhead inflates Python-heavy entries; read the phases as
shares, and the unprofiled medians printed first as the figures. For the whole process (imports, the
Sandbox, the runtime's load), run `./dev python -m cProfile -s cumtime
bench/javascript_calls.py --calls 2000 --profile 0`.
"""

from __future__ import annotations

import argparse
import cProfile
import operator
import pstats
import statistics
import sys
import time
from pathlib import Path

from _timing import taking_turns
from wasmtime import _bindings

import wasmbox
from wasmbox import _call, _schema, _tool
from wasmbox._backends.javascript import runner as _runner
from wasmbox._wasmtime import capi as _capi
from wasmbox._wasmtime import store as _store

ROOT = Path(__file__).resolve().parent.parent
# The functions that do each phase of a call (indented under the phase they are part of), by
# where they live: a phase whose function this tree lacks is listed as such.
PHASES = (
    ("Sandbox.run_javascript (the whole call)", wasmbox, "Sandbox.run_javascript"),
    ("  Sandbox.interpreter (the grant set's Tool looked up)", wasmbox, "Sandbox.interpreter"),
    ("  Tool.call", _tool, "Tool.call"),
    ("    Tool._check (args against {code: string})", _tool, "Tool._check"),
    ("    JavaScriptRunner.call", _runner, "JavaScriptRunner.call"),
    ("    _call.perform (the call skeleton)", _call, "perform"),
    ("      _call.new_store (Store, limits, fuel, deadline)", _call, "new_store"),
    ("      _call.build_wasi (WasiConfig, stdout/stderr)", _call, "build_wasi"),
    ("      capi.instantiate (the InstancePre instantiated)", _capi, "instantiate"),
    ("      JavaScriptRunner.run (instantiate, then _run)", _runner, "JavaScriptRunner.run"),
    ("      JavaScriptRunner._run", _runner, "JavaScriptRunner._run"),
    ("        ExportName.get (export lookups by name)", _capi, "ExportName.get"),
    ("        _Guest.write (seed, code, JS_Call argv)", _runner, "_Guest.write"),
    ("        capi.set_table_func (callHost's trampoline)", _capi, "set_table_func"),
    ("        _Guest.call (the raw calls into QuickJS)", _runner, "_Guest.call"),
    ("          capi.call_raw (the C call, the wasm in it)", _capi, "call_raw"),
    ("        _Guest.copy (malloc, bytes copied in)", _runner, "_Guest.copy"),
    ("        _Guest.string (the JSON reply read out)", _runner, "_Guest.string"),
    ("        runner._value (json.loads of the reply)", _runner, "_value"),
    ("      _call.finish (fuel, outputs, CallResult)", _call, "finish"),
    ("        store.close_store (the Store freed)", _store, "close_store"),
    ("every capi.memory_view (in the phases above)", _capi, "memory_view"),
    ("every _schema.Validator.problem (in Tool._check)", _schema, "Validator.problem"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=5_000)
    parser.add_argument("--profile", type=int, default=2_000, help="calls to profile (0: none)")
    parser.add_argument("--code", default="1 + 2")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "wasmbox-bench")
    options = parser.parse_args()
    with wasmbox.Sandbox(cache_dir=options.cache) as box:
        box.prepare_javascript()
        first = box.run_javascript(options.code)
        print(f"run_javascript({options.code!r}): {first.value!r}, fuel {first.fuel_used:,}, "
              f"peak memory {first.peak_memory:,} bytes")  # fmt: skip
        for _ in range(max(options.calls // 10, 1)):
            box.run_javascript(options.code)
        times = []
        cpu_started = time.process_time()
        for _ in range(options.calls):
            started = time.perf_counter()
            box.run_javascript(options.code)
            times.append(time.perf_counter() - started)
        cpu = (time.process_time() - cpu_started) / options.calls
        times.sort()
        p90 = times[int(len(times) * 0.9)]
        print(f"{options.calls:,} calls back to back: min {times[0] * 1e3:.3f} ms, median "
              f"{statistics.median(times) * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms, mean "
              f"{statistics.fmean(times) * 1e3:.3f} ms; process CPU {cpu * 1e3:.3f} ms a call")  # fmt: skip
        print_against_core(box, options.code, options.calls)
        if options.profile <= 0:
            return 0
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(options.profile):
            box.run_javascript(options.code)
        profile.disable()
    stats = pstats.Stats(profile)
    print(f"\ncProfile of {options.profile:,} calls, by cumulative time:")
    stats.sort_stats("cumulative").print_stats(options.top)
    print_phases(stats, options.profile)
    return 0


def print_against_core(box: wasmbox.Sandbox, code: str, calls: int) -> None:
    """The JavaScript call and a trivial core call (echo.wat), taking turns call by call, so that
    both meet the same machine: their medians and the ratio, the figure to compare across
    machines."""
    core, javascript = against_core(box, code, calls)
    print(f"taking turns with a trivial core call ({calls:,} each): core median "
          f"{core * 1e3:.3f} ms, JavaScript median {javascript * 1e3:.3f} ms: {javascript / core:.2f}x")  # fmt: skip


def against_core(box: wasmbox.Sandbox, code: str, calls: int) -> tuple[float, float]:
    """(trivial core call, `run_javascript(code)`) medians in seconds, taking turns call by call."""
    echo = box.load({"name": "echo", "module": str(ROOT / "runtimes" / "examples" / "wat" / "echo.wat")})
    tool = box.interpreter(runtime="javascript")
    times = taking_turns(
        {"core": lambda: echo.call({}), "javascript": lambda: tool.call({"code": code})}, calls
    )
    return statistics.median(times["core"]), statistics.median(times["javascript"])


def print_phases(stats: pstats.Stats, calls: int) -> None:
    """Each phase's cumulative time per call (under cProfile) and its share of the whole call;
    then the time spent in the C API calls made through wasmtime-py's `_bindings` wrappers (those
    `capi.c_function` binds, the hot path's, are not among them: cProfile counts their time in
    their callers')."""
    entries = stats.stats  # type: ignore[attr-defined]
    whole = None
    print(f"Phases: cumulative µs a call under cProfile ({calls:,} calls), share of the call")
    for label, module, name in PHASES:
        try:
            code = operator.attrgetter(name)(module).__code__
        except AttributeError:
            print(f"  {label}: not in this tree")
            continue
        found = entries.get((code.co_filename, code.co_firstlineno, code.co_name))
        if found is None:
            print(f"  {label}: not in the profile")
            continue
        ncalls, cumulative = found[1], found[3]
        whole = whole or cumulative
        print(f"  {label:<58} {cumulative / calls * 1e6:7.1f} µs {cumulative / whole:6.1%}"
              f"  ({ncalls / calls:g} a call)")  # fmt: skip
    bindings = _bindings.__file__
    inside = sorted(
        ((value[2], key[2], value[1]) for key, value in entries.items() if key[0] == bindings), reverse=True
    )
    total = sum(t for t, _, _ in inside)
    share = f" ({total / whole:.1%} of the call)" if whole else ""
    print(
        f"In C API calls through wasmtime-py's wrappers (not the hot path's own bindings): "
        f"{total / calls * 1e6:.1f} µs a call{share}"
    )
    for tottime, name, ncalls in inside[:8]:
        print(f"  {name:<58} {tottime / calls * 1e6:7.1f} µs  ({ncalls / calls:g} a call)")


if __name__ == "__main__":
    sys.exit(main())
