"""A short soak (bench/soak_mixed.py): mixed valid and hostile calls, core and Python, from
threads and asyncio at once. Every result must be right, and no fd or thread may accumulate.
The long run is `./dev soak --calls 200000` (figures in bench/README.md)."""

from __future__ import annotations

from pathlib import Path

from bench.soak_mixed import run
from wasmbox import ErrorKind


def test_short_mixed_soak_gives_only_right_results_and_leaks_nothing(cache_dir: Path) -> None:
    report = run(calls=3000, threads=2, tasks=3, samples=4, cache_dir=cache_dir, warmup=600, out=print)
    assert report.calls == 3000
    assert report.wrong_count == 0, report.wrong
    # every kind of outcome happened, so the mix really was mixed
    assert set(report.outcomes) == {"ok"} | {k.value for k in ErrorKind}, report.outcomes
    assert report.python_calls > 300
    first, last = report.samples[0], report.samples[-1]
    assert last.threads <= first.threads  # wasmbox's threads, without the soak's drivers
    assert last.fds <= first.fds + 4  # (spare instances and stores queued for closing move it)
