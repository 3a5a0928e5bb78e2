"""Reactor modules: a core module called through its own exports, by the C calling convention
its manifest's `[reactor]` table declares, rather than the wasmbox ABI or `_start`.

Per call, in a fresh instance (`ModuleRunner` makes it, with the call's limits and WASI):
`initialize` runs once, each argument the entry takes through memory is written into memory
the module's own allocator gave (strings NUL-terminated, buffers as pointer and length, argv
as a NULL-terminated array of strings, `out_len`/`out_ptr` as zeroed cells), then the entry
runs and its result is read back by its declared shape. The instance is dropped after the
call, so nothing is freed and nothing is left for the next call.

Every export named is checked at load, before the module is compiled (`export_problem`, on
the surface `_wasmparse` reads): it exists, with the type the declared shape calls it with,
so the calls here go through `_wasmtime.capi` without per-call type checks.
"""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import wasmtime

from ... import _abi
from ..._call import check_result_size
from ..._command import Template, schema_defaults
from ..._errors import ErrorKind
from ..._inspect import ModuleInfo, ToolKind
from ..._manifest import Manifest, Reactor, ReactorParam
from ..._outcome import Failure
from ..._units import format_size
from ..._wasmtime import capi as _capi
from ..._wasmtime import store as _store
from ..._wasmtime.output import Output

ALLOCATOR_TYPES = {
    "malloc": "(i32) -> i32",
    "realloc": "(i32, i32) -> i32",
    "cabi_realloc": "(i32, i32, i32, i32) -> i32",
}
_VOID = "() -> ()"
_ERROR_TYPE = "() -> i32"
# The result types each shape is called with (ptr_len: packed in an i64, or two i32 results).
_RESULTS: dict[str, tuple[tuple[str, ...], ...]] = {
    "cstring": (("i32",),),
    "out_len": (("i32",),),
    "out_ptr": (("i32",),),
    "exit_code": (("i32",),),
    "ptr_len": (("i64",), ("i32", "i32")),
    "none": ((),),
}
_TYPE = re.compile(r"^\((.*)\) -> (.*)$")
_MESSAGE_MAX = 1000  # bytes of the error export's string shown


def _split_type(functype: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    match = _TYPE.match(functype)
    if match is None:
        return None
    params, results = match.groups()
    return (
        tuple(params.split(", ")) if params else (),
        () if results == "()" else tuple(results.split(", ")),
    )


def export_problem(info: ModuleInfo, reactor: Reactor) -> str | None:
    """Why the module cannot be called as `reactor` declares, or None: each named export must
    exist with the type the declaration calls it with."""
    types = dict(info.exports)
    if not types.get(_abi.EXPORT_MEMORY, "").startswith("memory"):
        return "[reactor]: the module does not export its memory as `memory`"
    if reactor.allocator is not None:
        name, signature = reactor.allocator.export, reactor.allocator.signature
        expected = ALLOCATOR_TYPES[signature]
        if name not in types:
            return f"[reactor] allocator: the module exports no {name!r}"
        if types[name] != expected:
            return (
                f"[reactor] allocator: {name} has type {types[name]}, a {signature} allocator is {expected}"
            )
    initialize = reactor.initialize or (_abi.EXPORT_INITIALIZE if _abi.EXPORT_INITIALIZE in types else None)
    if initialize is not None and types.get(initialize, _VOID) != _VOID:
        return f"[reactor] initialize: {initialize} has type {types[initialize]}, expected {_VOID}"
    if initialize is not None and initialize not in types:
        return f"[reactor] initialize: the module exports no {initialize!r}"
    if reactor.error is not None and types.get(reactor.error) != _ERROR_TYPE:
        found = types.get(reactor.error)
        return f"[reactor] error: {reactor.error} " + (
            f"has type {found}, expected {_ERROR_TYPE} (a char *)" if found else "is not exported"
        )
    if reactor.entry not in types:
        return f"[reactor] entry: the module exports no {reactor.entry!r}"
    split = _split_type(types[reactor.entry])
    expected_params = _param_types(reactor.params)
    wrong = (
        split is None
        or len(split[0]) != len(expected_params)
        or any(have not in want for have, want in zip(split[0], expected_params, strict=True))
        or split[1] not in _RESULTS[reactor.result]
    )
    if wrong:
        want = "(" + ", ".join("/".join(w) for w in expected_params) + ") -> "
        want += " or ".join(
            "(" + ", ".join(r) + ")" if len(r) != 1 else r[0] for r in _RESULTS[reactor.result]
        )
        return (
            f"[reactor] entry: {reactor.entry} has type {types[reactor.entry]}, but its params and "
            f"result {reactor.result!r} call it as {want}"
        )
    if info.host_functions and types.get(_abi.EXPORT_ALLOC) != "(i32) -> i32":
        return "imports host functions but does not export wasmbox_alloc (i32) -> i32"
    return None


# What a C toolchain's runtime exports beside a command's `_start`: no sign of an API of its own.
_RUNTIME_EXPORTS = frozenset(
    {
        "_start",
        "_initialize",
        "main",
        "malloc",
        "free",
        "calloc",
        "realloc",
        "aligned_alloc",
        "posix_memalign",
        "cabi_realloc",
    }
)


def command_c_api(info: ModuleInfo) -> tuple[str, ...]:
    """The functions a WASI command module exports besides `_start` and its C runtime's own
    (e.g. Graphviz's `graphviz_render`): an API its `_start` may not reach at all, which only a
    `[reactor]` manifest calls. Empty for anything but a command."""
    if info.kind is not ToolKind.COMMAND:
        return ()
    return tuple(
        name
        for name, ty in info.exports
        if ty.startswith("(") and name not in _RUNTIME_EXPORTS and not name.startswith("__")
    )


def _param_types(params: Sequence[str | ReactorParam]) -> list[tuple[str, ...]]:
    """The wasm param types the declared params take, in order (an integer: i32 or i64)."""
    out: list[tuple[str, ...]] = []
    for param in params:
        if isinstance(param, ReactorParam) and param.integer is not None:
            out.append(("i32", "i64"))
        elif isinstance(param, ReactorParam) and param.buffer is not None:
            out += [("i32",), ("i32",)]
        else:
            out.append(("i32",))
    return out


@dataclass(frozen=True, slots=True)
class _Param:
    kind: str  # "cstring", "buffer", "integer", "argc", "argv", "out_len", "out_ptr"
    template: Template | None
    wasm: str  # "i32" or "i64" (an integer's type; "i32" for everything else)


Prepared = tuple[Any, ...]  # per param: bytes (cstring, buffer), int (integer), None (absent / slots)


class EntryCall:
    """The declared call of one reactor module, checked at load (`export_problem`)."""

    def __init__(self, manifest: Manifest, info: ModuleInfo) -> None:
        reactor = manifest.reactor
        assert reactor is not None
        types = dict(info.exports)
        found = _split_type(types[reactor.entry])
        assert found is not None  # checked by export_problem
        wasm_params, self._results = found
        params: list[_Param] = []
        position = 0
        for param in reactor.params:
            if isinstance(param, ReactorParam):
                kind = (
                    "cstring"
                    if param.cstring is not None
                    else "buffer"
                    if param.buffer is not None
                    else "integer"
                )
                params.append(
                    _Param(kind, Template.parse(param.template, argv_item=False), wasm_params[position])
                )
                position += 2 if kind == "buffer" else 1
            else:
                params.append(_Param(param, None, "i32"))
                position += 1
        self._params = tuple(params)
        self._defaults = schema_defaults((manifest.input_schema or {}).get("properties"))
        self._entry = _capi.ExportName(reactor.entry)
        initialize = reactor.initialize or (
            _abi.EXPORT_INITIALIZE if _abi.EXPORT_INITIALIZE in types else None
        )
        self._initialize = _capi.ExportName(initialize) if initialize is not None else None
        allocator = reactor.allocator
        self._allocator = _capi.ExportName(allocator.export) if allocator is not None else None
        self._signature = allocator.signature if allocator is not None else "malloc"
        self._error = _capi.ExportName(reactor.error) if reactor.error is not None else None
        self.result = reactor.result
        self._encoding = reactor.result_encoding
        self._name = reactor.entry

    def prepare(self, args: Mapping[str, Any]) -> Prepared:
        """Each param's value from the call's checked args (before the instance is made):
        a Failure `invalid_arguments` for a string with a NUL byte or an integer that is not one."""
        values = {**self._defaults, **args} if self._defaults else args
        out: list[Any] = []
        for index, param in enumerate(self._params):
            if param.template is None:
                out.append(None)
                continue
            rendered = param.template.render(values)
            if not rendered:  # an absent or null arg: a NULL pointer, (NULL, 0), or 0
                out.append(None)
                continue
            text = rendered[0]
            try:
                data = text.encode()
            except UnicodeEncodeError:
                raise Failure(ErrorKind.INVALID_ARGUMENTS, f"param {index}: not valid Unicode") from None
            if param.kind == "integer":
                out.append(_integer(text, param.wasm, index))
            elif param.kind == "cstring" and b"\0" in data:
                raise Failure(
                    ErrorKind.INVALID_ARGUMENTS, f"param {index}: a string would contain a NUL byte"
                )
            else:
                out.append(data)
        return tuple(out)

    def run(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        memory: _capi.Extern,
        prepared: Prepared,
        argv: Sequence[str],
        cap: int,
        stderr: Output,
    ) -> Any:
        """Initialize, write the args, call the entry, read its result (at most `cap` bytes).
        Raises Failure, wasmtime.Trap / WasmtimeError (the runner classifies those)."""
        context = _store.context(store)
        if self._initialize is not None:
            _capi.call_void(context, self._initialize.get(store, instance))
        raw: list[tuple[str, int]] = []  # (wasm type, value) per wasm param
        cells: dict[str, int] = {}
        for param, value in zip(self._params, prepared, strict=True):
            if param.kind == "integer":
                raw.append((param.wasm, value or 0))
            elif param.kind == "cstring":
                raw.append(
                    ("i32", self._write(store, instance, memory, value + b"\0") if value is not None else 0)
                )
            elif param.kind == "buffer":
                ptr = self._write(store, instance, memory, value) if value is not None else 0
                raw += [("i32", ptr), ("i32", len(value or b""))]
            elif param.kind == "argc":
                raw.append(("i32", len(argv)))
            elif param.kind == "argv":
                pointers = [self._write(store, instance, memory, item.encode() + b"\0") for item in argv]
                table = b"".join(p.to_bytes(4, "little") for p in [*pointers, 0])
                raw.append(("i32", self._write(store, instance, memory, table)))
            else:  # out_len, out_ptr: a zeroed 32-bit cell the entry writes
                cells[param.kind] = self._write(store, instance, memory, bytes(4))
                raw.append(("i32", cells[param.kind]))
        try:
            values = _capi.call_typed(context, self._entry.get(store, instance), raw, self._results)
        except wasmtime.ExitTrap as exit_trap:
            if self.result == "exit_code":
                return {"exit_code": exit_trap.code}
            message = f"{self._name} exited with code {exit_trap.code}"
            raise Failure(ErrorKind.GUEST_ERROR, _with_stderr(message, stderr)) from None
        if self.result == "none":
            return None
        if self.result == "exit_code":
            return {"exit_code": values[0]}
        first = values[0] & 0xFFFF_FFFF
        if self.result == "cstring":
            if first == 0:
                raise self._failed(store, instance, memory, "returned NULL", stderr)
            return self._decode(_cstring(context, memory, first, cap))
        if self.result == "ptr_len":
            if self._results == ("i64",):
                ptr, length = _abi.split(values[0])
            else:
                ptr, length = first, values[1] & 0xFFFF_FFFF
            if ptr == 0:
                raise self._failed(store, instance, memory, "returned a NULL pointer", stderr)
        elif self.result == "out_len":
            if first == 0:
                raise self._failed(store, instance, memory, "returned NULL", stderr)
            ptr, length = first, _u32(context, memory, cells["out_len"])
        else:  # out_ptr: the return value is a status
            if values[0] != 0:
                raise self._failed(store, instance, memory, f"returned status {values[0]}", stderr)
            ptr, length = _u32(context, memory, cells["out_ptr"]), _u32(context, memory, cells["out_len"])
        check_result_size(length, cap)
        base, size = _capi.memory_view(context, memory)
        if ptr + length > size:
            raise Failure(ErrorKind.BAD_RESPONSE, f"{self._name}'s result points outside the module's memory")
        return self._decode(ctypes.string_at(base + ptr, length))

    def _write(
        self, store: wasmtime.Store, instance: wasmtime.Instance, memory: _capi.Extern, data: bytes
    ) -> int:
        """`data` in memory the module's allocator gave; its address."""
        assert self._allocator is not None  # the manifest has one when a param needs memory
        context = _store.context(store)
        size = max(len(data), 1)
        args = {"malloc": (size,), "realloc": (0, size), "cabi_realloc": (0, 0, 1, size)}[self._signature]
        ptr = _capi.call_i32(context, self._allocator.get(store, instance), *args)
        if ptr == 0:
            raise Failure(ErrorKind.MEMORY_LIMIT, f"{self._allocator.name} returned NULL for {size} bytes")
        base, memory_size = _capi.memory_view(context, memory)
        if ptr + size > memory_size:
            raise Failure(
                ErrorKind.BAD_RESPONSE, f"{self._allocator.name} returned a pointer outside the memory"
            )
        ctypes.memmove(base + ptr, data, len(data))
        return ptr

    def _failed(
        self,
        store: wasmtime.Store,
        instance: wasmtime.Instance,
        memory: _capi.Extern,
        what: str,
        stderr: Output,
    ) -> Failure:
        """The entry's failure: `guest_error` with the error export's message, else stderr's tail."""
        message = f"{self._name} {what}"
        if self._error is not None:
            context = _store.context(store)
            pointer = _capi.call_i32(context, self._error.get(store, instance))
            if pointer:
                try:
                    said = _cstring(context, memory, pointer, _MESSAGE_MAX, cut=True)
                except Failure:
                    said = b""
                if said:
                    return Failure(ErrorKind.GUEST_ERROR, f"{message}: {said.decode('utf-8', 'replace')}")
        return Failure(ErrorKind.GUEST_ERROR, _with_stderr(message, stderr))

    def _decode(self, data: bytes) -> Any:
        if self._encoding == "bytes":
            return data
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Failure(
                ErrorKind.BAD_RESPONSE,
                f"{self._name}'s result is not UTF-8 ({exc.reason} at byte {exc.start}); "
                'declare result_encoding = "bytes" for binary results',
            ) from None
        if self._encoding == "text":
            return text
        try:
            value = json.loads(text)
            _abi.check_depth(value)
        except (ValueError, RecursionError) as exc:
            raise Failure(ErrorKind.BAD_RESPONSE, f"{self._name}'s result is not JSON: {exc}"[:300]) from None
        return value


def _integer(text: str, wasm: str, index: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise Failure(
            ErrorKind.INVALID_ARGUMENTS, f"param {index}: {text[:40]!r} is not an integer"
        ) from None
    bits = 64 if wasm == "i64" else 32
    if not -(1 << (bits - 1)) <= value < 1 << bits:
        raise Failure(ErrorKind.INVALID_ARGUMENTS, f"param {index}: {value} does not fit in {wasm}")
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _u32(context: _capi.Context, memory: _capi.Extern, ptr: int) -> int:
    base, size = _capi.memory_view(context, memory)
    if ptr + 4 > size:
        raise Failure(ErrorKind.BAD_RESPONSE, "an out-parameter is outside the module's memory")
    return int.from_bytes(ctypes.string_at(base + ptr, 4), "little")


def _cstring(
    context: _capi.Context,
    memory: _capi.Extern,
    ptr: int,
    cap: int,
    *,
    cut: bool = False,
) -> bytes:
    """The NUL-terminated string at `ptr`, read no further than `cap` bytes (or the memory's
    end): longer is an `output_limit` Failure (cut to `cap` when `cut`), unterminated a
    `bad_response`."""
    base, size = _capi.memory_view(context, memory)
    if ptr >= size:
        raise Failure(ErrorKind.BAD_RESPONSE, "a returned string points outside the module's memory")
    data = ctypes.string_at(base + ptr, min(size - ptr, cap + 1))
    end = data.find(b"\0")
    if end >= 0:
        return data[:end]
    if len(data) > cap:
        if cut:
            return data[:cap]
        raise Failure(
            ErrorKind.OUTPUT_LIMIT, f"the returned string is longer than the {format_size(cap)} output cap"
        )
    raise Failure(ErrorKind.BAD_RESPONSE, "a returned string runs past the end of the module's memory")


def _with_stderr(message: str, stderr: Output) -> str:
    tail = stderr.text().strip()
    if len(tail) > _MESSAGE_MAX:
        tail = "…" + tail[-_MESSAGE_MAX:]
    return f"{message}: {tail}" if tail else message
