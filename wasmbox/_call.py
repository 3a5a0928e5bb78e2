"""What every call shares, whatever runs it: the per-call state that host functions see, the
WASI context built from the manifest alone, and turning the outcome into a `CallResult`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi

from ._capabilities import grants as _grants
from ._capabilities.hostfuncs import HostFunction, HostReply, refusal
from ._errors import ErrorKind, WasmboxError
from ._manifest import Limits, Manifest, Preopen
from ._results import CallError, CallResult, HostCallRecord, construct_result
from ._units import format_size
from ._wasmtime.component_io import REPLY_MAX
from ._wasmtime.engine import EpochTicker
from ._wasmtime.output import Output, sniff, views

# A guest that turns a failed allocation into its own error says so in words like these.
_OOM_WORDING = re.compile(r"^\s*(out of memory|memoryerror\b|cannot allocate memory)", re.IGNORECASE)
# Wasmtime's words for a store limit refusing memory (linear, table, or the GC heap).
_OVER_MEMORY_CAP = ("exceeds memory limits", "exceeds table limits", "GC heap out of memory")
# Wasmtime's words when a component hands the host more than its per-call copy budget.
_HOSTCALL_FUEL = "fuel allocated for hostcalls has been exhausted"
# Failures that a guest may show because its output was cut: the cut is then the cause.
_MAY_FOLLOW_TRUNCATION = {ErrorKind.GUEST_ERROR, ErrorKind.BAD_RESPONSE, ErrorKind.TRAP}
_local = threading.local()


@dataclass(frozen=True)
class CallInput:
    """One call's input: args for ABI v1 and Python tools; argv/stdin for WASI commands."""

    args: Mapping[str, Any]
    argv: tuple[str, ...] = ()
    stdin: bytes = b""


@dataclass
class CallState:
    """What the host functions of the call running on this thread need to know and record."""

    manifest: Manifest
    deadline: float
    records: list[HostCallRecord] = field(default_factory=list)
    failure: ErrorKind | None = None  # root cause a host call reported, if the guest then fails
    abort: CallError | None = None  # set by the host to stop the guest; wins over its result
    fuel_left_at_abort: int | None = None
    reraise: BaseException | None = None  # e.g. KeyboardInterrupt in a host function
    exports: Any = None  # what a host-call trampoline looked up once for this instance
    files: Any = None  # the guest's open-file count and WASI forwarder (_wasi_files.OpenFiles)

    @classmethod
    def start(cls, manifest: Manifest, started: float) -> CallState:
        return cls(manifest, started + manifest.limits.timeout)


class Failure(Exception):
    """Raised inside a runner to end the call with `kind`."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.error = CallError(kind=kind, message=message)


def inside_call() -> bool:
    """Whether this thread is running a call (e.g. inside a host function)."""
    return getattr(_local, "state", None) is not None


def current() -> CallState:
    """The state of the call running on this thread (host functions run on the caller's thread)."""
    state: CallState = _local.state
    return state


# How deep calls may nest on one thread (a host function calling a tool whose guest calls a
# host function that calls a tool ...). Each level costs ~15 Python frames and some native
# stack; unbounded, a guest could drive the host into a RecursionError inside a ctypes
# callback, which aborted the process.
MAX_NESTED_CALLS = 16


@contextlib.contextmanager
def running(state: CallState) -> Iterator[None]:
    """Make `state` current for the duration of a call; calls may nest (a host function may
    call another tool), up to MAX_NESTED_CALLS deep (deeper is a `host_error` Failure)."""
    outer = getattr(_local, "state", None)
    depth = getattr(_local, "depth", 0)
    if depth >= MAX_NESTED_CALLS:
        message = f"calls nested more than {MAX_NESTED_CALLS} deep (host functions calling tools)"
        raise Failure(ErrorKind.HOST_ERROR, message)
    _local.state, _local.depth = state, depth + 1
    try:
        yield
    finally:
        _local.state, _local.depth = outer, depth


def abort(context: ctypes._Pointer[ffi.wasmtime_context_t] | None, kind: ErrorKind, message: str) -> None:
    """Stop the current guest from inside a host function: record why, and take its fuel
    (a raw callback also returns a trap; one that has no store `context` yet only records).

    Raising instead would cross threads through wasmtime-py's global last-exception slot.
    """
    state = current()
    if state.abort is None:
        state.abort = CallError(kind=kind, message=message)
        state.fuel_left_at_abort = fuel_left(context) if context is not None else None
    if context is not None:
        set_fuel(context, 0)


def callback_failed(context: ctypes._Pointer[ffi.wasmtime_context_t] | None, name: str, exc: BaseException) -> str:
    """Stop the guest after one of our callbacks failed, without raising into Wasmtime: a bug
    of ours ends the call as `host_error`; an interrupt (KeyboardInterrupt, SystemExit) is
    re-raised on the caller's thread once the call is over. Returns what the guest is told."""
    if isinstance(exc, Exception):
        abort(context, ErrorKind.HOST_ERROR, f"{name}: internal error: {exc!r}")
        return "internal error"
    current().reraise = exc
    abort(context, ErrorKind.HOST_ERROR, f"{name}: interrupted")
    return "interrupted"


def serve_host_call(
    context: ctypes._Pointer[ffi.wasmtime_context_t],
    name: str,
    request: bytes,
    function: HostFunction | None,
) -> HostReply:
    """The host-call policy both runners share: what the guest gets for one host call.

    Nothing is served once the guest is being stopped or its deadline has passed; every
    call, refused ones included, counts against `limits.host_calls`; `function` None means
    not granted (`capability_denied`); a reply over `limits.output` is refused. Each call is
    recorded. When the guest must stop, `state.abort` is set: the caller then returns
    without running guest code again.
    """
    state = current()
    size = len(request)
    if state.abort is not None:
        reply = refusal(name, "limit", "the call is being stopped", size)
    elif time.perf_counter() > state.deadline:
        abort(context, ErrorKind.TIMEOUT, f"{name} called after the deadline")
        reply = refusal(name, "limit", "the deadline has passed", size)
    elif len(state.records) >= state.manifest.limits.host_calls:  # (each call made a record)
        message = f"host-call limit ({len(state.records)}) exceeded"
        abort(context, ErrorKind.HOST_ERROR, message)
        reply = refusal(name, "limit", message, size)
    else:
        if function is None:
            reply = refusal(
                name, "denied", "this host function is not granted to this tool", size,
                ErrorKind.CAPABILITY_DENIED,
            )  # fmt: skip
        else:
            reply = function.invoke(request)
            if time.perf_counter() > state.deadline:
                abort(context, ErrorKind.TIMEOUT, f"{name} ran past the deadline")
            elif len(reply.payload) > state.manifest.limits.output:
                message = f"{name}: reply larger than the output cap"
                abort(context, ErrorKind.OUTPUT_LIMIT, message)
                reply = refusal(name, "limit", message, size, ErrorKind.OUTPUT_LIMIT)
    state.records.append(reply.record)
    if reply.failure is not None and state.failure is None:
        state.failure = reply.failure
    return reply


def new_store(
    engine: wasmtime.Engine,
    limits: Limits,
    ticker: EpochTicker,
    *,
    table_elements: int = -1,
    instances: int = -1,
    tables: int = -1,
    memories: int = -1,
) -> wasmtime.Store:
    """A Store with the call's fuel, memory cap and epoch deadline (-1: no such store limit)."""
    if not ticker.running:
        raise WasmboxError("the Sandbox is closed: deadlines are no longer enforced")
    store = wasmtime.Store(engine)
    store.set_limits(limits.memory, table_elements, instances, tables, memories)
    renew(store._context(), limits, ticker)
    return store


def renew(context: ctypes._Pointer[ffi.wasmtime_context_t], limits: Limits, ticker: EpochTicker) -> None:
    """Full fuel, and a deadline counted from now."""
    set_fuel(context, limits.fuel)
    ffi.wasmtime_context_set_epoch_deadline(context, ticker.ticks(limits.timeout))


def set_fuel(context: ctypes._Pointer[ffi.wasmtime_context_t], fuel: int) -> None:
    error = ffi.wasmtime_context_set_fuel(context, fuel)
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


def fuel_left(context: ctypes._Pointer[ffi.wasmtime_context_t]) -> int:
    left = ctypes.c_uint64(0)
    error = ffi.wasmtime_context_get_fuel(context, ctypes.byref(left))
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)
    return left.value


def build_wasi(
    manifest: Manifest,
    call: CallInput,
    stdout: Output,
    stderr: Output,
    extra_preopens: tuple[tuple[Path, str, bool], ...] = (),
) -> wasmtime.WasiConfig:
    """The guest's whole world, from the manifest and the call: nothing is inherited.

    Each preopen is opened here (Wasmtime opens a preopen when it is added to the config) as
    the directory its manifest resolved, never by following its path (`_grants.open_granted`);
    `extra_preopens` are the Sandbox's own folders, which no guest can reach the path of."""
    wasi = wasmtime.WasiConfig()
    wasi.argv = [manifest.name, *manifest.args, *call.argv]
    if manifest.env:
        wasi.env = list(manifest.env.items())
    try:
        for preopen in manifest.preopens:
            fd = open_preopen(preopen)
            try:  # Wasmtime opens its own descriptor of the directory `fd` is
                wasi.preopen_dir(_grants.fd_path(fd), preopen.guest, fs_mutable=preopen.writable)
            finally:
                os.close(fd)
        for host, guest, writable in extra_preopens:
            wasi.preopen_dir(str(host), guest, fs_mutable=writable)
    except wasmtime.WasmtimeError as exc:
        raise Failure(ErrorKind.CAPABILITY_DENIED, f"a preopen could not be opened: {exc}") from None
    stdout.attach(wasi, "stdout")
    stderr.attach(wasi, "stderr")
    if call.stdin:
        vec = ffi.wasm_byte_vec_t()
        buffer = (ctypes.c_uint8 * len(call.stdin)).from_buffer_copy(call.stdin)
        ffi.wasm_byte_vec_new(ctypes.byref(vec), len(call.stdin), buffer)
        ffi.wasi_config_set_stdin_bytes(wasi.ptr(), ctypes.byref(vec))
    return wasi


def open_preopen(preopen: Preopen) -> int:
    """A descriptor of `preopen`'s directory (see `_grants.open_granted`); a `capability_denied`
    Failure when it is gone or is no longer the directory granted (e.g. swapped for a symlink)."""
    try:
        return _grants.open_granted(preopen)
    except OSError:
        raise Failure(
            ErrorKind.CAPABILITY_DENIED,
            f"preopen {preopen.guest}: {preopen.host} is gone or no longer the directory granted",
        ) from None


def check_preopens(manifest: Manifest) -> None:
    """Refuse the call if a granted directory is gone or was swapped since it was resolved."""
    for preopen in manifest.preopens:
        os.close(open_preopen(preopen))


def classify(exc: wasmtime.WasmtimeError | wasmtime.Trap, limits: Limits) -> CallError:
    """The error kind of a trap or Wasmtime error (core traps carry a code, component errors
    only text)."""
    text = exc.message if isinstance(exc, wasmtime.Trap) else str(exc)
    code = exc.trap_code if isinstance(exc, wasmtime.Trap) else None
    if code is wasmtime.TrapCode.OUT_OF_FUEL or "all fuel consumed" in text:
        return CallError(kind=ErrorKind.OUT_OF_FUEL, message=f"used all {limits.fuel:,} units of fuel")
    if code is wasmtime.TrapCode.INTERRUPT or "wasm trap: interrupt" in text:
        return CallError(kind=ErrorKind.TIMEOUT, message=deadline_message(limits))
    message = cause(text)
    if _HOSTCALL_FUEL in message:  # a list<u8> from a component over what Wasmtime copies
        return CallError(
            kind=ErrorKind.OUTPUT_LIMIT,
            message=f"the guest handed the host more than the {REPLY_MAX} bytes Wasmtime copies "
            "from a component at once",
        )
    if any(words in message for words in _OVER_MEMORY_CAP):
        return CallError(kind=ErrorKind.MEMORY_LIMIT, message=message)
    if "maximum concurrent limit" in message:  # the pooling allocator's slots are all in use
        return CallError(
            kind=ErrorKind.HOST_ERROR,
            message=f"the Sandbox is at capacity ({message}; see EngineSettings.pool_slots)",
        )
    return CallError(kind=ErrorKind.TRAP, message=message)


def deadline_message(limits: Limits) -> str:
    return f"exceeded the {limits.timeout:g}s deadline"


def check_result_size(size: int, cap: int) -> None:
    """Failure `output_limit` when a result of `size` bytes is over the output cap."""
    if size > cap:
        raise Failure(
            ErrorKind.OUTPUT_LIMIT, f"result of {size} bytes exceeds the {format_size(cap)} output cap"
        )


def cause(text: str) -> str:
    """The line of a Wasmtime error that says what went wrong (not the backtrace)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Caused by:" in lines:
        rest = lines[lines.index("Caused by:") + 1 :]
        if rest:
            return re.sub(r"^\d+:\s*", "", rest[0])[:500]
    return (lines[0] if lines else "unknown error")[:500]


def finish(
    state: CallState,
    store: wasmtime.Store,
    started: float,
    value: Any,
    error: CallError | None,
    stdout: Output,
    stderr: Output,
    peak_memory: int | None,
    close: Callable[[wasmtime.Store], None] | None = None,
    files: dict[str, bytes] | None = None,
) -> CallResult:
    """The CallResult of a finished call: the host's own verdicts first, then the guest's.

    `close` disposes of the Store: at once by default, since wasmtime-py keeps a failed
    call's Store in a reference cycle until the garbage collector runs. `files` are the output
    files the call wrote (`command.outputs`); a failed call returns none."""
    limits = state.manifest.limits
    if state.abort is not None:
        error = state.abort
    elif error is not None and error.kind in (ErrorKind.GUEST_ERROR, ErrorKind.TRAP):
        if error.kind is ErrorKind.GUEST_ERROR and state.failure is not None:
            error = CallError(kind=state.failure, message=error.message)
        else:
            says_oom = error.kind is ErrorKind.GUEST_ERROR and bool(_OOM_WORDING.search(error.message))
            if says_oom or (peak_memory is not None and near_cap(peak_memory, limits.memory)):
                suffix = "" if says_oom else " (memory cap reached)"
                error = CallError(kind=ErrorKind.MEMORY_LIMIT, message=error.message + suffix)
    truncated = stdout.truncated or stderr.truncated
    if truncated and (error is None or error.kind in _MAY_FOLLOW_TRUNCATION):
        which = "stdout" if stdout.truncated else "stderr"
        error = CallError(
            kind=ErrorKind.OUTPUT_LIMIT,
            message=f"{which} exceeded the {format_size(limits.output)} output cap",
        )
    fuel = fuel_left(store._context()) if state.fuel_left_at_abort is None else state.fuel_left_at_abort
    (close or close_store)(store)
    if state.reraise is not None:
        raise state.reraise
    out, err = stdout.data(), stderr.data()
    out_text, out_bytes = views(out) if out else _NO_OUTPUT
    err_text, err_bytes = views(err) if err else _NO_OUTPUT
    files = files if files and error is None else {}
    return construct_result(
        tool=state.manifest.name,
        ok=error is None,
        value=value if error is None else None,
        error=error,
        stdout=out_text,
        stderr=err_text,
        stdout_bytes=out_bytes,
        stderr_bytes=err_bytes,
        files=files,
        media_types=media_types(state.manifest, out, files) if out or files else {},
        truncated=truncated,
        fuel_used=limits.fuel - fuel,
        duration_s=time.perf_counter() - started,
        peak_memory=peak_memory,
        host_calls=state.records,
    )


_NO_OUTPUT: tuple[str, bytes | None] = ("", None)


def media_types(manifest: Manifest, stdout: bytes, files: dict[str, bytes]) -> dict[str, str]:
    """The media types a result knows: the manifest's (`command.stdout_media_type`, each output's
    `media_type`), else sniffed from the bytes (`_output.sniff`); none for plain text."""
    command = manifest.command
    known: dict[str, str] = {}
    declared = command.stdout_media_type if command is not None else None
    found = declared or (sniff(stdout) if stdout else None)
    if found:
        known["stdout"] = found
    if files:
        assert command is not None
        for output in command.outputs:
            if output.path in files:
                found = output.media_type or sniff(files[output.path])
                if found:
                    known[output.path] = found
    return known


def close_store(store: wasmtime.Store) -> None:
    """Free `store` now, safely even if a KeyboardInterrupt arrives meanwhile.

    `Store.close()` frees the store in C and only then forgets the pointer in Python: a signal
    handler that raises between the two (Python runs them right after a C call returns) left
    a freed pointer that `__del__` freed again later, a segfault. Here the Store forgets its
    pointer first, so an interrupt can at worst leak one store, never free it twice.
    """
    try:
        ptr = store._consume()
    except ValueError:  # already closed
        return
    store._Store__context = None  # type: ignore[attr-defined]
    ffi.wasmtime_store_delete(ptr)


def near_cap(memory_size: int, cap: int) -> bool:
    """A memory of `memory_size` bytes cannot grow by another 64 KiB page under `cap`."""
    return memory_size + 65536 > cap
