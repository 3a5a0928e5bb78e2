"""The shared Wasmtime engine: its settings, and the epoch ticker that enforces deadlines."""

from __future__ import annotations

import hashlib
import json
import math
import threading
import weakref
from dataclasses import asdict, dataclass
from importlib.metadata import version

import wasmtime

WASMTIME_VERSION = version("wasmtime")


@dataclass(frozen=True)
class EngineSettings:
    """Everything that changes compiled code; part of every cache key."""

    max_wasm_stack: int = 512 * 1024
    epoch_tick_s: float = 0.005
    cranelift_opt_level: str = "speed"

    def fingerprint(self) -> str:
        """A digest of the settings that affect compiled artifacts, plus the Wasmtime version."""
        data = asdict(self)
        data.pop("epoch_tick_s")  # runtime only
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
    return wasmtime.Engine(config)


class EpochTicker:
    """A daemon thread that advances the engine's epoch every `tick_s` seconds.

    A store's deadline of `ticks(timeout)` epochs then traps the guest once the timeout has
    passed; the thread stops when the ticker is closed or garbage-collected.
    """

    def __init__(self, engine: wasmtime.Engine, tick_s: float) -> None:
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=_tick, args=(weakref.ref(engine), tick_s, self._stop),
            name="wasmbox-epoch", daemon=True,
        )  # fmt: skip
        self._thread.start()
        weakref.finalize(self, self._stop.set)

    def ticks(self, timeout_s: float) -> int:
        """Epoch ticks to allow for `timeout_s` (rounded up, plus one for the partial tick)."""
        return max(1, math.ceil(timeout_s / self.tick_s)) + 1

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _tick(engine_ref: weakref.ref[wasmtime.Engine], tick_s: float, stop: threading.Event) -> None:
    while not stop.wait(tick_s):
        engine = engine_ref()
        if engine is None:
            return
        engine.increment_epoch()
        del engine
