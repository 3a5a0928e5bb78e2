"""Hot-path access to the Wasmtime C API, skipping wasmtime-py's per-call type lookups.

`wasmtime.Func.__call__` asks the engine for the function's type and boxes every value on
each call; our ABI exports' types are checked once at load (`_inspect`), so a call here is one
`wasmtime_func_call_unchecked`. Only use it on functions whose type was checked.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, cast

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime._func import maybe_raise_last_exn

from .. import _abi

T = TypeVar("T")

if TYPE_CHECKING:  # the C pointer types that raw calls and callbacks take
    Caller: TypeAlias = ctypes._Pointer[ffi.wasmtime_caller_t]
    Values: TypeAlias = ctypes._Pointer[ffi.wasmtime_val_raw_t]
    Context: TypeAlias = ctypes._Pointer[ffi.wasmtime_context_t]
    Extern: TypeAlias = ffi.wasmtime_extern_t


# The C type of a raw host-function callback: (data, caller, values, count) -> trap pointer.
HostCallback = ffi.wasmtime_func_unchecked_callback_t


def c_function(name: str, restype: Any = None) -> Any:
    """The C function `name` as ctypes calls it, without wasmtime-py's Python wrapper around
    it (one frame less a call on the hot path): its argument types are wasmtime-py's; with
    `restype`, a binding of our own that returns that type instead (e.g. an address as an int)."""
    shared = getattr(ffi.dll, name)  # (the object wasmtime-py's bindings gave its argtypes)
    if restype is None:
        return shared
    own = ffi.dll[name]  # (indexing makes a new function object: its restype is ours alone)
    own.argtypes, own.restype = shared.argtypes, restype
    return own


_export_get = c_function("wasmtime_instance_export_get")
_memory_data = c_function("wasmtime_memory_data", ctypes.c_void_p)
_memory_data_size = c_function("wasmtime_memory_data_size")
_func_call_unchecked = c_function("wasmtime_func_call_unchecked", ctypes.c_void_p)
_instance_pre_instantiate = c_function("wasmtime_instance_pre_instantiate", ctypes.c_void_p)
RawValue = ffi.wasmtime_val_raw_t  # one cell of a raw call's params and results
_ErrorPointer = ctypes.POINTER(ffi.wasmtime_error_t)
_TrapPointer = ctypes.POINTER(ffi.wasm_trap_t)
_byref = ctypes.byref


def caller_context(caller: Caller) -> Context:
    """The store context of the instance calling a host function."""
    return ffi.wasmtime_caller_context(caller)


class ExportName:
    """An export name encoded once, for lookups on every fresh instance."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._bytes = name.encode()
        self._buffer = ctypes.create_string_buffer(self._bytes)
        self._size = len(self._bytes)

    def get(self, store: wasmtime.Store, instance: wasmtime.Instance) -> ffi.wasmtime_extern_t:
        return self.lookup(store._context(), instance._instance)

    def lookup(
        self, context: ctypes._Pointer[ffi.wasmtime_context_t], instance: ffi.wasmtime_instance_t
    ) -> ffi.wasmtime_extern_t:
        item = ffi.wasmtime_extern_t()
        found = _export_get(context, _byref(instance), self._buffer, self._size, _byref(item))
        if not found:
            raise wasmtime.WasmtimeError(f"instance has no export {self.name!r}")
        return item

    def from_caller(self, caller: Caller, kind: int) -> ffi.wasmtime_extern_t | None:
        """The calling instance's export of `kind`, from inside a host function; else None."""
        item = ffi.wasmtime_extern_t()
        found = ffi.wasmtime_caller_export_get(caller, self._buffer, len(self._bytes), ctypes.byref(item))
        return item if found and cast(int, item.kind) == kind else None  # (a ctypes field reads as int)


class Handles(Generic[T]):
    """Objects that a C callback finds by the integer it was registered with (its `data`
    pointer). Handles start at 1, so a NULL `data` finds nothing."""

    def __init__(self) -> None:
        self._items: dict[int, T] = {}
        self._ids = itertools.count(1)

    def add(self, item: T) -> int:
        handle = next(self._ids)
        self._items[handle] = item
        return handle

    def get(self, handle: int | None) -> T | None:
        return self._items.get(handle or 0)

    def discard(self, handle: int) -> None:
        self._items.pop(handle, None)


# What Wasmtime calls with a callback's data once nothing can call the callback any more.
Finalizer = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
NO_FINALIZER = Finalizer()  # for callbacks whose data we own


def define_func(
    linker: wasmtime.Linker,
    module: str,
    name: str,
    functype: wasmtime.FuncType,
    callback: Any,  # a ffi.wasmtime_func_unchecked_callback_t
    handle: int = 0,
    finalizer: Any = NO_FINALIZER,  # a Finalizer
) -> None:
    """Define import `module` `name` on `linker` as a raw host callback
    (`wasmtime_func_unchecked_callback_t`), which gets `handle` as its data; `finalizer` gets
    it once the linker and everything made from it (InstancePres, instances) are freed."""
    module_bytes, name_bytes = module.encode(), name.encode()
    error = ffi.wasmtime_linker_define_func_unchecked(
        linker.ptr(),
        module_bytes,
        len(module_bytes),
        name_bytes,
        len(name_bytes),
        functype.ptr(),
        callback,
        handle,
        finalizer,
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


def error_pointer(message: str) -> int:
    """A new `wasmtime_error_t` as the address a C callback returns to fail."""
    return ctypes.cast(ffi.wasmtime_error_new(message.encode()), ctypes.c_void_p).value or 0


def trap_pointer(message: str) -> int:
    """A new `wasm_trap_t` as the address a host-function callback returns to trap the guest."""
    encoded = message.encode()
    return ctypes.cast(ffi.wasmtime_trap_new(encoded, len(encoded)), ctypes.c_void_p).value or 0


def set_table_func(
    context: Context,
    table: Extern,
    index: int,
    functype: wasmtime.FuncType,
    callback: Any,  # a ffi.wasmtime_func_unchecked_callback_t
    handle: int = 0,
) -> None:
    """Put a new raw host function (`callback`, given `handle` as its data) into `table` at
    `index`, in this store only. The callback's data is ours (no finalizer): keep what `handle`
    finds for as long as the store may call it."""
    func = ffi.wasmtime_func_t()
    ffi.wasmtime_func_new_unchecked(
        context, functype.ptr(), callback, handle, NO_FINALIZER, ctypes.byref(func)
    )
    value = ffi.wasmtime_val_t()
    value.kind = ffi.WASMTIME_FUNCREF
    value.of.funcref = func
    error = ffi.wasmtime_table_set(context, ctypes.byref(table.of.table), index, ctypes.byref(value))
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


# The ABI exports both the runner and the host-call trampoline look up, and extern kinds.
MEMORY = ExportName(_abi.EXPORT_MEMORY)
ALLOC = ExportName(_abi.EXPORT_ALLOC)
EXTERN_MEMORY = ffi.WASMTIME_EXTERN_MEMORY.value
EXTERN_FUNC = ffi.WASMTIME_EXTERN_FUNC.value
EXTERN_TABLE = ffi.WASMTIME_EXTERN_TABLE.value


def memory_view(
    context: ctypes._Pointer[ffi.wasmtime_context_t], item: ffi.wasmtime_extern_t
) -> tuple[int, int]:
    """`(address, size)` of a memory's bytes now; stale after the guest runs (it may grow)."""
    memory = _byref(item.of.memory)
    return _memory_data(context, memory) or 0, _memory_data_size(context, memory)


def memory_size(context: ctypes._Pointer[ffi.wasmtime_context_t], item: ffi.wasmtime_extern_t) -> int:
    """The size in bytes of a memory now."""
    size: int = _memory_data_size(context, _byref(item.of.memory))
    return size


def instantiate(pre: wasmtime.InstancePre, store: wasmtime.Store) -> wasmtime.Instance:
    """`pre.instantiate(store)`, as one C call (what wasmtime-py's raises on a trap or error)."""
    instance = ffi.wasmtime_instance_t()
    trap = _TrapPointer()
    error = _instance_pre_instantiate(pre.ptr(), store._context(), _byref(instance), _byref(trap))
    if error:
        failure: Exception = wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, _ErrorPointer))
        maybe_raise_last_exn()
        raise failure
    if trap:
        failure = wasmtime.Trap._from_ptr(trap)
        maybe_raise_last_exn()
        raise failure
    return wasmtime.Instance._from_raw(instance)


def call_i32(
    context: ctypes._Pointer[ffi.wasmtime_context_t], func: ffi.wasmtime_extern_t, *args: int
) -> int:
    """Call a checked function of i32 params and one i32 result."""
    return _call(context, func, args).i32 & 0xFFFF_FFFF


def call_void(context: ctypes._Pointer[ffi.wasmtime_context_t], func: ffi.wasmtime_extern_t) -> None:
    """Call a checked `() -> ()` function."""
    _call(context, func, ())


def instantiate_with(
    context: Context,
    module: wasmtime.Module,
    linker: wasmtime.Linker,
    linked: tuple[tuple[str, str], ...],
    last: Extern,
    exports: dict[str, ExportName],
) -> dict[str, Extern]:
    """A new instance of `module` in `context`'s store, its imports the (module, name) items
    `linked` finds in `linker` and then `last`; its exports by name (`exports`). Raises the
    WasmtimeError or Trap instantiating it gave (e.g. a store limit)."""
    imports = (ffi.wasmtime_extern_t * (len(linked) + 1))()
    for i, (module_name, name) in enumerate(linked):
        space, encoded = module_name.encode(), name.encode()
        found = ffi.wasmtime_linker_get(
            linker.ptr(), context, space, len(space), encoded, len(encoded), ctypes.byref(imports[i])
        )
        if not found:
            raise wasmtime.WasmtimeError(f"the linker defines no {module_name}.{name}")
    imports[len(linked)] = last
    instance = ffi.wasmtime_instance_t()
    trap = ctypes.POINTER(ffi.wasm_trap_t)()
    error = ffi.wasmtime_instance_new(
        context, module.ptr(), imports, len(imports), ctypes.byref(instance), ctypes.byref(trap)
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)
    if trap:
        raise wasmtime.Trap._from_ptr(trap)
    return {name: export.lookup(context, instance) for name, export in exports.items()}


def call_raw(
    context: ctypes._Pointer[ffi.wasmtime_context_t],
    func: ffi.wasmtime_extern_t,
    values: ctypes.Array[ffi.wasmtime_val_raw_t] | Values,
    count: int,
) -> int:
    """Call `func` on raw `values` (its params in, its results out; `count` is the larger of
    the two numbers), e.g. a host callback's own array; returns the first result as an i32."""
    trap = _TrapPointer()
    error = _func_call_unchecked(context, _byref(func.of.func), values, count, _byref(trap))
    if error:
        raise wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, _ErrorPointer))
    if trap:
        raise wasmtime.Trap._from_ptr(trap)
    return values[0].i32


def call_typed(
    context: ctypes._Pointer[ffi.wasmtime_context_t],
    func: ffi.wasmtime_extern_t,
    params: Sequence[tuple[str, int]],
    results: Sequence[str],
) -> list[int]:
    """Call a checked function of i32/i64 `params` (each `(type, value)`, an i32 taken modulo
    2**32) and i32/i64 `results`; the results as signed integers."""
    values = (ffi.wasmtime_val_raw_t * max(len(params), len(results), 1))()
    for i, (kind, value) in enumerate(params):
        if kind == "i64":
            values[i].i64 = value
        else:
            value &= 0xFFFF_FFFF
            values[i].i32 = value - (1 << 32) if value >= 1 << 31 else value
    call_raw(context, func, values, len(values))
    return [values[i].i64 if kind == "i64" else values[i].i32 for i, kind in enumerate(results)]


def _call(
    context: ctypes._Pointer[ffi.wasmtime_context_t],
    func: ffi.wasmtime_extern_t,
    args: tuple[int, ...],
) -> ffi.wasmtime_val_raw_t:
    values = (ffi.wasmtime_val_raw_t * max(len(args), 1))()
    for i, arg in enumerate(args):
        values[i].i32 = arg
    call_raw(context, func, values, len(values))
    return values[0]
