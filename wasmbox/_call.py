"""What every call shares, whatever runs it: the call skeleton (`perform`, over a runtime's
`Backend` hooks), the per-call state that host functions see, the WASI context built from the
manifest alone, and turning the outcome into a `CallResult`.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import wasmtime

from . import _outcome, _phases, _replay, _telemetry
from ._capabilities import grants as _grants
from ._capabilities.hostfuncs import HostFunction, HostReply, not_granted, refusal
from ._errors import ErrorKind, WasmboxError
from ._manifest import Inputs, Limits, Manifest, Preopen
from ._outcome import Failure
from ._results import CallError, CallResult, HostCallRecord, construct_result
from ._schema import Validator
from ._units import format_size
from ._wasmtime import capi as _capi
from ._wasmtime import store as _store
from ._wasmtime.engine import EpochTicker
from ._wasmtime.output import Output, sniff, views


class _Local(threading.local):
    """This thread's call (`running`), how deeply calls nest on it, and the deadline its host
    function's calls end by (`ceiling`); the class's values until a call sets them."""

    state: CallState | None = None
    depth = 0
    ceiling: float | None = None


_local = _Local()


@dataclass(frozen=True)
class CallInput:
    """One call's input: args for ABI v1 and Python tools; argv/stdin for WASI commands; the
    input files to write under /tmp/in (checked: `_capabilities.scratch.check_inputs`); the
    limits it runs under, when not its manifest's."""

    args: Mapping[str, Any]
    argv: tuple[str, ...] = ()
    stdin: bytes = b""
    files: Mapping[str, bytes] = field(default_factory=dict)
    limits: Limits | None = None  # the call's own, tighter than its manifest's (None: the manifest's)

    def manifest(self, manifest: Manifest) -> Manifest:
        """`manifest`, under this call's limits."""
        return manifest if self.limits is None else manifest.model_copy(update={"limits": self.limits})


@dataclass(slots=True)
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
    files: Any = None  # the guest's open-file count and WASI forwarder (`_capabilities.wasi_files.OpenFiles`)
    phases: _phases.Clock | None = None  # set while this thread records phases (`_phases.record`)
    requests: dict[int, int] = field(default_factory=dict)  # http.fetch requests sent per network rule
    tape: _replay.Taped | None = None  # what serves its host calls, clock and randomness while taped

    @classmethod
    def start(cls, manifest: Manifest, started: float) -> CallState:
        """The state of a call starting now; one started from a host function (a tool called by
        code) ends no later than the call that made it (`ceiling`)."""
        state = cls(manifest, min(started + manifest.limits.timeout, ceiling() or math.inf))
        if _phases.active:
            state.phases = _phases.clock(started, _local.depth)
        return state

    def release_files(self) -> None:
        """Give the call's open descriptors back to the process budget (once its store is closed)."""
        if self.files is not None:
            self.files.release()

    def ready(self, made_ahead: bool | None = None) -> None:
        """Mark the instance made (a recorded call's instantiate phase ends here); `made_ahead`:
        whether it was a spare made before the call."""
        if self.phases is not None:
            self.phases.ready = time.perf_counter()
            self.phases.made_ahead = made_ahead


def ceiling() -> float | None:
    """The latest a call started on this thread now may end: the deadline of the call whose host
    function is running here (None outside one)."""
    return _local.ceiling


def inside_call() -> bool:
    """Whether this thread is running a call (e.g. inside a host function)."""
    return _local.state is not None


def current() -> CallState:
    """The state of the call running on this thread (host functions run on the caller's thread)."""
    state = _local.state
    if state is None:  # (a bug of ours: only code running inside a call asks)
        raise RuntimeError("no call is running on this thread")
    return state


# How deep calls may nest on one thread (a host function calling a tool whose guest calls a
# host function that calls a tool ...). Each level costs Python frames and native stack;
# unbounded, a guest could drive the host into a RecursionError inside a ctypes callback,
# which aborts the process.
MAX_NESTED_CALLS = 16


class running:
    """Make `state` current for the duration of a call (a `with` block); calls may nest (a host
    function may call another tool), up to MAX_NESTED_CALLS deep (deeper is a `host_error`
    Failure, raised on entering). A class rather than a generator's context manager: every
    call enters one."""

    __slots__ = ("_depth", "_outer", "_state")

    def __init__(self, state: CallState) -> None:
        self._state = state

    def __enter__(self) -> None:
        outer = _local.state
        depth = _local.depth
        if depth >= MAX_NESTED_CALLS:
            message = f"calls nested more than {MAX_NESTED_CALLS} deep (host functions calling tools)"
            raise Failure(ErrorKind.HOST_ERROR, message)
        self._outer, self._depth = outer, depth
        _local.state, _local.depth = self._state, depth + 1

    def __exit__(self, *exc: object) -> None:
        _local.state, _local.depth = self._outer, self._depth


def abort(context: _capi.Context | None, kind: ErrorKind, message: str) -> None:
    """Stop the current guest from inside a host function: record why, and take its fuel
    (a raw callback also returns a trap; one that has no store `context` yet only records).

    Raising instead would cross threads through wasmtime-py's global last-exception slot.
    """
    state = current()
    if state.abort is None:
        state.abort = CallError(kind=kind, message=message)
        state.fuel_left_at_abort = _store.fuel_left(context) if context is not None else None
    if context is not None:
        _store.set_fuel(context, 0)


def callback_failed(context: _capi.Context | None, name: str, exc: BaseException) -> str:
    """Stop the guest after one of our callbacks failed, without raising into Wasmtime: a bug
    of ours ends the call as `host_error`; an interrupt (KeyboardInterrupt, SystemExit) is
    re-raised on the caller's thread once the call is over. Returns what the guest is told."""
    if isinstance(exc, Exception):
        abort(context, ErrorKind.HOST_ERROR, f"{name}: internal error: {exc!r}")
        return "internal error"
    current().reraise = exc
    abort(context, ErrorKind.HOST_ERROR, f"{name}: interrupted")
    return "interrupted"


HostBody = Callable[[int | None, "_capi.Caller", "_capi.Context", "_capi.Values", int], int]


def host_callback(name: str | Callable[[int | None], str]) -> Callable[[HostBody], Any]:
    """Decorator: `body(handle, caller, context, values, count)` as a raw host-function
    callback (a `capi.HostCallback`; keep it alive as a module global). The guard every such
    callback needs, in one place: nothing unwinds into Wasmtime; an exception stops the guest
    (`callback_failed`, under `name`, or `name(handle)`) with a trap; and once the call is being
    stopped (`CallState.abort`) the callback traps, so the guest runs none of its code after."""

    def wrap(body: HostBody) -> Any:
        @_capi.HostCallback
        def callback(handle: int | None, caller: _capi.Caller, values: _capi.Values, count: int) -> int:
            context = None
            try:
                context = _capi.caller_context(caller)
                result = body(handle, caller, context, values, count)
                stop = current().abort
                return _capi.trap_pointer(stop.message) if stop is not None else result
            except BaseException as exc:  # noqa: BLE001 - a bug of ours, or an interrupt: stop the guest, keep the process
                label = name if isinstance(name, str) else _label(name, handle)
                return _capi.trap_pointer(callback_failed(context, label, exc))

        return callback

    return wrap


def _label(name: Callable[[int | None], str], handle: int | None) -> str:
    try:
        return name(handle)
    except Exception:  # noqa: BLE001 - a name for an error message; never a second failure
        return "host function"


def serve_host_call(
    context: _capi.Context,
    name: str,
    request: bytes,
    function: HostFunction | None,
    problem: str | None = None,
) -> HostReply:
    """The host-call policy every runner shares: what the guest gets for one host call.

    Nothing is served once the guest is being stopped or its deadline has passed; every
    call, refused ones included, counts against `limits.host_calls`; `problem` says why the
    request itself is malformed (`bad_request`, not run); `function` None means not granted
    (`capability_denied`); args outside what the manifest's `host_function_args` narrowed the
    grant to are `capability_denied` too (`HostFunction.invoke`); a reply over `limits.output` is refused. Each call is recorded. When the guest must stop, `state.abort` is set: the caller then returns
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
        if problem is not None:
            reply = refusal(name, "bad_request", problem, size, None)
        elif function is None:
            reply = refusal(
                name,
                "denied",
                not_granted(name),
                size,
                ErrorKind.CAPABILITY_DENIED,
            )
        else:
            outer, _local.ceiling = ceiling(), state.deadline  # what the function calls ends by then
            try:
                narrowed = state.manifest._narrowing("host", function.name)
                reply = _invoke(function, request, narrowed, state.tape)
            finally:
                _local.ceiling = outer
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


def _invoke(
    function: HostFunction, request: bytes, narrowed: Validator | None, tape: _replay.Taped | None
) -> HostReply:
    """`function.invoke(request, narrowed)` (recorded or replayed by the call's `tape`), in a
    span of its own when telemetry is on."""
    invoke = function.invoke if tape is None else partial(tape.host, function)
    telemetry = _telemetry.active
    if telemetry is None:
        return invoke(request, narrowed)
    return telemetry.host_call(function.name, partial(invoke, request, narrowed), _record_of)


def _record_of(reply: HostReply) -> HostCallRecord:
    return reply.record


T = TypeVar("T")


def carried(function: Callable[[], T]) -> Callable[[], T]:
    """`function` to hand a worker thread, run in the caller's context (which work handed to
    another thread does not take along by itself) when telemetry is on (its OpenTelemetry
    context) or a recording or replay is open (its tape; the call takes its place in it now,
    `_replay.hand_off`); itself otherwise."""
    if _telemetry.active is None and not _replay.open_tapes:
        return function
    context = contextvars.copy_context()
    if _replay.open_tapes:
        context.run(_replay.hand_off)
    return partial(context.run, function)


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
    store = _store.new_store(
        engine,
        limits.memory,
        table_elements=table_elements,
        instances=instances,
        tables=tables,
        memories=memories,
    )
    ticker.opened(store)
    renew(store, limits, ticker)
    return store


def renew(store: wasmtime.Store, limits: Limits, ticker: EpochTicker) -> None:
    """The call's full fuel, and its deadline counted from now (no later than `ceiling`)."""
    timeout = limits.timeout
    latest = ceiling()
    if latest is not None:
        timeout = max(0.0, min(timeout, latest - time.perf_counter()))
    _store.renew(_store.context(store), limits.fuel, ticker.ticks(timeout))


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
        _store.set_stdin(wasi, call.stdin)
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


def check_result_size(size: int, cap: int) -> None:
    """Failure `output_limit` when a result of `size` bytes is over the output cap."""
    if size > cap:
        raise Failure(
            ErrorKind.OUTPUT_LIMIT, f"result of {size} bytes exceeds the {format_size(cap)} output cap"
        )


class CallScratch(Protocol):
    """A call's scratch folder as the skeleton uses it (`_capabilities.scratch.CallScratch`)."""

    @property
    def preopens(self) -> tuple[tuple[Path, str, bool], ...]: ...

    def put(self, files: Mapping[str, bytes]) -> None: ...

    def arm(self, store: wasmtime.Store) -> None: ...

    def settle(self) -> str | None: ...

    def collect(self, paths: tuple[str, ...], cap: int) -> dict[str, bytes]: ...

    def collect_globs(self, patterns: tuple[str, ...], cap: int) -> dict[str, bytes]: ...

    def listing(self) -> dict[str, int]: ...

    def read(self, guest: str, cap: int) -> bytes | None: ...

    def remove(self) -> None: ...


@dataclass(eq=False)
class Instance:
    """One call's store and what its guest writes to, made for the call (`fresh_instance`) or
    ahead of it; a backend records on it what the run left (`Backend.after`)."""

    manifest: Manifest  # the grants and limits it is ready for
    store: wasmtime.Store
    stdout: Output
    stderr: Output
    scratch: CallScratch | None = None  # the call's /tmp
    error: CallError | None = None  # making it failed: the call ends with this, its guest unrun
    kept: bool = False  # a session's: its store, streams and scratch outlive the call
    memory: Any = None  # the guest's memory export, once instantiated (for `Backend.after`)
    entry: Any = None  # what the backend's `run` takes from preparing (a component's `run`, a door)
    # what the run left, for `finish`
    peak_memory: int | None = None  # the guest memory's size when it stopped, if known
    files: dict[str, bytes] | None = None  # the output files the call left
    overflowed: str | None = None  # the guest's stack ran past its guard: why, in words

    def renew(self, ticker: EpochTicker, manifest: Manifest | None = None) -> None:
        """Ready for a call under `manifest` (None: the one it is ready for) when it was made
        ahead of it or served an earlier run: that manifest's full fuel and a deadline counted
        from now, empty streams capped at its output limit and streaming to this thread's
        listener, and nothing left of an earlier run's evidence. Its memory cap is its store's,
        fixed when it was made."""
        if manifest is not None:
            self.manifest = manifest
        limits = self.manifest.limits
        renew(self.store, limits, ticker)
        self.stdout.reset(limits.output)
        self.stderr.reset(limits.output)
        self.peak_memory = self.files = self.overflowed = None

    def discard(self) -> None:
        """Free it: its streams, its store and its scratch directory."""
        self.stdout.detach()
        self.stderr.detach()
        _store.close_store(self.store)
        if self.scratch is not None:
            self.scratch.remove()


Request_contra = TypeVar("Request_contra", contravariant=True)


class Backend(Protocol[Request_contra]):
    """What a runtime supplies to `perform` for one call of its: hooks that gather evidence.
    None of them decides the call's error: that is `_outcome.decide`'s, in `finish`."""

    @property
    def exit_is_an_end(self) -> bool:
        """Whether a WASI exit ends the call as a `guest_error` (a command, a script's
        `std.exit`) rather than a trap (a runtime whose driver never exits)."""
        ...

    def prepare(self, state: CallState, request: Request_contra) -> Instance:
        """The call's store and WASI world, made now or taken ready (mark `state.ready` when it
        comes made). Raises `Failure` for a call refused before any store is made."""
        ...

    def run(self, instance: Instance, state: CallState, request: Request_contra) -> Any:
        """Inside `running(state)` with the scratch armed: instantiate (marking `state.ready`)
        unless made ahead, run the guest, and read its reply into the call's value. Raises what
        `_outcome.RUN_ENDS` lists."""
        ...

    def after(self, instance: Instance, state: CallState, ok: bool) -> None:
        """Once the guest has stopped: record on `instance` what bears on the outcome (its
        memory's size, a stack past its guard); `ok`: whether the call has succeeded so far.
        (The output files are the skeleton's to read, after this.)"""
        ...

    def dispose(self, store: wasmtime.Store) -> None:
        """Free the call's store (at once, by a housekeeping thread, or not at all: a session's)."""
        ...


def perform(
    backend: Backend[Request_contra],
    manifest: Manifest,
    request: Request_contra,
    ticker: EpochTicker,
    files: Mapping[str, bytes] | None = None,
) -> CallResult:
    """One call, in the order every runtime's call takes: its state, its instance, the input
    `files` written into its scratch space (checked already), the run under `running`, the
    evidence, the output files its manifest names (`_output_files`), the outcome (`finish`),
    then the clean-up. Raises only what a host function re-raises on the caller's thread (an
    interrupt)."""
    ticker.enter()
    started = time.perf_counter()
    state = CallState.start(manifest, started)
    instance: Instance | None = None
    try:
        if _replay.open_tapes:  # (off: this one check)
            state.tape = _replay.starting()
        try:
            instance = backend.prepare(state, request)
        except Failure as refused:
            took = time.perf_counter() - started
            return CallResult.failed(manifest.name, refused.error.kind, refused.error.message, took)
        value: Any = None
        error = instance.error
        scratch_over: str | None = None
        try:
            if error is None:
                if files and instance.scratch is not None:
                    instance.scratch.put(files)
                with running(state):
                    if instance.scratch is not None:
                        instance.scratch.arm(instance.store)
                    value = backend.run(instance, state, request)
        except _outcome.RUN_ENDS as exc:
            error = _outcome.ended_with(exc, manifest.limits, exit_is_an_end=backend.exit_is_an_end)
        finally:
            if not instance.kept:
                instance.stdout.detach()
                instance.stderr.detach()
            if instance.scratch is not None:
                scratch_over = instance.scratch.settle()
        ok = error is None and scratch_over is None
        try:
            backend.after(instance, state, ok)
            if ok and instance.scratch is not None:
                instance.files = _output_files(manifest, instance.scratch)
        except Failure as failure:  # output files over the cap
            error = failure.error
        return finish(state, instance, started, value, error, backend.dispose, scratch_over)
    finally:
        if instance is not None and instance.scratch is not None and not instance.kept:
            instance.scratch.remove()
        state.release_files()  # its store is closed, or is a session's, which keeps its files
        ticker.leave()


def _output_files(manifest: Manifest, scratch: CallScratch) -> dict[str, bytes] | None:
    """The files a succeeded call returns from its scratch folder: a runtime manifest's
    `outputs` (paths and globs), or a command's `command.outputs` (the manifest allows one of
    the two). Raises an `output_limit` Failure when they hold more than `limits.output`."""
    cap = manifest.limits.output
    if manifest.outputs:
        return scratch.collect_globs(manifest.outputs, cap)
    command = manifest.command
    if command is not None and command.outputs:
        return scratch.collect(tuple(output.path for output in command.outputs), cap)
    return None


def fresh_instance(
    engine: wasmtime.Engine,
    manifest: Manifest,
    ticker: EpochTicker,
    call: CallInput = CallInput({}),
    *,
    wasi: bool = True,
    preopens: tuple[tuple[Path, str, bool], ...] = (),
    scratch: Callable[[int, Inputs | None], CallScratch] | None = None,
    last: tuple[tuple[Path, str, bool], ...] = (),
    store_limits: Mapping[str, int] | None = None,
) -> Instance:
    """A new store for one call under `manifest`, with its streams, its scratch (`scratch`
    makes one when the manifest asks) and, with `wasi`, its WASI world (`build_wasi`, with the
    Sandbox's own `preopens`, the scratch's, then `last`). A failure opening the world becomes the
    instance's `error`; raises WasmboxError when the Sandbox is closed."""
    limits = manifest.limits
    store = new_store(engine, limits, ticker, **(store_limits or {}))
    instance = Instance(manifest, store, Output(limits.output), Output(limits.output))
    try:
        if wasi:
            if scratch is not None and manifest.scratch is not None:
                instance.scratch = scratch(manifest.scratch, manifest.inputs)
                preopens = (*preopens, *instance.scratch.preopens)
            world = build_wasi(manifest, call, instance.stdout, instance.stderr, (*preopens, *last))
            instance.store.set_wasi(world)
    except Failure as failure:
        instance.error = failure.error
    return instance


def finish(
    state: CallState,
    instance: Instance,
    started: float,
    value: Any,
    error: CallError | None,
    close: Callable[[wasmtime.Store], None] = _store.close_store,
    scratch_over: str | None = None,
) -> CallResult:
    """The CallResult of a finished call, its error decided by `_outcome.decide` from `error`
    (what the guest's run ended with) and the rest of the evidence on `instance`.

    `close` disposes of the Store: at once by default, since wasmtime-py keeps a failed
    call's Store in a reference cycle until the garbage collector runs. A failed call returns
    no output files (`command.outputs`, `outputs`)."""
    limits = state.manifest.limits
    clock = state.phases
    ran = time.perf_counter() if clock is not None else 0.0
    stdout, stderr = instance.stdout, instance.stderr
    truncated = "stdout" if stdout.truncated else "stderr" if stderr.truncated else None
    if (
        error is not None
        or state.abort is not None
        or truncated is not None
        or scratch_over is not None
        or instance.overflowed is not None
    ):
        error = _outcome.decide(
            _outcome.Evidence(
                limits,
                error,
                state.abort,
                state.failure,
                instance.peak_memory,
                truncated,
                scratch_over,
                instance.overflowed,
            )
        )
    # (else every rule of the table gives success: the common case skips building the evidence)
    store = instance.store
    fuel = (
        _store.fuel_left(_store.context(store))
        if state.fuel_left_at_abort is None
        else state.fuel_left_at_abort
    )
    close(store)
    if clock is not None:
        clock.into.append(
            (state.manifest.name, clock, ran, time.perf_counter(), state.records, limits.fuel - fuel)
        )
    if state.reraise is not None:
        raise state.reraise
    out, err = stdout.data(), stderr.data()
    out_text, out_bytes = views(out) if out else _NO_OUTPUT
    err_text, err_bytes = views(err) if err else _NO_OUTPUT
    files = instance.files if instance.files and error is None else {}
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
        truncated=truncated is not None,
        fuel_used=limits.fuel - fuel,
        duration_s=time.perf_counter() - started,
        peak_memory=instance.peak_memory,
        host_calls=state.records,
    )


_NO_OUTPUT: tuple[str, bytes | None] = ("", None)


def media_types(manifest: Manifest, stdout: bytes, files: dict[str, bytes]) -> dict[str, str]:
    """The media types a result knows: the manifest's (`command.stdout_media_type`, each output's
    `media_type`), else sniffed from the bytes (`_wasmtime.output.sniff`); none for plain text."""
    command = manifest.command
    known: dict[str, str] = {}
    declared = command.stdout_media_type if command is not None else None
    found = declared or (sniff(stdout) if stdout else None)
    if found:
        known["stdout"] = found
    if files:
        named = {output.path: output.media_type for output in command.outputs} if command else {}
        for path, data in files.items():
            found = named.get(path) or sniff(data)
            if found:
                known[path] = found
    return known
