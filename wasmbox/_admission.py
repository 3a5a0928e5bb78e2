"""Admission control for a whole Sandbox: a bound on the calls in flight and on the process's
resident memory, past which a new call is refused at once (`overloaded`) instead of queueing.

A call takes its place where it enters the Sandbox: a sync call on its caller's thread, before
anything else of it runs; work handed to the worker threads (acall, arun_*, adispatch, dispatch's
concurrent calls, the MCP server's) before it is queued, so the queue holds only admitted calls.
A place is given back when the call ends, or when queued work is cancelled before it starts. A
call made while its thread holds a place (a tool its code calls, the calls of admitted work, a
dispatch from inside a call) takes none: it is part of the call that holds it. A queued call
refused is run on the caller's thread as far as its refusal (no guest runs: what precedes the
call, such as reading a run_python grant set, does), so a refused tool call is audited,
counted and traced like any (and a `Budget` gives back the admission of a call refused here,
`Budget.charge`). The count is exact under threads and asyncio (one lock); the memory
bound is a reading of the process's resident set when a call would start (Linux's
`/proc/self/statm`), so calls admitted together may pass it by up to their memory limits.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from ._errors import ErrorKind
from ._results import CallResult
from ._units import format_size, parse_size

T = TypeVar("T")

_local = threading.local()  # `held`: the Gate whose place this thread's work holds; `refused`


@dataclasses.dataclass(frozen=True)
class AdmissionLimits:
    """`Sandbox(admission=...)`: `in_flight` caps the calls admitted and not yet ended (running,
    or queued for the worker threads); `resident` (bytes, or a size such as "6GiB") caps the
    process's resident memory, read when a call would start (Linux only). None: not capped.
    A call past either is not started and ends at once as `overloaded`. ValueError for a cap
    that is not a positive whole number, or `resident` where it cannot be read."""

    in_flight: int | None = None
    resident: int | str | None = None

    def __post_init__(self) -> None:
        if self.in_flight is not None and (
            isinstance(self.in_flight, bool) or not isinstance(self.in_flight, int) or self.in_flight < 1
        ):
            raise ValueError(f"AdmissionLimits in_flight must be an int >= 1 or None, got {self.in_flight!r}")
        if self.resident is not None:
            expected = f"AdmissionLimits resident must be a size in bytes (an int or e.g. '6GiB') or None, got {self.resident!r}"
            try:
                size = parse_size(self.resident)
            except ValueError as exc:
                raise ValueError(f"{expected}: {exc}") from None
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ValueError(expected)
            if not os.path.exists(_STATM):
                raise ValueError(f"AdmissionLimits resident needs {_STATM} (Linux) to read the resident set")
            object.__setattr__(self, "resident", size)


@dataclasses.dataclass(frozen=True)
class AdmissionStats:
    """`SandboxStats.admission`: the calls admitted and not yet ended, the calls refused by
    the bound that refused them (`in_flight`, `resident`), and the last resident-set reading
    in bytes (None without a `resident` cap)."""

    in_flight: int
    admitted: int
    refused: dict[str, int]
    resident: int | None


_STATM = "/proc/self/statm"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class Gate:
    """One Sandbox's admission: `run` for a call made on this thread, `submit` for work handed
    to an executor. With no limits it is off: `run` calls through, `submit` submits."""

    def __init__(self, limits: AdmissionLimits | None) -> None:
        limits = limits if limits is not None else AdmissionLimits()
        if not isinstance(limits, AdmissionLimits):
            raise TypeError(f"admission must be an AdmissionLimits, got {type(limits).__name__}")
        self._cap = limits.in_flight
        self._resident_cap = limits.resident if isinstance(limits.resident, int) else None
        self.on = self._cap is not None or self._resident_cap is not None
        self._lock = threading.Lock()
        self._in_flight = 0
        self._admitted = 0
        self._refused = {"in_flight": 0, "resident": 0}
        self._resident: int | None = None
        self._statm: tuple[int, int] | None = None  # (pid, fd): /proc/self is the opener's pid
        self._closed = False

    def run(self, name: str, call: Callable[[], CallResult]) -> CallResult:
        """`call()` holding a place, if one is free; else an `overloaded` result of `name`, and
        `call` is not run. A thread already holding one of this Gate's places (or refused it,
        for queued work) runs `call` under that."""
        if not self.on:
            return call()
        if getattr(_local, "held", None) is self:
            return call()
        refused: tuple[Gate, str] | None = getattr(_local, "refused", None)
        if refused is not None and refused[0] is self:
            return CallResult.failed(name, ErrorKind.OVERLOADED, refused[1])
        problem = self.enter()
        if problem is not None:
            return CallResult.failed(name, ErrorKind.OVERLOADED, problem)
        return self._holding(call)

    def submit(self, executor: Executor, work: Callable[[], T]) -> Future[T]:
        """`work` queued on `executor` holding a place taken now; refused, `work` runs here at
        once with its calls refused (its future is then done). The place is given back when
        `work` ends, or when the future is cancelled before it starts. Raises what
        `executor.submit` raises (after giving the place back)."""
        if not self.on or getattr(_local, "held", None) is self:
            return executor.submit(work)
        problem = self.enter()
        if problem is not None:
            done: Future[T] = Future()
            before = getattr(_local, "refused", None)
            _local.refused = (self, problem)
            try:
                done.set_result(work())
            except BaseException as exc:  # noqa: BLE001 - handed to the future's waiter, as a worker's
                done.set_exception(exc)
            finally:
                _local.refused = before
            return done
        try:
            future = executor.submit(self._holding, work)
        except BaseException:
            self.leave()
            raise
        future.add_done_callback(self._cancelled)
        return future

    async def offload(self, executor: Executor, work: Callable[[], T]) -> T:
        """`submit`, awaited from asyncio."""
        import asyncio  # lazily, as in Tool.acall

        return await asyncio.wrap_future(self.submit(executor, work))

    def enter(self) -> str | None:
        """Take a place, or say why there is none (counted as refused; nothing is taken)."""
        with self._lock:
            resident = self._read_resident() if self._resident_cap is not None else None
            if resident is not None:
                self._resident = resident
            if self._cap is not None and self._in_flight >= self._cap:
                self._refused["in_flight"] += 1
                return (
                    f"not run: the Sandbox is overloaded: {self._in_flight} calls are in flight, the "
                    f"most it admits (AdmissionLimits.in_flight); retry shortly, or elsewhere"
                )
            if resident is not None and self._resident_cap is not None and resident >= self._resident_cap:
                self._refused["resident"] += 1
                return (
                    f"not run: the Sandbox is overloaded: the process's resident memory is "
                    f"{resident / 1024**2:,.0f} MiB, at or over its bound of "
                    f"{format_size(self._resident_cap)} (AdmissionLimits.resident); retry "
                    "when calls end, or elsewhere"
                )
            self._in_flight += 1
            self._admitted += 1
            return None

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def stats(self) -> AdmissionStats | None:
        """What `SandboxStats.admission` shows; None when the Gate is off."""
        if not self.on:
            return None
        with self._lock:
            return AdmissionStats(self._in_flight, self._admitted, dict(self._refused), self._resident)

    def close(self) -> None:
        """Close the held `/proc/self/statm` (a call checked after this reads it afresh)."""
        with self._lock:
            self._closed = True
            statm, self._statm = self._statm, None
        if statm is not None:
            os.close(statm[1])

    def _holding(self, call: Callable[[], T]) -> T:
        """`call()` with this thread holding the place `enter` took, given back after."""
        before = getattr(_local, "held", None)
        _local.held = self
        try:
            return call()
        finally:
            _local.held = before
            self.leave()

    def _cancelled(self, future: Future[Any]) -> None:
        if future.cancelled():  # `_holding` never ran: its place is given back here
            self.leave()

    def _read_resident(self) -> int:
        """The process's resident set in bytes, from a held `/proc/self/statm` (a pread: about
        a microsecond; under the lock, so `close` never closes it mid-read); opened again in
        a forked child, read afresh once closed."""
        if self._closed:
            with open(_STATM, "rb") as file:
                return int(file.read().split()[1]) * _PAGE
        pid = os.getpid()
        if self._statm is None or self._statm[0] != pid:
            if self._statm is not None:  # the parent's, copied by fork
                os.close(self._statm[1])
            self._statm = (pid, os.open(_STATM, os.O_RDONLY | os.O_CLOEXEC))
        return int(os.pread(self._statm[1], 128, 0).split()[1]) * _PAGE
