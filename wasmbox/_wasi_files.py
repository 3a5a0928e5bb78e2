"""Per-call limits on a WASI preview1 guest's files: a cap on open descriptors, no symlinks.

Wasmtime's WASI has no cap on descriptors: a guest with a preopen could open files until the
host process ran out of them, and every other call on the host with it. Our `path_open` and
`fd_close` count what the call holds and refuse an open past `MAX_OPEN_FILES` with EMFILE.

They cannot call Wasmtime's functions themselves: a WASI function finds the guest's memory
through its caller's exports, and a call from the host has no caller. So at a call's first
`path_open` or `fd_close` a tiny forwarding module is instantiated in the call's store: it
imports the guest's memory and re-exports it as `memory`, and its two functions call
Wasmtime's. Calls that never touch a file pay nothing.

`path_symlink` is refused outright (EPERM). A guest-made link may point out of its writable
grant; no guest can follow it out, but the host or another program reading the directory
later could.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass

import wasmtime
from wasmtime import _ffi as ffi

from . import _abi, _call, _rawcall
from ._errors import ErrorKind

MAX_OPEN_FILES = 128  # descriptors a call may have open from path_open at once
_WASI = _abi.WASI_MODULE.encode()
_PATH_OPEN, _FD_CLOSE, _PATH_SYMLINK = "path_open", "fd_close", "path_symlink"
_FORWARDER = f"""(module
  (import "{_abi.WASI_MODULE}" "{_PATH_OPEN}"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "{_abi.WASI_MODULE}" "{_FD_CLOSE}" (func $fd_close (param i32) (result i32)))
  (import "guest" "memory" (memory 0))
  (export "{_abi.EXPORT_MEMORY}" (memory 0))
  (func (export "{_PATH_OPEN}") (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)
    (call $path_open (local.get 0) (local.get 1) (local.get 2) (local.get 3) (local.get 4)
                     (local.get 5) (local.get 6) (local.get 7) (local.get 8)))
  (func (export "{_FD_CLOSE}") (param i32) (result i32) (call $fd_close (local.get 0))))"""
_EXPORTS = {name: _rawcall.ExportName(name) for name in (_PATH_OPEN, _FD_CLOSE)}


class FileGuard:
    """The forwarding module and Wasmtime's own WASI functions, for one module's calls; its
    owner (the runner) keeps it alive for as long as its linker may call it."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self._module = wasmtime.Module(engine, _FORWARDER)
        self._wasi = wasmtime.Linker(engine)  # Wasmtime's WASI, unshadowed
        self._wasi.define_wasi()
        self._handle = _guards.add(weakref.ref(self))
        weakref.finalize(self, _guards.discard, self._handle)

    def define(self, linker: wasmtime.Linker) -> None:
        """Shadow `path_open`, `fd_close` and `path_symlink` on `linker` (which has WASI)."""
        i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
        for name, params, callback in (
            (_PATH_OPEN, [i32] * 5 + [i64, i64, i32, i32], _path_open),
            (_FD_CLOSE, [i32], _fd_close),
            (_PATH_SYMLINK, [i32] * 5, _path_symlink),
        ):
            encoded = name.encode()
            functype = wasmtime.FuncType(params, [i32])
            error = ffi.wasmtime_linker_define_func_unchecked(
                linker.ptr(), _WASI, len(_WASI), encoded, len(encoded), functype.ptr(),
                callback, self._handle, _rawcall.NO_FINALIZER,
            )  # fmt: skip
            if error:
                raise wasmtime.WasmtimeError._from_ptr(error)

    def forwarder(
        self, caller: ctypes._Pointer[ffi.wasmtime_caller_t], context: ctypes._Pointer[ffi.wasmtime_context_t]
    ) -> OpenFiles:
        """A forwarder instance in the caller's store, around the caller's memory."""
        memory = _rawcall.MEMORY.from_caller(caller, _rawcall.EXTERN_MEMORY)
        if memory is None:
            raise wasmtime.WasmtimeError("missing required memory export")  # as Wasmtime's WASI says
        imports = (ffi.wasmtime_extern_t * 3)()
        for i, name in enumerate((_PATH_OPEN, _FD_CLOSE)):
            encoded = name.encode()
            found = ffi.wasmtime_linker_get(
                self._wasi.ptr(), context, _WASI, len(_WASI), encoded, len(encoded), ctypes.byref(imports[i])
            )
            assert found, name  # define_wasi defines both
        imports[2] = memory
        instance = ffi.wasmtime_instance_t()
        trap = ctypes.POINTER(ffi.wasm_trap_t)()
        error = ffi.wasmtime_instance_new(
            context, self._module.ptr(), imports, 3, ctypes.byref(instance), ctypes.byref(trap)
        )
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
        if trap:
            raise wasmtime.Trap._from_ptr(trap)
        return OpenFiles({name: export.lookup(context, instance) for name, export in _EXPORTS.items()})


@dataclass
class OpenFiles:
    """One call's forwarder functions and how many descriptors its guest holds open."""

    functions: dict[str, ffi.wasmtime_extern_t]
    count: int = 0


_guards: _rawcall.Handles[weakref.ref[FileGuard]] = _rawcall.Handles()


def _forward(
    handle: int | None,
    caller: ctypes._Pointer[ffi.wasmtime_caller_t],
    values: ctypes._Pointer[ffi.wasmtime_val_raw_t],
    count: int,
    name: str,
) -> None:
    """Call Wasmtime's `name` with the guest's raw arguments, keeping the call's count.
    Never raises: a trap in the forwarded call stops the guest with that trap's kind."""
    context = ffi.wasmtime_caller_context(caller)
    try:
        state = _call.current()
        files: OpenFiles | None = state.files
        if name == _PATH_OPEN and files is not None and files.count >= MAX_OPEN_FILES:
            values[0].i32 = _abi.Errno.MFILE
            return
        try:
            if files is None:
                ref = _guards.get(handle)
                guard = ref() if ref is not None else None
                assert guard is not None  # its runner is alive while its calls run
                files = state.files = guard.forwarder(caller, context)
            errno = _rawcall.call_raw(context, files.functions[name], values, count) & 0xFFFF
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:  # as if the guest had trapped
            error = _call.classify(exc, state.manifest.limits)
            _call.abort(context, error.kind, error.message)
            values[0].i32 = _abi.Errno.FAULT
            return
        if errno == 0:
            files.count = files.count + 1 if name == _PATH_OPEN else max(0, files.count - 1)
    except BaseException as exc:  # a bug of ours, or an interrupt: stop the guest, keep the process
        _call.callback_failed(context, name, exc)
        values[0].i32 = _abi.Errno.FAULT


@ffi.wasmtime_func_unchecked_callback_t
def _path_open(
    handle: int | None,
    caller: ctypes._Pointer[ffi.wasmtime_caller_t],
    values: ctypes._Pointer[ffi.wasmtime_val_raw_t],
    count: int,
) -> int:
    _forward(handle, caller, values, count, _PATH_OPEN)
    return 0


@ffi.wasmtime_func_unchecked_callback_t
def _fd_close(
    handle: int | None,
    caller: ctypes._Pointer[ffi.wasmtime_caller_t],
    values: ctypes._Pointer[ffi.wasmtime_val_raw_t],
    count: int,
) -> int:
    _forward(handle, caller, values, count, _FD_CLOSE)
    return 0


@ffi.wasmtime_func_unchecked_callback_t
def _path_symlink(
    handle: int | None,
    caller: ctypes._Pointer[ffi.wasmtime_caller_t],
    values: ctypes._Pointer[ffi.wasmtime_val_raw_t],
    count: int,
) -> int:
    values[0].i32 = _abi.Errno.PERM
    return 0
