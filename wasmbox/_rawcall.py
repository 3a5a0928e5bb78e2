"""Hot-path calls into the Wasmtime C API, skipping wasmtime-py's per-call type lookups.

`wasmtime.Func.__call__` asks the engine for the function's type and boxes every value on
each call; our exports' types are checked once at load (`_inspect`), so a call here is one
`wasmtime_func_call_unchecked`. Only use it on functions whose type was checked.
"""

from __future__ import annotations

import ctypes

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime._func import enter_wasm


class ExportName:
    """An export name encoded once, for lookups on every fresh instance."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._bytes = name.encode()
        self._buffer = ctypes.create_string_buffer(self._bytes)

    def get(self, store: wasmtime.Store, instance: wasmtime.Instance) -> ffi.wasmtime_extern_t:
        item = ffi.wasmtime_extern_t()
        found = ffi.wasmtime_instance_export_get(
            store._context(), ctypes.byref(instance._instance),
            self._buffer, len(self._bytes), ctypes.byref(item),
        )  # fmt: skip
        if not found:
            raise wasmtime.WasmtimeError(f"instance has no export {self.name!r}")
        return item


    def get_from_caller(self, caller: wasmtime.Caller) -> ffi.wasmtime_extern_t | None:
        """The calling instance's export, from inside a host function; None if absent."""
        item = ffi.wasmtime_extern_t()
        found = ffi.wasmtime_caller_export_get(
            caller._Caller__ptr, self._buffer, len(self._bytes), ctypes.byref(item)  # type: ignore[attr-defined]
        )
        return item if found else None


def memory(item: ffi.wasmtime_extern_t) -> wasmtime.Memory:
    return wasmtime.Memory._from_raw(item.of.memory)


Storelike = wasmtime.Store | wasmtime.Caller


def call_i32(store: Storelike, func: ffi.wasmtime_extern_t, *args: int) -> int:
    """Call a checked function of i32 params and one i32 result."""
    return _call(store, func, args).i32 & 0xFFFF_FFFF


def call_i64(store: Storelike, func: ffi.wasmtime_extern_t, *args: int) -> int:
    """Call a checked function of i32 params and one i64 result."""
    return _call(store, func, args).i64


def call_void(store: Storelike, func: ffi.wasmtime_extern_t) -> None:
    """Call a checked `() -> ()` function."""
    _call(store, func, ())


def _call(
    store: Storelike, func: ffi.wasmtime_extern_t, args: tuple[int, ...]
) -> ffi.wasmtime_val_raw_t:
    values = (ffi.wasmtime_val_raw_t * max(len(args), 1))()
    for i, arg in enumerate(args):
        values[i].i32 = arg
    with enter_wasm(store) as trap:
        error = ffi.wasmtime_func_call_unchecked(
            store._context(), ctypes.byref(func.of.func), values, len(values), trap
        )
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
    return values[0]
