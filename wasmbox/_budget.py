"""Budgets: what many calls may use together (a tenant's, a conversation's), decided before each
call starts and charged with what it used when it ends.

A call its budget cannot admit is not started: it ends at once as `over_budget`, naming the
limit and when the budget frees up again (a router can forward it, or wait and retry). A call
that is admitted runs under its own limits, so it may take the budget past a fuel, time or
output limit by up to what one call may use; the next call then waits for the window to
move. Thread-safe (one lock a budget, held for a few dict and deque operations); the asyncio
calls take the same budget, since they run on the Sandbox's worker threads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ._errors import ErrorKind
from ._results import CallResult


class Budget:
    """Caps on what the calls given this budget use together. Each cap is optional (None: not
    capped): `calls`, `fuel`, `wall_s` (seconds of calls' durations) and `output` (bytes of
    stdout, stderr and files) per `window_s` seconds (None: over the budget's life), and
    `concurrent` calls at once. ValueError for a cap that is not a positive number."""

    def __init__(
        self,
        *,
        calls: int | None = None,
        fuel: int | None = None,
        wall_s: float | None = None,
        output: int | None = None,
        concurrent: int | None = None,
        window_s: float | None = None,
        name: str = "budget",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for label, value in (
            ("calls", calls),
            ("fuel", fuel),
            ("wall_s", wall_s),
            ("output", output),
            ("concurrent", concurrent),
            ("window_s", window_s),
        ):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            ):
                raise ValueError(f"Budget {label} must be a positive number or None, got {value!r}")
        self.name = name
        self.calls, self.fuel, self.wall_s, self.output = calls, fuel, wall_s, output
        self.concurrent, self.window_s = concurrent, window_s
        self._clock = clock
        self._lock = threading.Lock()
        self._running = 0
        self._started: deque[float] = deque()  # when each call in the window was admitted
        self._spent: deque[tuple[float, int, float, int]] = deque()  # (ended, fuel, seconds, output)
        self._fuel, self._wall, self._output = 0, 0.0, 0  # the sums of `_spent`

    def run(self, tool: str, call: Callable[[], CallResult]) -> CallResult:
        """`call()`'s result, charged to the budget, if it admits the call; else an
        `over_budget` result of `tool`, and `call` is not run."""
        refused = self.admit()
        if refused is not None:
            return CallResult.failed(tool, ErrorKind.OVER_BUDGET, f"not run: {refused}")
        result = None
        try:
            result = call()
        finally:
            self.charge(result)
        return result

    def admit(self) -> str | None:
        """Take a place for one call, or say why there is none (then nothing is taken)."""
        with self._lock:
            now = self._clock()
            self._forget(now)
            problem = self._refusal(now)
            if problem is None:
                self._running += 1
                self._started.append(now)
            return problem

    def charge(self, result: CallResult | None) -> None:
        """Give the place `admit` took back, charging what the call used (None: it raised). A
        call the Sandbox's admission control refused (`overloaded`) never started: it is not
        charged, nor counted in `calls`."""
        if result is not None and result.error is not None and result.error.kind is ErrorKind.OVERLOADED:
            with self._lock:
                self._running -= 1
                if self._started:  # (one admission fewer: the newest, so the window frees no sooner)
                    self._started.pop()
            return
        fuel, wall, output = 0, 0.0, 0
        if result is not None:
            fuel, wall = result.fuel_used, result.duration_s
            output = (
                len(result.stdout.encode())
                + len(result.stderr.encode())
                + sum(map(len, result.files.values()))
            )
        with self._lock:
            self._running -= 1
            self._spent.append((self._clock(), fuel, wall, output))
            self._fuel += fuel
            self._wall += wall
            self._output += output

    def used(self) -> dict[str, float]:
        """What the calls in the window used so far (calls, fuel, wall_s, output), and how many
        are running."""
        with self._lock:
            self._forget(self._clock())
            return {
                "calls": len(self._started),
                "fuel": self._fuel,
                "wall_s": self._wall,
                "output": self._output,
                "running": self._running,
            }

    def _forget(self, now: float) -> None:
        if self.window_s is None:
            return
        horizon = now - self.window_s
        while self._started and self._started[0] <= horizon:
            self._started.popleft()
        while self._spent and self._spent[0][0] <= horizon:
            _, fuel, wall, output = self._spent.popleft()
            self._fuel -= fuel
            self._wall -= wall
            self._output -= output

    def _refusal(self, now: float) -> str | None:
        where = f"{self.name}: " if self.name else ""
        if self.concurrent is not None and self._running >= self.concurrent:
            return f"{where}{self._running} calls are running, the most this budget allows at once; retry when one ends"
        oldest_spent = self._spent[0][0] if self._spent else now
        spent = (
            ("calls", len(self._started), self.calls, self._started[0] if self._started else now),
            ("fuel", self._fuel, self.fuel, oldest_spent),
            ("wall_s", self._wall, self.wall_s, oldest_spent),
            ("output", self._output, self.output, oldest_spent),
        )
        for label, used, cap, oldest in spent:
            if cap is not None and used >= cap:
                if self.window_s is None:
                    return f"{where}its {label} ({_shown(label, cap)}) is used up"
                free = max(0.0, oldest + self.window_s - now)
                return (
                    f"{where}its {label} for {self.window_s:g} s ({_shown(label, cap)}) is used up; "
                    f"some frees in {free:.1f} s"
                )
        return None


def _shown(label: str, cap: float) -> str:
    if label == "wall_s":
        return f"{cap:g} s"
    if label == "output":
        return f"{int(cap):,} bytes"
    return f"{int(cap):,}"
