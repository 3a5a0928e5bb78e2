"""Where a call's time goes, phase by phase, for whoever asks (`record`); nothing otherwise.

A runner's call is timed from its start (`CallState.start`) to its result (`_call.finish`):
instantiate (the store, its WASI context, the instance; for Python, taking a spare made ahead
or making one), run (the guest, and reading its reply), teardown (freeing the store). Calls
pay for this only while some thread records: otherwise `CallState.phases` stays None and each
mark is one `is None` test.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ._results import HostCallRecord

# What a recorded call leaves (`_call.finish` appends it to `Clock.into`): (tool, clock, ran,
# closed, host-call records, fuel used), turned into a CallPhases only when read, so that
# recording costs a call little. `ran`: the guest's run and its reply are over; `closed`: the
# store is freed.
_Raw = tuple[str, "Clock", float, float, list[HostCallRecord], int]


@dataclass(frozen=True, slots=True)
class CallPhases:
    """One call's phases, in seconds (`wasmbox.testing.record_phases` collects them).

    `instantiate_s` is 0 for a session's run (its instance lives on). `host_s` is the time
    inside host functions, part of `run_s`. `made_ahead` says whether a spare instance made
    ahead of the call served it (Python tools and snippets; None for other runners). A Python
    call hands its store to a background thread, so its `teardown_s` is that hand-off, or the
    whole free when that thread is behind."""

    tool: str
    instantiate_s: float
    run_s: float
    teardown_s: float
    host_s: float
    host_calls: int
    fuel_used: int
    made_ahead: bool | None

    @property
    def total_s(self) -> float:
        return self.instantiate_s + self.run_s + self.teardown_s


class Clock:
    """The marks of one call being recorded (`CallState.phases`), and where it goes (`into`)."""

    __slots__ = ("into", "made_ahead", "ready", "started")

    def __init__(self, started: float, into: list[_Raw]) -> None:
        self.started = started
        self.ready: float | None = None  # the instance is made: the guest runs next
        self.made_ahead: bool | None = None
        self.into = into


# How many `record` blocks are open, in all threads: while 0, calls make no Clock.
active = 0
_lock = threading.Lock()
_local = threading.local()


class Recording:
    """The calls `record` saw, in order (`calls`)."""

    def __init__(self) -> None:
        self._raw: list[_Raw] = []

    @property
    def calls(self) -> list[CallPhases]:
        return [_phases(*raw) for raw in self._raw]

    def __len__(self) -> int:
        return len(self._raw)


@contextlib.contextmanager
def record() -> Iterator[Recording]:
    """Collect the phases of every call that this thread makes while inside, in order.

    Only a thread's outermost calls are recorded: a tool called from a host function is part
    of its caller's `host_s`. Calls on other threads (`acall`'s workers among them) are not,
    nor calls refused before their runner started (bad args)."""
    global active
    outer: list[_Raw] | None = getattr(_local, "raw", None)
    recording = Recording()
    with _lock:
        active += 1
    _local.raw = recording._raw
    try:
        yield recording
    finally:
        _local.raw = outer
        with _lock:
            active -= 1


def clock(started: float, depth: int) -> Clock | None:
    """A Clock for a call starting now at nesting `depth`, if this thread records."""
    into: list[_Raw] | None = getattr(_local, "raw", None)
    if depth or into is None:
        return None
    return Clock(started, into)


def _phases(
    tool: str, clock: Clock, ran: float, closed: float, records: list[HostCallRecord], fuel_used: int
) -> CallPhases:
    ready = clock.ready if clock.ready is not None else clock.started
    return CallPhases(
        tool=tool,
        instantiate_s=ready - clock.started,
        run_s=ran - ready,
        teardown_s=closed - ran,
        host_s=sum(r.duration_s for r in records),
        host_calls=len(records),
        fuel_used=fuel_used,
        made_ahead=clock.made_ahead,
    )
