"""`list<u8>` in and out of a component at C speed, and host functions of a few fixed
signatures defined through the C API.

wasmtime-py converts a `list<u8>` one element at a time, with a Python call per byte: slow for
a tool's source, and a guest could keep the host busy for as long as its `call-host` name is
long. In the C API each element is a 32-byte `wasmtime_component_val_t`, so here the array is
built and read with strided byte slicing instead (what it saves: bench/README.md, "Python: fresh
calls"). Only for the two functions of the runtime's world, whose types are fixed
(`wasmbox/_backends/python/wit/world.wit`).

wasmtime-py also reads a host function's types back from Wasmtime at every call, which
outweighs a call as small as a clock reading; the clock and random functions
the runner serves itself are defined here instead (`add_u64_func`, `add_datetime_func`,
`add_random_bytes_func`), each by its WASI signature.
"""

from __future__ import annotations

import ctypes
import inspect
import weakref
from collections.abc import Callable
from typing import Any, TypeAlias

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import component

from . import capi as _capi

_VAL = ctypes.sizeof(ffi.wasmtime_component_val_t)
_OF = ffi.wasmtime_component_val_t.of.offset
_U8 = ffi.WASMTIME_COMPONENT_U8.value
_LIST = ffi.WASMTIME_COMPONENT_LIST.value
_STRING = ffi.WASMTIME_COMPONENT_STRING.value
_U32 = ffi.WASMTIME_COMPONENT_U32.value
_U64 = ffi.WASMTIME_COMPONENT_U64.value
_RECORD = ffi.WASMTIME_COMPONENT_RECORD.value
# wasi:clocks/wall-clock's `datetime`: its fields' names, and their kinds
_DATETIME_FIELDS = tuple(
    (len(name), (ffi.wasm_byte_t * len(name)).from_buffer_copy(name), kind)
    for name, kind in ((b"seconds", _U64), (b"nanoseconds", _U32))
)

# The most bytes a `list<u8>` from the guest may hold (a result, or call-host's args): Wasmtime
# copies what a component hands the host under a budget of 128 MiB per call ("hostcall fuel",
# which the C API cannot raise), and its dynamic values cost 48 bytes an element. Past this the
# call traps ("fuel allocated for hostcalls has been exhausted"); the guest driver has the same
# figure and reports a bigger result without sending it.
REPLY_MAX = (128 << 20) // 48

Context: TypeAlias = "_capi.Context"
BytesHandler = Callable[[Context, str, bytes], bytes]  # (context, name, args) -> reply; never raises
U64Handler = Callable[[Context], int]  # () -> u64
DatetimeHandler = Callable[[Context], tuple[int, int]]  # () -> (seconds, nanoseconds)
RandomBytesHandler = Callable[[Context, int], bytes]  # (len) -> list<u8>
_handlers: _capi.Handles[Callable[[], Callable[..., Any] | None]] = _capi.Handles()


def set_bytes(value: ffi.wasmtime_component_val_t, data: bytes) -> None:
    """Make `value` a `list<u8>` holding `data` (the caller owns it afterwards)."""
    items = ffi.wasmtime_component_vallist_t()
    ffi.wasmtime_component_vallist_new_uninit(ctypes.byref(items), len(data))
    if data:
        raw = bytearray(len(data) * _VAL)
        raw[0::_VAL] = bytes((_U8,)) * len(data)
        raw[_OF::_VAL] = data
        ctypes.memmove(items.data, (ctypes.c_char * len(raw)).from_buffer(raw), len(raw))
    value.kind = _LIST
    value.of.list = items


def take_bytes(value: ffi.wasmtime_component_val_t) -> bytes:
    """The bytes of a `list<u8>` value, which is freed."""
    try:
        if value.kind != _LIST:
            raise TypeError("expected a list<u8>")
        size = value.of.list.size
        if size == 0:
            return b""
        address = ctypes.cast(value.of.list.data, ctypes.c_void_p).value or 0
        view = memoryview((ctypes.c_ubyte * (size * _VAL)).from_address(address)).cast("B")
        if view[0::_VAL].tobytes() != bytes((_U8,)) * size:  # read in place: no 32x copy
            raise TypeError("expected a list<u8>")
        return view[_OF::_VAL].tobytes()
    finally:
        ffi.wasmtime_component_val_delete(ctypes.byref(value))


def take_string(value: ffi.wasmtime_component_val_t) -> str:
    """The text of a `string` value, which is freed."""
    try:
        if value.kind != _STRING:
            raise TypeError("expected a string")
        return ctypes.string_at(value.of.string.data, value.of.string.size).decode("utf-8", "replace")
    finally:
        ffi.wasmtime_component_val_delete(ctypes.byref(value))


def call_bytes(store: wasmtime.Store, func: component.Func, payload: bytes) -> bytes:
    """Call `func: (list<u8>) -> list<u8>` (then its post-return)."""
    argument = ffi.wasmtime_component_val_t()
    result = ffi.wasmtime_component_val_t()
    set_bytes(argument, payload)
    try:
        error = ffi.wasmtime_component_func_call(
            ctypes.byref(func._func),
            store._context(),
            ctypes.byref(argument),
            1,
            ctypes.byref(result),
            1,
        )
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
        reply = take_bytes(result)
    finally:
        ffi.wasmtime_component_val_delete(ctypes.byref(argument))
    func.post_return(store)
    return reply


def add_bytes_func(instance: component.LinkerInstance, name: str, handler: BytesHandler) -> int:
    """Define `name: (string, list<u8>) -> list<u8>` on `instance`, served by `handler`.
    Returns a handle for `forget`, once the linker is closed."""
    return _add(instance, name, handler, _trampoline)


def add_u64_func(instance: component.LinkerInstance, name: str, handler: U64Handler) -> int:
    """Define `name: () -> u64` (a monotonic clock's `now`, `get-random-u64`); as `add_bytes_func`,
    except that an exception `handler` raises traps the guest with its message."""
    return _add(instance, name, handler, _u64_trampoline)


def add_datetime_func(instance: component.LinkerInstance, name: str, handler: DatetimeHandler) -> int:
    """Define `name: () -> datetime` (the wall clock's `now`, `resolution`); as `add_u64_func`."""
    return _add(instance, name, handler, _datetime_trampoline)


def add_random_bytes_func(instance: component.LinkerInstance, name: str, handler: RandomBytesHandler) -> int:
    """Define `name: (len: u64) -> list<u8>` (`get-random-bytes`); as `add_u64_func`."""
    return _add(instance, name, handler, _random_bytes_trampoline)


def _add(instance: component.LinkerInstance, name: str, handler: Callable[..., Any], trampoline: Any) -> int:
    # weakly, for a bound method: the registry must not keep its owner (and engine) alive
    handle = _handlers.add(weakref.WeakMethod(handler) if inspect.ismethod(handler) else lambda: handler)
    encoded = name.encode()
    error = ffi.wasmtime_component_linker_instance_add_func(
        instance.ptr(), encoded, len(encoded), trampoline, handle, _capi.NO_FINALIZER
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)
    return handle


def forget(handle: int) -> None:
    """Drop a handler (it holds its owner, e.g. a runner and its whole engine, alive)."""
    _handlers.discard(handle)


@ffi.wasmtime_component_func_callback_t
def _trampoline(
    handle: int | None,
    context: _capi.Context,
    _type: object,
    args: ctypes._Pointer[ffi.wasmtime_component_val_t],
    nargs: int,
    results: ctypes._Pointer[ffi.wasmtime_component_val_t],
    nresults: int,
) -> int:
    if nargs != 2 or nresults != 1:  # not the world's signature: refuse before touching them
        return _capi.error_pointer("call-host: wrong signature")
    try:
        name = take_string(args[0])
        request = take_bytes(args[1])
        reply = _handler(handle)(context, name, request)
    except Exception:  # noqa: BLE001 - a malformed call: answer with an empty reply, the guest sees an error
        reply = b""
    set_bytes(results[0], reply)
    return 0


def _handler(handle: int | None) -> Callable[..., Any]:
    owner = _handlers.get(handle)
    handler = owner() if owner is not None else None
    if handler is None:
        raise RuntimeError("the host function's owner is gone")
    return handler


def _typed(arity: int, write: Callable[[ffi.wasmtime_component_val_t, Any], None]) -> Any:
    """The callback of a function of `arity` u64 arguments (a module global, kept for the
    process's life): its handler's value written as its one result by `write`; an exception
    the handler raises traps the guest with its message."""

    @ffi.wasmtime_component_func_callback_t
    def trampoline(
        handle: int | None,
        context: _capi.Context,
        _type: object,
        args: ctypes._Pointer[ffi.wasmtime_component_val_t],
        nargs: int,
        results: ctypes._Pointer[ffi.wasmtime_component_val_t],
        nresults: int,
    ) -> int:
        if nargs != arity or nresults != 1 or any(args[i].kind != _U64 for i in range(nargs)):
            return _capi.error_pointer("wrong signature")
        try:
            write(results[0], _handler(handle)(context, *(args[i].of.u64 for i in range(nargs))))
        except Exception as exc:  # noqa: BLE001 - a trap with its message, never an exception into Wasmtime
            return _capi.error_pointer(str(exc))
        return 0

    return trampoline


def _set_u64(value: ffi.wasmtime_component_val_t, number: int) -> None:
    value.kind = _U64
    value.of.u64 = number


def _set_datetime(value: ffi.wasmtime_component_val_t, fields: tuple[int, int]) -> None:
    record = ffi.wasmtime_component_valrecord_t()
    ffi.wasmtime_component_valrecord_new_uninit(ctypes.byref(record), len(_DATETIME_FIELDS))
    for index, ((size, name, kind), number) in enumerate(zip(_DATETIME_FIELDS, fields, strict=True)):
        entry = record.data[index]
        ffi.wasm_byte_vec_new(ctypes.byref(entry.name), size, name)
        entry.val.kind = kind
        if kind == _U64:
            entry.val.of.u64 = number
        else:
            entry.val.of.u32 = number
    value.kind = _RECORD
    value.of.record = record


_u64_trampoline = _typed(0, _set_u64)
_datetime_trampoline = _typed(0, _set_datetime)
_random_bytes_trampoline = _typed(1, set_bytes)
