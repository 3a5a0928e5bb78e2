"""Soak: many mixed calls, valid and hostile, core and Python, from threads and asyncio at once.

Run: ./dev soak [--calls 200000] [--threads 3] [--tasks 4] [--samples 10]
     (or .venv/bin/python bench/soak_mixed.py ...)

Every result is checked against the value or the error kind its case must give; a result that
does not match, or a call that raises, is a wrong result (must be 0). Prints throughput, the
count of each outcome, and RSS / open fds / threads sampled over the run. `tests/test_soak.py`
runs a short version in the default test run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmbox
from wasmbox import ErrorKind
from wasmbox._bench import process_stats
from wasmbox._capabilities.wasi_files import MAX_OPEN_FILES

ROOT = Path(__file__).resolve().parent.parent
WAT = ROOT / "runtimes" / "examples" / "wat"
CAPABILITIES = ROOT / "capabilities"
HOSTILE_CMD = ROOT / "runtimes" / "examples" / "build" / "hostile_cmd.wasm"


@dataclass(frozen=True)
class Case:
    """One kind of call: how to make it (sync and async) and what it must give."""

    name: str
    python: bool
    weight: int
    call: Callable[[int], wasmbox.CallResult]
    acall: Callable[[int], Awaitable[wasmbox.CallResult]]
    expect: Callable[[int], Any]  # the value for call number i, or the ErrorKind it must fail with


@dataclass
class Sample:
    seconds: float
    calls: int
    rss_mib: float
    fds: int
    threads: int


@dataclass
class Report:
    calls: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)  # "ok" or the error kind
    by_case: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)  # what went wrong, for the first few
    wrong_count: int = 0
    samples: list[Sample] = field(default_factory=list)
    python_calls: int = 0

    def table(self) -> str:
        lines = [
            f"{'time s':>7} {'calls':>9} {'RSS MiB':>8} {'fds':>5} {'threads':>8}   (threads: not counting the soak's drivers)"
        ]
        lines += [
            f"{s.seconds:7.1f} {s.calls:9,d} {s.rss_mib:8.1f} {s.fds:5d} {s.threads:8d}" for s in self.samples
        ]
        return "\n".join(lines)

    def summary(self) -> str:
        first, last = self.samples[0], self.samples[-1]
        outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(self.outcomes.items(), key=lambda kv: -kv[1]))
        rate = self.calls / self.seconds if self.seconds else 0.0
        calls = f"{self.calls:,} calls ({self.python_calls:,} Python) in {self.seconds:.1f} s: {rate:,.0f} calls/s"
        wrong = f"wrong results: {self.wrong_count}" + (f"  e.g. {self.wrong[:3]}" if self.wrong else "")
        growth = (
            f"after warm-up -> end: RSS {first.rss_mib:.1f} -> {last.rss_mib:.1f} MiB "
            f"({last.rss_mib - first.rss_mib:+.1f}), fds {first.fds} -> {last.fds} ({last.fds - first.fds:+d}), "
            f"threads {first.threads} -> {last.threads} ({last.threads - first.threads:+d})"
        )
        return "\n".join([calls, f"outcomes: {outcomes}", wrong, growth])


def _wat(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": fields.pop("as", name), "module": str(WAT / f"{name}.wat"), **fields}


SALES = {"rows": 8, "column": "units",
         "all": {"count": 8, "sum": 88.0, "mean": 11.0, "median": 10.5, "min": 3.0, "max": 20.0}}  # fmt: skip
SNIPPET_LIMITS = {"name": "hostile", "runtime": "python", "limits": {"fuel": 20_000_000, "memory": "64MiB",
                  "output": "16KiB", "timeout": "2s"}}  # fmt: skip
PY_TIMEOUT = {"name": "slow", "runtime": "python", "limits": {"fuel": 10**15, "timeout": "20ms"}}


def make_cases(box: wasmbox.Sandbox, scratch: Path, crowded: wasmbox.Sandbox) -> list[Case]:
    """Load the tools and return every case the soak mixes; `crowded` is a Sandbox whose
    admission control refuses every call (its resident-memory bound is one byte)."""
    store = {"a": "1", "b": "2"}
    box.register_host_function("kv.get", lambda key: store.get(key))

    def host_fn(x: int = 0, deny: bool = False) -> int:
        if deny:
            raise wasmbox.CapabilityDeniedError("not for you")
        return x * 2

    box.register_host_function("host.fn", host_fn)
    words = box.load(CAPABILITIES / "word_count.toml")
    kv = box.load(CAPABILITIES / "kv_lookup.toml")
    csv = box.load(CAPABILITIES / "csv_stats.toml")
    echo = box.load(_wat("echo"))
    tools = {
        "fuel": box.load(_wat("spin", **{"as": "spin_fuel", "limits": {"fuel": 1_000_000}})),
        "timeout": box.load(
            _wat("spin", **{"as": "spin_time", "limits": {"fuel": 10**15, "timeout": "20ms"}})
        ),
        "grow": box.load(_wat("grow", limits={"memory": "2MiB"})),
        "bigalloc": box.load(_wat("bigalloc", limits={"memory": "2MiB"})),
        "trap": box.load(_wat("trap")),
        "garbage": box.load(_wat("garbage")),
        "out_of_bounds": box.load(_wat("out_of_bounds")),
        "deep_result": box.load(_wat("deep_result")),
        "huge_result": box.load(_wat("huge_result")),
        "spam": box.load(_wat("spam", limits={"output": "1KiB"})),
        "deny": box.load(_wat("forward", **{"as": "deny", "host_functions": ["host.fn"]})),
        "forward": box.load(_wat("forward", host_functions=["host.fn"])),
        "host_cap": box.load(_wat("forward_loop", host_functions=["host.fn"], limits={"host_calls": 5})),
    }
    # a WASI command that opens one granted file 5,000 times: the open-file cap stops it at 128
    opener = box.load({"name": "open_many", "module": str(HOSTILE_CMD),
                       "preopens": [{"host": str(CAPABILITIES / "data"), "guest": "/data"}]})  # fmt: skip
    open_many = ["openmany", "/data/sample.txt", "5000"]

    def opened(result: wasmbox.CallResult) -> wasmbox.CallResult:
        """The exit code and the number of opens the guest reports, as the value to check."""
        count = result.stdout.split("\n", 1)[0]
        return result.model_copy(update={"value": [result.value, count]}) if result.ok else result

    async def aopened(i: int) -> wasmbox.CallResult:
        return opened(await opener.acall(argv=open_many))

    adder = scratch / "adder.py"
    adder.write_text("def main(a: int, b: int):\n    return {'sum': a + b, 'args': [a, b]}\n")
    add = box.load({"name": "adder", "runtime": "python", "source": str(adder)})

    refused = crowded.load(_wat("echo"))

    spent = wasmbox.Budget(calls=1, name="spent")
    assert spent.run("echo", lambda: echo.call({"n": 0})).ok  # its one call, used up here

    def core(
        name: str, weight: int, tool: wasmbox.Tool, args: Callable[[int], Any], expect: Callable[[int], Any]
    ) -> Case:
        return Case(name, False, weight, lambda i: tool.call(args(i)), lambda i: tool.acall(args(i)), expect)

    def py(
        name: str, weight: int, code: Callable[[int], str], expect: Callable[[int], Any], grants: Any = None
    ) -> Case:
        return Case(name, True, weight, lambda i: box.run_python(code(i), grants),
                    lambda i: box.arun_python(code(i), grants), expect)  # fmt: skip

    def kind(k: ErrorKind) -> Callable[[int], ErrorKind]:
        return lambda i: k

    def text(i: int) -> str:
        return " ".join(["w"] * (i % 50))

    cases = [
        # valid core calls
        core("echo", 30, echo, lambda i: {"n": i, "s": str(i)}, lambda i: {"n": i, "s": str(i)}),
        core("word_count", 20, words, lambda i: {"text": text(i)},
             lambda i: {"words": i % 50, "lines": 1 if i % 50 else 0, "bytes": max(0, 2 * (i % 50) - 1)}),
        core("kv_lookup", 15, kv, lambda i: {"key": "ab"[i % 2]}, lambda i: {"key": "ab"[i % 2], "value": "12"[i % 2]}),
        core("host_round_trip", 10, tools["forward"], lambda i: {"x": i}, lambda i: 2 * i),
        # hostile core calls
        core("out_of_fuel", 3, tools["fuel"], lambda i: {}, kind(ErrorKind.OUT_OF_FUEL)),
        core("timeout", 1, tools["timeout"], lambda i: {}, kind(ErrorKind.TIMEOUT)),
        core("memory_grow", 3, tools["grow"], lambda i: {}, kind(ErrorKind.MEMORY_LIMIT)),
        core("memory_alloc", 3, tools["bigalloc"], lambda i: {}, kind(ErrorKind.MEMORY_LIMIT)),
        core("trap", 3, tools["trap"], lambda i: {}, kind(ErrorKind.TRAP)),
        core("garbage", 3, tools["garbage"], lambda i: {}, kind(ErrorKind.BAD_RESPONSE)),
        core("out_of_bounds", 3, tools["out_of_bounds"], lambda i: {}, kind(ErrorKind.BAD_RESPONSE)),
        core("deep_result", 2, tools["deep_result"], lambda i: {}, kind(ErrorKind.BAD_RESPONSE)),
        core("huge_result", 2, tools["huge_result"], lambda i: {}, kind(ErrorKind.OUTPUT_LIMIT)),
        core("output_flood", 2, tools["spam"], lambda i: {}, kind(ErrorKind.OUTPUT_LIMIT)),
        core("host_denied", 3, tools["deny"], lambda i: {"deny": True}, kind(ErrorKind.CAPABILITY_DENIED)),
        core("host_call_cap", 2, tools["host_cap"], lambda i: {"x": 1}, kind(ErrorKind.HOST_ERROR)),
        core("bad_args", 3, kv, lambda i: {"key": i}, kind(ErrorKind.INVALID_ARGUMENTS)),
        # a budget with nothing left: refused before the call starts
        Case("over_budget", False, 2, lambda i: echo.call({"n": i}, budget=spent),
             lambda i: echo.acall({"n": i}, budget=spent), kind(ErrorKind.OVER_BUDGET)),
        # a Sandbox past its admission bound: refused at once, the others' calls unaffected
        Case("overloaded", False, 2, lambda i: refused.call({"n": i}), lambda i: refused.acall({"n": i}),
             kind(ErrorKind.OVERLOADED)),
        Case("open_many", False, 1, lambda i: opened(opener.call(argv=open_many)), aopened,
             lambda i: [{"exit_code": 1}, str(MAX_OPEN_FILES)]),
        # valid Python calls
        py("py_snippet", 8, lambda i: f"sum(range({i % 1000}))", lambda i: (i % 1000) * (i % 1000 - 1) // 2),
        Case("py_tool", True, 4, lambda i: add.call({"a": i, "b": 1}), lambda i: add.acall({"a": i, "b": 1}),
             lambda i: {"sum": i + 1, "args": [i, 1]}),
        Case("py_csv", True, 2, lambda i: csv.call({"path": "/data/sales.csv"}),
             lambda i: csv.acall({"path": "/data/sales.csv"}), lambda i: SALES),
        # hostile Python calls
        py("py_fuel", 1, lambda i: "while True: pass", kind(ErrorKind.OUT_OF_FUEL), SNIPPET_LIMITS),
        py("py_timeout", 1, lambda i: "while True: pass", kind(ErrorKind.TIMEOUT), PY_TIMEOUT),
        py("py_memory", 1, lambda i: "x = bytearray(1 << 30)", kind(ErrorKind.MEMORY_LIMIT), SNIPPET_LIMITS),
        py("py_output_flood", 1, lambda i: "print('x' * 100_000)", kind(ErrorKind.OUTPUT_LIMIT), SNIPPET_LIMITS),
        py("py_ungranted_host_call", 1, lambda i: "import wasmbox_guest\nwasmbox_guest.call_host('kv.get', key='a')",
           kind(ErrorKind.CAPABILITY_DENIED)),
        py("py_exception", 1, lambda i: f"raise ValueError({i})", kind(ErrorKind.GUEST_ERROR)),
        py("py_sleep", 1, lambda i: "import time\ntime.sleep(10)", kind(ErrorKind.GUEST_ERROR)),
        Case("py_bad_args", True, 1, lambda i: add.call({"a": i}), lambda i: add.acall({"a": i}),
             kind(ErrorKind.INVALID_ARGUMENTS)),
    ]  # fmt: skip
    return cases


def schedule(cases: list[Case], seed: int = 1) -> list[Case]:
    """Each case as often as its weight, in a fixed shuffled order."""
    order = [case for case in cases for _ in range(case.weight)]
    random.Random(seed).shuffle(order)
    return order


def check(case: Case, i: int, result: Any) -> str | None:
    """None if `result` is what call `i` of `case` must give, else what is wrong."""
    if not isinstance(result, wasmbox.CallResult):
        return f"{case.name}#{i}: raised {result!r}"[:300]
    expected = case.expect(i)
    if isinstance(expected, ErrorKind):
        if result.error is None or result.error.kind is not expected:
            return f"{case.name}#{i}: expected {expected.value}, got {result.error or result.value!r}"[:300]
    elif not result.ok or result.value != expected:
        return f"{case.name}#{i}: expected {expected!r}, got {result.error or result.value!r}"[:300]
    return None


class Soak:
    """Hands out call numbers to every driver, and records each outcome."""

    def __init__(self, plan: list[Case], calls: int) -> None:
        self.plan = plan
        self.total = calls
        self.report = Report()
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            if self._next >= self.total:
                return None
            self._next += 1
            return self._next - 1

    def record(self, case: Case, i: int, result: Any) -> None:
        problem = check(case, i, result)
        outcome = "raised" if not isinstance(result, wasmbox.CallResult) else (
            "ok" if result.ok else result.error.kind.value if result.error else "?")  # fmt: skip
        with self._lock:
            report = self.report
            report.calls += 1
            report.python_calls += case.python
            report.outcomes[outcome] += 1
            report.by_case[case.name] += 1
            if problem is not None:
                report.wrong_count += 1
                if len(report.wrong) < 20:
                    report.wrong.append(problem)

    @property
    def done(self) -> int:
        with self._lock:
            return self.report.calls


def _thread_driver(soak: Soak) -> None:
    while (i := soak.take()) is not None:
        case = soak.plan[i % len(soak.plan)]
        try:
            result: Any = case.call(i)
        except Exception as exc:  # noqa: BLE001 - a raise is a wrong result, counted
            result = exc
        soak.record(case, i, result)


async def _async_drivers(soak: Soak, tasks: int) -> None:
    async def driver() -> None:
        while (i := soak.take()) is not None:
            case = soak.plan[i % len(soak.plan)]
            try:
                result: Any = await case.acall(i)
            except Exception as exc:  # noqa: BLE001 - a raise is a wrong result, counted
                result = exc
            soak.record(case, i, result)

    await asyncio.gather(*(driver() for _ in range(tasks)))


def run(
    calls: int,
    threads: int = 3,
    tasks: int = 4,
    samples: int = 10,
    cache_dir: str | Path | None = None,
    warmup: int = 2000,
    out: Callable[[str], None] = print,
) -> Report:
    """Warm up, then make `calls` calls from `threads` threads and `tasks` asyncio tasks at
    once (the asyncio loop runs on its own thread), sampling RSS/fds/threads `samples` times."""
    import tempfile

    kwargs: dict[str, Any] = {} if cache_dir is None else {"cache_dir": cache_dir}
    with (
        tempfile.TemporaryDirectory() as scratch,
        wasmbox.Sandbox(max_workers=max(2, tasks), **kwargs) as box,
        wasmbox.Sandbox(admission=wasmbox.AdmissionLimits(resident=1), **kwargs) as crowded,
    ):
        cases = make_cases(box, Path(scratch), crowded)
        plan = schedule(cases)
        warm_sync, warm_async = Soak(plan, warmup // 2), Soak(plan, warmup // 2)
        _thread_driver(warm_sync)
        asyncio.run(_async_drivers(warm_async, tasks))
        soak = Soak(plan, calls)
        for warm in (warm_sync, warm_async):  # a wrong result while warming up counts too
            soak.report.wrong_count += warm.report.wrong_count
            soak.report.wrong += warm.report.wrong
        drivers = [
            threading.Thread(target=_thread_driver, args=(soak,), name=f"soak-{n}") for n in range(threads)
        ]
        drivers.append(
            threading.Thread(target=asyncio.run, args=(_async_drivers(soak, tasks),), name="soak-asyncio")
        )
        started = time.perf_counter()

        def sample() -> None:
            """Threads are counted without the soak's own drivers, so the figure is wasmbox's."""
            rss, fds, count = process_stats()
            drivers_alive = sum(d.is_alive() for d in drivers)
            soak.report.samples.append(
                Sample(time.perf_counter() - started, soak.done, rss, fds, count - drivers_alive)
            )

        sample()  # the baseline: after warm-up, before the drivers start
        for driver in drivers:
            driver.start()
        next_at = 1
        while any(d.is_alive() for d in drivers):
            time.sleep(0.05)
            if soak.done >= next_at * calls / samples and next_at < samples:
                sample()
                next_at += 1
        for driver in drivers:
            driver.join()
        soak.report.seconds = time.perf_counter() - started
        sample()
    return soak.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=3, help="threads calling Tool.call/run_python")
    parser.add_argument("--tasks", type=int, default=4, help="asyncio tasks calling acall/arun_python")
    parser.add_argument("--samples", type=int, default=10, help="RSS/fd/thread samples over the run")
    args = parser.parse_args(argv)
    report = run(args.calls, args.threads, args.tasks, args.samples)
    print(report.table())
    print(report.summary())
    return 1 if report.wrong_count else 0


if __name__ == "__main__":
    sys.exit(main())
