"""Runs one call of a core module: a fresh Store and instance from the tool's InstancePre.

Everything the guest can reach is set up here from the manifest alone: the WASI context
(preopens, env, argv, stdin, captured stdout/stderr), the granted host functions, fuel,
the memory cap and the epoch deadline. Every failure becomes a `CallResult` with an error kind.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import wasmtime

from ... import _abi, _call, _outcome
from ..._call import CallInput, CallState
from ..._capabilities import scratch as _scratch
from ..._capabilities import wasi_files as _wasi_files
from ..._capabilities import wasi_poll as _wasi_poll
from ..._capabilities.hostfuncs import HostFunction
from ..._errors import CapabilityError, ErrorKind, ManifestError
from ..._inspect import ModuleInfo, ToolKind
from ..._manifest import SCRATCH_GUEST_PATH, Manifest
from ..._outcome import Failure
from ..._results import CallResult
from ..._wasmtime import capi as _capi
from ..._wasmtime import store as _store
from ..._wasmtime.engine import EpochTicker
from ..._wasmtime.output import Output
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
        self._ticker = ticker
        self._uses_wasi = info.uses_wasi
        self._scratch = scratch
        self._initialize = info.has_initialize and self.kind is ToolKind.ABI
        command = manifest.command
        if command is not None and self.kind not in (ToolKind.COMMAND, ToolKind.C_REACTOR):
            raise ManifestError(
                f"{manifest.module}: [command] is for WASI command modules (with _start) and [reactor] modules"
            )
        # a [reactor] module: called through its own exports (_backends/core/reactor.py)
        self._entry = reactor.EntryCall(manifest, info) if self.kind is ToolKind.C_REACTOR else None
        self._fail_on_exit = command is not None and command.fail_on_exit_code
        # The hidden root: an empty read-only preopen at / after the manifest's and the
        # scratch's, unless a grant is at / already, so that a path no grant covers reaches
        # `_wasi_files`, is refused there as before, and the call says why (`_explain`).
        at_root = any(p.guest.strip("/") == "" for p in manifest.preopens)
        self._root: Path | None = scratch.empty if info.uses_wasi and not at_root else None
        granted = (
            *(p.guest for p in manifest.preopens),
            *((SCRATCH_GUEST_PATH,) if manifest.scratch is not None and info.uses_wasi else ()),
        )
        self._granted = ", ".join(granted)
        root_fd = _wasi_files.FIRST_PREOPEN_FD + len(granted) if self._root is not None else None
        # caps open files, refuses symlinks
        self._files = _wasi_files.FileGuard(engine, root_fd) if info.uses_wasi else None
        # held here, as long as the InstancePre that calls them (the registry holds them weakly)
        self._host_functions = tuple(host_functions[name] for name in sorted(set(info.host_functions)))
        self._module = module
        self._pre = self._link()
        # what calls a recording or replay tapes instantiate (their clock and randomness read
        # through the tape): only a module using WASI has them
        self._taped = self._link(taped=True) if self._files is not None else self._pre

    def _link(self, *, taped: bool = False) -> wasmtime.InstancePre:
        """The module linked with what its calls get: WASI (our deadline-aware poll_oneoff and
        file calls shadowing Wasmtime's; with `taped`, its clock and randomness read through
        the call's tape) and the granted host functions. CapabilityError for an import
        nothing defines."""
        linker = wasmtime.Linker(self._engine)
        if self._files is not None:
            linker.define_wasi()
            linker.allow_shadowing = True
            _wasi_poll.define(linker)
            self._files.define(linker, taped=taped)
            linker.allow_shadowing = False
        for function in self._host_functions:
            _hostcall.define(linker, function)
        try:
            return linker.instantiate_pre(self._module)
        except wasmtime.WasmtimeError as exc:  # e.g. an import WASI preview1 does not have
            raise CapabilityError(f"{self._manifest.module}: {_outcome.cause(str(exc))}") from None

    exit_is_an_end = True  # a command's exit, or a C entry's, ends the call as a guest error

    def call(self, call: CallInput) -> CallResult:
        return _call.perform(self, call.manifest(self._manifest), call, self._ticker)

    def prepare(self, state: CallState, call: CallInput) -> _call.Instance:
        # A module that cannot reach WASI cannot use a scratch directory: none is made.
        root = ((self._root, "/", False),) if self._root is not None else ()
        return _call.fresh_instance(
            self._engine,
            state.manifest,
            self._ticker,
            call,
            wasi=self._uses_wasi,
            scratch=self._scratch.create,
            last=root,
            store_limits=_STORE_LIMITS,
        )

    def run(self, instance: _call.Instance, state: CallState, call: CallInput) -> Any:
        store = instance.store
        prepared = self._entry.prepare(call.args) if self._entry is not None else ()
        created = _capi.instantiate(self._pre if state.tape is None else self._taped, store)
        memory = instance.memory = _memory(store, created)
        state.ready()
        if self.kind is ToolKind.COMMAND:
            value = _run_command(store, created)
            self._explain(state, instance.stderr)  # before the exit's message quotes stderr
            if self._fail_on_exit and value["exit_code"] != 0:
                raise Failure(ErrorKind.GUEST_ERROR, _exit_message(value["exit_code"], instance.stderr))
            return value
        assert memory is not None  # checked at load
        if self._entry is not None:
            argv = (self._manifest.name, *self._manifest.args, *call.argv)
            value = self._entry.run(
                store, created, memory, prepared, argv, state.manifest.limits.output, instance.stderr
            )
            self._explain(state, instance.stderr)
            if self._fail_on_exit and self._entry.result == "exit_code" and value["exit_code"] != 0:
                raise Failure(ErrorKind.GUEST_ERROR, _exit_message(value["exit_code"], instance.stderr))
            return value
        return self._run_abi(store, created, memory, call, state.manifest.limits.output)

    def after(self, instance: _call.Instance, state: CallState, ok: bool) -> None:
        self._explain(state, instance.stderr)  # (a run that trapped or was stopped said nothing yet)
        if instance.memory is not None:
            instance.peak_memory = _capi.memory_size(_store.context(instance.store), instance.memory)

    dispose = staticmethod(_store.close_store)

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

    def _run_abi(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        memory: _capi.Extern,
        call: CallInput,
        cap: int,
    ) -> Any:
        args = call.args
        try:
            payload = _abi.pack(args if type(args) is dict else dict(args))
        except (TypeError, ValueError, OverflowError) as exc:
            raise Failure(ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}") from None
        context = _store.context(store)
        if self._initialize:
            _capi.call_void(context, _INITIALIZE.get(store, instance))
        # one array of raw values for both calls: (len) -> ptr, then (ptr, len) -> packed
        size = len(payload)
        values = (_capi.RawValue * 2)()
        values[0].i32 = size
        ptr = _capi.call_raw(context, _capi.ALLOC.get(store, instance), values, 2) & 0xFFFF_FFFF
        base, now = _capi.memory_view(context, memory)
        if ptr == 0 or ptr + size > now:
            raise Failure(ErrorKind.BAD_RESPONSE, "wasmbox_alloc returned an invalid pointer")
        ctypes.memmove(base + ptr, payload, size)
        values[0].i32, values[1].i32 = ptr, size
        _capi.call_raw(context, _CALL.get(store, instance), values, 2)
        rptr, rlen = _abi.split(values[0].i64)
        _call.check_result_size(rlen, cap)
        base, now = _capi.memory_view(context, memory)  # the guest may have grown it
        if rptr + rlen > now:
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
    return item if cast(int, item.kind) == _capi.EXTERN_MEMORY else None  # (a ctypes field reads as int)


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
