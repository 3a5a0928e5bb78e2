"""`wasmbox._snapshot`: a module's set-up run once and written into a new module (memory image,
mutable globals, no start function), table slots reserved for the host, and a function of the
name section exported. Each case is a tiny WAT module, so what the snapshot must keep is known."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import wasmtime

from wasmbox import WasmboxError
from wasmbox._snapshot import _MEMORY_EXPORT as INSTRUMENTED_MEMORY
from wasmbox._snapshot import _TABLE_EXPORT as INSTRUMENTED_TABLE
from wasmbox._snapshot import (
    TABLE_EXPORT,
    SnapshotError,
    _segments,
    export_named_function,
    snapshot,
)

Init = Callable[[wasmtime.Store, wasmtime.Instance], None]


def compile_wat(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))


@pytest.fixture(scope="module")
def engine() -> wasmtime.Engine:
    return wasmtime.Engine()


def nothing(linker: wasmtime.Linker, store: wasmtime.Store, module: wasmtime.Module) -> None:
    """A `define` for modules without imports."""


def call_export(name: str, *args: int) -> Init:
    """An `init` that calls the instance's export `name`."""

    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        func = instance.exports(store)[name]
        assert isinstance(func, wasmtime.Func)
        func(store, *args)

    return init


def instantiate(
    engine: wasmtime.Engine, wasm: bytes, imports: dict[str, wasmtime.Func] | None = None
) -> tuple[wasmtime.Store, wasmtime.Instance]:
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    for name, func in (imports or {}).items():
        linker.define(store, "env", name, func)
    return store, linker.instantiate(store, wasmtime.Module(engine, wasm))


def export(store: wasmtime.Store, instance: wasmtime.Instance, name: str) -> wasmtime.Func:
    func = instance.exports(store)[name]
    assert isinstance(func, wasmtime.Func)
    return func


def memory_of(store: wasmtime.Store, instance: wasmtime.Instance, name: str = "memory") -> wasmtime.Memory:
    memory = instance.exports(store)[name]
    assert isinstance(memory, wasmtime.Memory)
    return memory


def table_of(store: wasmtime.Store, instance: wasmtime.Instance, name: str) -> wasmtime.Table:
    table = instance.exports(store)[name]
    assert isinstance(table, wasmtime.Table)
    return table


# -- memory and globals ---------------------------------------------------------------------

STATEFUL = """
(module
  (memory (export "memory") 1 4)
  (data (i32.const 16) "hello")
  (global $counter (mut i32) (i32.const 0))
  (global $negative (mut i32) (i32.const 0))
  (global $wide (mut i64) (i64.const 0))
  (global $single (mut f32) (f32.const 0))
  (global $double (mut f64) (f64.const 0))
  (global $fixed i32 (i32.const 1234))
  (func (export "init")
    (i32.store8 (i32.const 16) (i32.const 0x4a))      ;; "hello" -> "Jello"
    (drop (memory.grow (i32.const 1)))
    (i32.store (i32.const 70000) (i32.const 0x01020304))  ;; in the page it grew
    (global.set $counter (i32.add (global.get $counter) (i32.const 7)))
    (global.set $negative (i32.const -5))
    (global.set $wide (i64.const 0x7fffffffffff0001))
    (global.set $single (f32.const 1.5))
    (global.set $double (f64.const -2.25)))
  (func (export "counter") (result i32) global.get $counter)
  (func (export "negative") (result i32) global.get $negative)
  (func (export "wide") (result i64) global.get $wide)
  (func (export "single") (result f32) global.get $single)
  (func (export "double") (result f64) global.get $double)
  (func (export "fixed") (result i32) global.get $fixed)
  (func (export "load") (param i32) (result i32) (i32.load (local.get 0)))
)
"""


def test_snapshot_keeps_memory_written_and_grown_by_init(engine: wasmtime.Engine) -> None:
    wasm = snapshot(engine, compile_wat(STATEFUL), nothing, call_export("init"))
    store, instance = instantiate(engine, wasm)
    memory = memory_of(store, instance)
    assert memory.size(store) == 2  # the page init grew is part of the image
    assert bytes(memory.read(store, 16, 21)) == b"Jello"
    assert export(store, instance, "load")(store, 70000) == 0x01020304


def test_snapshot_keeps_the_memory_image_byte_for_byte(engine: wasmtime.Engine) -> None:
    seen: list[bytes] = []
    wat = """
    (module
      (memory (export "memory") 2)
      (func (export "init")
        (local $i i32)
        (loop $fill  ;; a byte every 97 bytes, zero runs both longer and shorter than a segment's gap
          (i32.store8 (local.get $i) (i32.add (i32.rem_u (local.get $i) (i32.const 251)) (i32.const 1)))
          (local.set $i (i32.add (local.get $i) (i32.const 97)))
          (br_if $fill (i32.lt_u (local.get $i) (i32.const 131000))))
        (i32.store8 (i32.const 131071) (i32.const 9))))  ;; the very last byte
    """

    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        call_export("init")(store, instance)
        memory = memory_of(store, instance, INSTRUMENTED_MEMORY)
        seen.append(bytes(memory.read(store, 0, memory.data_len(store))))

    wasm = snapshot(engine, compile_wat(wat), nothing, init)
    store, instance = instantiate(engine, wasm)
    memory = memory_of(store, instance)
    assert bytes(memory.read(store, 0, memory.data_len(store))) == seen[0]


def test_snapshot_image_is_exact_when_segments_are_merged(
    engine: wasmtime.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_SEGMENTS stretches of non-zero bytes, the nearest are joined: the image stays exact."""
    monkeypatch.setattr("wasmbox._snapshot.MAX_SEGMENTS", 3)
    image = bytearray(8192)
    for start in range(0, 8000, 500):  # 16 stretches, with zero runs of 490 bytes between them
        image[start : start + 10] = bytes(range(1, 11))
    assert len(_segments(bytes(image))) == 3
    assert len(_segments(bytes(image[:1010]))) == 3  # (fewer stretches than the cap: not joined)

    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        memory_of(store, instance, INSTRUMENTED_MEMORY).write(store, bytes(image), 0)

    wasm = snapshot(engine, compile_wat('(module (memory (export "memory") 1) (func))'), nothing, init)
    store, instance = instantiate(engine, wasm)
    assert bytes(memory_of(store, instance).read(store, 0, 8192)) == bytes(image)


def test_snapshot_keeps_the_memory_of_a_module_without_functions(engine: wasmtime.Engine) -> None:
    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        memory_of(store, instance, INSTRUMENTED_MEMORY).write(store, b"set up by the host", 0)

    wasm = snapshot(engine, compile_wat('(module (memory (export "memory") 1))'), nothing, init)
    store, instance = instantiate(engine, wasm)
    assert bytes(memory_of(store, instance).read(store, 0, 18)) == b"set up by the host"


def test_segments_skip_long_zero_runs_and_keep_short_ones() -> None:
    image = b"\0" * 10 + b"ab" + b"\0" * 8 + b"cd" + b"\0" * 200 + b"ef" + b"\0" * 30
    assert _segments(image) == [(10, b"ab" + b"\0" * 8 + b"cd"), (222, b"ef")]
    assert _segments(bytes(100)) == []


def test_snapshot_keeps_mutable_globals_as_init_left_them(engine: wasmtime.Engine) -> None:
    wasm = snapshot(engine, compile_wat(STATEFUL), nothing, call_export("init"))
    store, instance = instantiate(engine, wasm)
    assert export(store, instance, "counter")(store) == 7
    assert export(store, instance, "negative")(store) == -5
    assert export(store, instance, "wide")(store) == 0x7FFFFFFFFFFF0001
    assert export(store, instance, "single")(store) == 1.5
    assert export(store, instance, "double")(store) == -2.25
    assert export(store, instance, "fixed")(store) == 1234


def test_snapshot_instances_are_independent_copies(engine: wasmtime.Engine) -> None:
    """Each instance of the snapshot starts from the image, not from what another one did."""
    wasm = snapshot(engine, compile_wat(STATEFUL), nothing, call_export("init"))
    store, first = instantiate(engine, wasm)
    export(store, first, "init")(store)  # a second init in this instance only
    assert export(store, first, "counter")(store) == 14
    store2, second = instantiate(engine, wasm)
    assert export(store2, second, "counter")(store2) == 7


def test_snapshot_drops_the_start_function(engine: wasmtime.Engine) -> None:
    wat = """
    (module
      (memory (export "memory") 1)
      (global $runs (mut i32) (i32.const 0))
      (func $start
        (global.set $runs (i32.add (global.get $runs) (i32.const 1)))
        (i32.store (i32.const 0) (global.get $runs)))
      (start $start)
      (func (export "runs") (result i32) global.get $runs))
    """
    wasm = snapshot(engine, compile_wat(wat), nothing, lambda store, instance: None)
    store, instance = instantiate(engine, wasm)
    assert export(store, instance, "runs")(store) == 1  # ran once, in the set-up; not again
    assert bytes(memory_of(store, instance).read(store, 0, 4)) == b"\x01\0\0\0"


def test_snapshot_keeps_passive_data_segments_usable(engine: wasmtime.Engine) -> None:
    wat = """
    (module
      (memory (export "memory") 1)
      (data (i32.const 0) "active")
      (data $later "passive")
      (func (export "copy") (memory.init $later (i32.const 100) (i32.const 0) (i32.const 7))))
    """
    wasm = snapshot(engine, compile_wat(wat), nothing, lambda store, instance: None)
    store, instance = instantiate(engine, wasm)
    memory = memory_of(store, instance)
    assert bytes(memory.read(store, 0, 6)) == b"active"
    assert bytes(memory.read(store, 100, 107)) == bytes(7)  # not copied yet
    export(store, instance, "copy")(store)
    assert bytes(memory.read(store, 100, 107)) == b"passive"


def test_snapshot_gives_init_the_imports_define_makes(engine: wasmtime.Engine) -> None:
    wat = """
    (module
      (import "env" "seed" (func $seed (result i32)))
      (memory (export "memory") 1)
      (func (export "init") (i32.store (i32.const 8) (call $seed)))
      (func (export "load") (param i32) (result i32) (i32.load (local.get 0))))
    """

    def define(linker: wasmtime.Linker, store: wasmtime.Store, module: wasmtime.Module) -> None:
        linker.define_func("env", "seed", wasmtime.FuncType([], [wasmtime.ValType.i32()]), lambda: 4242)

    wasm = snapshot(engine, compile_wat(wat), define, call_export("init"))
    # the snapshot still imports `seed`; an instance of it defines its own
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_func("env", "seed", wasmtime.FuncType([], [wasmtime.ValType.i32()]), lambda: 0)
    instance = linker.instantiate(store, wasmtime.Module(engine, wasm))
    assert export(store, instance, "load")(store, 8) == 4242


def test_what_init_raises_propagates(engine: wasmtime.Engine) -> None:
    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        raise LookupError("set-up failed")

    with pytest.raises(LookupError, match="set-up failed"):
        snapshot(engine, compile_wat(STATEFUL), nothing, init)


# -- what cannot be snapshotted ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("wat", "reason"),
    [
        ('(module (import "env" "memory" (memory 1)))', "memory"),
        ('(module (import "env" "g" (global (mut i32))) (memory 1))', "imports a memory or a global"),
        ('(module (import "env" "g" (global i32)) (memory 1))', "imports a memory or a global"),
        ("(module (memory 1) (memory 1))", "more than one memory"),
        ("(module (func))", "defines no memory"),
        ("(module (memory i64 1))", "64-bit"),
        ("(module (memory 1) (global (mut externref) (ref.null extern)))", "mutable global"),
    ],
    ids=["imported-memory", "imported-mutable-global", "imported-global", "two-memories", "no-memory",
         "memory64", "reference-global"],
)  # fmt: skip
def test_unsound_modules_are_refused(engine: wasmtime.Engine, wat: str, reason: str) -> None:
    ran: list[bool] = []
    with pytest.raises(SnapshotError, match=reason):
        snapshot(engine, compile_wat(wat), nothing, lambda store, instance: ran.append(True))
    assert ran == []  # refused before any set-up ran


@pytest.mark.parametrize(
    "wasm",
    [b"", b"not wasm at all", b"\0asm\x02\0\0\0", b"\0asm\x01\0\0\0\x05\x10\x01"],
    ids=["empty", "text", "bad-version", "cut-section"],
)
def test_malformed_modules_are_a_snapshot_error(engine: wasmtime.Engine, wasm: bytes) -> None:
    with pytest.raises(SnapshotError):
        snapshot(engine, wasm, nothing, lambda store, instance: None)


def test_snapshot_error_is_a_wasmbox_error() -> None:
    assert issubclass(SnapshotError, WasmboxError)


# -- table slots ------------------------------------------------------------------------------

TABLED = """
(module
  (type $answer (func (result i32)))
  (memory (export "memory") 1)
  (table 2 funcref)
  (elem (i32.const 0) $one $two)
  (func $one (result i32) i32.const 1)
  (func $two (result i32) i32.const 2)
  (func (export "call") (param i32) (result i32) (call_indirect (type $answer) (local.get 0))))
"""


def test_table_slots_adds_null_entries_at_the_end_and_exports_the_table(engine: wasmtime.Engine) -> None:
    sizes: list[int] = []

    def init(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        sizes.append(table_of(store, instance, INSTRUMENTED_TABLE).size(store))  # init sees the slots

    wasm = snapshot(engine, compile_wat(TABLED), nothing, init, table_slots=3)
    assert sizes == [5]
    store, instance = instantiate(engine, wasm)
    table = table_of(store, instance, TABLE_EXPORT)
    assert table.size(store) == 5
    functions = [isinstance(table.get(store, i), wasmtime.Func) for i in range(5)]
    assert functions == [True, True, False, False, False]  # the three new slots are null
    call = export(store, instance, "call")
    assert (call(store, 0), call(store, 1)) == (1, 2)  # the elements stay where they were
    with pytest.raises(wasmtime.Trap):
        call(store, 4)  # a null slot, until the host fills it


def test_a_reserved_slot_can_hold_a_host_function(engine: wasmtime.Engine) -> None:
    wasm = snapshot(engine, compile_wat(TABLED), nothing, lambda store, instance: None, table_slots=1)
    store, instance = instantiate(engine, wasm)
    host = wasmtime.Func(store, wasmtime.FuncType([], [wasmtime.ValType.i32()]), lambda: 99)
    table_of(store, instance, TABLE_EXPORT).set(store, 2, host)
    assert export(store, instance, "call")(store, 2) == 99


def test_table_slots_raise_a_table_maximum_by_as_many(engine: wasmtime.Engine) -> None:
    wat = '(module (memory 1) (table (export "t") 1 3 funcref))'
    wasm = snapshot(engine, compile_wat(wat), nothing, lambda store, instance: None, table_slots=2)
    store, instance = instantiate(engine, wasm)
    table = table_of(store, instance, "t")
    assert table.size(store) == 3
    assert (table.type(store).limits.min, table.type(store).limits.max) == (3, 5)


def test_without_table_slots_the_table_is_not_exported(engine: wasmtime.Engine) -> None:
    wasm = snapshot(engine, compile_wat(TABLED), nothing, lambda store, instance: None)
    store, instance = instantiate(engine, wasm)
    assert TABLE_EXPORT not in instance.exports(store)
    assert INSTRUMENTED_TABLE not in instance.exports(store)  # the set-up's own exports are gone too


@pytest.mark.parametrize(
    "wat",
    [
        "(module (memory 1))",
        "(module (memory 1) (table 1 funcref) (table 1 funcref))",
        '(module (import "env" "t" (table 1 funcref)) (memory 1))',
        "(module (memory 1) (table 1 externref))",
    ],
    ids=["no-table", "two-tables", "imported-table", "externref-table"],
)
def test_table_slots_need_one_funcref_table_of_the_modules_own(engine: wasmtime.Engine, wat: str) -> None:
    with pytest.raises(SnapshotError, match="table"):
        snapshot(engine, compile_wat(wat), nothing, lambda store, instance: None, table_slots=1)


def test_a_table_grown_by_the_set_up_is_refused(engine: wasmtime.Engine) -> None:
    wat = """
    (module
      (memory 1)
      (table 1 funcref)
      (func (export "init") (drop (table.grow (ref.null func) (i32.const 1)))))
    """
    with pytest.raises(SnapshotError, match="grew a table"):
        snapshot(engine, compile_wat(wat), nothing, call_export("init"))


# -- export_named_function --------------------------------------------------------------------


def test_export_named_function_exports_a_function_from_the_name_section(engine: wasmtime.Engine) -> None:
    wat = """
    (module
      (func $hidden (result i32) i32.const 42)
      (func (export "visible") (result i32) i32.const 1))
    """
    wasm = export_named_function(compile_wat(wat), "hidden", "exposed")
    store, instance = instantiate(engine, wasm)
    assert export(store, instance, "exposed")(store) == 42
    assert export(store, instance, "visible")(store) == 1  # the module's own exports stay


def test_export_named_function_counts_imported_functions_in_its_index(engine: wasmtime.Engine) -> None:
    wat = """
    (module
      (import "env" "first" (func $first (result i32)))
      (func $second (result i32) i32.const 2)
      (func (export "third") (result i32) i32.const 3))
    """
    wasm = export_named_function(compile_wat(wat), "second", "exposed")
    store = wasmtime.Store(engine)
    imported = wasmtime.Func(store, wasmtime.FuncType([], [wasmtime.ValType.i32()]), lambda: 1)
    linker = wasmtime.Linker(engine)
    linker.define(store, "env", "first", imported)
    instance = linker.instantiate(store, wasmtime.Module(engine, wasm))
    assert export(store, instance, "exposed")(store) == 2


def test_export_named_function_refuses_an_unknown_name() -> None:
    wasm = compile_wat('(module (func $known) (export "k" (func $known)))')
    with pytest.raises(SnapshotError, match="no function unknown"):
        export_named_function(wasm, "unknown", "exposed")


def test_export_named_function_refuses_a_module_without_names() -> None:
    wasm = compile_wat('(module (func (export "k")))')  # no $name: no name section entry
    with pytest.raises(SnapshotError, match="name section"):
        export_named_function(wasm, "k", "exposed")


def test_export_named_function_refuses_a_malformed_module() -> None:
    with pytest.raises(SnapshotError, match="not a valid module"):
        export_named_function(b"\0asm\x01\0\0\0\x07\xff\xff", "f", "exposed")


def test_export_named_function_exports_from_a_module_without_exports(engine: wasmtime.Engine) -> None:
    wasm = export_named_function(
        compile_wat("(module (func $only (result i32) i32.const 7))"), "only", "exposed"
    )
    store, instance = instantiate(engine, wasm)
    assert export(store, instance, "exposed")(store) == 7


def test_export_named_function_then_snapshot(engine: wasmtime.Engine) -> None:
    """What the JavaScript build does: a C library function exported first, called after the
    snapshot (the set-up's state kept)."""
    wat = """
    (module
      (memory (export "memory") 1)
      (global $env (mut i32) (i32.const 0))
      (func $reload (global.set $env (i32.add (global.get $env) (i32.const 100))))
      (func (export "init") (global.set $env (i32.const 5)))
      (func (export "env") (result i32) global.get $env))
    """
    wasm = export_named_function(compile_wat(wat), "reload", "wasmbox.reload")
    wasm = snapshot(engine, wasm, nothing, call_export("init"))
    store, instance = instantiate(engine, wasm)
    assert export(store, instance, "env")(store) == 5
    export(store, instance, "wasmbox.reload")(store)
    assert export(store, instance, "env")(store) == 105
