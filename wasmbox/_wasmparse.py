"""A core module's imports and exports, read from its binary without compiling it.

Reads the type (1), import (2), function (3), memory (5) and export (7) sections; every other
section is skipped by its length. Every read is bounds-checked and every count is bounded by the
bytes left, so any input ends in a result or a ManifestError, in time linear in its size.
Encodings this reader does not describe (GC type definitions, an import or export whose type
has a reference type other than funcref and externref, custom page sizes, tags) make
`read_surface` return None: the caller then asks Wasmtime, which compiles the module.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import ManifestError

MAGIC = b"\0asm"  # the binary format's first four bytes
_CORE_VERSION = b"\x01\x00\x00\x00"
_VALTYPES = {
    0x7F: "i32",
    0x7E: "i64",
    0x7D: "f32",
    0x7C: "f64",
    0x7B: "v128",
    0x70: "funcref",
    0x6F: "anyref",  # externref, as wasmtime-py names it
}
_SECTIONS_READ = {1, 2, 3, 5, 7}
_UNNAMED = "?"


class _Unsupported(Exception):
    """A well-formed encoding this reader does not describe."""


@dataclass(frozen=True)
class Surface:
    """(module, name, type) per import and (name, type) per export, in module order, each type
    spelled as `_inspect` spells Wasmtime's: "(i32, i32) -> i64", "memory1..", "global", "table"."""

    imports: tuple[tuple[str, str, str], ...]
    exports: tuple[tuple[str, str], ...]


class _Reader:
    def __init__(self, data: bytes | memoryview, start: int = 0, end: int | None = None) -> None:
        self.data = data
        self.pos = start
        self.end = len(data) if end is None else end

    def left(self) -> int:
        return self.end - self.pos

    def byte(self) -> int:
        if self.pos >= self.end:
            raise _Malformed("unexpected end")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def take(self, size: int) -> bytes:
        if size > self.left():
            raise _Malformed("unexpected end")
        chunk = bytes(self.data[self.pos : self.pos + size])
        self.pos += size
        return chunk

    def uleb(self, bits: int = 32) -> int:
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
            if shift >= bits:
                raise _Malformed("integer too long")
        if result >> bits:
            raise _Malformed("integer too large")
        return result

    def count(self) -> int:
        """A vector's length: each element takes at least one byte, so no more than are left."""
        n = self.uleb()
        if n > self.left():
            raise _Malformed("vector longer than its section")
        return n

    def name(self) -> str:
        raw = self.take(self.uleb())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _Malformed("name is not UTF-8") from None


class _Malformed(Exception):
    pass


def read_surface(wasm: bytes, origin: str) -> Surface | None:
    """The imports and exports of the core module `wasm`; None when it uses encodings this
    reader does not describe. Raises ManifestError (naming `origin`) for a malformed module or
    a component."""
    try:
        return _read(wasm)
    except _Unsupported:
        return None
    except _Malformed as exc:
        raise ManifestError(f"{origin}: module: not a valid module: {exc} (read before compiling)") from None


def _read(wasm: bytes) -> Surface:  # noqa: C901 - a branch per section of the binary format
    if len(wasm) < 8 or wasm[:4] != MAGIC:
        raise _Malformed("no wasm magic number")
    if wasm[4:8] != _CORE_VERSION:
        raise _Malformed("not a core module of version 1 (a component?)")
    view = memoryview(wasm)
    reader = _Reader(view, 8)
    types: list[str] = []
    funcs: list[int] = []  # type index per function, imported ones first
    memories: list[str] = []
    imports: list[tuple[str, str, str]] = []
    exports: list[tuple[str, str]] = []
    seen: set[int] = set()
    last = 0  # the sections read come in this order in a valid module: 1, 2, 3, 5, 7
    while reader.left():
        section = reader.byte()
        size = reader.uleb()
        if size > reader.left():
            raise _Malformed(f"section {section} runs past the end")
        body = _Reader(view, reader.pos, reader.pos + size)
        reader.pos += size
        if section == 0:
            continue
        if section in seen:
            raise _Malformed(f"section {section} appears twice")
        seen.add(section)
        if section not in _SECTIONS_READ:
            continue
        if section < last:
            raise _Malformed(f"section {section} out of order")
        last = section
        if section == 1:
            types = [_functype(body) for _ in range(body.count())]
        elif section == 2:
            for _ in range(body.count()):
                module, name = body.name(), body.name()
                imports.append((module, name, _import_type(body, types, funcs, memories)))
        elif section == 3:
            for _ in range(body.count()):
                funcs.append(_type_index(body, types))
        elif section == 5:
            memories.extend(_memtype(body) for _ in range(body.count()))
        else:
            for _ in range(body.count()):
                exports.append((body.name(), _export_type(body, types, funcs, memories)))
        if body.left():
            raise _Malformed(f"section {section} has trailing bytes")
    return Surface(tuple(imports), tuple(exports))


def _functype(body: _Reader) -> str:
    form = body.byte()
    if form != 0x60:
        raise _Unsupported if form in (0x4E, 0x4F, 0x50, 0x5E, 0x5F) else _Malformed("bad type form")
    params = ", ".join(_valtype(body) for _ in range(body.count()))
    results = ", ".join(_valtype(body) for _ in range(body.count()))
    return f"({params}) -> {results or '()'}"


def _valtype(body: _Reader) -> str:
    """The type's name, or "?" for a reference type this reader does not name (exnref, a typed
    reference): such a type makes the module unsupported only where an import or export uses it."""
    code = body.byte()
    described = _VALTYPES.get(code)
    if described is not None:
        return described
    if 0x69 <= code <= 0x74:  # the other abstract reference types' short forms
        return _UNNAMED
    if code in (0x63, 0x64):  # (ref null? heaptype), the heap type a signed LEB128
        body.uleb(33)
        return _UNNAMED
    raise _Malformed(f"bad value type 0x{code:02x}")


def _named(described: str) -> str:
    if _UNNAMED in described:
        raise _Unsupported
    return described


def _type_index(body: _Reader, types: list[str]) -> int:
    index = body.uleb()
    if index >= len(types):
        raise _Malformed(f"type index {index} out of range")
    return index


def _import_type(body: _Reader, types: list[str], funcs: list[int], memories: list[str]) -> str:
    kind = body.byte()
    if kind == 0x00:
        index = _type_index(body, types)
        funcs.append(index)
        return _named(types[index])
    if kind == 0x01:
        _tabletype(body)
        return "table"
    if kind == 0x02:
        memory = _memtype(body)
        memories.append(memory)
        return memory
    if kind == 0x03:
        _valtype(body)
        if body.byte() not in (0, 1):
            raise _Malformed("bad global mutability")
        return "global"
    if kind == 0x04:
        raise _Unsupported
    raise _Malformed(f"bad import kind 0x{kind:02x}")


def _export_type(body: _Reader, types: list[str], funcs: list[int], memories: list[str]) -> str:
    kind = body.byte()
    index = body.uleb()
    if kind == 0x00:
        if index >= len(funcs):
            raise _Malformed(f"exported function {index} out of range")
        return _named(types[funcs[index]])
    if kind == 0x01:
        return "table"
    if kind == 0x02:
        if index >= len(memories):
            raise _Malformed(f"exported memory {index} out of range")
        return memories[index]
    if kind == 0x03:
        return "global"
    if kind == 0x04:
        raise _Unsupported
    raise _Malformed(f"bad export kind 0x{kind:02x}")


def _tabletype(body: _Reader) -> None:
    if body.pos < body.end and body.data[body.pos] == 0x40:  # a table with an initial value
        raise _Unsupported
    if _valtype(body) not in ("funcref", "anyref", _UNNAMED):
        raise _Malformed("a table of a value type that is not a reference")
    _limits(body)


def _memtype(body: _Reader) -> str:
    minimum, maximum = _limits(body, memory=True)
    return f"memory{minimum}..{maximum if maximum is not None else ''}"


def _limits(body: _Reader, memory: bool = False) -> tuple[int, int | None]:
    flags = body.byte()
    if flags & 0x08 and memory:  # custom page size
        raise _Unsupported
    if flags > 0x07:
        raise _Malformed(f"bad limits flags 0x{flags:02x}")
    bits = 64 if flags & 0x04 else 32
    minimum = body.uleb(bits)
    maximum = body.uleb(bits) if flags & 0x01 else None
    return minimum, maximum
