"""What `Sandbox.stats` reports: the calls its tools finished, and a snapshot of the Sandbox."""

from __future__ import annotations

import dataclasses
import threading

from ._admission import AdmissionStats
from ._cache import CacheStats
from ._results import CallResult


class CallCounts:
    """The calls a Sandbox's tools finished, and their errors by kind (`Sandbox.stats`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls = 0
        self._errors: dict[str, int] = {}

    def add(self, result: CallResult) -> None:
        with self._lock:
            self._calls += 1
            if result.error is not None:
                kind = result.error.kind.value
                self._errors[kind] = self._errors.get(kind, 0) + 1

    def snapshot(self) -> tuple[int, dict[str, int]]:
        with self._lock:
            return self._calls, dict(self._errors)


@dataclasses.dataclass(frozen=True)
class SandboxStats:
    """`Sandbox.stats()`: tools loaded, calls finished and their errors by kind, calls running
    (`in_flight`: guests running now, tools code calls among them), live sessions, the compile
    cache's counters, admission control's counts (None without `AdmissionLimits`), and the
    instance pool: `stores` open (each call's, spare's and session's, every runtime's; each
    holds instance and memory slots of its engine's pool, `EngineSettings.pool_slots`) and
    the Python runtime's `spares` ready."""

    tools: int
    calls: int
    errors: dict[str, int]
    in_flight: int
    sessions: int
    cache: CacheStats
    admission: AdmissionStats | None = None
    stores: int = 0
    spares: int = 0
