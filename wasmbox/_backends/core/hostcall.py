"""Host functions as core-module imports: `(ptr, len) -> (ptr << 32) | len`, MessagePack.

The trampoline is registered with `wasmtime_linker_define_func_unchecked`, so a guest → host
call is one ctypes callback with raw values: no `Caller`/`Val` objects and no type checks per
call (the import's type was checked at load, in `_inspect.check_grants`). It never raises: an
exception escaping a ctypes callback would be printed and lost; to stop the guest it records
why in the call state (`_call.abort`) and returns a trap.
"""

from __future__ import annotations

import ctypes
import weakref

import wasmtime

from ... import _abi, _call, _outcome
from ..._capabilities.hostfuncs import HostFunction, HostReply
from ..._errors import ErrorKind
from ..._wasmtime import capi as _capi

# The host functions that linkers define, by handle: one handle per definition, held weakly
# (the runner that owns the linker's InstancePre holds its functions; a host function often
# holds its Sandbox, which a strong registry would keep alive forever). Wasmtime calls
# `_forget` with the handle once the last linker, InstancePre and store that can call it are
# freed, so the registry holds only what is still callable.
_functions: _capi.Handles[weakref.ref[HostFunction]] = _capi.Handles()


@_capi.Finalizer
def _forget(handle: int | None) -> None:
    try:
        _functions.discard(handle or 0)
    except BaseException:  # noqa: BLE001, S110 - never unwind into Wasmtime (nor at exit, when globals may be gone)
        pass


def define(linker: wasmtime.Linker, function: HostFunction) -> None:
    """Link `function` as import `wasmbox` `<name>` of type (i32, i32) -> i64. The caller
    keeps `function` alive for as long as the linker, or what it instantiates, may call it."""
    handle = _functions.add(weakref.ref(function))
    i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
    functype = wasmtime.FuncType([i32, i32], [i64])  # a FuncType is bound to its first engine
    try:
        _capi.define_func(linker, _abi.ABI_MODULE, function.name, functype, _trampoline, handle, _forget)
    except BaseException:
        _functions.discard(handle)  # (Wasmtime may or may not have called `_forget` already)
        raise


def _function(handle: int | None) -> HostFunction:
    ref = _functions.get(handle)
    function = ref() if ref is not None else None
    if function is None:  # its runner holds it while a call runs: a bug of ours
        raise RuntimeError(f"no host function for handle {handle}")
    return function


# A stopped call traps at once (`_call.host_callback`), so the guest runs none of its code, not
# even straight-line code that the fuel taken by the abort would only stop at its next check.
@_call.host_callback(lambda handle: _function(handle).name)
def _trampoline(
    handle: int | None, caller: _capi.Caller, context: _capi.Context, values: _capi.Values, count: int
) -> int:
    function = _function(handle)
    values[0].i64 = _serve(
        function, _call.current(), caller, context, values[0].i32 & 0xFFFF_FFFF, values[1].i32 & 0xFFFF_FFFF
    )
    return 0


def _serve(
    function: HostFunction,
    state: _call.CallState,
    caller: _capi.Caller,
    context: _capi.Context,
    ptr: int,
    length: int,
) -> int:
    if state.abort is not None:  # the guest is being stopped: do not even read its request
        return 0
    if state.exports is None:  # the same for every host call of this instance
        state.exports = (
            _capi.MEMORY.from_caller(caller, _capi.EXTERN_MEMORY),
            _capi.ALLOC.from_caller(caller, _capi.EXTERN_FUNC),
        )
    memory, alloc = state.exports
    if memory is None or alloc is None:  # checked at load; a guard all the same
        return _abort(context, ErrorKind.BAD_RESPONSE, "guest exports no memory or wasmbox_alloc")
    base, size = _capi.memory_view(context, memory)
    if ptr + length > size:
        return _abort(context, ErrorKind.BAD_RESPONSE, f"{function.name}: request out of bounds")
    reply = _call.serve_host_call(context, function.name, ctypes.string_at(base + ptr, length), function)
    if state.abort is not None:  # refused in a way that stops the guest: run none of its code
        return 0
    return _write_reply(context, memory, alloc, reply, state)


def _write_reply(
    context: _capi.Context,
    memory: _capi.Extern,
    alloc: _capi.Extern,
    reply: HostReply,
    state: _call.CallState,
) -> int:
    size = len(reply.payload)
    limits = state.manifest.limits
    try:
        rptr = _capi.call_i32(context, alloc, size)
    except wasmtime.ExitTrap as exit_trap:
        return _abort(context, ErrorKind.GUEST_ERROR, f"exited with code {exit_trap.code}")
    except (wasmtime.Trap, wasmtime.WasmtimeError) as trap:
        error = _outcome.from_trap(trap, limits)
        kind = error.kind
        if kind is ErrorKind.TRAP and _outcome.near_cap(_capi.memory_view(context, memory)[1], limits.memory):
            kind = ErrorKind.MEMORY_LIMIT
        return _abort(context, kind, error.message)
    base, now = _capi.memory_view(context, memory)  # the guest may have grown its memory
    if rptr == 0 or rptr + size > now:
        return _abort(context, ErrorKind.BAD_RESPONSE, "wasmbox_alloc returned an invalid pointer")
    ctypes.memmove(base + rptr, reply.payload, size)
    return _abi.join(rptr, size)


def _abort(context: _capi.Context, kind: ErrorKind, message: str) -> int:
    _call.abort(context, kind, message)
    return 0
