"""Runs one call of a core module: a fresh Store and instance from the tool's InstancePre.

Everything the guest can reach is set up here from the manifest alone: the WASI context
(preopens, env, argv, stdin, captured stdout/stderr), the granted host functions, fuel,
the memory cap and the epoch deadline. Every failure becomes a `CallResult` with an error kind.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import wasmtime

from ... import _call, _outcome
from ..._call import CallInput, CallState
from ..._capabilities import scratch as _scratch
from ..._capabilities.hostfuncs import HostFunction
from ..._errors import CapabilityError, ErrorKind, ManifestError
from ..._inspect import ModuleInfo, ToolKind
from ..._manifest import Manifest
from ..._outcome import Failure
from ..._results import CallError, CallResult
from ..._wasmtime import capi as _capi
from ..._wasmtime import store as _store
from ..._wasmtime import wasi_files as _wasi_files
from ..._wasmtime import wasi_poll as _wasi_poll
from ..._wasmtime.engine import EpochTicker
from ..._wasmtime.output import Output
from . import abi as _abi
from . import hostcall as _hostcall
from . import reactor

# Store limits beyond the manifest's: the guest's instance (and the memoryless WASI forwarder of
# `_wasi_files`) with one memory (so `limits.memory` is the whole budget), and tables small
# enough that they cannot be used to exhaust host memory.
_STORE_LIMITS = {"table_elements": 100_000, "instances": 2, "tables": 8, "memories": 1}
_CALL = _capi.ExportName(_abi.EXPORT_CALL)
_INITIALIZE = _capi.ExportName(_abi.EXPORT_INITIALIZE)
_START = _capi.ExportName(_abi.EXPORT_START)


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
        scratch: _scratch.ScratchSpace,
    ) -> None:
        assert info.kind is not None
        self.kind = info.kind
        self._engine = engine
        self._manifest = manifest
        self._limits = manifest.limits
        self._ticker = ticker
        self._uses_wasi = info.uses_wasi
        self._scratch = scratch
        # A module that cannot reach WASI cannot use a scratch directory: none is made.
        self._scratch_cap = manifest.scratch if info.uses_wasi else None
        self._initialize = info.has_initialize and self.kind is ToolKind.REACTOR
        command = manifest.command
        if command is not None and self.kind not in (ToolKind.COMMAND, ToolKind.C_REACTOR):
            raise ManifestError(
                f"{manifest.module}: [command] is for WASI command modules (with _start) and [reactor] modules"
            )
        # a [reactor] module: called through its own exports (_backends/core/reactor.py)
        self._entry = reactor.EntryCall(manifest, info) if self.kind is ToolKind.C_REACTOR else None
        self._fail_on_exit = command is not None and command.fail_on_exit_code
        self._outputs = tuple(o.path for o in command.outputs) if command is not None else ()
        # The hidden root: an empty read-only preopen at / after the manifest's and the
        # scratch's, unless a grant is at / already, so that a path no grant covers reaches
        # `_wasi_files`, is refused there as before, and the call says why (`_explain`).
        at_root = any(p.guest.strip("/") == "" for p in manifest.preopens)
        self._root: Path | None = scratch.empty if info.uses_wasi and not at_root else None
        granted = (
            *(p.guest for p in manifest.preopens),
            *((_scratch.GUEST_PATH,) if self._scratch_cap is not None else ()),
        )
        self._granted = ", ".join(granted)
        linker = wasmtime.Linker(engine)
        if info.uses_wasi:
            linker.define_wasi()
            linker.allow_shadowing = True  # our deadline-aware poll_oneoff replaces Wasmtime's
            _wasi_poll.define(linker)
            root_fd = _wasi_files.FIRST_PREOPEN_FD + len(granted) if self._root is not None else None
            self._files = _wasi_files.FileGuard(engine, root_fd)  # caps open files, refuses symlinks
            self._files.define(linker)
            linker.allow_shadowing = False
        # held here, as long as the InstancePre that calls them (the registry holds them weakly)
        self._host_functions = tuple(host_functions[name] for name in sorted(set(info.host_functions)))
        for function in self._host_functions:
            _hostcall.define(linker, function)
        try:
            self._pre = linker.instantiate_pre(module)
        except wasmtime.WasmtimeError as exc:  # e.g. an import WASI preview1 does not have
            raise CapabilityError(f"{manifest.module}: {_outcome.cause(str(exc))}") from None

    def call(self, call: CallInput) -> CallResult:
        self._ticker.enter()
        scratch = None
        try:
            if self._scratch_cap is not None:
                scratch = self._scratch.create(self._scratch_cap)
            return self._call(call, scratch)
        finally:
            if scratch is not None:
                scratch.remove()
            self._ticker.leave()

    def _call(self, call: CallInput, scratch: _scratch.CallScratch | None) -> CallResult:
        started = time.perf_counter()
        state = CallState.start(self._manifest, started)
        try:
            return self._run(call, scratch, state, started)
        finally:
            _wasi_files.release(state)  # its store, and every descriptor, is closed or garbage

    def _run(
        self, call: CallInput, scratch: _scratch.CallScratch | None, state: CallState, started: float
    ) -> CallResult:
        limits = self._limits
        stdout, stderr = Output(limits.output), Output(limits.output)
        store = _call.new_store(self._engine, limits, self._ticker, **_STORE_LIMITS)
        memory: _capi.Extern | None = None
        value: Any = None
        error: CallError | None = None
        scratch_over: str | None = None
        try:
            if self._uses_wasi:
                extra = (scratch.preopen,) if scratch is not None else ()
                if self._root is not None:
                    extra = (*extra, (self._root, "/", False))
                store.set_wasi(_call.build_wasi(self._manifest, call, stdout, stderr, extra))
            with _call.running(state):
                prepared = self._entry.prepare(call.args) if self._entry is not None else ()
                if scratch is not None:
                    scratch.arm(store)
                instance = self._pre.instantiate(store)
                memory = _memory(store, instance)
                state.ready()
                if self.kind is ToolKind.COMMAND:
                    value = _run_command(store, instance)
                    self._explain(state, stderr)  # before the exit's message quotes stderr
                    if self._fail_on_exit and value["exit_code"] != 0:
                        raise Failure(ErrorKind.GUEST_ERROR, _exit_message(value["exit_code"], stderr))
                elif self._entry is not None:
                    assert memory is not None  # checked at load
                    argv = (self._manifest.name, *self._manifest.args, *call.argv)
                    value = self._entry.run(store, instance, memory, prepared, argv, limits.output, stderr)
                    self._explain(state, stderr)
                    if self._fail_on_exit and self._entry.result == "exit_code" and value["exit_code"] != 0:
                        raise Failure(ErrorKind.GUEST_ERROR, _exit_message(value["exit_code"], stderr))
                else:
                    assert memory is not None  # checked at load
                    value = self._run_reactor(store, instance, memory, call)
        except _outcome.RUN_ENDS as exc:
            error = _outcome.ended_with(exc, limits, exit_is_an_end=True)
        finally:
            stdout.detach()
            stderr.detach()
            self._explain(state, stderr)
            if scratch is not None:
                scratch_over = scratch.settle()
        files = None
        if self._outputs and scratch is not None and error is None and scratch_over is None:
            files, error = scratch.collect(self._outputs, limits.output)
        peak = _capi.memory_view(_store.context(store), memory)[1] if memory is not None else None
        return _call.finish(
            state, store, started, value, error, stdout, stderr, peak, files=files, scratch_over=scratch_over
        )

    def _explain(self, state: CallState, stderr: Output) -> None:
        """Say on stderr, once per path, which paths the guest was refused because no grant
        covers them (on the hidden root, which wasi-libc fails as a missing file). The note
        is the host's: it is added past the output cap if need be, and never counts as output
        over it. Again after it has spoken is a no-op."""
        paths, more = _wasi_files.take_refused(state)
        if not paths:
            return
        granted = f"granted: {self._granted}" if self._granted else "nothing is granted"
        lines = [
            f"wasmbox: no preopen covers {path!r} ({granted}): grant its folder in the manifest's preopens\n"
            for path in paths
        ]
        if more:
            lines.append("wasmbox: and more paths no preopen covers\n")
        stderr.note("".join(lines).encode())

    def _run_reactor(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        memory: _capi.Extern,
        call: CallInput,
    ) -> Any:
        try:
            payload = _abi.pack(dict(call.args))
        except (TypeError, ValueError, OverflowError) as exc:
            raise Failure(ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}") from None
        context = _store.context(store)
        if self._initialize:
            _capi.call_void(context, _INITIALIZE.get(store, instance))
        ptr = _capi.call_i32(context, _capi.ALLOC.get(store, instance), len(payload))
        base, size = _capi.memory_view(context, memory)
        if ptr == 0 or ptr + len(payload) > size:
            raise Failure(ErrorKind.BAD_RESPONSE, "wasmbox_alloc returned an invalid pointer")
        ctypes.memmove(base + ptr, payload, len(payload))
        packed = _capi.call_i64(context, _CALL.get(store, instance), ptr, len(payload))
        rptr, rlen = _abi.split(packed)
        _call.check_result_size(rlen, self._limits.output)
        base, size = _capi.memory_view(context, memory)  # the guest may have grown it
        if rptr + rlen > size:
            raise Failure(ErrorKind.BAD_RESPONSE, "result points outside the guest's memory")
        try:
            is_ok, value = _abi.unpack_reply(ctypes.string_at(base + rptr, rlen))
        except _abi.FramingError as exc:
            raise Failure(ErrorKind.BAD_RESPONSE, str(exc)) from None
        if not is_ok:
            raise Failure(ErrorKind.GUEST_ERROR, value)
        return value


def _memory(store: wasmtime.Store, instance: wasmtime.Instance) -> _capi.Extern | None:
    try:
        item = _capi.MEMORY.get(store, instance)
    except wasmtime.WasmtimeError:  # a command module need not export it
        return None
    return item if item.kind == _capi.EXTERN_MEMORY else None


def _exit_message(code: int, stderr: Output) -> str:
    """A failed exit, with the end of what the command wrote to stderr (where tools say why)."""
    tail = stderr.text().strip()
    if len(tail) > _STDERR_TAIL:
        tail = "…" + tail[-_STDERR_TAIL:]
    return f"exited with code {code}: {tail}" if tail else f"exited with code {code}"


_STDERR_TAIL = 1000


def _run_command(store: wasmtime.Store, instance: wasmtime.Instance) -> dict[str, int]:
    try:
        _capi.call_void(_store.context(store), _START.get(store, instance))
    except wasmtime.ExitTrap as exit_trap:
        return {"exit_code": exit_trap.code}
    return {"exit_code": 0}
