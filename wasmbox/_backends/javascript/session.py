"""A session's instance of the JavaScript runtime: one QuickJS context kept from run to run.

`Session` (`_backends/python/session.py`) holds the rules (totals, the failure rule, expiry);
this is its `Kernel` for `runtime = "javascript"`. The instance is made once, as a fresh
call's is (`JavaScriptRunner.prepare`: random state, environment, host-call slot), with a
scratch `/tmp` of its own for the session's life. It is linked as a taped call's is
(`JavaScriptRunner.taped`), so a run made while a recording or replay is open reads the
clock through its tape, and its Math.random state is seeded again from the tape; a run with
none open reads the clock live, at the cost of a host callback per reading. Each run evaluates its code in the same
global scope, so `var`, `function` and top-level `let`/`const` bindings and `globalThis`
properties persist (a second `let x` of one name is a SyntaxError, as in one script), and gets
the run's own fuel, deadline and output cap. Before each run the driver's `reset` cancels the
timers earlier runs left pending, so none fires in a later run (a fresh call's never fire).

Open files: the store keeps what a run left open, so the file guard's count (`wasi_files`) is
carried from run to run; more than `SessionLimits.files` after a run ends the session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import wasmtime

from ... import _call
from ..._call import CallState
from ..._capabilities import wasi_files as _wasi_files
from ..._errors import SessionError
from ..._manifest import Manifest
from ..._outcome import Failure
from ..._results import CallResult
from ..._wasmtime import capi as _capi
from ..python.session import SessionLimits
from .runner import _STORE_LIMITS, JavaScriptRunner, Request


class JavaScriptKernel:
    """One store and QuickJS instance, its scratch `/tmp` and output streams, for a session."""

    runtime = "javascript"

    def __init__(self, runner: JavaScriptRunner, manifest: Manifest) -> None:
        """Raises SessionError when the instance cannot be made."""
        self._runner = runner
        self._files: _wasi_files.OpenFiles | None = None
        ticker = runner._ticker
        ticker.enter()
        self._kept: _call.Instance | None = None
        try:
            instance = self._kept = _call.fresh_instance(
                runner._engine, manifest, ticker, scratch=runner._scratch.create, store_limits=_STORE_LIMITS
            )
            instance.kept = True  # its store, streams and scratch outlive each run
            if instance.error is not None:
                raise Failure(instance.error.kind, instance.error.message)
            state = CallState.start(manifest, time.perf_counter())
            with _call.running(state):
                created = runner.taped.instantiate(instance.store)  # (each run's clock: its tape's, if any)
                memory = instance.memory = _capi.MEMORY.get(instance.store, created)
                if memory is None:
                    raise SessionError("the JavaScript runtime exports no memory")
                self._guest = runner.prepare_guest(instance.store, created, memory, bool(manifest.env))
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
            ticker.leave()

    @property
    def scratch(self) -> _call.CallScratch | None:
        return self._kept.scratch if self._kept is not None else None

    def run(self, manifest: Manifest, code: str) -> tuple[CallResult, bool]:
        """One run in the instance, which stays open: its result, and whether the guest
        returned (False: a trap, an exit, a stack past its guard or a host's stop left it part
        way)."""
        run = _Run(code)
        result = _call.perform(_KeptInstance(self, run), manifest, run, self._runner._ticker)
        return result, run.returned

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
        instance, self._kept = self._kept, None
        if instance is not None:
            instance.discard()  # (its streams, its store and its scratch folder)
        if self._files is not None:
            self._files.release()
            self._files = None


@dataclass(eq=False)
class _Run:
    """One run's code, and what became of it."""

    code: str
    returned: bool = True  # False once the guest started and did not return of itself


class _KeptInstance:
    """The hooks (`_call.Backend`) of a run in a JavaScript session's instance: the same instance
    every run, renewed (full fuel, a deadline from now, empty streams, the driver's `reset`)
    and never disposed of; the file guard's count carried from run to run."""

    exit_is_an_end = True  # std.exit(n) ends the script (and the session)

    def __init__(self, kernel: JavaScriptKernel, run: _Run) -> None:
        self._kernel = kernel
        self._runner = kernel._runner
        self._run = run

    def prepare(self, state: CallState, run: _Run) -> _call.Instance:
        kept = self._kernel._kept
        assert kept is not None
        kept.renew(self._runner._ticker, state.manifest)  # (this run's limits: fuel and a deadline from now)
        state.files = self._kernel._files  # (the descriptors earlier runs left open)
        state.ready(True)
        return kept

    def run(self, instance: _call.Instance, state: CallState, run: _Run) -> Any:
        run.returned = False
        _call.check_preopens(state.manifest)
        runner, guest = self._runner, self._kernel._guest
        runner._call_driver(guest, runner._layout.reset, [])
        if state.tape is not None:  # a taped run's Math.random starts from a seed on its tape
            runner.seed(guest, state.tape)
        try:
            value = runner.evaluate(guest, Request(run.code), state.manifest.limits.output)
        except Failure:  # the script's error reply, or a check of ours: it returned
            run.returned = state.abort is None
            raise
        run.returned = state.abort is None
        return value

    def after(self, instance: _call.Instance, state: CallState, ok: bool) -> None:
        self._runner.after(instance, state, ok)  # (its memory's size; a stack past its guard)
        if instance.overflowed is not None:  # its memory holds what the overflow wrote
            self._run.returned = False
        self._kernel._files = state.files  # the kernel keeps the open files: the run gives none back
        state.files = None

    def dispose(self, store: wasmtime.Store) -> None:
        """(The session's store lives on.)"""
