"""Builds the CPython runtime component with componentize-py, once per set of inputs.

Inputs are `guest/` and `wit/` beside this module (the guest driver and the WIT world), msgpack's pure-Python
codec (bundled into the guest) and the pinned componentize-py. Their digest names a directory
in the cache holding `runtime.wasm` (the pre-initialized component) and `stdlib/` (CPython's
standard library, taken from the archive componentize-py embeds, preopened read-only in every
call so modules not in the snapshot still import).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..._dist import version
from ..._errors import WasmboxError
from ..._progress import Progress, Step, stderr_progress

if TYPE_CHECKING:
    import tarfile

COMPONENTIZE_PY = "0.25.1"
RECIPE = "3"  # bump when the build steps change (3: the stdlib .pyc written whole)
# The runtime's own sources (the WIT world and the guest driver) sit beside this module, in a
# checkout and in a wheel alike (package data, see pyproject.toml).
SOURCES = Path(__file__).resolve().parent
# The byte-compile step's program (run in the runtime by the host; part of the build's inputs).
PRECOMPILE = SOURCES / "programs" / "precompile.py"
_MSGPACK_FILES = ("__init__.py", "exceptions.py", "ext.py", "fallback.py")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class RuntimeBuildError(WasmboxError):
    """The CPython runtime could not be built."""


@dataclass(frozen=True)
class PythonRuntime:
    """A built runtime: the component and the stdlib directory its calls preopen."""

    component: Path
    stdlib: Path
    key: str

    @property
    def component_sha256(self) -> str:
        """The component's digest, recorded at build time (so loading need not hash 20 MB)."""
        recorded = self.component.with_name(self.component.name + ".sha256")
        if recorded.is_file():
            return recorded.read_text().strip()
        return hashlib.sha256(self.component.read_bytes()).hexdigest()


def ensure_runtime(
    directory: Path,
    progress: Progress = stderr_progress,
    prepare: Callable[[PythonRuntime], None] | None = None,
) -> PythonRuntime:
    """The runtime for the current inputs under `directory`, built first if missing.

    `prepare` runs on the freshly built runtime before it is published (the Sandbox uses it
    to byte-compile the stdlib inside the guest, so lazy imports do not compile at call time).
    """
    key = _inputs_digest()

    def build(stage: Path) -> None:
        _build(stage, progress)
        if prepare is not None:
            prepare(PythonRuntime(stage / "runtime.wasm", stage / "stdlib", key))

    target = build_once(directory, _folder(key), "runtime.wasm", build, "the Python runtime")
    return PythonRuntime(target / "runtime.wasm", target / "stdlib", key)


def built(directory: Path) -> bool:
    """Whether the runtime for the current inputs is built under `directory` (builds nothing)."""
    return (directory / _folder(_inputs_digest()) / "runtime.wasm").is_file()


def _folder(key: str) -> str:
    return f"python-runtime-{key[:24]}"


def build_once(directory: Path, name: str, done: str, build: Callable[[Path], None], what: str) -> Path:
    """`directory/name`, made by `build(stage)` in a private stage folder and moved into place
    whole unless it already holds the file `done`: once across threads and processes (a file
    lock). Raises RuntimeBuildError, naming `what`, when `directory` cannot be written."""
    target = directory / name
    if (target / done).is_file():
        return target
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(directory / f".{name}.lock"):
            if (target / done).is_file():  # another process built it while we waited
                return target
            stage = Path(tempfile.mkdtemp(dir=directory, prefix=".build-"))
            try:
                build(stage)
                os.replace(stage, target)
            finally:
                shutil.rmtree(stage, ignore_errors=True)
    except OSError as exc:  # e.g. the cache directory is unwritable or full
        raise RuntimeBuildError(f"cannot build {what} in {directory}: {exc}") from None
    return target


def _build(stage: Path, progress: Progress) -> None:
    started = time.perf_counter()
    app = stage / "src" / "app"
    deps = stage / "src" / "deps" / "msgpack"
    app.mkdir(parents=True)
    deps.mkdir(parents=True)
    for source in sorted((SOURCES / "guest").glob("*.py")):
        shutil.copy(source, app / source.name)
    msgpack_dir = _msgpack_dir()
    for name in _MSGPACK_FILES:
        shutil.copy(msgpack_dir / name, deps / name)
    no_venv = stage / "src" / "no-venv"  # keeps the host's site-packages out of the guest
    no_venv.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "VIRTUAL_ENV": str(no_venv),
        "HOME": str(stage),
        "TMPDIR": str(stage),
    }
    command = [
        _componentize_py(),
        "-d",
        str(SOURCES / "wit"),
        "-w",
        "runtime",
        "componentize",
        "-p",
        str(app),
        "-p",
        str(deps.parent),
        "wasmbox_driver",
        "-o",
        str(stage / "runtime.wasm"),
    ]
    doing = f"building the Python runtime with componentize-py {COMPONENTIZE_PY}"
    with Step(progress, doing, "about 10 s, once per cache; then compiled, and the stdlib byte-compiled"):
        import subprocess  # (only a build runs one: kept out of `import wasmbox`)

        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)  # noqa: S603 - our argv
    if done.returncode != 0 or not (stage / "runtime.wasm").is_file():
        raise RuntimeBuildError(f"componentize-py failed:\n{done.stdout}\n{done.stderr}"[-4000:])
    wasm = stage / "runtime.wasm"
    (stage / "runtime.wasm.sha256").write_text(hashlib.sha256(wasm.read_bytes()).hexdigest())
    _extract_stdlib(stage / "stdlib")
    shutil.rmtree(stage / "src")
    size = (stage / "runtime.wasm").stat().st_size
    progress(f"built the Python runtime ({size / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s")


def precompile_program(root: str) -> str:
    """The snippet that byte-compiles the guest folder `root` (`programs/precompile.py`); its
    value is the .py files left without bytecode."""
    return f"{PRECOMPILE.read_text()}\nprecompile({root!r})\n"


def _inputs_digest() -> str:
    digest = hashlib.sha256()
    digest.update(f"recipe={RECIPE} componentize-py={version('componentize-py')}".encode())
    digest.update(f" msgpack={version('msgpack')}".encode())
    if version("componentize-py") != COMPONENTIZE_PY:
        raise RuntimeBuildError(
            f"the Python runtime needs componentize-py=={COMPONENTIZE_PY}, found {version('componentize-py')}"
        )
    sources = [*(SOURCES / "guest").glob("*.py"), *(SOURCES / "wit").glob("*.wit")]
    files = sorted([*sources, PRECOMPILE])
    if not sources or not PRECOMPILE.is_file():
        raise RuntimeBuildError(f"the runtime sources are missing: {SOURCES}")
    for path in files:
        digest.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes())
    for name in _MSGPACK_FILES:
        digest.update((_msgpack_dir() / name).read_bytes())
    return digest.hexdigest()


def _msgpack_dir() -> Path:
    import msgpack

    return Path(msgpack.__file__).parent


def _componentize_py() -> str:
    beside = Path(sys.executable).parent / "componentize-py"
    found = str(beside) if beside.is_file() else shutil.which("componentize-py")
    if not found:
        raise RuntimeBuildError("componentize-py is not installed (pip install wasmbox)")
    return found


def _extract_stdlib(target: Path) -> None:
    """Unpack CPython's standard library from the archive inside componentize-py."""
    import componentize_py
    import zstandard

    binary = Path(componentize_py.__file__).parent
    blobs = sorted(binary.glob("componentize_py*.so"))
    if not blobs:
        raise RuntimeBuildError(f"no componentize-py binary in {binary}")
    data = blobs[0].read_bytes()
    offset = data.find(_ZSTD_MAGIC)
    while offset != -1:
        archive = _stdlib_archive(data, offset, zstandard)
        if archive is not None:
            _safe_extract(archive, target)
            return
        offset = data.find(_ZSTD_MAGIC, offset + 1)
    raise RuntimeBuildError("CPython's standard library was not found inside componentize-py")


def _stdlib_archive(data: bytes, offset: int, zstandard: object) -> tarfile.TarFile | None:
    decompressor = zstandard.ZstdDecompressor().decompressobj()  # type: ignore[attr-defined]
    try:
        head = decompressor.decompress(data[offset : offset + 65536])
    except zstandard.ZstdError:  # type: ignore[attr-defined]
        return None
    if len(head) < 512 or head[257:262] != b"ustar":
        return None
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(data[offset:])  # type: ignore[attr-defined]
    import tarfile  # (only a build reads one: kept out of `import wasmbox`)

    archive = tarfile.open(fileobj=io.BytesIO(raw))  # noqa: SIM115 - returned open, to the caller's `with`
    names = set(archive.getnames())
    return archive if {"statistics.py", "socket.py", "json/__init__.py"} <= names else None


def _safe_extract(archive: tarfile.TarFile, target: Path) -> None:
    target.mkdir(parents=True)
    for member in archive.getmembers():
        if not (member.isfile() or member.isdir()):
            continue  # no links or devices
        path = Path(member.name)
        if path.is_absolute() or ".." in path.parts:
            raise RuntimeBuildError(f"unsafe path in the stdlib archive: {member.name}")
        out = target / path
        if member.isdir():
            out.mkdir(parents=True, exist_ok=True)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        source = archive.extractfile(member)
        assert source is not None
        out.write_bytes(source.read())


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
