"""Runs JavaScript snippets and tools in the JavaScript runtime, one fresh instance of its
snapshot per call.

A call instantiates the snapshot (`build`: QuickJS-NG with its context made and the driver
installed; Wasmtime maps its memory copy-on-write) with the manifest's WASI world (preopens,
env, scratch /tmp; stdout and stderr captured up to the cap) and limits, seeds the context's
Math.random state from the host's randomness, fills the host-call table slot with the
trampoline below, and then, through the C API: evaluates the code (an async script only when
it contains `await`); when nothing is left to await, has the driver's `finish` make the reply
at once (a tool's entry called with its args in it); else has its `run` make it and runs
QuickJS's event loop until that settles (`_settle`: jobs, timers, the wait for the next timer
up to the deadline); reads the JSON reply; and checks the guard below C's stack. Nothing is
freed: the instance is dropped whole.

Host functions: `wasmbox.callHost(name, args)` in the guest calls the C function the build
registered with `JS_NewCFunction2` on the reserved table slot, which here is `_host_call` (a
raw host function, `_call.host_callback`'s guard): it reads the name and the JSON args back
through `JS_ToCStringLen2`, serves the call by the shared host-call policy
(`_call.serve_host_call`: granted names only, counted, capped, recorded) and returns the JSON
reply as a new JS string.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import struct
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime

from ... import _abi, _call, _outcome, _replay, _snapshot
from ..._call import CallInput, CallState
from ..._capabilities import scratch as _scratch
from ..._capabilities import wasi_files as _wasi_files
from ..._capabilities import wasi_poll as _wasi_poll
from ..._capabilities.hostfuncs import HostFunction
from ..._errors import ErrorKind
from ..._inspect import ToolKind
from ..._manifest import Limits, Manifest
from ..._outcome import Failure
from ..._results import CallResult
from ..._wasmtime import capi as _capi
from ..._wasmtime import store as _store
from ..._wasmtime.engine import EpochTicker
from . import build

# The guest's instance and the file forwarder of `_wasi_files`, one memory; the table holds the
# snapshot's 581 entries (QuickJS never grows it).
_STORE_LIMITS = {"table_elements": 10_000, "instances": 2, "tables": 2, "memories": 1}
_MASK = 0xFFFF_FFFF_FFFF_FFFF
_NO_INPUT = CallInput({})
_STACK_OVERFLOW = (
    "call stack exhausted: the script's frames ran past the end of the C stack (a deep recursion "
    "of functions with many locals); its result is dropped"
)
_MAX_NAME = 128  # host function names are short; a longer one is a guest playing games
_REPLY_KEYS = 64  # bytes of a reply's own keys, beyond the value the output cap counts
_OK_FRAME = '{"ok":}'  # what the driver's ok reply adds around the value's JSON
_EXPORTS = {
    name: _capi.ExportName(name)
    for name in (
        "malloc",
        "free",
        "JS_Eval",
        "JS_Call",
        "JS_GetException",
        "JS_IsJobPending",
        "js_std_loop_once",
        "JS_PromiseState",
        "JS_PromiseResult",
        "JS_ToCStringLen2",
        "JS_FreeCString",
        "JS_NewStringLen",
        "JS_FreeValue",
    )
}
_TABLE = _capi.ExportName(_snapshot.TABLE_EXPORT)
_INITIALIZE_ENVIRON = _capi.ExportName(build.INITIALIZE_ENVIRON_EXPORT)
I32, I64 = "i32", "i64"


@dataclass(frozen=True)
class Request:
    """What one call runs: `code` (a snippet, or a tool's source named `filename`) and, for a
    tool, the `entry` function to call with `args` (JSON)."""

    code: str
    filename: str | None = None
    entry: str | None = None
    args: str | None = None
    compile_only: bool = False  # only parse `code`: its SyntaxError, or the value None


class JavaScriptRunner:
    """The Sandbox's JavaScript runtime: the compiled snapshot and its linker. Thread-safe."""

    kind = ToolKind.JAVASCRIPT

    def __init__(
        self,
        engine: wasmtime.Engine,
        module: wasmtime.Module,
        runtime: build.JavaScriptRuntime,
        host_functions: Mapping[str, HostFunction],
        ticker: EpochTicker,
        scratch: _scratch.ScratchSpace,
    ) -> None:
        self._engine = engine
        self._runtime = runtime
        self._layout = runtime.layout
        self._host_functions = host_functions
        self._ticker = ticker
        self._scratch = scratch
        self._module = module
        self._files = _wasi_files.FileGuard(engine)  # caps open files, refuses symlinks
        self._pre = self._link()
        self.taped = self._link(taped=True)  # what taped calls and sessions' instances instantiate
        i32, i64 = wasmtime.ValType.i32(), wasmtime.ValType.i64()
        # JSValue (*)(JSContext *, JSValueConst this, int argc, JSValueConst *argv)
        self._host_type = wasmtime.FuncType([i32, i64, i32, i32], [i64])
        self._handle = _runners.add(weakref.ref(self))
        weakref.finalize(self, _runners.discard, self._handle)

    def _link(self, *, taped: bool = False) -> wasmtime.InstancePre:
        """The snapshot linked with WASI: our poll_oneoff (sleeps and timers end at the
        deadline) and file calls shadowing Wasmtime's; with `taped`, its clock read through
        the call's tape."""
        linker = wasmtime.Linker(self._engine)
        linker.define_wasi()
        linker.allow_shadowing = True
        _wasi_poll.define(linker)
        self._files.define(linker, taped=taped)
        linker.allow_shadowing = False
        return linker.instantiate_pre(self._module)

    def pre(self, state: CallState) -> wasmtime.InstancePre:
        """What a call with `state` instantiates: the taped InstancePre while it is taped."""
        return self._pre if state.tape is None else self.taped

    @property
    def folder(self) -> Path:
        """The folder the runtime was built in (its module and what its calls preopen)."""
        return self._runtime.module.parent

    @property
    def build_digest(self) -> str:
        """The digest of the runtime's build inputs."""
        return self._runtime.key

    def check_syntax(self, source: str, filename: str) -> CallResult:
        """Parse a tool's `source` (running none of it) under limits far above what parsing a
        real source costs: a `guest_error` with the SyntaxError, or success."""
        return self.call(_COMPILING, Request(source, filename, compile_only=True))

    exit_is_an_end = True  # std.exit(n) ends the script

    def call(
        self, manifest: Manifest, request: Request, files: Mapping[str, bytes] = _scratch.NO_FILES
    ) -> CallResult:
        """Run `request` in a fresh instance under `manifest`'s grants and limits, with `files`
        (checked input files) written under /tmp/in before it runs."""
        return _call.perform(self, manifest, request, self._ticker, files)

    def prepare(self, state: CallState, request: Request) -> _call.Instance:
        return _call.fresh_instance(
            self._engine,
            state.manifest,
            self._ticker,
            scratch=self._scratch.create,
            store_limits=_STORE_LIMITS,
        )

    def run(self, instance: _call.Instance, state: CallState, request: Request) -> Any:
        store = instance.store
        created = _capi.instantiate(self.pre(state), store)
        memory = instance.memory = _capi.MEMORY.get(store, created)
        state.ready()
        manifest = state.manifest
        return self._run(store, created, memory, request, manifest.limits.output, bool(manifest.env))

    def after(self, instance: _call.Instance, state: _call.CallState, ok: bool) -> None:
        memory = instance.memory
        if memory is not None:
            view = _capi.memory_view(_store.context(instance.store), memory)
            instance.peak_memory = view[1]
            if self._stack_overflowed(view):
                instance.overflowed = _STACK_OVERFLOW

    dispose = staticmethod(_store.close_store)

    def _stack_overflowed(self, view: tuple[int, int]) -> bool:
        """Whether C's stack ran past its end (over `build.GUARD`), from the memory's `view`
        (`capi.memory_view`): the guest's memory then holds whatever the overflow wrote, so its
        value or error is not to be trusted."""
        base, size = view
        guard = self._layout.stack_guard
        return (
            guard + len(build.GUARD) > size or ctypes.string_at(base + guard, len(build.GUARD)) != build.GUARD
        )

    def _run(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        memory: _capi.Extern,
        request: Request,
        cap: int,
        env: bool,
    ) -> Any:
        return self.evaluate(self.prepare_guest(store, instance, memory, env), request, cap)

    def prepare_guest(
        self, store: wasmtime.Store, instance: wasmtime.Instance, memory: _capi.Extern, env: bool
    ) -> _Guest:
        """A fresh instance made ready for code: its random state seeded, the call's
        environment read (`env`), the host-call slot filled."""
        layout = self._layout
        context = _store.context(store)
        if env:  # the C library read the set-up's empty environment: read the call's
            _capi.call_void(context, _INITIALIZE_ENVIRON.get(store, instance))
        # (after that call: the guest's own code ran in it, and a `_Guest` reads views of the
        # memory only between its own calls)
        guest = _Guest(context, _Exports(store, instance), memory)
        self.seed(guest, _call.current().tape)
        _capi.set_table_func(
            context, _TABLE.get(store, instance), layout.host_slot, self._host_type, _host_call, self._handle
        )
        return guest

    def seed(self, guest: _Guest, tape: _replay.Taped | None) -> None:
        """Seed the instance's Math.random state: from the host's randomness, through `tape`
        (kept or replayed) when the call is taped."""
        guest.write(self._layout.random_state, _seed() if tape is None else tape.random(8, _seed))

    def evaluate(self, guest: _Guest, request: Request, cap: int) -> Any:
        """Run `request` in a prepared instance: its value (a Failure for its error reply)."""
        layout = self._layout
        ctx = layout.context
        code = request.code.encode("utf-8", "surrogatepass")
        if len(code) < build.CODE_CAPACITY:  # (with its NUL)
            source = layout.code_buffer
            guest.write(source, code + b"\0")
        else:
            source = guest.copy(code + b"\0")
        name = (
            layout.input_name
            if request.filename is None
            else guest.copy(os.fsencode(request.filename) + b"\0")
        )
        # An async script (its completion a promise of {value}) only where it may await at top
        # level: a script evaluated as such costs about twice the fuel.
        is_async = b"await" in code
        flags = build.EVAL_ASYNC if is_async else build.EVAL_GLOBAL
        flags |= build.EVAL_COMPILE_ONLY if request.compile_only else 0
        evaluated = guest.call(
            "JS_Eval", (I32, ctx), (I32, source), (I32, len(code)), (I32, name), (I32, flags)
        )
        if request.compile_only and evaluated != layout.exception:
            return None
        if evaluated == layout.exception:  # it did not compile, or threw: the driver describes it
            reply = self._call_driver(guest, layout.fail, [guest.call("JS_GetException", (I32, ctx))])
        else:
            entry = []
            if request.entry is not None:
                entry = [guest.new_string(ctx, request.entry), guest.new_string(ctx, request.args or "{}")]
            # (a tool's entry runs in the driver: the jobs it leaves are seen only by `run`)
            if is_async or entry or guest.call("JS_IsJobPending", (I32, layout.runtime)):
                asynchronous = layout.true if is_async else layout.undefined
                reply = self._call_driver(guest, layout.run, [evaluated, asynchronous, *entry])
            else:
                reply = self._call_driver(guest, layout.finish, [evaluated, *entry])
            if reply >> 32 != layout.string_tag:  # a promise of the reply: something to await
                reply = self._settle(guest, reply)
        text, size = guest.string(
            ctx, reply, layout.length_cell, cap=cap + _REPLY_KEYS, cap_shown=cap, free=False
        )  # (the instance is dropped whole)
        try:
            value = _value(text)  # (a Failure for an error reply)
        except Failure as failure:
            message = failure.error.message
            if evaluated != layout.exception or not message.startswith("SyntaxError: "):
                raise
            where = request.filename if request.filename is not None else build.INPUT_NAME
            raise Failure(
                failure.error.kind, _Probe(guest, layout, name, flags).locate(request.code, where, message)
            ) from None
        _call.check_result_size(size - len(_OK_FRAME), cap)
        return value

    def _settle(self, guest: _Guest, promise: int) -> int:
        """The value `promise` (the driver's `run`) settles to, with QuickJS's event loop run
        from here: its jobs and due timers (`js_std_loop_once`), and the wait for the next
        timer on this thread, up to the deadline. A promise nothing is left to settle fails at
        once; a timer's exception nothing catches fails the call."""
        layout = self._layout
        ctx = layout.context
        while True:
            status = _signed(guest.call("js_std_loop_once", (I32, ctx)))
            state = guest.call("JS_PromiseState", (I32, ctx), (I64, promise))
            if state != _PENDING:  # fulfilled: the reply; rejected (`run` catches all): the reason
                result = guest.call("JS_PromiseResult", (I32, ctx), (I64, promise))
                return result if state == _FULFILLED else self._call_driver(guest, layout.fail, [result])
            if status == _LOOP_ERROR:  # a timer set with os.setTimeout threw
                return self._call_driver(guest, layout.fail, [guest.call("JS_GetException", (I32, ctx))])
            if status == _LOOP_IDLE or status > 0:  # before a wait: did a timer's callback throw?
                failed = self._call_driver(guest, layout.check, [])
                if failed >> 32 == layout.string_tag:
                    return failed
            if status == _LOOP_IDLE:
                raise Failure(
                    ErrorKind.GUEST_ERROR,
                    "the script awaits a promise that nothing is left to settle (no job, no timer)",
                )
            if status > 0:  # the next timer is due in `status` ms
                wait = status / 1000
                left = _call.current().deadline - time.perf_counter()
                if wait > left:
                    time.sleep(max(left, 0.0))
                    raise Failure(ErrorKind.TIMEOUT, "awaited a timer due after the deadline")
                time.sleep(wait)

    def _call_driver(self, guest: _Guest, function: int, argv: list[int]) -> int:
        layout = self._layout
        guest.write(layout.scratch, struct.pack(f"<{len(argv)}Q", *argv))
        result = guest.call(
            "JS_Call",
            (I32, layout.context),
            (I64, function),
            (I64, layout.undefined),
            (I32, len(argv)),
            (I32, layout.scratch),
        )
        self._check(guest, result)
        return result

    def _check(self, guest: _Guest, value: int) -> None:
        """A Failure when `value` is JS_EXCEPTION: the driver itself failed (e.g. out of memory)."""
        layout = self._layout
        if value != layout.exception:
            return
        thrown = guest.call("JS_GetException", (I32, layout.context))
        try:
            text, _ = guest.string(layout.context, thrown, layout.length_cell, cut=4096)
        except Failure:
            text = "(its exception cannot be read)"
        raise Failure(ErrorKind.GUEST_ERROR, f"the JavaScript runtime failed: {text}")

    def serve(self, caller: _capi.Caller, context: _capi.Context, values: _capi.Values) -> int:
        """The host-call C function: `callHost(name, argsJSON)` → the JSON reply (a JS string).
        Every call, a malformed one too, is served by `_call.serve_host_call` (counted, recorded)."""
        state = _call.current()
        layout = self._layout
        if state.abort is not None:
            return layout.undefined
        if state.exports is None:  # the same for every host call of this instance
            memory = _capi.MEMORY.from_caller(caller, _capi.EXTERN_MEMORY)
            funcs = {n: _capi.ExportName(n).from_caller(caller, _capi.EXTERN_FUNC) for n in _HOST_EXPORTS}
            if memory is None or any(f is None for f in funcs.values()):
                _call.abort(context, ErrorKind.BAD_RESPONSE, "the JavaScript runtime lacks an export")
                return layout.undefined
            state.exports = _Guest(context, funcs, memory)  # type: ignore[arg-type]
        guest: _Guest = state.exports
        guest.entered(context)
        ctx, argc, argv = (values[0].i32 & 0xFFFF_FFFF, values[2].i32, values[3].i32 & 0xFFFF_FFFF)
        name, packed, problem = "?", b"", None
        try:
            if ctx != layout.context or argc < 2:  # (our driver always sends a name and args)
                problem = "the host-call function takes a name and args"
            else:
                name_value, args_value = struct.unpack("<QQ", guest.read(argv, 16))
                name, _ = guest.string(ctx, name_value, layout.length_cell, cut=_MAX_NAME)
                request, _ = guest.string(ctx, args_value, layout.length_cell)
                try:
                    packed = _abi.pack(_well_formed(json.loads(request)))
                except (ValueError, TypeError, OverflowError, RecursionError):
                    problem = "the args are not JSON of plain values"
        except Failure as failure:
            problem = failure.error.message
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:  # e.g. out of fuel in JS_ToCStringLen2
            _call.abort(context, _outcome.from_trap(exc, state.manifest.limits).kind, str(exc))
            return layout.undefined
        granted = problem is None and name in state.manifest.host_functions
        function = self._host_functions.get(name) if granted else None
        served = _call.serve_host_call(context, name, packed, function, problem)
        if state.abort is not None:
            return layout.undefined
        try:
            return guest.new_string(ctx, _json_reply(served.payload))
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            _call.abort(context, _outcome.from_trap(exc, state.manifest.limits).kind, str(exc))
            return layout.undefined
        except Failure as failure:  # no memory left for the reply
            _call.abort(context, failure.error.kind, failure.error.message)
            return layout.undefined


_COMPILING = Manifest(
    name="compile",
    runtime="javascript",
    limits=Limits(fuel=2_000_000_000, memory=256 * 1024**2, timeout=10.0, output=1024**2),
)
_HOST_EXPORTS = ("malloc", "free", "JS_ToCStringLen2", "JS_FreeCString", "JS_NewStringLen")
# The runners the trampoline finds by the handle its function was made with, held weakly.
_runners: _capi.Handles[weakref.ref[JavaScriptRunner]] = _capi.Handles()


@_call.host_callback("javascript host call")
def _host_call(
    handle: int | None, caller: _capi.Caller, context: _capi.Context, values: _capi.Values, count: int
) -> int:
    ref = _runners.get(handle)
    runner = ref() if ref is not None else None
    if runner is None:  # the Sandbox holds its runner while a call runs: a bug of ours
        raise RuntimeError(f"no JavaScript runtime for handle {handle}")
    values[0].i64 = runner.serve(caller, context, values)
    return 0


class _Exports(dict[str, Any]):
    """An instance's function exports, each looked up when first called."""

    def __init__(self, store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        super().__init__()
        self.store = store
        self.instance = instance

    def __missing__(self, name: str) -> _capi.Extern:
        found = self[name] = _EXPORTS[name].get(self.store, self.instance)
        return found


class _Guest:
    """Raw calls into one instance (types checked by the build: the pinned module's exports).

    The memory's address and size are read once between two guest calls (`_view`): only the
    guest's code can grow its memory, so a view is forgotten as each call ends."""

    def __init__(
        self, context: _capi.Context, funcs: Mapping[str, _capi.Extern], memory: _capi.Extern
    ) -> None:
        self.context = context
        self.funcs = funcs
        self.memory = memory
        self._seen: tuple[int, int] | None = None

    def entered(self, context: _capi.Context) -> None:
        """Used again from a later host call of the same instance (whose guest has run since)."""
        self.context = context
        self._seen = None

    def _view(self) -> tuple[int, int]:
        """`capi.memory_view` of the memory, read once since the last guest call."""
        seen = self._seen
        if seen is None:
            seen = self._seen = _capi.memory_view(self.context, self.memory)
        return seen

    def call(self, name: str, *params: tuple[str, int]) -> int:
        """The function's one result, unsigned."""
        results = _RESULT_I64 if name in _RETURNS_VALUE else _RESULT_I32
        try:
            value = _capi.call_typed(self.context, self.funcs[name], params, results)[0]
        finally:
            self._seen = None  # (the guest may have grown its memory)
        return value & (_MASK if results is _RESULT_I64 else 0xFFFF_FFFF)

    def copy(self, data: bytes) -> int:
        """`data` in memory the guest's malloc gave; a `memory_limit` Failure when it has none."""
        pointer = self.call("malloc", (I32, len(data)))
        base, size = self._view()
        if pointer == 0 or pointer + len(data) > size:
            raise Failure(ErrorKind.MEMORY_LIMIT, f"no memory for {len(data)} bytes of input")
        ctypes.memmove(base + pointer, data, len(data))
        return pointer

    def write(self, address: int, data: bytes) -> None:
        base, size = self._view()
        if address + len(data) > size:
            raise Failure(ErrorKind.BAD_RESPONSE, "an address outside the guest's memory")
        ctypes.memmove(base + address, data, len(data))

    def read(self, address: int, size: int) -> bytes:
        base, now = self._view()
        if address + size > now:
            raise Failure(ErrorKind.BAD_RESPONSE, "an address outside the guest's memory")
        return ctypes.string_at(base + address, size)

    def new_string(self, ctx: int, text: str) -> int:
        data = text.encode("utf-8", "surrogatepass")
        pointer = self.copy(data or b"\0")
        value = self.call("JS_NewStringLen", (I32, ctx), (I32, pointer), (I32, len(data)))
        self.call("free", (I32, pointer))  # (QuickJS made its own copy)
        return value

    def string(
        self,
        ctx: int,
        value: int,
        cell: int,
        *,
        cut: int | None = None,
        cap: int | None = None,
        cap_shown: int | None = None,
        free: bool = True,
    ) -> tuple[str, int]:
        """A JS value as text, through JS_ToCStringLen2 (lone surrogates become U+FFFD), and its
        length in UTF-8 bytes: with `cut`, its first `cut` bytes and "..." if it is longer; with
        `cap`, an `output_limit` Failure (naming `cap_shown`, default `cap`) if it is longer.
        The C string is freed unless `free` is False."""
        pointer = self.call("JS_ToCStringLen2", (I32, ctx), (I32, cell), (I64, value), (I32, 0))
        if pointer == 0:
            raise Failure(ErrorKind.GUEST_ERROR, "a value could not be made text (out of memory?)")
        (length,) = struct.unpack("<I", self.read(cell, 4))
        try:
            if cap is not None and length > cap:
                _call.check_result_size(length, cap if cap_shown is None else cap_shown)
            shown = length if cut is None else min(length, cut)
            text = self.read(pointer, shown).decode("utf-8", "replace")
        finally:
            if free:
                self.call("JS_FreeCString", (I32, ctx), (I32, pointer))
        return text + ("..." if shown < length else ""), length


# (the others return an i32 or nothing)
_RESULT_I32, _RESULT_I64 = (I32,), (I64,)
_RETURNS_VALUE = {"JS_Eval", "JS_Call", "JS_GetException", "JS_PromiseResult", "JS_NewStringLen"}
_PENDING, _FULFILLED = 0, 1  # JSPromiseStateEnum
_LOOP_IDLE, _LOOP_ERROR = -1, -2  # js_std_loop_once: else 0 (more to run) or the next timer's ms


def _signed(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def _seed() -> bytes:
    """Eight random bytes, never all zero (xorshift's one stuck state)."""
    while True:
        seed = os.urandom(8)
        if any(seed):
            return seed


_FRAME = re.compile(r"^    at (?P<file>.+):(?P<line>\d+):(?P<column>\d+)$", re.MULTILINE)
_QUOTED = re.compile(r"'([^']*)'$")  # the token a SyntaxError's message ends by quoting
PROBE_FUEL = 500_000_000  # what finding a SyntaxError's column may cost, the call's own fuel aside
PROBE_TIMES = 16  # ... and at most this many times the fuel the failing call had used
PROBE_MAX = 64 * 1024  # bytes of source up to the error's line past which no column is looked for


class _Probe:
    """Where a SyntaxError really is. QuickJS-NG reports the right line but the column of the
    statement (or expression) the parser was in, not of the token it choked on; so the code up
    to growing prefixes of that line is compiled (compile-only: nothing runs) in the failed
    call's instance, bisecting for the shortest prefix that fails with the same message: the
    token that ends it is the culprit. About log2(line length) + 3 compiles, only on this error
    path, under a fuel budget of their own (`PROBE_FUEL`, and no more than `PROBE_TIMES` the
    fuel the call had used: what a guest makes the host spend stays a multiple of its own; the
    call's fuel is put back after) and the call's deadline; any failure of theirs leaves
    QuickJS's column standing."""

    def __init__(self, guest: _Guest, layout: build.Layout, name: int, flags: int) -> None:
        self._guest = guest
        self._layout = layout
        self._name = name
        self._flags = flags | build.EVAL_COMPILE_ONLY

    def locate(self, code: str, where: str, message: str) -> str:
        """`message` (the driver's description of the SyntaxError compiling `code`, named `where`)
        with its first frame's column made the offending token's; else `message` unchanged."""
        frame = _FRAME.search(message)
        if frame is None or frame["file"] != where:
            return message
        number, lines = int(frame["line"]), code.split("\n")
        if not 1 <= number <= len(lines):
            return message
        head, line = "".join(f"{text}\n" for text in lines[: number - 1]), lines[number - 1]
        if len(head.encode("utf-8", "surrogatepass")) + len(line) * 4 > PROBE_MAX:
            return message
        first = message.split("\n", 1)[0]
        context = self._guest.context
        fuel = _store.fuel_left(context)
        used = _call.current().manifest.limits.fuel - fuel
        _store.set_fuel(context, min(PROBE_FUEL, PROBE_TIMES * used))
        try:
            column = self._column(code, head, line, first)
        except (Failure, wasmtime.Trap, wasmtime.WasmtimeError):
            column = None  # out of the probes' fuel, past the deadline, out of memory: QuickJS's stands
        finally:
            _store.set_fuel(context, fuel)
        if column is None:
            return message
        return f"{message[: frame.start('column')]}{column}{message[frame.end('column') :]}"

    def _column(self, code: str, head: str, line: str, first: str) -> int | None:
        """The 1-based column on `line` of the token whose prefix first fails as `first`;
        None when the code does not fail so when compiled (it threw a SyntaxError when run),
        or the line alone does not decide it (the whole line fails so, or no prefix of it
        does)."""

        def fails(k: int) -> bool:
            return self._error(head + line[:k]) == first

        if self._error(code) != first or fails(0) or not fails(len(line)):
            return None
        good, bad = 0, len(line)  # the prefix of `good` characters does not fail so; of `bad`, does
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (good, middle) if fails(middle) else (middle, bad)
        # the last character of the shortest failing prefix ends the token: back to its start,
        # by the token the message quotes ("Unexpected token '=>'"), else over a word's characters
        quoted = _QUOTED.search(first)
        if quoted is not None and quoted[1] and line[:bad].endswith(quoted[1]):
            return bad - len(quoted[1]) + 1
        start = bad - 1
        while start > 0 and _is_word(line[start]) and _is_word(line[start - 1]):
            start -= 1
        return start + 1

    def _error(self, code: str) -> str | None:
        """The first line of the error compiling `code` (nothing runs), or None if it compiles."""
        guest, layout = self._guest, self._layout
        data = code.encode("utf-8", "surrogatepass")
        source = guest.copy(data + b"\0")
        try:
            compiled = guest.call(
                "JS_Eval",
                (I32, layout.context),
                (I32, source),
                (I32, len(data)),
                (I32, self._name),
                (I32, self._flags),
            )
        finally:
            guest.call("free", (I32, source))
        if compiled != layout.exception:
            guest.call("JS_FreeValue", (I32, layout.context), (I64, compiled))
            return None
        reply = self._call_driver(guest.call("JS_GetException", (I32, layout.context)))
        text, _ = guest.string(layout.context, reply, layout.length_cell, cut=4096)
        guest.call("JS_FreeValue", (I32, layout.context), (I64, reply))
        try:
            described = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            return None
        return described.split("\n", 1)[0] if isinstance(described, str) else None

    def _call_driver(self, exception: int) -> int:
        layout = self._layout
        self._guest.write(layout.scratch, struct.pack("<Q", exception))
        return self._guest.call(
            "JS_Call",
            (I32, layout.context),
            (I64, layout.fail),
            (I64, layout.undefined),
            (I32, 1),
            (I32, layout.scratch),
        )


def _is_word(character: str) -> bool:
    """Part of an identifier or a number (a token the parser may take before it is whole)."""
    return character.isalnum() or character in "_$"


def _value(text: str) -> Any:
    """The call's value from the driver's JSON reply; a Failure for its error reply."""
    try:
        reply = json.loads(text)
        if _SURROGATE_ESCAPE.search(text):  # JSON.stringify escapes a lone surrogate; Python's keeps it
            reply = _well_formed(reply)
    except RecursionError:
        raise Failure(ErrorKind.BAD_RESPONSE, "the result is nested deeper than the host reads") from None
    except ValueError:
        raise Failure(ErrorKind.BAD_RESPONSE, "the JavaScript driver's reply is not JSON") from None
    if isinstance(reply, dict) and "ok" in reply:
        return reply["ok"]
    if isinstance(reply, dict) and isinstance(reply.get("error"), str):
        raise Failure(ErrorKind.GUEST_ERROR, reply["error"])  # (the driver claims no other kind)
    raise Failure(ErrorKind.BAD_RESPONSE, "the JavaScript driver's reply is not an ok/error map")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _well_formed(value: Any) -> Any:
    """`value` with each lone surrogate in its strings made U+FFFD (a str must be UTF-8 to be
    sent anywhere: JSON, MessagePack, a model)."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_well_formed(item) for item in value]
    if isinstance(value, dict):
        return {_well_formed(key): _well_formed(item) for key, item in value.items()}
    return value


def _json_reply(payload: bytes) -> str:
    """A host function's MessagePack reply as JSON for the guest (bytes as base64 text)."""
    decoded = _abi.unpack(payload)

    def plain(value: object) -> object:
        if isinstance(value, bytes):
            return base64.b64encode(value).decode()
        raise TypeError(f"{type(value).__name__} is not JSON")

    try:
        return json.dumps(decoded, default=plain, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        return json.dumps({"error": f"the host function's value cannot be sent as JSON: {exc}"})


class JavaScriptSnippetRunner:
    """A `run_javascript` grant set: each call runs its args' `code`."""

    kind = ToolKind.JAVASCRIPT

    def __init__(self, runtime: JavaScriptRunner, grants: Manifest) -> None:
        self._runtime = runtime
        self._grants = grants

    def call(self, call: CallInput) -> CallResult:
        # the Tool checked the args against `{"code": str}`
        return self._runtime.call(call.manifest(self._grants), Request(call.args["code"]), call.files)


class JavaScriptToolRunner:
    """A JavaScript tool (manifest `runtime = "javascript"`): its source, then its entry(args)."""

    kind = ToolKind.JAVASCRIPT

    def __init__(self, runtime: JavaScriptRunner, manifest: Manifest, source: str) -> None:
        assert manifest.source is not None
        self._runtime = runtime
        self._manifest = manifest
        self._source = source
        self._filename = manifest.source.name
        self._entry = manifest.entry

    def call(self, call: CallInput) -> CallResult:
        try:
            args = json.dumps(dict(call.args), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            return CallResult.failed(
                self._manifest.name, ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}"
            )
        request = Request(self._source, self._filename, self._entry, args)
        return self._runtime.call(call.manifest(self._manifest), request, call.files)
