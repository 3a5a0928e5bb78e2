"""A session's instance of the JavaScript runtime: one QuickJS context kept from run to run.

`Session` (`_backends/python/session.py`) holds the rules (totals, the failure rule, expiry);
this is its `Kernel` for `runtime = "javascript"`. The instance is made once, as a fresh
call's is (`JavaScriptRunner.prepare`: random state, environment, host-call slot), with a
scratch `/tmp` of its own for the session's life. Each run evaluates its code in the same
global scope, so `var`, `function` and top-level `let`/`const` bindings and `globalThis`
properties persist (a second `let x` of one name is a SyntaxError, as in one script), and gets
the run's own fuel, deadline and output cap. Before each run the driver's `reset` cancels the
timers earlier runs left pending, so none fires in a later run (a fresh call's never fire).

Open files: the store keeps what a run left open, so the file guard's count (`wasi_files`) is
carried from run to run; more than `SessionLimits.files` after a run ends the session.
"""

from __future__ import annotations

import time
from typing import Any

import wasmtime

from ... import _call, _outcome
from ..._call import CallInput, CallState
from ..._capabilities import scratch as _scratch
from ..._errors import ErrorKind, SessionError
from ..._manifest import Manifest
from ..._outcome import Failure
from ..._results import CallError, CallResult
from ..._wasmtime import capi as _capi
from ..._wasmtime import store as _store
from ..._wasmtime import wasi_files as _wasi_files
from ..._wasmtime.output import Output
from ..python.session import SessionLimits, _keep_open
from .runner import _STACK_OVERFLOW, _STORE_LIMITS, JavaScriptRunner, Request


class JavaScriptKernel:
    """One store and QuickJS instance, its scratch `/tmp` and output streams, for a session."""

    runtime = "javascript"

    def __init__(self, runner: JavaScriptRunner, manifest: Manifest) -> None:
        """Raises SessionError when the instance cannot be made."""
        self._runner = runner
        limits = manifest.limits
        self._stdout, self._stderr = Output(limits.output), Output(limits.output)
        self._files: _wasi_files.OpenFiles | None = None
        self._scratch: _scratch.CallScratch | None = None
        if manifest.scratch is not None:
            self._scratch = runner._scratch.create(manifest.scratch, manifest.inputs)
        self._store: wasmtime.Store | None = None
        runner._ticker.enter()
        try:
            self._store = _call.new_store(runner._engine, limits, runner._ticker, **_STORE_LIMITS)
            extra = self._scratch.preopens if self._scratch is not None else ()
            self._store.set_wasi(_call.build_wasi(manifest, CallInput({}), self._stdout, self._stderr, extra))
            state = CallState.start(manifest, time.perf_counter())
            with _call.running(state):
                instance = runner._pre.instantiate(self._store)
                memory = _capi.MEMORY.get(self._store, instance)
                if memory is None:
                    raise SessionError("the JavaScript runtime exports no memory")
                self._memory = memory
                self._guest = runner.prepare(self._store, instance, memory, bool(manifest.env))
            if state.abort is not None:
                raise SessionError(state.abort.message)
            self._files = state.files
        except (Failure, wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            self.discard()
            message = exc.error.message if isinstance(exc, Failure) else str(exc)
            raise SessionError(f"the runtime could not make its instance: {message}") from None
        except BaseException:
            self.discard()
            raise
        finally:
            runner._ticker.leave()

    @property
    def scratch(self) -> _scratch.CallScratch | None:
        return self._scratch

    def run(self, manifest: Manifest, code: str) -> tuple[CallResult, bool]:
        """One run in the instance, which stays open: its result, and whether the guest
        returned (False: a trap, an exit or a host's stop left it part way)."""
        runner = self._runner
        store = self._store
        assert store is not None
        started = time.perf_counter()
        limits = manifest.limits
        ticker = runner._ticker
        ticker.enter()
        try:
            state = CallState.start(manifest, started)
            state.files = self._files  # (the descriptors earlier runs left open)
            _call.renew(store, limits, ticker)
            self._stdout.reset(limits.output)
            self._stderr.reset(limits.output)
            value: Any = None
            error: CallError | None = None
            scratch_over: str | None = None
            returned = False
            try:
                _call.check_preopens(manifest)
                with _call.running(state):
                    if self._scratch is not None:
                        self._scratch.arm(store)
                    layout = runner._layout
                    runner._call_driver(self._guest, layout.reset, [])
                    try:
                        value = runner.evaluate(self._guest, Request(code), limits.output)
                    finally:
                        returned = state.abort is None
            except Failure as failure:  # the guest's error reply, or a check of ours
                error = failure.error
            except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:  # stopped part way
                returned = False
                error = _outcome.ended_with(exc, limits, exit_is_an_end=True)
            finally:
                self._files = state.files
                if self._scratch is not None:
                    scratch_over = self._scratch.settle()
            if runner._stack_overflowed(store, self._memory):
                error, returned = CallError(kind=ErrorKind.TRAP, message=_STACK_OVERFLOW), False
            peak = _capi.memory_view(_store.context(store), self._memory)[1]
            kept, error = _scratch.outputs(self._scratch, manifest, error, scratch_over)
            result = _call.finish(
                state, store, started, value, error, self._stdout, self._stderr, peak,
                close=_keep_open, files=kept, scratch_over=scratch_over,
            )  # fmt: skip
            return result, returned
        finally:
            ticker.leave()

    def files_over(self, session: str, limits: SessionLimits) -> str | None:
        """The files the instance keeps open past `SessionLimits.files` (the file guard's count;
        the process's budget is the guard's own, refused at the open)."""
        count = len(self._files.fds) if self._files is not None else 0
        if count > limits.files:
            return (
                f"the session keeps {count} files open between runs, more than its {limits.files} "
                "(SessionLimits.files): close files when done with them (`f.close()`), or open the "
                "session with a higher SessionLimits.files"
            )
        return None

    def discard(self) -> None:
        self._stdout.detach()
        self._stderr.detach()
        if self._store is not None:
            _store.close_store(self._store)
            self._store = None
        if self._files is not None:
            self._files.release()
        if self._scratch is not None:
            self._scratch.remove()
            self._scratch = None
