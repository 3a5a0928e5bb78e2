"""Trivial core calls from one thread and from two: calls/s, the CPU the process used and its
context switches, with the two threads sharing a Sandbox and with a Sandbox each.

Run: ./dev python bench/threads.py [--seconds S] [--rounds N]
Each round times one thread, two threads on one Sandbox's tool, then two threads each on its
own Sandbox's tool (so no lock of wasmbox's is shared), `--seconds` each, and prints calls/s,
the cores' worth of CPU the process used (`getrusage`, user and system), and its voluntary
context switches per second and per call (a thread waiting for the GIL or a lock).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import wasmbox
from wasmbox import _bench

ARGS = {"text": "the quick brown fox", "n": 3}


def measure(calls: Sequence[Callable[[], object]], seconds: float) -> str:
    stop = time.perf_counter() + seconds
    counts = [0] * len(calls)

    def worker(i: int) -> None:
        call = calls[i]
        while time.perf_counter() < stop:
            call()
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(calls))]
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after, elapsed = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - started
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    switches, done = after.ru_nvcsw - before.ru_nvcsw, sum(counts)
    return (
        f"{done / elapsed:9,.0f} calls/s, CPU {(user + system) / elapsed:.2f} cores (system"
        f" {system / elapsed:.2f}), {switches / elapsed:8,.0f} voluntary switches/s"
        f" ({switches / max(done, 1):.1f} a call)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
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
            print(f"  1 thread                 {measure([a], options.seconds)}")
            print(f"  2 threads, one Sandbox   {measure([a, a], options.seconds)}")
            print(f"  2 threads, two Sandboxes {measure([a, b], options.seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
