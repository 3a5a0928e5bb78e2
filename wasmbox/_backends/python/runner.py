"""Runs Python tools and snippets in the CPython runtime component, one fresh instance a call.

The component is shared by every Python tool of a Sandbox; what differs per call is the
manifest (preopens, env, limits, granted host functions) and the request (a tool's bytecode,
compiled at load, and args; or a snippet). The one host import, `call-host`, checks the name
against the current call's manifest every time.
"""

from __future__ import annotations

import atexit
import contextlib
import marshal
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial, wraps
from pathlib import Path
from typing import Any, TypeVar, cast

import msgpack
import wasmtime
from wasmtime import component

from ... import _abi, _call, _outcome, _replay
from ..._call import CallInput
from ..._capabilities import scratch as _scratch
from ..._capabilities.hostfuncs import HostFunction
from ..._errors import ErrorKind
from ..._inspect import ToolKind
from ..._manifest import PACKAGES_GUEST_PATH, STDLIB_GUEST_PATH, Limits, Manifest
from ..._outcome import Failure
from ..._results import CallError, CallResult
from ..._wasmtime import component_io as _component_io
from ..._wasmtime import store as _store
from ..._wasmtime.engine import EpochTicker
from .build import PythonRuntime


class PythonRuntimeRunner:
    """The Sandbox's CPython runtime: a compiled component and its linker. Thread-safe."""

    def __init__(
        self,
        engine: wasmtime.Engine,
        compiled: component.Component,
        runtime: PythonRuntime,
        host_functions: Mapping[str, HostFunction],
        ticker: EpochTicker,
        scratch: _scratch.ScratchSpace,
        *,
        stdlib_writable: bool = False,
        spares: int = 2,
    ) -> None:
        self._engine = engine
        self._component = compiled
        self._runtime = runtime
        self._host_functions = host_functions
        self._ticker = ticker
        self._scratch = scratch
        self._linker, handles = self._link(compiled, engine)
        # what taped calls and sessions instantiate: the wall clock and randomness served by
        # the host too (through the call's tape when it has one), which costs each read a Python call
        self._taped_linker, taped_handles = self._link(compiled, engine, taped=True)
        self._host_handles = (*handles, *taped_handles)
        run = compiled.get_export_index("run")
        if run is None:
            raise RuntimeError("the Python runtime component exports no `run`")
        self._packages: dict[tuple[str, ...], tuple[Path, bool]] = {}  # by `Manifest.packages`
        self._instances = _Instances(
            engine,
            compiled,
            self._linker,
            run,
            ticker,
            scratch,
            ((runtime.stdlib, STDLIB_GUEST_PATH, stdlib_writable),),
            self._packages,
            self._taped_linker,
        )
        self._spares = _Spares(spares)
        # The thread makes spares from `_instances`, which holds no host function: nothing it
        # does keeps this runner (its host functions, their owners) alive.
        self._keeper = _Housekeeper(self._spares, self._instances.make)
        # Released when closed, or when the Sandbox is dropped without closing it: nothing
        # here may keep the runner (and its engine's pool reservation) alive.
        self._release = weakref.finalize(
            self,
            _release,
            self._keeper,
            self._spares,
            (self._linker, self._taped_linker),
            self._host_handles,
        )

    def _link(
        self, compiled: component.Component, engine: wasmtime.Engine, *, taped: bool = False
    ) -> tuple[component.Linker, list[int]]:
        """A linker with WASI p2, the `call-host` import and our clocks (`_replace_clocks`),
        and the handles of the functions it defines through `_component_io` (for `forget`)."""
        linker = component.Linker(engine)
        linker.add_wasip2()
        linker.allow_shadowing = True
        with linker.root() as root:
            handles = [_component_io.add_bytes_func(root, "call-host", self._call_host)]
            handles += _replace_clocks(root, compiled, engine, taped=taped)
        linker.allow_shadowing = False
        return linker, handles

    @property
    def folder(self) -> Path:
        """The folder the runtime was built in (its module and what its calls preopen)."""
        return self._runtime.component.parent

    @property
    def build_digest(self) -> str:
        """The digest of the runtime's build inputs (what bytecode it makes depends on)."""
        return self._runtime.key

    @property
    def component_path(self) -> str:
        """Where the built component lives (its compiled form is in the artifact cache)."""
        return str(self._runtime.component)

    def sibling(self) -> PythonRuntimeRunner:
        """A runner of the same component with no host functions and no spares, for a build
        step's grants (close it after use)."""
        return PythonRuntimeRunner(
            self._engine, self._component, self._runtime, {}, self._ticker, self._scratch, spares=0
        )

    def add_packages(self, packages: tuple[str, ...], site: Path, *, writable: bool = False) -> None:
        """Calls under a manifest whose `packages` are `packages` see `site` at /packages (on
        their `sys.path`); read-only unless `writable` (the byte-compiling step's)."""
        self._packages[packages] = (site, writable)

    def call(
        self,
        manifest: Manifest,
        grants_digest: str,
        request: dict[str, Any],
        *,
        prepare_next: bool = True,
        files: Mapping[str, bytes] = _scratch.NO_FILES,
    ) -> CallResult:
        """Send one request to a fresh instance under `manifest`'s grants and limits;
        `grants_digest` is `manifest.digest()`, which names the grant set (callers compute it
        once). With `prepare_next`, a spare instance for the next call under these grants is made
        meanwhile. `files` (checked input files) are written under /tmp/in before it runs."""
        self._ticker.enter()
        try:
            return self._send(manifest, grants_digest, request, prepare_next, files)
        finally:
            self._ticker.leave()

    def compile_tool(self, manifest: Manifest, source: str) -> CallResult:
        """A Python tool's source compiled by the runtime's own CPython (its value:
        `{"code": the bytecode PythonToolRunner sends, "signature": the entry's, or None}`), in
        an instance that runs no tool code, with no grants and limits of its own (compiling
        costs more than running many a tool, and its result is bigger than the source). A
        syntax error is a failed result."""
        assert manifest.source is not None
        compiling = Manifest(name=manifest.name, runtime="python", limits=_COMPILE_LIMITS)
        request = {
            "mode": "compile",
            "source": source,
            "filename": manifest.source.name,
            "entry": manifest.entry,
        }
        return self.call(compiling, compiling.digest(), request, prepare_next=False)

    exit_is_an_end = False  # the driver never exits: a WASI exit is a trap

    def _send(
        self,
        manifest: Manifest,
        grants_digest: str,
        request: dict[str, Any],
        prepare_next: bool,
        files: Mapping[str, bytes],
    ) -> CallResult:
        if manifest.packages:
            request = {**request, "path": PACKAGES_GUEST_PATH}
        return _call.perform(
            self, manifest, _Request(request, grants_digest, prepare_next), self._ticker, files
        )

    def prepare(self, state: _call.CallState, request: _Request) -> _call.Instance:
        manifest = state.manifest
        try:
            request.payload = encode_request(request.body, manifest.limits.output)
        except (TypeError, ValueError, OverflowError) as exc:
            raise Failure(ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}") from None
        taped = state.tape is not None  # (a spare is not linked for a taped call)
        prepared = None if taped else self._spares.take(request.grants_digest, manifest)
        made_ahead = request.made_ahead = prepared is not None
        if prepared is None:
            prepared = self.instantiate(manifest, taped=taped)  # (its preopens opened just now)
            if prepared.error is None:  # the call's fuel is its run's, as a spare's: not its making's
                _store.set_fuel(_store.context(prepared.store), manifest.limits.fuel)
        else:
            prepared.renew(self._ticker, manifest)  # (made on another thread, maybe under other limits)
        if request.prepare_next:  # the next call under these grants finds one ready
            self._keeper.request_spare(manifest, request.grants_digest)
        state.ready(made_ahead)
        return prepared

    def run(self, instance: _call.Instance, state: _call.CallState, request: _Request) -> Any:
        if request.made_ahead:  # its preopens were opened when it was made: still the grants?
            _call.check_preopens(state.manifest)
        response = _component_io.call_bytes(instance.store, instance.entry, request.payload)
        return self._decode(response, state.manifest.limits.output)

    def after(self, instance: _call.Instance, state: _call.CallState, ok: bool) -> None:
        """(A component's memory is not the runner's to read: its peak is not known.)"""

    def dispose(self, store: wasmtime.Store) -> None:
        self._keeper.retire_store(store)

    @property
    def spares(self) -> int:
        """Spare instances ready for a next call (one per recent grant set)."""
        return self._spares.ready

    def instantiate(self, manifest: Manifest, *, taped: bool = False) -> _call.Instance:
        """A store and instance for one call under `manifest`, not yet run (see `_Instances.make`)."""
        return self._instances.make(manifest, taped=taped)

    def close(self) -> None:
        """Stop the housekeeping thread, free the spare instances and the linker (which
        wasmtime-py's function registry would otherwise keep alive with the whole engine)."""
        self._release()

    @staticmethod
    def _decode(response: bytes, cap: int) -> Any:
        _call.check_result_size(len(response), cap)
        try:
            message = _abi.unpack(response)
        except _abi.FramingError as exc:
            raise Failure(ErrorKind.BAD_RESPONSE, str(exc)) from None
        if isinstance(message, dict) and "ok" in message:
            return message["ok"]
        if isinstance(message, dict) and type(message.get("too_big")) is int:
            size = message["too_big"]  # the driver's word; the verdict and its message are ours
            _call.check_result_size(size, cap)
            if size > _component_io.REPLY_MAX:
                raise Failure(
                    ErrorKind.OUTPUT_LIMIT,
                    f"result of {size} bytes exceeds the {_component_io.REPLY_MAX} bytes a Python call "
                    "can return (Wasmtime's limit on one transfer from a component)",
                )
            raise Failure(ErrorKind.BAD_RESPONSE, f"the runtime withheld a result of {size} bytes that fits")
        if isinstance(message, dict) and isinstance(message.get("error"), str):
            kind = _outcome.GUEST_CLAIMS.get(message.get("kind", ""), ErrorKind.GUEST_ERROR)
            trace = message.get("traceback")
            raise Failure(kind, trace if isinstance(trace, str) and trace else message["error"])
        raise Failure(ErrorKind.BAD_RESPONSE, "the runtime's response is not an ok/error map")

    def _call_host(self, context: _component_io.Context, name: str, args: bytes) -> bytes:
        """The `call-host` import. Never raises (see `_call.abort`)."""
        if len(name) > _MAX_NAME:
            name = name[:_MAX_NAME] + "..."  # never echo a guest's megabytes back
        granted = name in _call.current().manifest.host_functions
        try:
            function = self._host_functions.get(name) if granted else None
            return _call.serve_host_call(context, name, args, function).payload
        except BaseException as exc:  # noqa: BLE001 - must not escape into the C callback
            return _abi.error(_call.callback_failed(context, name, exc))


def encode_request(request: dict[str, Any], output_cap: int) -> bytes:
    """What the driver's `run` takes: the output cap (8 bytes, little-endian; the driver sends
    no result over it) and the request in `marshal`'s format, which the guest decodes in C.
    The request is what MessagePack makes of `request` (lists for tuples, str keys only), so
    the guest sees the values the ABI carries. Raises what `_abi.pack` raises, and ValueError
    for a map key that is not a string."""
    carried = msgpack.unpackb(_abi.pack(request), raw=False)
    return min(output_cap, _component_io.REPLY_MAX).to_bytes(8, "little") + marshal.dumps(carried, 4)


def _replace_clocks(
    root: component.LinkerInstance, compiled: component.Component, engine: wasmtime.Engine, *, taped: bool
) -> list[int]:
    """Serve `wasi:clocks/monotonic-clock` ourselves, without its sleeps (its readings
    through a taped call's tape, `_replay`); with `taped` (the linker of taped calls), the
    wall clock and `wasi:random/random` too, through the tape.

    Wasmtime's `subscribe-duration`/`subscribe-instant` let a guest block inside the host
    (`time.sleep`, `select` with a timeout), where the epoch deadline cannot reach it: a
    sleeping call would hold its thread and its pool slots for as long as it liked. wasmtime-py cannot
    make the pollables a capped sleep would need, so sleeping is refused outright, as a
    guest error with a message that says why. Returns the handles of what it defined through
    `_component_io`.
    """
    io, handles = _component_io, []
    for name in compiled.type.imports(engine):
        if name.startswith("wasi:clocks/monotonic-clock@"):
            with root.add_instance(name) as clock:
                handles += [
                    io.add_u64_func(clock, "now", _monotonic_now),
                    io.add_u64_func(clock, "resolution", _one),
                ]
                clock.add_func("subscribe-duration", _refuse_sleep)
                clock.add_func("subscribe-instant", _refuse_sleep)
        elif name.startswith("wasi:clocks/wall-clock@") and taped:
            with root.add_instance(name) as clock:
                handles += [
                    io.add_datetime_func(clock, "now", _wall_now),
                    io.add_datetime_func(clock, "resolution", _nanosecond),
                ]
        elif name.startswith("wasi:random/random@") and taped:
            with root.add_instance(name) as random:
                handles += [
                    io.add_random_bytes_func(random, "get-random-bytes", _random_bytes),
                    io.add_u64_func(random, "get-random-u64", _random_u64),
                ]
    return handles


_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def _guarded(handler: _Handler) -> _Handler:
    """`handler` (a clock or random function) raising only WasmtimeError, which traps the
    guest: a stop it recorded itself (`_call.abort`), or, for anything else it raised, the
    call stopped by `_call.callback_failed` (an interrupt re-raised after the call)."""

    @wraps(handler)
    def guarded(context: _component_io.Context, *args: Any) -> Any:
        try:
            return handler(context, *args)
        except wasmtime.WasmtimeError:
            raise
        except BaseException as exc:  # noqa: BLE001 - nothing may unwind into Wasmtime
            raise wasmtime.WasmtimeError(_call.callback_failed(context, handler.__name__, exc)) from None

    return cast(_Handler, guarded)


@_guarded
def _monotonic_now(context: _component_io.Context) -> int:
    return time.monotonic_ns() if not _replay.open_tapes else _taped_clock("monotonic", time.monotonic_ns)


def _one(context: _component_io.Context) -> int:
    return 1


@_guarded
def _wall_now(context: _component_io.Context) -> tuple[int, int]:
    return divmod(_taped_clock("wall", time.time_ns), 1_000_000_000)


def _nanosecond(context: _component_io.Context) -> tuple[int, int]:
    return 0, 1


def _taped_clock(kind: str, read: Callable[[], int]) -> int:
    tape = _call.current().tape
    return read() if tape is None else tape.clock(kind, read)


@_guarded
def _random_bytes(context: _component_io.Context, size: int) -> bytes:
    return _draw_random(context, size)


@_guarded
def _random_u64(context: _component_io.Context) -> int:
    return int.from_bytes(_draw_random(context, 8), "little")


def _draw_random(context: _component_io.Context, size: int) -> bytes:
    state = _call.current()
    if size > state.manifest.limits.memory:  # (its memory could not take them)
        message = f"asked for {size} random bytes, more than the memory cap"
        _call.abort(context, ErrorKind.MEMORY_LIMIT, message)
        raise wasmtime.WasmtimeError(message)
    tape = state.tape
    return os.urandom(size) if tape is None else tape.random(size, partial(os.urandom, size))


def _refuse_sleep(store: wasmtime.StoreContext, *_: object) -> None:
    _call.abort(_store.context(store), ErrorKind.GUEST_ERROR, _NO_SLEEP)
    raise wasmtime.WasmtimeError(_NO_SLEEP)  # stops the guest now; the abort names the kind


_NO_SLEEP = (
    "sleeping (time.sleep, select with a timeout) is not available in the sandbox: "
    "it would hold the host past the call's deadline"
)
_NO_INPUT = CallInput({})
# Far above what compiling any real tool's source costs (bench/README.md); they bound a hostile one.
_COMPILE_LIMITS = Limits(fuel=2_000_000_000, memory=512 * 1024**2, timeout=10.0, output=64 * 1024**2)
_MAX_NAME = 128  # host function names are short; a longer one is a guest playing games
# The grants an instance is made under: none (the component's start-up calls no host function).
_INSTANTIATING = Manifest(name="preparing", runtime="python")


def _release(
    keeper: _Housekeeper, spares: _Spares, linkers: tuple[component.Linker, ...], handles: tuple[int, ...]
) -> None:
    keeper.stop()
    for spare in spares.drain():
        spare.discard()
    for linker in linkers:
        linker.close()
    for handle in handles:
        _component_io.forget(handle)


class _Instances:
    """Makes the store and instance for one call: what the runner and its housekeeping thread
    share. It holds no host function (they are reached through the runner, held weakly by
    the linker), so a spare being made keeps no tenant of the Sandbox alive."""

    def __init__(
        self,
        engine: wasmtime.Engine,
        compiled: component.Component,
        linker: component.Linker,
        run: component.ExportIndex,
        ticker: EpochTicker,
        scratch: _scratch.ScratchSpace,
        stdlib: tuple[tuple[Path, str, bool], ...],
        packages: dict[tuple[str, ...], tuple[Path, bool]],
        taped_linker: component.Linker,
    ) -> None:
        self._engine = engine
        self._taped_linker = taped_linker
        self._component = compiled
        self._linker = linker
        self._run = run
        self._ticker = ticker
        self._scratch = scratch
        self._stdlib = stdlib
        self._packages = packages  # the runner's, filled by `add_packages`

    def make(self, manifest: Manifest, *, taped: bool = False) -> _call.Instance:
        """A store and instance for one call under `manifest`, not yet run (with `taped`, linked
        for a taped call, `_replace_clocks`). A failure is kept
        in what it returns and becomes the call's error; raises only when the Sandbox is
        closed (WasmboxError) or its scratch folder cannot be made (OSError)."""
        preopens = self._stdlib
        site = self._packages.get(manifest.packages) if manifest.packages else None
        if site is not None:
            preopens = (*preopens, (site[0], PACKAGES_GUEST_PATH, site[1]))
        ready = not manifest.packages or site is not None
        instance = _call.fresh_instance(
            self._engine, manifest, self._ticker, wasi=ready, preopens=preopens, scratch=self._scratch.create
        )
        if not ready:
            message = "the manifest's packages are not installed in this Sandbox"
            instance.error = CallError(kind=ErrorKind.HOST_ERROR, message=message)
        if instance.error is not None:
            return instance
        try:
            with _call.running(_call.CallState.start(_INSTANTIATING, time.perf_counter())):
                linker = self._taped_linker if taped else self._linker
                created = linker.instantiate(instance.store, self._component)
            instance.entry = created.get_func(instance.store, self._run)
        except _outcome.RUN_ENDS as exc:
            instance.error = _outcome.ended_with(exc, manifest.limits, exit_is_an_end=False)
        except Exception as exc:  # noqa: BLE001 - the call reports it
            instance.error = CallError(kind=ErrorKind.HOST_ERROR, message=f"preparing the call: {exc!r}")
        return instance


@dataclass(eq=False)
class _Request:
    """One call's request to the runtime, and what preparing its instance found."""

    body: dict[str, Any]
    grants_digest: str
    prepare_next: bool
    payload: bytes = b""  # `body`, encoded (`encode_request`)
    made_ahead: bool = False  # its instance is a spare, made before the call


class _Spares:
    """Instances prepared ahead, at most one per grant set (manifest digest) and `limit` in
    all (the oldest grant set's is dropped first)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._ready: dict[str, _call.Instance] = {}
        self._lock = threading.Lock()

    def take(self, grants_digest: str, manifest: Manifest) -> _call.Instance | None:
        with self._lock:
            spare = self._ready.pop(grants_digest, None)
        if spare is None or spare.manifest == manifest:
            return spare
        if not _serves(spare.manifest, manifest):  # never another grant set's
            spare.discard()
            return None
        return spare  # (the call's own limits come with `Instance.renew`)

    def wanted(self, grants_digest: str) -> bool:
        with self._lock:
            return self.limit > 0 and grants_digest not in self._ready

    def put(self, grants_digest: str, spare: _call.Instance) -> list[_call.Instance]:
        """Keep `spare` for grant set `grants_digest`; return the spares it displaced (to be closed)."""
        with self._lock:
            displaced = []
            old = self._ready.pop(grants_digest, None)
            if old is not None:
                displaced.append(old)
            self._ready[grants_digest] = spare
            while len(self._ready) > self.limit:
                displaced.append(self._ready.pop(next(iter(self._ready))))
            return displaced

    @property
    def ready(self) -> int:
        return len(self._ready)

    def drain(self) -> list[_call.Instance]:
        with self._lock:
            spares, self._ready = list(self._ready.values()), {}
            return spares


def _serves(made: Manifest, wanted: Manifest) -> bool:
    """Whether an instance made (never run) under `made` can serve a call under `wanted`: the
    same grants, and the same memory cap (its store's limit); fuel, deadline, output cap and
    host calls are the call's own."""
    return (
        made.limits.memory == wanted.limits.memory
        and made.model_copy(update={"limits": wanted.limits}) == wanted
    )


class _Housekeeper:
    """A background thread that closes finished stores (a teardown the caller need not wait
    for) and prepares spare instances. Its queue is short, so
    retired stores hold their pool slots and files only briefly; when it is full the caller
    closes its own store and skips the spare."""

    QUEUE = 4  # its queue's bound: the stores and spare requests waiting for it

    def __init__(self, spares: _Spares, make: Callable[[Manifest], _call.Instance]) -> None:
        self._spares = spares
        self._make = make
        self._tasks: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=self.QUEUE)
        self._thread = threading.Thread(target=self._run, name="wasmbox-python", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def retire_store(self, store: wasmtime.Store) -> None:
        try:
            self._tasks.put_nowait(("close", store))
        except queue.Full:
            _store.close_store(store)

    def request_spare(self, manifest: Manifest, grants_digest: str) -> None:
        if self._spares.wanted(grants_digest):
            with contextlib.suppress(queue.Full):
                self._tasks.put_nowait(("spare", (manifest, grants_digest)))

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            action, item = task
            try:
                if action == "close":
                    _store.close_store(item)  # (counted closed, as every store is)
                else:
                    self._make_spare(*item)
            except Exception:  # noqa: BLE001, S110 - housekeeping must outlive any one failure
                pass
            del task, item  # hold nothing (a store, the runner) while waiting for the next

    def _make_spare(self, manifest: Manifest, grants_digest: str) -> None:
        if not self._spares.wanted(grants_digest):
            return
        spare = self._make(manifest)
        if spare.error is not None:  # e.g. the pool is full now: try again later
            spare.discard()
            return
        for old in self._spares.put(grants_digest, spare):
            old.discard()

    def _at_exit(self) -> None:
        """Finish before the interpreter finalizes; the stores it and the runner's release
        (a `weakref.finalize`, run after this) close are only forgotten (`_store.exiting`)."""
        _store.exiting()
        self.stop()

    def stop(self) -> None:
        atexit.unregister(self._at_exit)
        if self._thread.is_alive():
            self._tasks.put(None)
            if threading.current_thread() is not self._thread:  # (a finalizer may run on it)
                self._thread.join()


class PythonSnippetRunner:
    """A `run_python` grant set: each call runs the snippet in its args' `code`."""

    kind = ToolKind.PYTHON

    def __init__(self, runtime: PythonRuntimeRunner, grants: Manifest, grants_digest: str) -> None:
        self._runtime = runtime
        self._grants = grants
        self._grants_digest = grants_digest

    def call(self, call: CallInput) -> CallResult:
        # the Tool checked the args against `{"code": str}`
        return self._runtime.call(
            call.manifest(self._grants),
            self._grants_digest,
            {"mode": "code", "code": call.args["code"]},
            files=call.files,
        )


class PythonToolRunner:
    """A Python tool: its manifest, source and bytecode, run by the shared runtime."""

    kind = ToolKind.PYTHON

    def __init__(
        self, runtime: PythonRuntimeRunner, manifest: Manifest, grants_digest: str, source: str, code: bytes
    ) -> None:
        """`code` is what `PythonRuntimeRunner.compile_tool` made of `source` (which travels
        too, for tracebacks)."""
        self._runtime = runtime
        self._manifest = manifest
        self._grants_digest = grants_digest
        assert manifest.source is not None
        self._request = {
            "mode": "tool",
            "code": code,
            "source": source,
            "filename": manifest.source.name,
            "entry": manifest.entry,
        }

    def call(self, call: CallInput) -> CallResult:
        request = {**self._request, "args": dict(call.args)}
        return self._runtime.call(
            call.manifest(self._manifest), self._grants_digest, request, files=call.files
        )
