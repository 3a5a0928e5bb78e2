"""Every row of the speed goals, measured beside its baseline in one run, printed as a table.

Run: ./dev python bench/goals.py [--quick] [--monty] [--calls N]
Each row is a figure, the baseline it is read against (measured in the same run, taking turns
with it where both are calls), their ratio, the goal and whether it is met:
- fresh `run_python("sum(range(100))")` back to back, against a run of the same in a session
  (blocks of calls back to back, the two taking turns block by block);
- the same with calls 5 ms apart (a spare instance is ready), against the session's run 5 ms
  apart, and beside the machine's own cost of such a pause (`_timing.cache_control`: host
  Python reading a few MiB, 5 ms apart against back to back);
- bench/corpus.py's HumanEval programs, fresh against a session (median of per-program ratios);
- with --monty, the same programs fresh against pydantic-monty's fresh checkout (bench/monty.py:
  its own venv, made the first time);
- fresh `run_javascript("1 + 2")`, against a trivial core call, taking turns call by call
  (javascript_calls.against_core);
- the trivial core call (`wasmbox._bench.ECHO_WAT`) against the same call in plain wasmtime-py
  (`_bench.plain_core_call`: new Store, no limits), taking turns in blocks;
- trivial core calls/s on 2 threads against 1 (`_bench.throughput`);
- a new process to its first Python result (`import wasmbox`, `Sandbox()`, `run_python`), wall
  time from the process's start to its exit, against a bare interpreter (`python -c pass`),
  taking turns (`_timing.processes`, bytecode cached as an installed package has it);
- the tail of back-to-back `run_python` as a user's pytest-benchmark run times it
  (`benchmark(box.run_python, "sum(range(100))")`: a fresh Sandbox, the runtime prepared, no
  warm-up, each call timed alone): max and p99 against the median, beside the same of a
  session's runs timed the same way.
--quick: fewer calls and ~20 corpus programs, for a look; the figures in bench/README.md are
from a full run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import corpus
from _timing import Summary, bytecode_cache, cache_control, processes, taking_turns
from javascript_calls import against_core

import wasmbox
from wasmbox import _bench

SNIPPET = "sum(range(100))"
ARGS = {"text": "the quick brown fox", "n": 3}  # `wasmbox bench`'s trivial call
FIRST_RESULT = f"""
import time
started = time.perf_counter()
import wasmbox
imported = time.perf_counter()
box = wasmbox.Sandbox()
made = time.perf_counter()
assert box.run_python({SNIPPET!r}).value == 4950
done = time.perf_counter()
print(imported - started, made - imported, done - made)
"""


@dataclass(frozen=True)
class Row:
    what: str
    figure: str
    baseline: str
    ratio: str
    goal: str
    met: bool

    def cells(self) -> list[str]:
        return [self.what, self.figure, self.baseline, self.ratio, self.goal, "met" if self.met else "missed"]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def python_rows(box: wasmbox.Sandbox, calls: int) -> list[Row]:
    """Fresh `run_python` back to back and 5 ms apart, each against a session's run."""
    with box.session(limits=corpus.UNBOUNDED) as session:
        ways: dict[str, Callable[[], object]] = {
            "fresh": lambda: box.run_python(SNIPPET),
            "session": lambda: session.run(SNIPPET),
        }
        for call in ways.values():
            assert call() is not None and box.run_python(SNIPPET).value == session.run(SNIPPET).value == 4950
        back = taking_turns(ways, rounds=10, block=calls // 10)
        spaced = taking_turns(ways, rounds=4, block=calls // 40, gap_s=0.005)
    control_back, control_spaced = cache_control(calls // 10, 0.005)
    control = (
        f"; host Python reading ~5 MiB: {ms(control_spaced)} 5 ms apart,"
        f" {control_spaced / control_back:.1f}× back to back"
    )
    rows = []
    for label, times, limit, factor in (
        ("fresh `run_python`, back to back", back, 0.5e-3, 1.5),
        ("fresh `run_python`, 5 ms apart", spaced, 0.3e-3, None),
    ):
        fresh, kept = statistics.median(times["fresh"]), statistics.median(times["session"])
        ratio = fresh / kept
        goal = f"≤ {limit * 1e3:g} ms" + (f"; ≤ {factor}× a session run" if factor else "")
        met = fresh <= limit and (factor is None or ratio <= factor)
        baseline = f"session run {ms(kept)}" + (control if factor is None else "")
        rows.append(Row(label, ms(fresh), baseline, f"{ratio:.2f}×", goal, met))
    return rows


def corpus_rows(box: wasmbox.Sandbox, quick: int, rounds: int, monty: bool) -> list[Row]:
    """The HumanEval programs fresh against a session, and with `monty`, against monty's fresh
    checkout, all four ways taking turns; failures are printed."""
    programs = corpus.programs(quick)
    with box.session(limits=corpus.UNBOUNDED) as session:
        ways = corpus.wasmbox_runners(box, session)
        if monty:
            import monty as _monty  # (bench/monty.py: needs its venv, made the first time)

            with _monty.monty_runners() as monty_ways:
                result = corpus.race(ways | monty_ways, programs, rounds)
        else:
            result = corpus.race(ways, programs, rounds)
    corpus.print_race(
        result, [("wasmbox fresh", "wasmbox session")] + monty * [("wasmbox fresh", "monty fresh")]
    )
    n, fresh, kept, _, ratio = corpus.compare(result, "wasmbox fresh", "wasmbox session")
    rows = [
        Row(
            f"HumanEval programs ({n}), fresh ÷ session, medians", ms(fresh), f"session {ms(kept)}",
            f"{ratio:.2f}×", "≤ 1.15×", ratio <= 1.15,
        )
    ]  # fmt: skip
    if monty:
        n, fresh, theirs, _, ratio = corpus.compare(result, "wasmbox fresh", "monty fresh")
        rows.append(
            Row(
                f"the same ({n} monty runs), fresh ÷ monty's fresh checkout", ms(fresh),
                f"monty {ms(theirs)}", f"{ratio:.2f}×", "≤ 1×", ratio <= 1,
            )
        )  # fmt: skip
    return rows


def javascript_row(box: wasmbox.Sandbox, calls: int) -> Row:
    core, javascript = against_core(box, "1 + 2", calls)
    return Row(
        "fresh `run_javascript(\"1 + 2\")`", ms(javascript), f"trivial core call {core * 1e6:.0f} µs",
        f"{javascript / core:.2f}×", "≤ 0.2 ms", javascript <= 0.2e-3,
    )  # fmt: skip


def core_rows(box: wasmbox.Sandbox, calls: int, seconds: float) -> list[Row]:
    """The trivial core call against plain wasmtime-py, and its calls/s on 2 threads against 1."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "echo.wat"
        path.write_text(_bench.ECHO_WAT)
        echo = box.load({"name": "trivial", "module": str(path)})
        ours, plain = lambda: echo.call(ARGS), _bench.plain_core_call(path, ARGS)
        for _ in range(200):
            ours(), plain()
        times = taking_turns({"wasmbox": ours, "plain": plain}, rounds=10, block=calls // 10)
        one = _bench.throughput(ours, 1, seconds)
        two = _bench.throughput(ours, 2, seconds)
    call, base = statistics.median(times["wasmbox"]), statistics.median(times["plain"])
    return [
        Row(
            "trivial core call", f"{call * 1e6:.1f} µs", f"plain wasmtime-py {base * 1e6:.1f} µs",
            f"{base / call:.2f}× faster", "≥ 10× (≤ 8 µs)", base / call >= 10 and call <= 8e-6,
        ),
        Row(
            "trivial core calls/s, 2 threads ÷ 1", f"{two:,.0f} /s", f"1 thread {one:,.0f} /s",
            f"{two / one:.2f}×", "≥ 1.7×; ≥ 100,000 /s", two / one >= 1.7 and two >= 100_000,
        ),
    ]  # fmt: skip


def process_row(runs: int) -> Row:
    """A new process to its first Python result, against a bare interpreter's start."""
    with bytecode_cache() as env:
        timed = processes(
            {"wasmbox": [sys.executable, "-c", FIRST_RESULT], "bare": [sys.executable, "-c", "pass"]},
            runs,
            env,
        )
    whole = statistics.median(wall for wall, _ in timed["wasmbox"])
    bare = statistics.median(wall for wall, _ in timed["bare"])
    parts = [[float(x) * 1e3 for x in out.split()] for _, out in timed["wasmbox"]]
    split = "/".join(f"{statistics.median(p[i] for p in parts):.0f}" for i in range(3))
    return Row(
        f"new process to first Python result (import/`Sandbox()`/first call {split} ms)", f"{whole * 1e3:.0f} ms",
        f"`python -c pass` {bare * 1e3:.0f} ms", f"{whole / bare:.1f}×", "≤ 150 ms", whole <= 0.150,
    )  # fmt: skip


def tail_row(calls: int) -> tuple[Row, Summary]:
    """Back-to-back `run_python` as pytest-benchmark times it, in a Sandbox of its own; then,
    as the baseline, a session's runs of the same timed the same way (no store is made or
    freed around them), whose tail is the machine's and the interpreter's alone."""
    with wasmbox.Sandbox() as box, box.session(limits=corpus.UNBOUNDED) as session:
        box.prepare_python()
        # the session's block first: right after a block of fresh calls it would meet the
        # housekeeper still freeing their stores
        ways = {"session": lambda: session.run(SNIPPET), "run_python": lambda: box.run_python(SNIPPET)}
        times = taking_turns(ways, rounds=1, block=calls)
    tail, kept = Summary.of(times["run_python"]), Summary.of(times["session"])
    over_max, over_p99 = tail.max / tail.median, tail.p99 / tail.median
    row = Row(
        "tail of back-to-back `run_python` (pytest-benchmark's way)",
        f"max {ms(tail.max)}, p99 {ms(tail.p99)}, median {ms(tail.median)}",
        f"session run: max {kept.max / kept.median:.1f}×, p99 {kept.p99 / kept.median:.1f}× its median"
        f" {ms(kept.median)}", f"max {over_max:.1f}×, p99 {over_p99:.1f}× median",
        "max ≤ 5×, p99 ≤ 2× median", over_max <= 5 and over_p99 <= 2,
    )  # fmt: skip
    return row, tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, ~20 corpus programs")
    parser.add_argument("--monty", action="store_true", help="also against pydantic-monty (its venv)")
    parser.add_argument("--calls", type=int, default=2000, help="Python calls per figure (core: 10×)")
    options = parser.parse_args()
    calls = options.calls // 4 if options.quick else options.calls
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    rows: list[Row] = []
    with wasmbox.Sandbox() as box:
        box.prepare_python()
        box.prepare_javascript()
        rows += python_rows(box, calls)
        try:
            rows += corpus_rows(box, 20 if options.quick else 0, 2 if options.quick else 5, options.monty)
        except SystemExit as skipped:  # no registry to fetch the corpus or monty from: the rest still runs
            print(f"corpus rows: {skipped}", file=sys.stderr)
        rows.append(javascript_row(box, calls))
        rows += core_rows(box, calls * 10, 1.0 if options.quick else 3.0)
    rows.append(process_row(5 if options.quick else 15))
    tail, summary = tail_row(calls // 2)
    rows.append(tail)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"tail: {summary.ms()}\n")
    print_table(rows)
    return 0


def print_table(rows: list[Row]) -> None:
    """A markdown table, as bench/README.md keeps it."""
    print("| what | measured | baseline (same run) | ratio | goal | status |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")


if __name__ == "__main__":
    sys.exit(main())
