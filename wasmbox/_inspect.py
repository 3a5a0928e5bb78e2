"""What a module imports and exports, which ABI it speaks, and which grants it needs."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import wasmtime

from . import _abi
from ._capabilities.hostfuncs import not_granted
from ._errors import CapabilityError, ManifestError
from ._files import read_regular_file
from ._units import format_size
from ._wasmparse import MAGIC, read_surface

_HOST_CALL_TYPE = "(i32, i32) -> i64"
_VOID = "() -> ()"
_MEMORY_TYPE = re.compile(r"memory(\d+)\.\.(\d*)")
_WASM_PAGE = 64 * 1024


class ToolKind(str, Enum):
    """How a tool is called: wasmbox ABI v1 (abi), a WASI command (`_start`), a module's
    own exports by the C calling convention its manifest's `[reactor]` declares (c_reactor),
    Python source run by the CPython runtime, or JavaScript run by the QuickJS runtime."""

    ABI = "abi"
    COMMAND = "command"
    C_REACTOR = "c_reactor"
    PYTHON = "python"
    JAVASCRIPT = "javascript"


@dataclass(frozen=True)
class ModuleImport:
    """One import of a module: `module`.`name` and its type as text, e.g. "(i32, i32) -> i64"."""

    module: str
    name: str
    type: str


@dataclass(frozen=True)
class ModuleInfo:
    """The import/export surface of a module and the grants it would need."""

    imports: tuple[ModuleImport, ...]
    exports: tuple[tuple[str, str], ...]  # (name, type)
    kind: ToolKind | None

    @property
    def uses_wasi(self) -> bool:
        return any(i.module == _abi.WASI_MODULE for i in self.imports)

    @property
    def host_functions(self) -> tuple[str, ...]:
        """The host functions this module asks for: its `wasmbox` imports."""
        return tuple(i.name for i in self.imports if i.module == _abi.ABI_MODULE)

    @property
    def has_initialize(self) -> bool:
        return any(name == _abi.EXPORT_INITIALIZE for name, _ in self.exports)

    @property
    def memory_minimum(self) -> int:
        """The largest declared minimum, in bytes, of the memories it imports or exports (0:
        none): what an instance needs before its first instruction runs."""
        types = [i.type for i in self.imports] + [t for _, t in self.exports]
        pages = [int(m.group(1)) for t in types if (m := _MEMORY_TYPE.fullmatch(t))]
        return max(pages, default=0) * _WASM_PAGE


def read_wasm(path: Path) -> bytes:
    """The binary module at `path`; `.wat` text is translated first. Raises ManifestError
    when it cannot be read (or is not a regular file) or is neither wasm nor WAT."""
    try:
        data = read_regular_file(path)
    except OSError as exc:
        raise ManifestError(f"{path}: module: cannot read: {exc.strerror or exc}") from None
    if path.suffix == ".wat" or not data.startswith(MAGIC):
        try:
            return bytes(wasmtime.wat2wasm(data.decode("utf-8")))
        except (UnicodeDecodeError, wasmtime.WasmtimeError) as exc:
            raise ManifestError(f"{path}: module: not a wasm or WAT module: {exc}") from None
    return data


def inspect_file(path: Path) -> ModuleInfo:
    """The imports and exports of the module at `path`, read from its binary (compiled with a
    throwaway Engine only when it uses encodings the reader does not describe). Raises
    ManifestError for an unreadable or malformed module, wasmtime.WasmtimeError when Wasmtime
    rejects one the reader could not check."""
    wasm = read_wasm(path)
    info = read_module_info(wasm, str(path))
    return info if info is not None else inspect_module(wasmtime.Module(wasmtime.Engine(), wasm))


def read_module_info(wasm: bytes, origin: str) -> ModuleInfo | None:
    """The module's surface read from the binary, without compiling; None when it uses
    encodings `_wasmparse` does not describe (then compile and use `inspect_module`). Raises
    ManifestError (naming `origin`) for a malformed module."""
    surface = read_surface(wasm, origin)
    if surface is None:
        return None
    return _info(tuple(ModuleImport(*imp) for imp in surface.imports), surface.exports)


def inspect_module(module: wasmtime.Module) -> ModuleInfo:
    """The surface of a compiled module, as Wasmtime describes it."""
    imports = tuple(ModuleImport(imp.module, imp.name or "", _describe(imp.type)) for imp in module.imports)
    exports = tuple((exp.name, _describe(exp.type)) for exp in module.exports)
    return _info(imports, exports)


def _info(imports: tuple[ModuleImport, ...], exports: tuple[tuple[str, str], ...]) -> ModuleInfo:
    types = dict(exports)
    kind = None
    if _has_reactor_exports(types):
        kind = ToolKind.ABI
    elif types.get(_abi.EXPORT_START) == _VOID:
        kind = ToolKind.COMMAND
    return ModuleInfo(imports, exports, kind)


def abi_problem(info: ModuleInfo) -> str | None:
    """Why the module cannot be called safely, or None. The runner calls the ABI exports
    without per-call type checks, so their types must match exactly."""
    types = dict(info.exports)
    if info.kind is None:
        return (
            "exports neither the wasmbox ABI (memory, wasmbox_alloc (i32) -> i32, "
            "wasmbox_call (i32, i32) -> i64) nor a WASI _start () -> (); to call it through "
            "exports of its own, declare them in a [reactor] table"
        )
    if types.get(_abi.EXPORT_INITIALIZE, _VOID) != _VOID:
        return f"exports _initialize of type {types[_abi.EXPORT_INITIALIZE]}, expected () -> ()"
    if info.host_functions and not _has_allocator(types):
        # host-function replies are written through the guest's own allocator
        return "imports host functions but does not export memory and wasmbox_alloc (i32) -> i32"
    return None


def _has_allocator(types: dict[str, str]) -> bool:
    memory = types.get(_abi.EXPORT_MEMORY, "")
    return memory.startswith("memory") and types.get(_abi.EXPORT_ALLOC) == "(i32) -> i32"


def _has_reactor_exports(types: dict[str, str]) -> bool:
    return _has_allocator(types) and types.get(_abi.EXPORT_CALL) == _HOST_CALL_TYPE


def memory_problem(info: ModuleInfo, limit: int) -> str | None:
    """Why no instance of the module fits under a memory cap of `limit` bytes, or None: its
    declared memory minimum is above it (a C guest's stack is part of that minimum)."""
    minimum = info.memory_minimum
    if minimum <= limit:
        return None
    return (
        f"declares a memory minimum of {format_size(minimum)} ({minimum:,} bytes), above "
        f"limits.memory of {format_size(limit)} ({limit:,} bytes): no call could start; raise "
        f"limits.memory to at least {format_size(minimum)}, or build the module with a smaller "
        "memory (for zig/clang, a smaller stack: -Wl,-z,stack-size=N; -Wl,--initial-memory=N)"
    )


def check_grants(info: ModuleInfo, granted: Collection[str], origin: str) -> None:
    """Raise CapabilityError naming the first import the grants do not cover."""
    for imp in info.imports:
        if imp.module == _abi.WASI_MODULE:
            continue
        where = f"{origin}: import {imp.module!r} {imp.name!r}"
        if imp.module != _abi.ABI_MODULE:
            raise CapabilityError(f"{where} is not WASI preview1 or a wasmbox host function")
        if imp.name not in granted:
            raise CapabilityError(f"{where}: {not_granted(imp.name)}")
        if imp.type != _HOST_CALL_TYPE:
            raise CapabilityError(f"{where} has type {imp.type}, expected {_HOST_CALL_TYPE}")


def _describe(ty: object) -> str:
    if isinstance(ty, wasmtime.FuncType):
        params = ", ".join(str(p) for p in ty.params)
        results = ", ".join(str(r) for r in ty.results)
        return f"({params}) -> {results or '()'}"
    if isinstance(ty, wasmtime.MemoryType):
        return f"memory{ty.limits.min}..{ty.limits.max if ty.limits.max is not None else ''}"
    return type(ty).__name__.removesuffix("Type").lower()
