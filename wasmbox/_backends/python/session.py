"""Sessions: runs of snippets that share one instance of a runtime, like a notebook's cells.

A session keeps one Store and instance of the runtime (its `Kernel`): in the Python runtime's
(`PythonKernel`) the guest driver keeps one `__main__` namespace, in the JavaScript runtime's
(`_backends/javascript/session.py`) QuickJS keeps one global scope, so variables, imports and
files in the session's scratch `/tmp` persist from one run to the next. Each run has its manifest's per-call limits (fuel
refilled, a deadline counted from the run's start, the output cap; the memory cap holds for
the instance's whole life, since its memory only grows), clipped to what is left of the
session's totals (`SessionLimits`).

The failure rule: a run that ends with a Python exception (`guest_error`, or
`capability_denied` for a refused host call the snippet did not catch) keeps the session.
Any other failure (out of fuel, deadline, trap, memory or output cap, host error) ends it:
the instance may have stopped half way through updating its own state, so it is freed, the
run's error says so, and later runs raise `SessionEndedError`.

Expiry is lazy: an idle or expired session is freed at the next run of any session of its
Sandbox, at the next `Sandbox.session`, or when the Sandbox closes; there is no background
thread. `max_sessions` bounds what an unswept session can hold.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Annotated, Any, Protocol, Self

import wasmtime
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ... import _call, _outcome, _replay, _telemetry
from ..._admission import Gate
from ..._audit import Auditor, args_digest
from ..._budget import Budget
from ..._capabilities import scratch as _scratch
from ..._errors import ErrorKind, LimitsError, SessionEndedError, SessionError, WasmboxError
from ..._manifest import PACKAGES_GUEST_PATH, CallLimits, Limits, Manifest
from ..._outcome import Failure
from ..._results import CallError, CallResult
from ..._units import parse_duration
from ..._wasmtime import component_io as _component_io
from ..._wasmtime import output as _output
from ..._wasmtime.output import OutputListener
from . import descriptors as _descriptors
from .runner import PythonRuntimeRunner, encode_request

Seconds = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]

# Kinds after which a session goes on: the guest returned a response, and what failed was
# Python code (its exception) or a request that never reached it.
_SURVIVABLE = frozenset({ErrorKind.GUEST_ERROR, ErrorKind.CAPABILITY_DENIED, ErrorKind.INVALID_ARGUMENTS})
_ENDED_KEPT = 1024  # ended sessions remembered by name (why they ended), the oldest dropped


class SessionLimits(BaseModel):
    """A session's totals across its runs; each run also has its manifest's per-call limits,
    clipped to what is left of these."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    calls: int = Field(200, gt=0, description="Runs in all.")
    fuel: int = Field(10_000_000_000, gt=0, le=2**63 - 1, description="Fuel of all runs together.")
    time: Seconds = Field(600.0, description="Wall time of all runs together, seconds or '5m'.")
    idle: Seconds = Field(600.0, description="Freed this long after its last run ended.")
    lifetime: Seconds = Field(3600.0, description="Freed this long after it was opened.")
    files: int = Field(64, gt=0, description="Files and folders its interpreter may keep open between runs.")


class Kernel(Protocol):
    """The instance a session keeps, of one runtime: `PythonKernel` here, the JavaScript
    runtime's in `_backends/javascript/session.py`."""

    runtime: str  # the runtime's name ("python", "javascript"), as telemetry names it

    @property
    def scratch(self) -> _call.CallScratch | None:
        """Its scratch `/tmp` (kept for the session's life), if the manifest grants one."""
        ...

    def run(self, manifest: Manifest, code: str) -> tuple[CallResult, bool]:
        """One run under `manifest`'s per-call limits: its result, and whether the guest
        returned (False: it was stopped part way)."""
        ...

    def files_over(self, session: str, limits: SessionLimits) -> str | None:
        """What the files it keeps open between runs pass, after a run; else None."""
        ...

    def discard(self) -> None:
        """Free the instance and its scratch space."""
        ...


class PythonKernel:
    """A session's instance of the Python runtime (its store, component and scratch `/tmp`)."""

    runtime = "python"

    def __init__(self, runner: PythonRuntimeRunner, manifest: Manifest) -> None:
        """Raises SessionError when the runtime cannot make the instance."""
        # linked as a taped call's instance: a run made while a recording or replay is open
        # reads the wall clock and randomness through its tape, one with none open live
        spare = runner.instantiate(manifest, taped=True)
        if spare.error is not None:
            spare.discard()
            raise SessionError(f"the runtime could not make its instance: {spare.error.message}")
        spare.kept = True  # its store, streams and scratch outlive each run
        self._runner = runner
        self._spare = spare
        self._before: frozenset[_descriptors.Descriptor] = frozenset()

    @property
    def scratch(self) -> _call.CallScratch | None:
        return self._spare.scratch

    def run(self, manifest: Manifest, code: str) -> tuple[CallResult, bool]:
        self._before = _descriptors.census()
        return run_once(self._runner, self._spare, manifest, code)

    def files_over(self, session: str, limits: SessionLimits) -> str | None:
        """The session's own `SessionLimits.files`, or the process's budget for all sessions,
        counted from the process's open files (`descriptors`) before and after the run."""
        holdings = _descriptors.holdings
        count, total = holdings.settle(session, self._before, holdings.held(session))
        if count > limits.files:
            return (
                f"the session keeps {count} files open between runs, more than its {limits.files} "
                "(SessionLimits.files): close files when done with them (`with open(...)`), or open the "
                "session with a higher SessionLimits.files"
            )
        if total > holdings.limit:
            return (
                f"the sessions of this process keep {total} files open between runs, more than the "
                f"{holdings.limit} they may together (a quarter of the process's RLIMIT_NOFILE): close "
                "files when done with them, close sessions no longer used, or raise the limit (ulimit -n)"
            )
        return None

    def discard(self) -> None:
        self._spare.discard()


class Session:
    """Runs that share one interpreter (see the module docstring for the rules).

    Made by `Sandbox.session`; thread-safe, one run at a time (a second waits). Usable as a
    context manager (sync and async), which closes it."""

    def __init__(
        self,
        table: SessionTable,
        kernel: Callable[[Manifest], Kernel],
        manifest: Manifest,
        key: str,
        name: str | None,
        limits: SessionLimits,
        auditor: Auditor,
        executor: Executor,
        gate: Gate,
    ) -> None:
        self.id = secrets.token_hex(8)
        self.name = name if name is not None else self.id
        self.manifest_digest = key
        self.limits = limits
        self._table = table
        self._manifest = manifest
        self._auditor = auditor
        self._executor = executor
        self._gate = gate  # the Sandbox's admission control
        self._lock = threading.RLock()
        self._running = False
        self._calls = 0
        self._fuel = 0
        self._time = 0.0
        self._opened = self._last = table.clock()
        self._ended: str | None = None
        self._reported = False  # whether a run's result or a raised error told of the end
        try:
            self._kernel: Kernel | None = kernel(manifest)
        except SessionError as exc:
            raise SessionError(f"session {self.name!r}: {exc}") from None
        self.runtime = self._kernel.runtime

    # -- totals (read-only) ----------------------------------------------------------------

    @property
    def calls(self) -> int:
        """Runs so far (refused ones aside)."""
        return self._calls

    @property
    def fuel_used(self) -> int:
        return self._fuel

    @property
    def time_used(self) -> float:
        """Seconds of wall time its runs took, together."""
        return self._time

    @property
    def closed(self) -> bool:
        """Whether it has ended (its instance and scratch space are freed)."""
        return self._ended is not None

    @property
    def end_reason(self) -> str | None:
        return self._ended

    # -- runs ------------------------------------------------------------------------------

    def run(
        self,
        code: str,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """Run `code` in the session's interpreter: its stdout/stderr and the value of its last
        expression, as `Sandbox.run_python` returns them; with `budget`, only if it admits the
        run (else `over_budget`, and the session stays as it was; so too when the Sandbox's
        admission control refuses it, `overloaded`); with `limits`, under those (tighter than
        the manifest's; its memory cap is the session's, fixed when it opened). `files` are
        written under /tmp/in first, replacing those of the same name (the manifest needs
        `inputs`); the manifest's `outputs` come back in `CallResult.files`; `on_output` gets
        stdout and stderr as they are written (`Tool.call`). Raises `SessionEndedError` when the
        session has ended (or ends now: idle, too old, a total spent), LimitsError for limits
        that would loosen the manifest's."""
        run_limits = self._limits_for(limits)  # (raises before anything is admitted)
        work = partial(self._admitted, code, budget, run_limits, files)
        if on_output is not None:
            with _output.streaming(on_output):
                return self._gate.run(self._manifest.name, work)
        return self._gate.run(self._manifest.name, work)

    def _admitted(
        self, code: str, budget: Budget | None, run_limits: Limits, files: object = None
    ) -> CallResult:
        if budget is not None:
            return budget.run(self._manifest.name, partial(self._admitted, code, None, run_limits, files))
        if _replay.open_tapes and not _call.inside_call():
            with _replay.taping(self._manifest.name, code, files, self._manifest.preopens) as reference:
                return self._audited(code, run_limits, files, reference)
        return self._audited(code, run_limits, files, None)

    def _audited(self, code: str, run_limits: Limits, files: object, recording: str | None) -> CallResult:
        self._table.sweep(besides=self)
        with self._lock:
            if self._running:
                raise WasmboxError("a session cannot run inside its own run (a host function)")
            self._check_open()
            self._running = True
            try:
                telemetry = _telemetry.active
                if telemetry is None:
                    result = self._run(code, run_limits, files)
                else:  # a span as a tool call's, with the session's name
                    result = telemetry.tool_call(
                        self._manifest.name,
                        self.runtime,
                        partial(self._run, code, run_limits, files),
                        session=self.name,
                    )
            finally:
                self._running = False
                self._last = self._table.clock()
        if self._auditor.enabled:
            digest = _sha256(code) if isinstance(code, str) else args_digest(code)
            self._auditor.record(
                result,
                self.manifest_digest,
                digest,
                {},
                run_limits,
                session=self.name,
                session_id=self.id,
                recording=recording,
            )
        return result

    async def arun(
        self,
        code: str,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """`run` on the Sandbox's worker threads, admitted before it is queued for them (limits
        are checked here, before); `on_output` is called on the event loop."""
        import asyncio  # lazily, as in Tool.acall

        from ..._tool import on_the_loop

        self._limits_for(limits)
        listener = on_the_loop(asyncio.get_running_loop(), on_output) if on_output is not None else None
        run = partial(self.run, code, budget=budget, limits=limits, files=files, on_output=listener)
        return await self._gate.offload(self._executor, _call.carried(run))

    def files(self) -> dict[str, int]:
        """The regular files in the session's scratch `/tmp` now (what its runs left), by guest
        path, with their sizes; empty without `scratch`. Raises `SessionEndedError` once it
        has ended (its files are gone)."""
        with self._lock:
            self._check_running("listed")
            scratch = self._kernel.scratch if self._kernel is not None else None
            return scratch.listing() if scratch is not None else {}

    def read(self, path: str) -> bytes:
        """The file at guest `path` in the session's scratch `/tmp` (e.g. "/tmp/out/chart.png"),
        at most the manifest's `limits.output` bytes. Raises `SessionEndedError` once it has
        ended, FileNotFoundError when there is no regular file there (links are not followed),
        ValueError when it is bigger than the cap."""
        with self._lock:
            self._check_running("read")
            scratch = self._kernel.scratch if self._kernel is not None else None
            cap = self._manifest.limits.output
            data = scratch.read(path, cap) if scratch is not None and isinstance(path, str) else None
        if data is None:
            raise FileNotFoundError(f"session {self.name!r} has no file {path!r} under /tmp")
        if len(data) > cap:
            raise ValueError(f"{path} is bigger than the session's output cap (limits.output)")
        return data

    def _check_running(self, what: str) -> None:
        if self._running:
            raise WasmboxError(f"a session's files cannot be {what} inside its own run (a host function)")
        if self._ended is not None:
            raise SessionEndedError(self.name, self._ended)

    def _limits_for(self, limits: CallLimits | Mapping[str, Any] | None) -> Limits:
        """A run's limits: the manifest's, tightened by `limits`. LimitsError as `run` says."""
        own = self._manifest.limits
        if limits is None:
            return own
        tightened = CallLimits.of(limits).applied_to(own, self.name)
        if tightened.memory != own.memory:
            raise LimitsError(
                f"{self.name}: limits.memory: a session's memory cap is fixed when it opens (its "
                "instance lives on): open the session with a manifest of the memory cap wanted"
            )
        return tightened

    def _check_open(self) -> None:
        if self._ended is None:
            now = self._table.clock()
            if now - self._last >= self.limits.idle:
                self._end(f"idle for more than {self.limits.idle:g} s (SessionLimits.idle)")
            elif now - self._opened >= self.limits.lifetime:
                self._end(f"open for more than {self.limits.lifetime:g} s (SessionLimits.lifetime)")
            elif self._calls >= self.limits.calls:
                self._end(f"it ran its {self.limits.calls} runs (SessionLimits.calls)")
            elif self._fuel >= self.limits.fuel:
                self._end(f"its runs used its {self.limits.fuel:,} units of fuel (SessionLimits.fuel)")
            elif self._time >= self.limits.time:
                self._end(f"its runs took its {self.limits.time:g} s (SessionLimits.time)")
        if self._ended is not None:
            self._reported = True  # (the caller is told now)
            raise SessionEndedError(self.name, self._ended)

    def _run(self, code: str, limits: Limits, files: object = None) -> CallResult:
        manifest = self._run_manifest(limits)
        if not isinstance(code, str):
            return CallResult.failed(manifest.name, ErrorKind.INVALID_ARGUMENTS, "code must be a str")
        assert self._kernel is not None
        inputs, problem = _scratch.check_inputs(files, manifest.inputs)
        if problem is not None:  # (the session goes on, as after a refused run)
            return CallResult.failed(manifest.name, ErrorKind.INVALID_ARGUMENTS, problem)
        try:
            scratch = self._kernel.scratch
            if inputs and scratch is not None:
                scratch.put(inputs)
        except Failure as failure:
            return CallResult.failed(manifest.name, failure.error.kind, failure.error.message)
        finished = False
        try:
            result, returned = self._kernel.run(manifest, code)
            finished = True
        finally:
            if not finished:  # e.g. a KeyboardInterrupt out of a host function
                self._end("a run was interrupted")
        self._calls += 1
        self._fuel += result.fuel_used
        self._time += result.duration_s
        error = result.error
        if error is None or (returned and error.kind in _SURVIVABLE):
            over = self._kernel.files_over(self.id, self.limits)
            if over is None:
                return result
            self._end(over)
            self._reported = True
            message = f"{over}; the session has ended, which closed them: its variables and files are gone"
            failed = CallError(kind=ErrorKind.HOST_ERROR, message=message)
            return result.model_copy(update={"ok": False, "value": None, "error": failed})
        self._end(f"a run failed with {error.kind.value}")
        self._reported = True
        note = (
            "; the session has ended (a run that fails this way may leave the interpreter half way "
            "through an update): its variables and files are gone"
        )
        return result.model_copy(update={"error": CallError(kind=error.kind, message=error.message + note)})

    def _run_manifest(self, limits: Limits) -> Manifest:
        """The manifest under a run's `limits`, its fuel and deadline clipped to what is left
        of the totals."""
        fuel = min(limits.fuel, self.limits.fuel - self._fuel)
        timeout = min(limits.timeout, self.limits.time - self._time)
        if fuel == limits.fuel and timeout == limits.timeout and limits is self._manifest.limits:
            return self._manifest
        clipped = limits.model_copy(update={"fuel": fuel, "timeout": timeout})
        return self._manifest.model_copy(update={"limits": clipped})

    # -- the end ---------------------------------------------------------------------------

    def close(self) -> None:
        """Free the session now: its instance, its memory and its scratch space (waits for a
        run in flight, which its deadline bounds). Again is a no-op."""
        with self._lock:
            if self._running:
                raise WasmboxError("a session cannot be closed inside its own run (a host function)")
            self._end("closed")

    async def aclose(self) -> None:
        import asyncio

        await asyncio.get_running_loop().run_in_executor(self._executor, self.close)

    def _end(self, reason: str) -> None:
        """Free the instance and scratch (under the lock, not during a run)."""
        if self._ended is not None:
            return
        self._ended = reason
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            kernel.discard()
        _descriptors.holdings.forget(self.id)
        self._table.ended(self)

    def try_expire(self) -> None:
        """End the session if it is idle or too old, unless it is busy (the sweep's check)."""
        if self._ended is not None or not self._lock.acquire(blocking=False):
            return
        try:
            now = self._table.clock()
            expired = now - self._last >= self.limits.idle or now - self._opened >= self.limits.lifetime
            if not self._running and expired:
                with contextlib.suppress(SessionEndedError):
                    self._check_open()
                self._reported = False  # (no caller was told)
        finally:
            self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = f"ended: {self._ended}" if self._ended else f"{self._calls} runs"
        return f"<Session {self.name!r} ({state})>"


def run_once(
    runner: PythonRuntimeRunner, kept: _call.Instance, manifest: Manifest, code: str
) -> tuple[CallResult, bool]:
    """One run in a session's instance, which stays open: its result, and whether the guest
    returned (False: it was stopped, by a trap or a host verdict, part way)."""
    run = _Run(code)
    result = _call.perform(_KeptInstance(runner, kept), manifest, run, runner._ticker)
    return result, run.returned


@dataclass(eq=False)
class _Run:
    """One run's code, and what became of it."""

    code: str
    payload: bytes = b""
    returned: bool = True  # False once the guest started and did not return of itself


class _KeptInstance:
    """The hooks (`_call.Backend`) of a run in a session's instance: the same instance every
    run, renewed (full fuel, a deadline from now, empty streams) and never disposed of."""

    exit_is_an_end = False

    def __init__(self, runner: PythonRuntimeRunner, kept: _call.Instance) -> None:
        self._runner = runner
        self._kept = kept

    def prepare(self, state: _call.CallState, run: _Run) -> _call.Instance:
        manifest = state.manifest
        request: dict[str, Any] = {"mode": "code", "code": run.code, "session": True}
        if manifest.packages:
            request["path"] = PACKAGES_GUEST_PATH
        try:
            run.payload = encode_request(request, manifest.limits.output)
        except (TypeError, ValueError, OverflowError) as exc:  # e.g. a lone surrogate in the code
            raise _outcome.Failure(ErrorKind.INVALID_ARGUMENTS, f"code cannot be encoded: {exc}") from None
        self._kept.renew(self._runner._ticker, manifest)  # (this run's limits: fuel and a deadline from now)
        return self._kept

    def run(self, instance: _call.Instance, state: _call.CallState, run: _Run) -> Any:
        run.returned = False
        _call.check_preopens(state.manifest)
        response = _component_io.call_bytes(instance.store, instance.entry, run.payload)
        run.returned = state.abort is None
        return self._runner._decode(response, state.manifest.limits.output)

    def after(self, instance: _call.Instance, state: _call.CallState, ok: bool) -> None:
        """(Nothing to read: a component's memory is not the runner's.)"""

    def dispose(self, store: wasmtime.Store) -> None:
        """(The session's store lives on.)"""


class SessionTable:
    """A Sandbox's live sessions by name, at most `limit`, and why recently ended ones ended."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"max_sessions must be a non-negative integer, got {limit!r}")
        self.limit = limit
        self.clock = clock  # (tests put in their own)
        self._live: dict[str, Session] = {}
        self._ended: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._closed = False

    def open(self, name: str | None, key: str, make: Callable[[], Session]) -> Session:
        """The live session `name` when its grants are `key`, else a new one from `make`.
        Raises SessionError (name under other grants, `limit` reached) or what `make` raises."""
        self.sweep()
        with self._lock:
            if self._closed:
                raise WasmboxError("the Sandbox is closed")
            found = self._live.get(name) if name is not None else None
            if found is not None:
                if found.manifest_digest != key:
                    raise SessionError(
                        f"session {name!r} runs under other grants (manifest {found.manifest_digest[:12]}); "
                        "a session is never shared between grant sets: close it, or use another name"
                    )
                return found
            if len(self._live) >= self.limit:
                raise SessionError(
                    f"{len(self._live)} sessions are open, the most this Sandbox allows (max_sessions="
                    f"{self.limit}): close one, or wait for one to go idle"
                )
            session = make()  # (under the lock: two opens of one name make one session)
            self._live[session.name] = session
            if name is not None:
                self._ended.pop(name, None)
            return session

    def ended(self, session: Session) -> None:
        """`session` has ended: it no longer counts, and its name is free."""
        with self._lock:
            if self._live.get(session.name) is session:
                del self._live[session.name]
                self._ended[session.name] = session
                while len(self._ended) > _ENDED_KEPT:
                    self._ended.popitem(last=False)

    def take_unreported_end(self, name: str) -> str | None:
        """Why the session last called `name` ended, if no run's result said so yet (once)."""
        with self._lock:
            session = self._ended.get(name)
            if session is None or session._reported or name in self._live:
                return None
            session._reported = True
            return session.end_reason

    def sweep(self, besides: Session | None = None) -> None:
        """Free the sessions that are idle or too old (not busy ones)."""
        with self._lock:
            sessions = [s for s in self._live.values() if s is not besides]
        for session in sessions:
            session.try_expire()

    @property
    def live(self) -> int:
        return len(self._live)

    def close(self) -> None:
        """Close every session (waiting for runs in flight); no new ones open."""
        with self._lock:
            self._closed = True
            sessions = list(self._live.values())
        for session in sessions:
            session.close()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
