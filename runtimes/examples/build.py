"""Builds the C example tools in runtimes/examples/c/ into runtimes/examples/build/<name>.wasm.

    python runtimes/examples/build.py [--force]      # from any directory

or from Python (the file is not in a package; load it by path, since `build` is also the name
of a PyPI package):

    spec = importlib.util.spec_from_file_location("wasmbox_examples_build", PATH_OF_THIS_FILE)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
    module.build_examples(force=False)   # -> [Path of every example .wasm]

Each `c/*.c` is compiled with the `ziglang` package (`zig cc -target wasm32-wasi -O2`,
stripped, `-I runtimes` for wasmbox.h, a 256 KiB stack). A source is a wasmbox ABI v1 reactor
(`-mexec-model=reactor`) unless its first line is `// wasmbox: command`, which makes it a WASI
command (`main`, exported as `_start`). A target newer than its source, wasmbox.h, the
headers in c/ and this script is skipped unless `force`. Each module built is then checked: a
reactor exports exactly memory, _initialize, wasmbox_alloc and wasmbox_call; a command exports exactly memory and
_start; imports come only from wasi_snapshot_preview1 and (with wasmbox_alloc exported)
wasmbox, with the ABI's types. One line per module built goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from wasmbox._progress import Step

HERE = Path(__file__).resolve().parent
RUNTIMES = HERE.parent
SOURCES = HERE / "c"
BUILD = HERE / "build"
HEADER = RUNTIMES / "wasmbox.h"
COMMAND_MARKER = "// wasmbox: command"
# zig gives wasm a 16 MiB stack (258 pages before the heap): more than a small memory cap allows.
# The stack comes first in memory, so an overflow traps (out of bounds) instead of corrupting data.
STACK_SIZE = 256 * 1024
CFLAGS = [
    "-target", "wasm32-wasi", "-O2", "-s", "-std=c11", "-Wall", "-Wextra",
    f"-Wl,-z,stack-size={STACK_SIZE}", "-I", str(RUNTIMES),
]  # fmt: skip

_WASI = "wasi_snapshot_preview1"
_ABI = "wasmbox"
_REACTOR_EXPORTS = {
    "memory": "memory",
    "_initialize": "() -> ()",
    "wasmbox_alloc": "(i32) -> (i32)",
    "wasmbox_call": "(i32, i32) -> (i64)",
}
_COMMAND_EXPORTS = {"memory": "memory", "_start": "() -> ()"}
_HOST_FUNCTION_TYPE = "(i32, i32) -> (i64)"
_EXTERNS = ("func", "table", "memory", "global", "tag")


class BuildError(RuntimeError):
    """A source did not compile, or the module it gave breaks the wasmbox contract."""


def build_examples(force: bool = False) -> list[Path]:
    """Build what is out of date (everything with `force`); the .wasm of every example, sorted."""
    BUILD.mkdir(exist_ok=True)
    headers = [HEADER, *SOURCES.glob("*.h")]  # shared by the sources that include them
    deps = max(p.stat().st_mtime_ns for p in [*headers, Path(__file__)])
    outputs = []
    announced = False
    first = True
    for source in sorted(SOURCES.glob("*.c")):
        target = BUILD / f"{source.stem}.wasm"
        outputs.append(target)
        if not force and _newer(target, max(deps, source.stat().st_mtime_ns)):
            continue
        if not announced:
            print(f"building the example guests in {BUILD.relative_to(RUNTIMES.parent)} ...", file=sys.stderr)
            announced = True
        command = _is_command(source)
        about = "up to about 30 s while zig's cache is cold" if first else "about a second"
        with Step(_say, f"compiling {source.relative_to(HERE)} with zig cc", about):
            _compile(source, target, command)
        first = False
        print(f"built {target.relative_to(RUNTIMES.parent)} "
              f"({'command' if command else 'reactor'}, {target.stat().st_size:,} bytes)",
              file=sys.stderr)  # fmt: skip
    return outputs


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _newer(target: Path, than_ns: int) -> bool:
    try:
        return target.stat().st_mtime_ns > than_ns
    except FileNotFoundError:
        return False


def _is_command(source: Path) -> bool:
    with source.open(encoding="utf-8") as file:
        return file.readline().strip() == COMMAND_MARKER


def _compile(source: Path, target: Path, command: bool) -> None:
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")  # then renamed: atomic
    argv = [sys.executable, "-m", "ziglang", "cc", *CFLAGS]
    if not command:
        argv.append("-mexec-model=reactor")
    argv += [str(source), "-o", str(partial)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise BuildError(f"{source.name}: zig cc failed ({proc.returncode}):\n"
                             f"{proc.stdout}{proc.stderr}".rstrip())  # fmt: skip
        if proc.stdout or proc.stderr:  # warnings
            sys.stderr.write(proc.stdout + proc.stderr)
        _check(partial.read_bytes(), command, source.name)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def _check(wasm: bytes, command: bool, origin: str) -> None:
    imports, exports = _surface(wasm)
    wanted = _COMMAND_EXPORTS if command else _REACTOR_EXPORTS
    if exports != wanted:
        raise BuildError(f"{origin}: exports {exports}, expected exactly {wanted}")
    for module, name, kind in imports:
        if module == _WASI:
            continue
        if module != _ABI:
            raise BuildError(f"{origin}: imports {module!r} {name!r}: only {_WASI} and {_ABI}")
        if kind != _HOST_FUNCTION_TYPE:
            raise BuildError(f"{origin}: host function {name!r} has type {kind}, "
                             f"expected {_HOST_FUNCTION_TYPE}")  # fmt: skip
        if "wasmbox_alloc" not in exports:
            raise BuildError(f"{origin}: imports host function {name!r} without wasmbox_alloc")


def _surface(wasm: bytes) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """(imports as (module, name, type), exports as {name: type}) of a core wasm module."""
    if wasm[:8] != b"\0asm\1\0\0\0":
        raise BuildError("not a wasm core module (version 1)")
    types: list[str] = []
    funcs: list[str] = []  # the type of each function index
    imports: list[tuple[str, str, str]] = []
    exports: dict[str, str] = {}
    pos = 8
    while pos < len(wasm):
        section = wasm[pos]
        size, pos = _leb(wasm, pos + 1)
        r = _Reader(wasm[pos : pos + size])
        pos += size
        if section == 1:  # types
            for _ in range(r.leb()):
                if r.byte() != 0x60:
                    raise BuildError("unsupported type form")
                params = [r.valtype() for _ in range(r.leb())]
                results = [r.valtype() for _ in range(r.leb())]
                types.append(f"({', '.join(params)}) -> ({', '.join(results)})")
        elif section == 2:  # imports
            for _ in range(r.leb()):
                module, name, kind = r.name(), r.name(), r.byte()
                if kind == 0:
                    funcs.append(types[r.leb()])
                    imports.append((module, name, funcs[-1]))
                    continue
                if kind == 1:
                    r.byte()
                    r.limits()
                elif kind == 2:
                    r.limits()
                elif kind == 3:
                    r.byte()
                    r.byte()
                else:
                    raise BuildError(f"unsupported import kind {kind}")
                imports.append((module, name, ("table", "memory", "global")[kind - 1]))
        elif section == 3:  # functions
            funcs += [types[r.leb()] for _ in range(r.leb())]
        elif section == 7:  # exports
            for _ in range(r.leb()):
                name, kind, index = r.name(), r.byte(), r.leb()
                exports[name] = funcs[index] if kind == 0 else _EXTERNS[kind]
    return imports, exports


def _leb(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


class _Reader:
    _VALTYPES: ClassVar[dict[int, str]] = {0x7F: "i32", 0x7E: "i64", 0x7D: "f32", 0x7C: "f64", 0x7B: "v128",
                 0x70: "funcref", 0x6F: "externref"}  # fmt: skip

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def leb(self) -> int:
        value, self.pos = _leb(self.data, self.pos)
        return value

    def name(self) -> str:
        size = self.leb()
        self.pos += size
        return self.data[self.pos - size : self.pos].decode("utf-8")

    def valtype(self) -> str:
        code = self.byte()
        if code not in self._VALTYPES:
            raise BuildError(f"unsupported value type 0x{code:02x}")
        return self._VALTYPES[code]

    def limits(self) -> None:
        flags = self.byte()
        self.leb()
        if flags & 1:
            self.leb()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even what is up to date")
    options = parser.parse_args(argv)
    try:
        build_examples(force=options.force)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
