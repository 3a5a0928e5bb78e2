"""Timing helpers the bench scripts share (imported as `_timing`: the scripts run from bench/).

- `taking_turns`: several calls timed in turns, so that a noisy machine hits them alike;
- `Summary`: min, median, mean, p99 and max of a sample, and the tail's ratios to the median;
- `processes`: whole child processes timed from their start to their exit, taking turns;
- `bytecode_cache`: an environment whose children write their bytecode to a folder of their own;
- `cache_control`: what a pause costs plain host Python on this machine, the control for
  figures of calls made some milliseconds apart.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial


def taking_turns(
    calls: Mapping[str, Callable[[], object]], rounds: int, block: int = 1, gap_s: float = 0.0
) -> dict[str, list[float]]:
    """Each call's times in seconds: in every round each call runs `block` times in a row (back
    to back, or `gap_s` apart, the sleep untimed), the calls taking turns in an order reversed
    every other round, so that none always follows the same one. No warm-up: make one first."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            call, out = calls[name], times[name]
            for _ in range(block):
                if gap_s:
                    time.sleep(gap_s)
                started = time.perf_counter()
                call()
                out.append(time.perf_counter() - started)
    return times


def cache_control(calls: int, gap_s: float) -> tuple[float, float]:
    """The machine's own cost of a pause: the median seconds of plain host Python that reads
    a few MiB at random (a sum over 150,000 shuffled float objects, about a CPython
    interpreter's working set in a small call), back to back and `gap_s` apart (the pause
    untimed), taking turns in blocks. No wasmbox in it: what the second costs over the first
    is what the caches lose while the thread pauses (other processes, other tenants of the
    host), and a call pays it in kind."""
    numbers = [random.random() for _ in range(150_000)]
    random.shuffle(numbers)
    work = partial(sum, numbers)
    for _ in range(20):
        work()
    back = taking_turns({"work": work}, rounds=4, block=calls // 4)["work"]
    spaced = taking_turns({"work": work}, rounds=4, block=calls // 4, gap_s=gap_s)["work"]
    return statistics.median(back), statistics.median(spaced)


@dataclass(frozen=True)
class Summary:
    """A sample of times in seconds, summed up as pytest-benchmark does, plus the p99."""

    count: int
    min: float
    median: float
    mean: float
    p99: float
    max: float

    @classmethod
    def of(cls, times: list[float]) -> Summary:
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return cls(
            len(ordered), ordered[0], statistics.median(ordered), statistics.fmean(ordered), p99, ordered[-1]
        )

    def ms(self) -> str:
        return (
            f"min {self.min * 1e3:.2f} / median {self.median * 1e3:.2f} / mean {self.mean * 1e3:.2f}"
            f" / p99 {self.p99 * 1e3:.2f} / max {self.max * 1e3:.1f} ms ({self.count} calls)"
        )


def processes(
    children: Mapping[str, list[str]], runs: int, env: Mapping[str, str]
) -> dict[str, list[tuple[float, str]]]:
    """Each child command run once to warm the disk caches, then `runs` times, the children
    taking turns in an order reversed every other run: each run's wall time in seconds from
    its start to its exit (the interpreter's start included) and its stdout. A child that
    fails raises CalledProcessError."""
    names = list(children)
    for name in names:
        subprocess.run(children[name], check=True, capture_output=True, env=env)
    out: dict[str, list[tuple[float, str]]] = {name: [] for name in names}
    for run in range(runs):
        for name in names if run % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            done = subprocess.run(children[name], check=True, capture_output=True, text=True, env=env)
            out[name].append((time.perf_counter() - started, done.stdout))
    return out


@contextlib.contextmanager
def bytecode_cache() -> Iterator[dict[str, str]]:
    """This process's environment for children that may write bytecode, to a temporary cache of
    their own rather than the source tree, as an installed package has it: compiling wasmbox's
    sources again in every process would add ~20 ms that no user pays."""
    with tempfile.TemporaryDirectory(prefix="wasmbox-pyc-") as folder:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = folder
        yield env
