"""The pre-compile reader of a module's imports and exports (`_wasmparse`): the same answer
as Wasmtime's on every module we ship, and on any bytes a result or a ManifestError."""

from __future__ import annotations

from pathlib import Path

import pytest
import wasmtime
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wasmbox import ManifestError
from wasmbox._inspect import inspect_module, read_module_info, read_wasm
from wasmbox._wasmtime.engine import EngineSettings, make_engine

from .conftest import WAT

# surfaces the WAT modules do not cover: tables, globals, floats, references, imported memories,
# memory64, multi-value, re-exported imports, a custom section
EXTRA_WAT = {
    "surface_mix": """
        (module
          (import "env" "mem" (memory 2 10))
          (import "env" "g" (global $g (mut i64)))
          (import "env" "t" (table 1 funcref))
          (import "env" "f" (func $f (param f32 f64 externref) (result i32 i64)))
          (table $own 3 7 externref)
          (global $x f64 (f64.const 1))
          (func $h (result f32) (f32.const 0))
          (export "f" (func $f)) (export "h" (func $h)) (export "g" (global $g))
          (export "x" (global $x)) (export "t" (table $own)) (export "mem" (memory 0))
          (@custom "note" "hello"))
    """,
    "memory64": '(module (memory (export "m") i64 1 5))',
    "empty": "(module)",
}


def _modules() -> list[tuple[str, bytes]]:
    found = [(str(p.relative_to(WAT)), read_wasm(p)) for p in sorted(WAT.rglob("*.wat"))]
    build = WAT.parent / "build"
    found += [(p.name, p.read_bytes()) for p in sorted(build.glob("*.wasm"))]
    found += [(name, bytes(wasmtime.wat2wasm(text))) for name, text in EXTRA_WAT.items()]
    return found


def test_reader_agrees_with_wasmtime_on_every_module(built_examples: Path) -> None:
    engine = make_engine(EngineSettings())
    read = 0
    for name, wasm in _modules():
        info = read_module_info(wasm, name)
        if info is None:  # an encoding the reader leaves to Wasmtime
            continue
        try:
            module = wasmtime.Module(engine, wasm)
        except wasmtime.WasmtimeError:  # e.g. a table past the pooling allocator's limits
            continue
        read += 1
        assert info == inspect_module(module), name
    assert read >= len(_modules()) - 5  # all but a few GC / exception / oversized tests


def test_reader_refuses_components_and_garbage() -> None:
    component = b"\0asm\x0d\x00\x01\x00"
    for data in (b"", b"\0asm", component, b"\0asm\x01\x00\x00\x00\x07\x05\x01"):
        with pytest.raises(ManifestError, match="not a valid module"):
            read_module_info(data, "m.wasm")


def test_reader_refuses_an_index_past_the_function_space() -> None:
    # export section: one export "f", a function, index 0, with no function at all
    wasm = b"\0asm\x01\x00\x00\x00" + bytes([7, 5, 1, 1]) + b"f" + bytes([0, 0])
    with pytest.raises(ManifestError, match="out of range"):
        read_module_info(wasm, "m.wasm")


_ENGINE = make_engine(EngineSettings())
_SEEDS = [wasm for _, wasm in _modules() if 8 < len(wasm) < 4096]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_reader_on_random_bytes(data: bytes) -> None:
    for wasm in (data, b"\0asm\x01\x00\x00\x00" + data):
        try:
            read_module_info(wasm, "fuzz.wasm")
        except ManifestError:
            pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_SEEDS),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(0, 1 << 16),
)
def test_reader_on_mutated_modules(seed: bytes, edits: list[tuple[int, int]], cut: int) -> None:
    wasm = bytearray(seed)
    for where, value in edits:
        wasm[8 + where % max(1, len(wasm) - 8)] = value
    wasm = wasm[: max(8, len(wasm) - cut % 16)]
    try:
        info = read_module_info(bytes(wasm), "fuzz.wasm")
    except ManifestError:
        return
    # what the reader accepts and Wasmtime compiles, both describe alike (wasmtime-py aborts
    # the process when asked to describe a v128)
    if info is not None and not any("v128" in t for t in map(str, info.imports + info.exports)):
        try:
            module = wasmtime.Module(_ENGINE, bytes(wasm))
        except wasmtime.WasmtimeError:
            return
        assert info == inspect_module(module)


def test_reference_types_the_reader_does_not_name_matter_only_where_used() -> None:
    # type 0: () -> exnref, as a C++ program built with wasm exceptions has among its types
    header = b"\0asm\x01\x00\x00\x00" + bytes([1, 5, 1, 0x60, 0, 1, 0x69])
    info = read_module_info(header, "m.wasm")
    assert info is not None and info.imports == () and info.exports == ()
    imported = header + bytes([2, 7, 1, 1]) + b"m" + bytes([1]) + b"f" + bytes([0, 0])
    assert read_module_info(imported, "m.wasm") is None  # left to Wasmtime
