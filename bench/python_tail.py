"""What the slow calls of back-to-back `run_python` have in common: the tail, call by call.

Run: ./dev python bench/python_tail.py [--calls N] [--gc-off] [--switch-interval S] [--warm N]
     [--queue N]
Times N back-to-back `run_python("sum(range(100))")` calls as a user's pytest-benchmark run does
(a fresh Sandbox, the runtime prepared, each call timed alone) and records, for each call:
- its phases (`wasmbox.testing.record_phases`): instantiate, run, teardown, and whether a spare
  instance made ahead served it;
- the garbage collector's pauses inside it (`gc.callbacks`, on any thread);
- the calling thread's CPU time, its time runnable but waiting for a CPU (`runq`: Linux's
  schedstat, which books a wait when the thread next runs, so per call it is approximate and
  `blocked` can come out below 0), the rest of its wall time (`blocked`: waiting on the GIL, a
  lock, a fault), and
  the CPU time of the process's other threads (the
  housekeeper, the epoch ticker) while it ran; its involuntary context switches (Linux:
  preempted by the kernel, e.g. for another process), its voluntary ones (it blocked: on the
  GIL, a lock, I/O) and its minor page faults;
- the housekeeper's queue length when it began, and the stores the caller freed itself
  (`close_store` on the calling thread: the queue was full, or a spare was displaced), and
  for how long;
and, for every store freed on either thread whose freeing faulted over 1,000 pages in (a pool
slot's memory reset for the first time since it was mapped), its number in the order stores
were made, the thread that made it, how many stores were open then, and the thread that freed it;
and the process's resident set at the end (Linux).
Then prints the typical call (the middle half) beside the slow ones (over 2× the median, and
the slowest 1 %), each column a mean, so that what the slow calls add stands out.
--gc-off: `gc.disable()` for the timed calls, to see what the collector's pauses are worth;
--switch-interval: `sys.setswitchinterval(S)` (default 0.005 s), to see what the GIL's hand-over
between the caller and the housekeeper is worth. Two stand-ins for changes to the call path,
made from outside it, to see what they would be worth:
--warm N: before the timed calls, N instances made at once and freed, so N pool slots have had
  their first reset;
--queue N: the housekeeper's queue bound set to N (its `maxsize`; 4 in the package, 0 for no
  bound, where the caller never frees a store itself).
Calls that fail are counted and the first error printed (stores piling up can fill the pool).
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _timing import Summary

import wasmbox
from wasmbox._backends.python.runner import _INSTANTIATING
from wasmbox._wasmtime import store as _store
from wasmbox._wasmtime.engine import EpochTicker
from wasmbox.testing import record_phases

SNIPPET = "sum(range(100))"
COLUMNS = (
    ("wall", "ms"), ("inst", "ms"), ("run", "ms"), ("tear", "ms"), ("ahead", "%"), ("gc", "ms"),
    ("cpu", "ms"), ("runq", "ms"), ("blocked", "ms"), ("others", "ms"), ("ivcsw", ""), ("vcsw", ""), ("faults", ""), ("queue", ""), ("closes", ""),
    ("close", "ms"),
)  # fmt: skip


@dataclass
class Watch:
    """What happened during the current call: GC pauses and the stores the caller freed."""

    caller: int = field(default_factory=threading.get_ident)
    gc_s: float = 0.0
    closes: int = 0
    close_s: float = 0.0
    _gc_started: float = 0.0
    pauses: list[tuple[float, int]] = field(default_factory=list)  # every collection's (seconds, generation)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._gc_started
            self.gc_s += pause
            self.pauses.append((pause, info["generation"]))

    made: int = 0  # stores made so far (`EpochTicker.opened`)
    # stores whose freeing faulted a slot's memory in: (number, thread that made it, stores open
    # then, thread that freed it, faults)
    first_resets: list[tuple[int, str, int, str, int]] = field(default_factory=list)

    def closing(self, close: Callable[[Any], None]) -> Callable[[Any], None]:
        def timed(store: Any) -> None:
            started = time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            close(store)
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults
            if threading.get_ident() == self.caller:
                self.closes += 1
                self.close_s += time.perf_counter() - started
            if faults > 1000 and "_tail_made" in store.__dict__:
                number, maker, live = store.__dict__["_tail_made"]
                self.first_resets.append((number, maker, live, threading.current_thread().name, faults))

        return timed

    def opening(self, opened: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def counted(ticker: Any, store: Any) -> None:
            opened(ticker, store)
            self.made += 1  # (under the GIL: the two threads' increments do not interleave)
            store.__dict__["_tail_made"] = (self.made, threading.current_thread().name, ticker.stores)

        return counted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--gc-off", action="store_true")
    parser.add_argument("--switch-interval", type=float, default=sys.getswitchinterval())
    parser.add_argument("--warm", type=int, default=0, metavar="N")
    parser.add_argument("--queue", type=int, default=None, metavar="N")
    options = parser.parse_args()
    sys.setswitchinterval(options.switch_interval)
    watch = Watch()
    gc.callbacks.append(watch.on_gc)
    EpochTicker.opened = watch.opening(EpochTicker.opened)  # type: ignore[method-assign]
    _store.close_store = watch.closing(
        _store.close_store
    )  # (the runner and Instance.discard call it by module)
    rows: list[dict[str, float]] = []
    failures: list[str] = []
    with wasmbox.Sandbox() as box:
        box.prepare_python()
        runner = box._runtimes.python()
        queue = runner._keeper._tasks
        if options.queue is not None:
            queue.maxsize = options.queue  # (Queue.put reads it at every put)
        warm = [runner.instantiate(_INSTANTIATING) for _ in range(options.warm)]
        for instance in warm:
            instance.discard()
        if options.gc_off:
            gc.disable()
        with record_phases() as recording:
            for _ in range(options.calls):
                watch.gc_s = watch.close_s = watch.closes = 0
                waiting = queue.qsize()
                before = resource.getrusage(resource.RUSAGE_THREAD)
                waited = _run_delay()
                cpu, process = time.thread_time(), time.process_time()
                started = time.perf_counter()
                result = box.run_python(SNIPPET)
                wall = time.perf_counter() - started
                cpu, process = time.thread_time() - cpu, time.process_time() - process
                after = resource.getrusage(resource.RUSAGE_THREAD)
                waited = _run_delay() - waited
                rows.append({
                    "wall": wall, "gc": watch.gc_s, "cpu": cpu, "runq": waited, "blocked": wall - cpu - waited,
                    "others": process - cpu,
                    "ivcsw": after.ru_nivcsw - before.ru_nivcsw, "vcsw": after.ru_nvcsw - before.ru_nvcsw, "faults": after.ru_minflt - before.ru_minflt,
                    "queue": waiting, "closes": watch.closes, "close": watch.close_s,
                })  # fmt: skip
                if not result.ok:
                    failures.append(str(result.error))
        gc.enable()
    for row, phases in zip(rows, recording.calls, strict=True):
        row |= {"inst": phases.instantiate_s, "run": phases.run_s, "tear": phases.teardown_s,
                "ahead": float(bool(phases.made_ahead))}  # fmt: skip
    summary = Summary.of([r["wall"] for r in rows])
    print(
        f"{options.calls} calls, GC {'off' if options.gc_off else 'on'}, switch interval"
        f" {options.switch_interval * 1e3:g} ms, {options.warm} slots warmed, queue bound"
        f" {queue.maxsize or 'none'}: {summary.ms()}"
    )
    if failures:
        print(f"{len(failures)} calls failed; the first: {failures[0]}")
    ordered = sorted(rows, key=lambda r: r["wall"])
    n = len(ordered)
    groups = {
        "middle half": ordered[n // 4 : 3 * n // 4],
        "over 2× median": [r for r in rows if r["wall"] > 2 * summary.median],
        "slowest 1 %": ordered[-max(1, n // 100) :],
    }
    print(
        f"{'calls':>22} {'n':>5}"
        + "".join(f"{name + (' ' + unit if unit else ''):>11}" for name, unit in COLUMNS)
    )
    for label, group in groups.items():
        print(f"{label:>22} {len(group):5}" + "".join(_mean(group, name, unit) for name, unit in COLUMNS))
    by_generation = [[p for p, g in watch.pauses if g == generation] for generation in range(3)]
    print(
        f"GC: {len(watch.pauses)} collections (by generation {', '.join(str(len(g)) for g in by_generation)}),"
        f" {sum(p for p, _ in watch.pauses) * 1e3:.1f} ms in all; the longest of each generation "
        + ", ".join(f"{max(g, default=0) * 1e3:.2f}" for g in by_generation)
        + f" ms; objects tracked at the end {len(gc.get_objects()):,}"
    )
    faulting = [i for i, r in enumerate(rows) if r["faults"] > 1000]
    print(
        f"calls with over 1,000 page faults (a pool slot's memory touched for the first time): {len(faulting)}"
    )
    for i in faulting[:8]:
        print(f"  call {i}: " + ", ".join(_cell(rows[i], c) for c, _ in COLUMNS))
    rss = next(
        line.split()[1]
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS")
    )
    print(f"resident set at the end: {int(rss) // 1024} MiB")
    print(f"stores whose freeing faulted a slot's memory in (on any thread): {len(watch.first_resets)}")
    for number, maker, live, freer, faults in watch.first_resets[:12]:
        print(f"  store {number}, made on {maker} with {live} open, freed on {freer}: {faults} faults")
    slowest = sorted(range(len(rows)), key=lambda i: rows[i]["wall"])[-5:][::-1]
    print(
        "slowest 5: "
        + "; ".join(f"call {i}: " + ", ".join(_cell(rows[i], c) for c, _ in COLUMNS) for i in slowest)
    )
    return 0


def _run_delay() -> float:
    """Seconds this thread has waited runnable for a CPU (Linux's schedstat: its run queue wait)."""
    with open("/proc/thread-self/schedstat") as schedstat:
        return int(schedstat.read().split()[1]) / 1e9


def _mean(group: list[dict[str, float]], name: str, unit: str) -> str:
    if not group:
        return f"{'':>11}"
    value = statistics.fmean(r[name] for r in group)
    return f"{value * (1e3 if unit == 'ms' else 100 if unit == '%' else 1):11.2f}"


def _cell(row: dict[str, float], name: str) -> str:
    value = row[name]
    return f"{name} {value * 1e3:.2f}" if dict(COLUMNS)[name] == "ms" else f"{name} {value:g}"


if __name__ == "__main__":
    sys.exit(main())
