"""Progress lines for slow steps (runtime builds, big compiles, downloads, installs).

A `Progress` is a callable given one line at a time (`Sandbox(progress=...)`; default: stderr).
`Step` says what a slow step is doing and roughly how long it takes, then, while it runs, a line
every `TICK_S` seconds, so no stretch of a build is silent for long.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from types import TracebackType
from typing import Self

Progress = Callable[[str], None]

TICK_S = 10.0  # seconds between the lines of a step still running


def stderr_progress(message: str) -> None:
    print(f"wasmbox: {message}", file=sys.stderr, flush=True)


def quiet(message: str) -> None:
    """A Progress that shows nothing."""


class Step:
    """One slow step: `begin` sends "<doing> (<about>) ...", then "still <doing>: N s so far"
    every `every` seconds (default `TICK_S`) from a daemon thread until `end`, which returns the step's seconds.
    Also a context manager (`with Step(...) as step:`; `step.seconds` after it), which on a
    normal exit sends "<done> in N s" when `done` is given."""

    def __init__(
        self,
        progress: Progress | None,
        doing: str,
        about: str,
        *,
        done: str | None = None,
        every: float | None = None,
    ) -> None:
        self._progress = progress or quiet
        self._doing = doing
        self._about = about
        self._done = done
        self._every = TICK_S if every is None else every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self.seconds = 0.0

    def begin(self) -> Self:
        self._started = time.perf_counter()
        self._progress(f"{self._doing} ({self._about}) ...")
        self._thread = threading.Thread(target=self._tick, name="wasmbox-progress", daemon=True)
        self._thread.start()
        return self

    def end(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.seconds = time.perf_counter() - self._started
        return self.seconds

    def _tick(self) -> None:
        while not self._stop.wait(self._every):
            elapsed = time.perf_counter() - self._started
            try:
                self._progress(f"still {self._doing}: {elapsed:.0f} s so far ...")
            except Exception:  # noqa: BLE001 - a failing progress sink must not end the step
                return

    def __enter__(self) -> Self:
        return self.begin()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()
        if kind is None and self._done is not None:
            self._progress(f"{self._done} in {self.seconds:.1f} s")


# Modules from this size on get a progress line when they are compiled, with an estimate from
# this rate (the big-module figures are in bench/README.md).
BIG_MODULE = 8 * 1024**2
_COMPILE_BYTES_PER_S = 1.5e6


def compile_step(progress: Progress | None, module: Path, size: int) -> AbstractContextManager[object]:
    """The context a module's compile runs in: for a big module, a `Step` with an estimate
    from its size; else nothing."""
    if progress is None or size < BIG_MODULE:
        return nullcontext()
    about = f"{size / 1024**2:.0f} MiB, once per cache; about {max(1, round(size / _COMPILE_BYTES_PER_S))} s"
    return Step(progress, f"compiling {module.name}", about, done=f"compiled {module.name}")
