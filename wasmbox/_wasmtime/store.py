"""Stores through the C API: fuel, epoch deadline, stdin, and freeing one safely.

Callers name a store's context with `context(store)` (`capi.Context`, the C pointer that every
raw call and callback takes).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

import wasmtime
from wasmtime import _ffi as ffi

from .capi import c_function

if TYPE_CHECKING:
    from .capi import Context


def new_store(
    engine: wasmtime.Engine,
    memory: int,
    *,
    table_elements: int = -1,
    instances: int = -1,
    tables: int = -1,
    memories: int = -1,
) -> wasmtime.Store:
    """A Store whose memories may hold `memory` bytes in all (-1: no such store limit). It has
    no fuel and an expired deadline until `renew`.

    Made as `wasmtime.Store(engine)` makes one with no data, without its argument checks and
    wrappers (a Store is made on every call)."""
    store = _Store.__new__(_Store)
    pointer = _store_new(engine.ptr(), None, _NO_DATA)
    store._set_ptr(pointer)
    store._Store__context = _store_context(pointer)  # type: ignore[attr-defined]
    store.engine = engine
    _store_limiter(pointer, memory, table_elements, instances, tables, memories)
    return store


_Store = wasmtime.Store
_NO_DATA = ctypes.cast(0, ctypes.CFUNCTYPE(None, ctypes.c_void_p))  # (no data, no finalizer)
_store_new = c_function("wasmtime_store_new")
_store_context = c_function("wasmtime_store_context")
_store_limiter = c_function("wasmtime_store_limiter")
_set_fuel = c_function("wasmtime_context_set_fuel")
_get_fuel = c_function("wasmtime_context_get_fuel")
_set_epoch_deadline = c_function("wasmtime_context_set_epoch_deadline")
_store_delete = c_function("wasmtime_store_delete")


def context(store: wasmtime.Store | wasmtime.StoreContext) -> Context:
    """The C context of a Store, or of the store a wasmtime-py host function was called in."""
    return store._context()


def renew(context: Context, fuel: int, deadline_ticks: int) -> None:
    """`fuel` units, and a deadline `deadline_ticks` epoch ticks from now."""
    set_fuel(context, fuel)
    _set_epoch_deadline(context, deadline_ticks)


def set_fuel(context: Context, fuel: int) -> None:
    error = _set_fuel(context, fuel)
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


def fuel_left(context: Context) -> int:
    left = ctypes.c_uint64(0)
    error = _get_fuel(context, ctypes.byref(left))
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)
    return left.value


def set_stdin(wasi: wasmtime.WasiConfig, data: bytes) -> None:
    """Give the guest `data` as its stdin (the config takes its own copy)."""
    vec = ffi.wasm_byte_vec_t()
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    ffi.wasm_byte_vec_new(ctypes.byref(vec), len(data), buffer)
    ffi.wasi_config_set_stdin_bytes(wasi.ptr(), ctypes.byref(vec))


# `wasmtime_store_epoch_deadline_callback`'s callback: (context, data, delta out, kind out) ->
# an error pointer (0: go on). Setting `kind` to EPOCH_CONTINUE and `delta` to n ticks extends
# the deadline.
EpochCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.POINTER(ffi.wasmtime_context_t),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ffi.wasmtime_update_deadline_kind_t),
)
EPOCH_CONTINUE = 0  # WASMTIME_UPDATE_DEADLINE_CONTINUE


def on_epoch_deadline(store: wasmtime.Store, callback: Any, handle: int, finalizer: Any) -> None:
    """Have `callback` (an `EpochCallback`, kept alive by the caller) called with `handle` each
    time `store`'s epoch deadline passes, instead of trapping; the deadline is one tick away."""
    ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, handle, finalizer)
    store.set_epoch_deadline(1)


_exiting = False


def exiting(now: bool = True) -> None:
    """The process is ending (called from an `atexit` handler): from now on `close_store`
    forgets a store without freeing it. Freeing returns its instances to the engine's pool,
    which first resets their memories (10 ms or more for a Python runtime's), work that the
    process's end makes moot. `exiting(False)` undoes it: a new engine is being made, so the
    process goes on after all (its exit handlers were run early)."""
    global _exiting
    _exiting = now


def close_store(store: wasmtime.Store) -> None:
    """Free `store` now (once the process is `exiting`, only forget it), safely even if a
    KeyboardInterrupt arrives meanwhile.

    `Store.close()` frees the store in C and only then forgets the pointer in Python: a signal
    handler that raises between the two (Python runs them right after a C call returns) would
    leave a freed pointer for `__del__` to free again, a crash. Here the Store forgets its
    pointer first, so an interrupt can at worst leak one store, never free it twice.
    """
    try:
        ptr = store._consume()
    except ValueError:  # already closed
        return
    store._Store__context = None  # type: ignore[attr-defined]
    if not _exiting:
        _store_delete(ptr)
    ticker = store.__dict__.pop("_wasmbox_ticker", None)  # counted open by `EpochTicker.opened`
    if ticker is not None:
        ticker.store_closed()
