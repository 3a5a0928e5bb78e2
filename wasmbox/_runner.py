"""Runs one call of a core module: a fresh Store and instance from the tool's InstancePre.

Everything the guest can reach is set up here from the manifest alone: the WASI context
(preopens, env, argv, stdin, captured stdout/stderr), the granted host functions, fuel,
the memory cap and the epoch deadline. Every failure becomes a `CallResult` with an error kind.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi

from . import _abi, _rawcall
from ._engine import EpochTicker
from ._errors import ErrorKind
from ._hostfuncs import HostFunction, HostReply, refusal
from ._inspect import ModuleInfo, ToolKind
from ._manifest import Manifest
from ._output import Output
from ._results import CallError, CallResult, HostCallRecord
from ._units import format_size

_OOM_WORDING = re.compile(r"out of memory|memoryerror|cannot allocate|enomem", re.IGNORECASE)
_TRAP_KINDS = {
    wasmtime.TrapCode.OUT_OF_FUEL: ErrorKind.OUT_OF_FUEL,
    wasmtime.TrapCode.INTERRUPT: ErrorKind.TIMEOUT,
}
# Failures that a guest may show because its output was cut: the cut is then the cause.
_MAY_FOLLOW_TRUNCATION = {ErrorKind.GUEST_ERROR, ErrorKind.BAD_RESPONSE, ErrorKind.TRAP}
# Store limits beyond the manifest's: one instance with one memory (so `limits.memory` is the
# whole budget), and tables small enough that they cannot be used to exhaust host memory.
_TABLES = 8
_TABLE_ELEMENTS = 100_000
_MEMORY = _rawcall.ExportName(_abi.EXPORT_MEMORY)
_ALLOC = _rawcall.ExportName(_abi.EXPORT_ALLOC)
_CALL = _rawcall.ExportName(_abi.EXPORT_CALL)
_INITIALIZE = _rawcall.ExportName(_abi.EXPORT_INITIALIZE)
_START = _rawcall.ExportName(_abi.EXPORT_START)
_current = threading.local()  # the _CallState of the call running on this thread


@dataclass
class _CallState:
    host_calls_left: int
    deadline: float
    records: list[HostCallRecord] = field(default_factory=list)
    failure: ErrorKind | None = None  # root cause a host call reported, if the guest then fails
    abort: CallError | None = None  # set by the host to stop the guest; wins over its result
    fuel_left_at_abort: int | None = None


@dataclass(frozen=True)
class CallInput:
    """One call's input: args for ABI v1 tools; argv/stdin for WASI commands."""

    args: Mapping[str, Any]
    argv: tuple[str, ...] = ()
    stdin: bytes = b""


class _Failure(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.error = CallError(kind=kind, message=message)


class ModuleRunner:
    """Calls of one loaded core module. Thread-safe: each call has its own Store."""

    def __init__(
        self,
        engine: wasmtime.Engine,
        module: wasmtime.Module,
        info: ModuleInfo,
        manifest: Manifest,
        host_functions: Mapping[str, HostFunction],
        ticker: EpochTicker,
    ) -> None:
        assert info.kind is not None
        self.kind = info.kind
        self._engine = engine
        self._manifest = manifest
        self._limits = manifest.limits
        self._ticker = ticker
        self._uses_wasi = info.uses_wasi
        self._initialize = info.has_initialize and self.kind is ToolKind.REACTOR
        linker = wasmtime.Linker(engine)
        if info.uses_wasi:
            linker.define_wasi()
        for name in sorted(set(info.host_functions)):
            # A FuncType belongs to the first engine it meets, so each linker gets its own.
            host_call_type = wasmtime.FuncType(
                [wasmtime.ValType.i32(), wasmtime.ValType.i32()], [wasmtime.ValType.i64()]
            )
            linker.define_func(
                _abi.ABI_MODULE, name, host_call_type,
                _host_import(host_functions[name]), access_caller=True,
            )  # fmt: skip
        self._pre = linker.instantiate_pre(module)

    def call(self, call: CallInput) -> CallResult:
        start = time.perf_counter()
        limits = self._limits
        state = _CallState(limits.host_calls, start + limits.timeout)
        stdout, stderr = Output(limits.output), Output(limits.output)
        store = wasmtime.Store(self._engine)
        store.set_limits(
            memory_size=limits.memory, table_elements=_TABLE_ELEMENTS, instances=1, tables=_TABLES,
            memories=1,
        )  # fmt: skip
        store.set_fuel(limits.fuel)
        store.set_epoch_deadline(self._ticker.ticks(limits.timeout))
        if self._uses_wasi:
            store.set_wasi(self._wasi(call, stdout, stderr))
        memory: wasmtime.Memory | None = None
        value: Any = None
        error: CallError | None = None
        outer, _current.state = getattr(_current, "state", None), state  # a host function may call a tool
        try:
            instance = self._pre.instantiate(store)
            if self.kind is ToolKind.COMMAND:
                value = _run_command(store, instance)
            else:
                memory = _rawcall.memory(_MEMORY.get(store, instance))
                value = self._run_reactor(store, instance, memory, call)
        except _Failure as failure:
            error = failure.error
        except wasmtime.Trap as trap:
            error = self._classify_trap(trap, store, memory)
        except wasmtime.ExitTrap as exit_trap:
            error = CallError(kind=ErrorKind.GUEST_ERROR, message=f"exited with code {exit_trap.code}")
        except wasmtime.WasmtimeError as exc:
            error = _classify_wasmtime_error(exc)
        finally:
            _current.state = outer
            stdout.detach()
            stderr.detach()
        if state.abort is not None:
            error = state.abort
        elif error is not None and error.kind is ErrorKind.GUEST_ERROR:
            if state.failure is not None:
                error = CallError(kind=state.failure, message=error.message)
            elif _OOM_WORDING.search(error.message) or _exhausted(store, memory):
                error = CallError(kind=ErrorKind.MEMORY_LIMIT, message=error.message)
        truncated = stdout.truncated or stderr.truncated
        if truncated and (error is None or error.kind in _MAY_FOLLOW_TRUNCATION):
            which = "stdout" if stdout.truncated else "stderr"
            error = CallError(
                kind=ErrorKind.OUTPUT_LIMIT,
                message=f"{which} exceeded the {format_size(limits.output)} output cap",
            )
        fuel_left = store.get_fuel() if state.fuel_left_at_abort is None else state.fuel_left_at_abort
        fuel_used = limits.fuel - fuel_left
        return CallResult.model_construct(
            tool=self._manifest.name,
            ok=error is None,
            value=value if error is None else None,
            error=error,
            stdout=stdout.text(),
            stderr=stderr.text(),
            truncated=truncated,
            fuel_used=fuel_used,
            duration_s=time.perf_counter() - start,
            host_calls=state.records,
        )

    def _wasi(self, call: CallInput, stdout: Output, stderr: Output) -> wasmtime.WasiConfig:
        manifest = self._manifest
        wasi = wasmtime.WasiConfig()
        wasi.argv = [manifest.name, *manifest.args, *call.argv]
        if manifest.env:
            wasi.env = list(manifest.env.items())
        for preopen in manifest.preopens:
            wasi.preopen_dir(str(preopen.host), preopen.guest, fs_mutable=preopen.writable)
        stdout.attach(wasi, "stdout")
        stderr.attach(wasi, "stderr")
        if call.stdin:
            _set_stdin(wasi, call.stdin)
        return wasi

    def _run_reactor(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        memory: wasmtime.Memory,
        call: CallInput,
    ) -> Any:
        if call.argv or call.stdin:
            raise _Failure(ErrorKind.INVALID_ARGUMENTS, "argv and stdin are for WASI command tools")
        try:
            payload = _abi.pack(dict(call.args))
        except (TypeError, ValueError, OverflowError) as exc:
            raise _Failure(ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}") from None
        if self._initialize:
            _rawcall.call_void(store, _INITIALIZE.get(store, instance))
        ptr = _rawcall.call_i32(store, _ALLOC.get(store, instance), len(payload))
        if ptr == 0 or ptr + len(payload) > memory.data_len(store):
            raise _Failure(ErrorKind.BAD_RESPONSE, "wasmbox_alloc returned an invalid pointer")
        memory.write(store, payload, ptr)
        packed = _rawcall.call_i64(store, _CALL.get(store, instance), ptr, len(payload))
        rptr, rlen = _abi.split(packed)
        if rlen > self._limits.output:
            raise _Failure(
                ErrorKind.OUTPUT_LIMIT,
                f"result of {rlen} bytes exceeds the {format_size(self._limits.output)} output cap",
            )
        if rptr + rlen > memory.data_len(store):
            raise _Failure(ErrorKind.BAD_RESPONSE, "result points outside the guest's memory")
        try:
            is_ok, value = _abi.unpack_reply(memory.read(store, rptr, rptr + rlen))
        except _abi.FramingError as exc:
            raise _Failure(ErrorKind.BAD_RESPONSE, str(exc)) from None
        if not is_ok:
            raise _Failure(ErrorKind.GUEST_ERROR, value)
        return value

    def _classify_trap(
        self, trap: wasmtime.Trap, store: wasmtime.Store, memory: wasmtime.Memory | None
    ) -> CallError:
        code = trap.trap_code
        kind = _TRAP_KINDS.get(code) if code is not None else None
        if kind is ErrorKind.OUT_OF_FUEL:
            return CallError(kind=kind, message=f"used all {self._limits.fuel:,} units of fuel")
        if kind is ErrorKind.TIMEOUT:
            return CallError(kind=kind, message=f"exceeded the {self._limits.timeout:g}s deadline")
        message = _cause(trap.message)
        if _exhausted(store, memory):
            return CallError(kind=ErrorKind.MEMORY_LIMIT, message=f"{message} (memory cap reached)")
        return CallError(kind=ErrorKind.TRAP, message=message)


def _run_command(store: wasmtime.Store, instance: wasmtime.Instance) -> dict[str, int]:
    try:
        _rawcall.call_void(store, _START.get(store, instance))
    except wasmtime.ExitTrap as exit_trap:
        return {"exit_code": exit_trap.code}
    return {"exit_code": 0}


def _host_import(function: HostFunction) -> Callable[[wasmtime.Caller, int, int], int]:
    """The linker-side wrapper of a host function: guest memory in, reply written back.

    It never raises (an exception here would cross threads through wasmtime-py's global
    last-exception slot). To stop the guest it sets the store's fuel to zero and records why.
    """
    name = function.name

    def host_import(caller: wasmtime.Caller, ptr: int, length: int) -> int:
        state: _CallState = _current.state
        try:
            return _serve(caller, state, ptr, length)
        except Exception as exc:  # a bug of ours must not escape into wasmtime-py's trampoline
            return _abort(caller, state, ErrorKind.HOST_ERROR, f"{name}: internal error: {exc!r}")

    def _serve(caller: wasmtime.Caller, state: _CallState, ptr: int, length: int) -> int:
        item = _MEMORY.get_from_caller(caller)
        if item is None or item.kind != ffi.WASMTIME_EXTERN_MEMORY.value:
            return _abort(caller, state, ErrorKind.BAD_RESPONSE, "guest exports no memory")
        memory = _rawcall.memory(item)
        ptr &= 0xFFFF_FFFF
        length &= 0xFFFF_FFFF
        if ptr + length > memory.data_len(caller):
            return _abort(caller, state, ErrorKind.BAD_RESPONSE, f"{name}: request out of bounds")
        request = bytes(memory.read(caller, ptr, ptr + length))
        if state.host_calls_left <= 0:
            message = f"host-call limit ({len(state.records)}) exceeded"
            state.records.append(refusal(name, "limit", message, length).record)
            return _abort(caller, state, ErrorKind.HOST_ERROR, message)
        state.host_calls_left -= 1
        reply = function.invoke(request)
        state.records.append(reply.record)
        if time.perf_counter() > state.deadline:
            return _abort(caller, state, ErrorKind.TIMEOUT, f"{name} ran past the deadline")
        if reply.failure is not None and state.failure is None:
            state.failure = reply.failure
        return _write_reply(caller, state, memory, reply)

    return host_import


def _write_reply(
    caller: wasmtime.Caller, state: _CallState, memory: wasmtime.Memory, reply: HostReply
) -> int:
    # The reactor's exports were type-checked at load, so the raw call is safe.
    alloc = _ALLOC.get_from_caller(caller)
    if alloc is None or alloc.kind != ffi.WASMTIME_EXTERN_FUNC.value:
        return _abort(caller, state, ErrorKind.BAD_RESPONSE, "guest exports no wasmbox_alloc")
    size = len(reply.payload)
    try:
        rptr = _rawcall.call_i32(caller, alloc, size)
    except wasmtime.Trap as trap:
        kind = _TRAP_KINDS.get(trap.trap_code) if trap.trap_code is not None else None
        if kind is None:
            kind = ErrorKind.MEMORY_LIMIT if _exhausted(caller, memory) else ErrorKind.TRAP
        return _abort(caller, state, kind, _cause(trap.message))
    if rptr == 0 or rptr + size > memory.data_len(caller):
        return _abort(caller, state, ErrorKind.BAD_RESPONSE, "wasmbox_alloc returned an invalid pointer")
    memory.write(caller, reply.payload, rptr)
    return _abi.join(rptr, size)


def _abort(caller: wasmtime.Caller, state: _CallState, kind: ErrorKind, message: str) -> int:
    if state.abort is None:
        state.abort = CallError(kind=kind, message=message)
        left = ctypes.c_uint64(0)
        ffi.wasmtime_context_get_fuel(caller._context(), ctypes.byref(left))
        state.fuel_left_at_abort = left.value
    ffi.wasmtime_context_set_fuel(caller._context(), 0)
    return 0


def _set_stdin(wasi: wasmtime.WasiConfig, data: bytes) -> None:
    vec = ffi.wasm_byte_vec_t()
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    ffi.wasm_byte_vec_new(ctypes.byref(vec), len(data), buffer)
    ffi.wasi_config_set_stdin_bytes(wasi.ptr(), ctypes.byref(vec))


def _exhausted(store: wasmtime.Store | wasmtime.Caller, memory: wasmtime.Memory | None) -> bool:
    """True when the guest's memory cannot grow by one more page (the cap is reached)."""
    if memory is None:
        return False
    try:
        memory.grow(store, 1)
    except wasmtime.WasmtimeError:
        return True
    return False


def _cause(text: str) -> str:
    """The line of a Wasmtime error that says what went wrong (not the backtrace)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Caused by:" in lines:
        cause = lines[lines.index("Caused by:") + 1 :]
        if cause:
            return re.sub(r"^\d+:\s*", "", cause[0])[:500]
    return (lines[0] if lines else "unknown error")[:500]


def _classify_wasmtime_error(exc: wasmtime.WasmtimeError) -> CallError:
    message = _cause(str(exc))
    if "exceeds memory limits" in message or "exceeds table limits" in message:
        return CallError(kind=ErrorKind.MEMORY_LIMIT, message=message)
    return CallError(kind=ErrorKind.TRAP, message=message)
