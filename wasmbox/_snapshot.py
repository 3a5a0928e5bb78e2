"""Pre-initialised core modules: run a module's set-up once, then write what it left in memory
and globals into a new module, so every later instance starts from there (what Wizer does).

`snapshot(engine, wasm, define, init)` instantiates an instrumented copy of `wasm` (the same
code, its mutable globals and its memory exported), lets `init` run the set-up, and returns a
module whose data segments are the memory's non-zero bytes, whose memory starts at the size it
reached and whose mutable globals start at their values then; the start function is dropped
(it ran), and so are DWARF sections (they describe code that is unchanged, but cost bytes).
Wasmtime maps such a module's data copy-on-write, so instantiating it costs about as much as
instantiating an empty one.

Sound for modules whose set-up changes only their own memory and globals: the caller's imports
(`define`) decide what host state the set-up can reach (the JavaScript runtime's set-up gets a
WASI world without preopens, env or args). A table the set-up grew is refused; the entries of
a table are not compared (C code does not write its table). `table_slots` adds that many
empty (null) entries at the end of the module's one table, for the host to fill in each
instance (the JavaScript runtime's host functions); the snapshot then exports the table as
TABLE_EXPORT. Passive data segments are kept as they are, at their indices (the code names them); active ones are
replaced by the memory image, in at most MAX_SEGMENTS segments (the smallest zero gaps are
merged first; Wasmtime refuses modules with more than 100,000). Modules with imported
memories or globals, more than one memory, 64-bit memories or globals of reference or vector
types are refused with SnapshotError.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import wasmtime

from ._errors import WasmboxError
from ._wasmparse import MAGIC, _Malformed, _Reader

_PAGE = 65536
_GAP = 64  # zero bytes that end a data segment; shorter runs of zeros stay inside one
MAX_SEGMENTS = 10_000  # data segments of the memory image at most (Wizer's figure)
_EXPORT = "__wasmbox_snapshot_"
_MEMORY_EXPORT = _EXPORT + "memory"
_TABLE_EXPORT = _EXPORT + "table"
TABLE_EXPORT = "__wasmbox_table"  # the snapshot's export of its table, when it has reserved slots
_SETUP_FUEL = 10**11
_CONST = {0x7F: 0x41, 0x7E: 0x42, 0x7D: 0x43, 0x7C: 0x44}  # value type -> its const opcode


class SnapshotError(WasmboxError):
    """The module cannot be snapshotted soundly (see the module docstring)."""


class _Section:
    def __init__(self, code: int, body: bytes) -> None:
        self.code = code
        self.body = body


class _Module:
    """The sections of a module, and what the snapshot needs to know about them."""

    def __init__(self, wasm: bytes) -> None:
        if wasm[:8] != MAGIC + b"\x01\x00\x00\x00":
            raise SnapshotError("not a core module")
        self.sections: list[_Section] = []
        reader = _Reader(wasm, 8)
        try:
            while reader.left():
                code = reader.byte()
                size = reader.uleb()
                self.sections.append(_Section(code, reader.take(size)))
            # per segment, in order: None for an active one, the encoded segment for a passive one
            self.data_segments: list[bytes | None] = []
            self.globals = self._globals()
            self.memory = self._memory()
            self.tables = self._count(4) + self._imported(0x01)
            self.table_exported = False
        except _Malformed as exc:
            raise SnapshotError(f"not a valid module: {exc}") from None
        if self._imported(0x02) or self._imported(0x03):
            raise SnapshotError("the module imports a memory or a global")
        self._check_data()

    def reserve_table_slots(self, count: int) -> None:
        """Grow the one table, defined here, by `count` null entries, and export it."""
        section = self.section(4)
        if section is None or self.tables != 1 or self._imported(0x01):
            raise SnapshotError("table slots need exactly one table, defined by the module")
        body = _Reader(section.body)
        try:
            body.uleb()
            reftype = body.byte()
            minimum, maximum = _limits(body)
        except _Malformed as exc:
            raise SnapshotError(f"not a valid table: {exc}") from None
        if reftype != 0x70 or body.left():
            raise SnapshotError("table slots need a funcref table without an initializer")
        limits = _uleb(minimum + count)
        limits = b"\x01" + limits + _uleb(maximum + count) if maximum is not None else b"\x00" + limits
        self.sections[self.sections.index(section)] = _Section(4, b"\x01\x70" + limits)
        self.table_exported = True

    def section(self, code: int) -> _Section | None:
        return next((s for s in self.sections if s.code == code), None)

    def _count(self, code: int) -> int:
        section = self.section(code)
        return _Reader(section.body).uleb() if section is not None else 0

    def _imported(self, kind: int) -> int:
        section = self.section(2)
        if section is None:
            return 0
        body, found = _Reader(section.body), 0
        for _ in range(body.count()):
            body.name(), body.name()
            got = body.byte()
            found += got == kind
            if got == 0x00:
                body.uleb()
            elif got == 0x01:
                body.byte()
                _limits(body)
            elif got == 0x02:
                _limits(body)
            elif got == 0x03:
                body.byte(), body.byte()
            else:
                raise SnapshotError(f"an import of kind 0x{got:02x}")
        return found

    def _globals(self) -> list[tuple[int, bool, bytes]]:
        """(value type, mutable, init expression) per defined global."""
        section = self.section(6)
        if section is None:
            return []
        body, found = _Reader(section.body), []
        for _ in range(body.count()):
            valtype, mutable = body.byte(), body.byte()
            start = body.pos
            _skip_expression(body)
            if mutable and valtype not in _CONST:
                raise SnapshotError(f"a mutable global of type 0x{valtype:02x}")
            found.append((valtype, bool(mutable), bytes(body.data[start : body.pos])))
        return found

    def _memory(self) -> tuple[int, int | None]:
        section = self.section(5)
        if section is None:
            raise SnapshotError("the module defines no memory")
        body = _Reader(section.body)
        if body.uleb() != 1:
            raise SnapshotError("the module defines more than one memory")
        flags = body.data[body.pos]
        if flags & ~0x01:
            raise SnapshotError("a shared, 64-bit or custom-page memory")
        return _limits(body)

    def _check_data(self) -> None:
        section = self.section(11)
        if section is None:
            return
        body = _Reader(section.body)
        for _ in range(body.count()):
            start = body.pos
            flags = body.uleb()
            if flags == 0:
                _skip_expression(body)
                body.take(body.uleb())
                self.data_segments.append(None)
            elif flags == 1:
                body.take(body.uleb())
                self.data_segments.append(bytes(body.data[start : body.pos]))
            else:
                raise SnapshotError("a data segment for a memory other than the first")


def snapshot(
    engine: wasmtime.Engine,
    wasm: bytes,
    define: Callable[[wasmtime.Linker, wasmtime.Store, wasmtime.Module], None],
    init: Callable[[wasmtime.Store, wasmtime.Instance], None],
    *,
    table_slots: int = 0,
) -> bytes:
    """The module `wasm` as `init(store, instance)` leaves it; `define(linker, store, module)`
    defines its imports for that one instance. With `table_slots`, the table has that many more
    entries, null, at its end (`init` sees them: the table is its instance's export
    `_TABLE_EXPORT`), and the snapshot exports it as TABLE_EXPORT. Raises SnapshotError (see the
    module docstring); what `init` raises propagates."""
    module = _Module(wasm)
    if table_slots:
        module.reserve_table_slots(table_slots)
    instrumented = _instrument(module)
    store = wasmtime.Store(engine)
    try:  # bounded, on an engine that meters fuel; and never interrupted by its epoch
        store.set_fuel(_SETUP_FUEL)
    except wasmtime.WasmtimeError:
        pass
    store.set_epoch_deadline(2**40)
    linker = wasmtime.Linker(engine)
    compiled = wasmtime.Module(engine, instrumented)
    define(linker, store, compiled)
    instance = linker.instantiate(store, compiled)
    exports = instance.exports(store)
    table = exports.get(_TABLE_EXPORT)
    sizes = table.size(store) if isinstance(table, wasmtime.Table) else None
    init(store, instance)
    if isinstance(table, wasmtime.Table) and table.size(store) != sizes:
        raise SnapshotError("the set-up grew a table")
    memory = exports[_MEMORY_EXPORT]
    assert isinstance(memory, wasmtime.Memory)
    data = memory.read(store, 0, memory.data_len(store))
    values = []
    for index, (_, mutable, _) in enumerate(module.globals):
        if mutable:
            found = exports[f"{_EXPORT}global{index}"]
            assert isinstance(found, wasmtime.Global)
            values.append(found.value(store))
    return _write(module, memory.size(store), bytes(data), values)


def _instrument(module: _Module) -> bytes:
    """`module` with its memory, first table and mutable globals exported under our names."""
    extra = [(_MEMORY_EXPORT, 0x02, 0)]
    if module.tables:
        extra.append((_TABLE_EXPORT, 0x01, 0))
    imported_globals = 0  # refused above: defined globals' indices start at 0
    extra += [
        (f"{_EXPORT}global{i}", 0x03, imported_globals + i)
        for i, (_, mutable, _) in enumerate(module.globals)
        if mutable
    ]
    return _encode(_exporting(list(module.sections), extra))


def _exporting(sections: list[_Section], extra: list[tuple[str, int, int]]) -> list[_Section]:
    """`sections` with exports `(name, kind, index)` added to the export section."""
    exports = next((s for s in sections if s.code == 7), None)
    old = _Reader(exports.body) if exports is not None else None
    count = old.uleb() if old is not None else 0
    rest = bytes(old.data[old.pos :]) if old is not None else b""
    body = _uleb(count + len(extra)) + rest
    for name, kind, index in extra:
        encoded = name.encode()
        body += _uleb(len(encoded)) + encoded + bytes([kind]) + _uleb(index)
    new = _Section(7, body)
    sections = list(sections)
    if exports is not None:
        sections[sections.index(exports)] = new
    else:  # after the sections that come before exports (1..6)
        at = next((i for i, s in enumerate(sections) if s.code not in range(7)), len(sections))
        sections.insert(at, new)
    return sections


def _write(module: _Module, pages: int, data: bytes, values: list[int | float]) -> bytes:
    """The snapshot module: `module` with `data` as its memory image and `values` in its
    mutable globals."""
    _, maximum = module.memory
    if maximum is not None and pages > maximum:
        raise SnapshotError("the memory grew past its maximum")
    # The original segments keep their indices (the code names them in data.drop and
    # memory.init): a passive one as it was, an active one empty (it was dropped at
    # instantiation, and its bytes are in the image). The image's segments follow.
    segments = _segments(data)
    parts = [_uleb(len(module.data_segments) + len(segments))]
    for passive in module.data_segments:
        parts.append(passive if passive is not None else b"\x00\x41\x00\x0b\x00")
    for offset, chunk in segments:
        parts.append(b"\x00\x41" + _sleb(offset if offset < 2**31 else offset - 2**32) + b"\x0b")
        parts += [_uleb(len(chunk)), chunk]
    count = len(module.data_segments) + len(segments)
    data_section = _Section(11, b"".join(parts))
    out: list[_Section] = []
    for section in module.sections:
        if section.code == 0 and _custom_name(section.body).startswith(".debug"):
            continue
        if section.code == 8:  # start: it ran in the set-up
            continue
        if section.code == 5:
            limits = (
                b"\x01" + _uleb(pages) + _uleb(maximum) if maximum is not None else b"\x00" + _uleb(pages)
            )
            section = _Section(5, b"\x01" + limits)
        elif section.code == 6:
            section = _Section(6, _globals(module, values))
        elif section.code == 11:
            section = data_section
        elif section.code == 12:
            section = _Section(12, _uleb(count))
        out.append(section)
    if module.section(11) is None:  # after code, else after the last section that is no custom one
        at = max((i for i, s in enumerate(out) if s.code != 0), default=-1) + 1
        out.insert(at, data_section)
    if module.table_exported:
        out = _exporting(out, [(TABLE_EXPORT, 0x01, 0)])
    return _encode(out)


def _globals(module: _Module, values: list[int | float]) -> bytes:
    body = _uleb(len(module.globals))
    given = iter(values)
    for valtype, mutable, expression in module.globals:
        if mutable:
            expression = _const(valtype, next(given))
        body += bytes([valtype, int(mutable)]) + expression
    return body


def _const(valtype: int, value: float) -> bytes:
    opcode = _CONST[valtype]
    if valtype == 0x7F:
        number = int(value)
        immediate = _sleb(number - 2**32 if number >= 2**31 else number)
    elif valtype == 0x7E:
        number = int(value)
        immediate = _sleb(number - 2**64 if number >= 2**63 else number)
    elif valtype == 0x7D:
        immediate = struct.pack("<f", value)
    else:
        immediate = struct.pack("<d", value)
    return bytes([opcode]) + immediate + b"\x0b"


def _segments(data: bytes) -> list[tuple[int, bytes]]:
    """The non-zero stretches of `data` as (offset, bytes), zero runs shorter than _GAP kept;
    past MAX_SEGMENTS stretches, the ones with the smallest zero runs between them are joined."""
    spans: list[tuple[int, int]] = []
    end = len(data.rstrip(b"\0"))
    position = len(data) - len(data.lstrip(b"\0")) if end else end
    gap = b"\0" * _GAP
    while position < end:
        stop = data.find(gap, position, end)
        stop = end if stop < 0 else stop
        spans.append((position, stop))
        position = stop
        while position < end and data[position] == 0:
            position += 1
    if len(spans) > MAX_SEGMENTS:
        gaps = sorted(range(1, len(spans)), key=lambda i: spans[i][0] - spans[i - 1][1])
        joined = set(gaps[: len(spans) - MAX_SEGMENTS])  # each joins span i to the one before
        merged: list[tuple[int, int]] = []
        for i, span in enumerate(spans):
            if i in joined:
                merged[-1] = (merged[-1][0], span[1])
            else:
                merged.append(span)
        spans = merged
    return [(start, data[start:stop]) for start, stop in spans]


def _skip_expression(body: _Reader) -> None:
    """Past a constant expression, its `end` included."""
    while True:
        opcode = body.byte()
        if opcode == 0x0B:
            return
        if opcode == 0x41:
            _sleb_read(body, 32)
        elif opcode == 0x42:
            _sleb_read(body, 64)
        elif opcode == 0x43:
            body.take(4)
        elif opcode == 0x44:
            body.take(8)
        elif opcode in (0x23, 0xD2):  # global.get, ref.func
            body.uleb()
        elif opcode == 0xD0:  # ref.null
            body.byte()
        elif opcode in (0x6A, 0x6B, 0x6C, 0x7C, 0x7D, 0x7E):  # extended-const arithmetic
            pass
        else:
            raise SnapshotError(f"a constant expression with opcode 0x{opcode:02x}")


def _limits(body: _Reader) -> tuple[int, int | None]:
    flags = body.byte()
    minimum = body.uleb(64)
    maximum = body.uleb(64) if flags & 0x01 else None
    return minimum, maximum


def _custom_name(body: bytes) -> str:
    try:
        return _Reader(body).name()
    except _Malformed:
        return ""


def _encode(sections: list[_Section]) -> bytes:
    parts = [MAGIC, b"\x01\x00\x00\x00"]
    for section in sections:
        parts += [bytes([section.code]), _uleb(len(section.body)), section.body]
    return b"".join(parts)


def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40):
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _sleb_read(body: _Reader, bits: int) -> None:
    for _ in range((bits + 6) // 7):
        if not body.byte() & 0x80:
            return
    raise SnapshotError("an integer too long")


def export_named_function(wasm: bytes, function: str, name: str) -> bytes:
    """`wasm` with the function its name section calls `function` exported as `name` (e.g. a
    C library function the set-up or a call needs that the module does not export). Raises
    SnapshotError when the module is malformed or names no such function."""
    if wasm[:8] != MAGIC + b"\x01\x00\x00\x00":
        raise SnapshotError("not a core module")
    sections = []
    reader = _Reader(wasm, 8)
    index = None
    try:
        while reader.left():
            code = reader.byte()
            sections.append(_Section(code, reader.take(reader.uleb())))
            if code == 0 and index is None:
                index = _named_function(sections[-1].body, function)
    except _Malformed as exc:
        raise SnapshotError(f"not a valid module: {exc}") from None
    if index is None:
        raise SnapshotError(f"the module has no function {function} in its name section")
    return _encode(_exporting(sections, [(name, 0x00, index)]))


def _named_function(custom: bytes, function: str) -> int | None:
    body = _Reader(custom)
    if body.name() != "name":
        return None
    while body.left():
        kind = body.byte()
        sub = _Reader(body.take(body.uleb()))
        if kind != 1:  # function names
            continue
        for _ in range(sub.uleb()):
            index = sub.uleb()
            if sub.name() == function:
                return index
    return None
