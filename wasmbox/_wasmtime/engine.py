"""The shared Wasmtime engine: its settings, and the epoch ticker that enforces deadlines."""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import threading
import weakref
from dataclasses import asdict, dataclass

import wasmtime
from wasmtime import _ffi as ffi

from .._dist import version
from .._errors import WasmboxError
from . import signals, store

MAX_MEMORY = 4 * 1024**3  # wasm32 address space
WASMTIME_VERSION = version("wasmtime")


@dataclass(frozen=True)
class EngineSettings:
    """How the Sandbox's Engine is set up. The compile settings are part of every cache key.

    With `pooling` (the default), instances take their memories, tables and contexts from
    slots reserved once, instead of mapping and unmapping them per call (what that saves:
    bench/README.md, "Core calls"). A slot is reset to the module's initial image before
    reuse, so no call sees another's data. `pool_slots` bounds how many core instances (and memories) can
    be live at once across all threads; a component (the Python runtime) uses several.
    """

    max_wasm_stack: int = 512 * 1024
    epoch_tick_s: float = 0.005
    cranelift_opt_level: str = "speed"
    pooling: bool = True
    pool_slots: int = 512
    pool_components: int = 64
    pool_keep_resident: int = 32 * 1024**2  # bytes of each memory reset in place, not unmapped

    def fingerprint(self) -> str:
        """A digest of the settings that affect compiled artifacts, plus the Wasmtime version."""
        data = asdict(self)
        for runtime_only in ("epoch_tick_s", "pool_slots", "pool_components", "pool_keep_resident"):
            data.pop(runtime_only)
        data["wasmtime"] = WASMTIME_VERSION
        text = json.dumps(data, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_engine(settings: EngineSettings) -> wasmtime.Engine:
    """An Engine with fuel and epoch interruption on."""
    config = wasmtime.Config()
    config.consume_fuel = True
    config.epoch_interruption = True
    config.max_wasm_stack = settings.max_wasm_stack
    config.cranelift_opt_level = settings.cranelift_opt_level
    # Wasmtime's own cache stays off (the default): ours is keyed and checked (see _cache).
    if settings.pooling:
        _use_pooling_allocator(config, settings)
    engine = wasmtime.Engine(config)
    store.exiting(False)  # (a process making engines is not ending: its stores are freed again)
    signals.keep()  # Wasmtime's trap handlers, installed by the process's first Engine
    signals.restore()  # and back in place if a library took them since (faulthandler, Ray)
    return engine


def _use_pooling_allocator(config: wasmtime.Config, settings: EngineSettings) -> None:
    """The C API's pooling allocator (wasmtime-py 50 has no wrapper for it)."""
    pool = ffi.wasmtime_pooling_allocation_config_new()
    slots = settings.pool_slots
    for setter, value in (
        # a Python call instantiates many core instances (the component's modules and shims) but few memories
        (ffi.wasmtime_pooling_allocation_config_total_core_instances_set, 4 * slots),
        (ffi.wasmtime_pooling_allocation_config_total_memories_set, slots),
        (ffi.wasmtime_pooling_allocation_config_total_tables_set, 2 * slots),
        (ffi.wasmtime_pooling_allocation_config_total_component_instances_set, settings.pool_components),
        (ffi.wasmtime_pooling_allocation_config_total_stacks_set, 0),  # no async stacks
        (ffi.wasmtime_pooling_allocation_config_max_memory_size_set, MAX_MEMORY),
        (ffi.wasmtime_pooling_allocation_config_max_core_instances_per_component_set, 64),
        (ffi.wasmtime_pooling_allocation_config_max_memories_per_component_set, 16),
        (ffi.wasmtime_pooling_allocation_config_max_tables_per_component_set, 32),
        (ffi.wasmtime_pooling_allocation_config_max_core_instance_size_set, 16 * 1024**2),
        (ffi.wasmtime_pooling_allocation_config_max_component_instance_size_set, 16 * 1024**2),
        (ffi.wasmtime_pooling_allocation_config_table_elements_set, 200_000),
        (ffi.wasmtime_pooling_allocation_config_linear_memory_keep_resident_set, settings.pool_keep_resident),
    ):
        setter(pool, value)
    ffi.wasmtime_pooling_allocation_strategy_set(config.ptr(), pool)
    ffi.wasmtime_pooling_allocation_config_delete(pool)


class EpochTicker:
    """A daemon thread that advances the engine's epoch every `tick_s` seconds (and those of the
    engines `also` adds: a runtime's engine of its own ticks with the Sandbox's).

    A store's deadline of `ticks(timeout)` epochs then traps the guest once the timeout has
    passed; the thread stops when the ticker is closed or garbage-collected. It ticks each
    engine through a C reference of its own (`_Engines`), never through the Python `Engine`,
    whose C engine another thread may be freeing.
    """

    def __init__(self, engine: wasmtime.Engine, tick_s: float) -> None:
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._engines = _Engines(engine)
        self._calls = 0  # calls in flight: closing waits for them, or their deadlines lapse
        self._stores = 0  # stores open (`opened`, `close_store`): calls', spares', sessions'
        self._stores_lock = threading.Lock()
        self._longest = 1  # the most ticks any store was given (`ticks`): what `interrupt` passes
        # (a plain lock under the condition: calls count in and out holding it alone, `_held`)
        self._held = threading.Lock()
        self._idle = threading.Condition(self._held)
        self._accepting = True
        self._thread = threading.Thread(
            target=_tick,
            args=(self._engines, tick_s, self._stop),
            name="wasmbox-epoch",
            daemon=True,
        )
        self._thread.start()
        weakref.finalize(self, self._stop.set)

    def also(self, engine: wasmtime.Engine) -> None:
        """Advance `engine`'s epoch too, from now on (its C engine held until the ticker stops)."""
        self._engines.add(engine)

    def ticks(self, timeout_s: float) -> int:
        """Epoch ticks to allow for `timeout_s` (rounded up, plus one for the partial tick)."""
        ticks = max(1, math.ceil(timeout_s / self.tick_s)) + 1
        if ticks > self._longest:  # (rarely: only a deadline longer than any before takes the lock)
            with self._idle:
                self._longest = max(self._longest, ticks)
        return ticks

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    @property
    def in_flight(self) -> int:
        """Calls running now."""
        return self._calls

    @property
    def stores(self) -> int:
        """Stores open now that ticks with this ticker: each call's, each spare's, each
        session's (each holds instance and memory slots of its engine's pool)."""
        return self._stores

    def opened(self, store: wasmtime.Store) -> None:
        """Count `store` open until `store.close_store` frees it."""
        store._wasmbox_ticker = self  # type: ignore[attr-defined]  # (what close_store counts it off)
        with self._stores_lock:
            self._stores += 1

    def store_closed(self) -> None:
        with self._stores_lock:
            self._stores -= 1

    def enter(self) -> None:
        """Count a call in; refused once closing has begun (deadlines need the ticker)."""
        with self._held:
            if not self._accepting:
                raise WasmboxError("the Sandbox is closed: deadlines are no longer enforced")
            self._calls += 1

    def leave(self) -> None:
        with self._held:
            self._calls -= 1
            if self._calls == 0:
                self._idle.notify_all()
                if not self._accepting:
                    self._stop.set()  # the last call of a closed Sandbox stops the ticker

    def close(self, wait_s: float = 60.0) -> bool:
        """Refuse new calls and let the ones in flight finish (their own deadlines bound
        them). True if they did within `wait_s`: the ticker has stopped. Otherwise it keeps
        ticking until the last of them leaves, so none loses its deadline."""
        with self._idle:
            self._accepting = False
            idle = self._idle.wait_for(lambda: self._calls == 0, timeout=wait_s)
            if idle:
                self._stop.set()
        if idle:
            self._thread.join()
        return idle

    def interrupt(self) -> None:
        """Pass every deadline a store was given now: each guest running wasm traps at once as
        a timeout (a host function it is in finishes first). For a close that does not wait."""
        for _ in range(self._longest + 1):
            self._engines.tick()


class _Engines:
    """The engines a ticker advances, each by a C reference of its own (`wasmtime_engine_clone`),
    so that an `Engine` freed meanwhile (its `__del__` runs before its weak references are
    cleared) never leaves the ticker a freed pointer. The references are released, and the C
    engines freed if nothing else holds them, when the ticker's thread stops (`release`)."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self._lock = threading.Lock()
        self._held: list[ctypes._Pointer[ffi.wasm_engine_t]] | None = []
        self.add(engine)

    def add(self, engine: wasmtime.Engine) -> None:
        with self._lock:
            if self._held is not None:
                self._held.append(ffi.wasmtime_engine_clone(engine.ptr()))

    def tick(self) -> None:
        with self._lock:
            for held in self._held or ():
                ffi.wasmtime_engine_increment_epoch(held)

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held or [], None
        for engine in held:
            ffi.wasm_engine_delete(engine)


def _tick(engines: _Engines, tick_s: float, stop: threading.Event) -> None:
    try:
        while not stop.wait(tick_s):
            engines.tick()
    finally:
        engines.release()
