"""The on-disk cache of compiled code: trusted, so private and checked.

An entry is `<key>.cwasm` (Wasmtime's serialized module) beside `<key>.json` (the key's inputs,
the artifact's size and digest, `artifact_digest`). The key is sha256(wasm) + Wasmtime version + engine settings.
Python tools' bytecode (compiled by the runtime, which runs it; stored with the entry's
signature) is kept the same way, as `bytecode-<sha256 of runtime, file name, entry and source>.bin`.
Entries are written atomically; one whose metadata, size or digest does not match is rebuilt,
never loaded. The directory is created 0700 and refused if another user owns it or can write it.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import stat
import tempfile
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import wasmtime
from wasmtime import component

from ._engine import EngineSettings
from ._errors import WasmboxError
from ._grants import lookup

Artifact = wasmtime.Module | component.Component


def default_cache_dir() -> Path:
    """`$WASMBOX_CACHE_DIR`, else `$XDG_CACHE_HOME/wasmbox`, else `~/.cache/wasmbox`."""
    explicit = os.environ.get("WASMBOX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "wasmbox"


@dataclass
class CacheStats:
    """What the cache did in this process."""

    hits: int = 0
    compiles: int = 0
    rejected: int = 0  # entries found but not trusted (corrupt, mismatched), then rebuilt
    write_failures: int = 0  # compiled but not stored (the directory is unwritable or full)


class ArtifactCache:
    """Compiled modules by content, shared by every Sandbox that uses the same directory."""

    def __init__(self, directory: Path | None, settings: EngineSettings) -> None:
        # resolved once: a symlink on the way, swapped later, cannot move this cache elsewhere;
        # and the folders whose entries spell `directory` as given (through its symlinks), in
        # the same walk: a guest able to write one could swap what that path names for the
        # next process
        found = lookup(directory) if directory is not None else None
        self.directory = found.real if found is not None else None
        self.path_folders = set(map(Path, found.folders)) if found is not None else set()
        self.stats = CacheStats()
        self._fingerprint = settings.fingerprint()
        self._lock = threading.Lock()
        if self.directory is not None:
            _ensure_private_dir(self.directory)

    def module(self, engine: wasmtime.Engine, wasm: bytes, digest: str) -> wasmtime.Module:
        """The compiled module for `wasm` (binary) whose sha256 is `digest`, from the cache
        when a trusted entry exists."""
        return self._artifact(engine, digest, lambda: wasm, wasmtime.Module)  # type: ignore[return-value]

    def component(
        self,
        engine: wasmtime.Engine,
        wasm: Path,
        digest: str,
        on_compile: Callable[[], None] | None = None,
    ) -> component.Component:
        """The compiled component for the file `wasm` whose sha256 is `digest` (the file is
        read only to compile it). `on_compile` is called before a (slow) compile."""
        return self._artifact(engine, digest, wasm.read_bytes, component.Component, on_compile)  # type: ignore[return-value]

    def _artifact(
        self,
        engine: wasmtime.Engine,
        digest: str,
        wasm: Callable[[], bytes],
        kind: type[Artifact],
        on_compile: Callable[[], None] | None = None,
    ) -> Artifact:
        if self.directory is None:
            return self._compile(engine, wasm(), kind)
        key = f"{kind.__name__.lower()}-{digest}-{self._fingerprint}"
        artifact = self.directory / f"{key}.cwasm"
        meta = self.directory / f"{key}.json"
        expected = {"wasm_sha256": digest, "engine": self._fingerprint}
        loaded = self._load(engine, artifact, meta, expected, kind)
        if loaded is not None:
            with self._lock:
                self.stats.hits += 1
            return loaded
        if on_compile is not None:
            on_compile()
        compiled = self._compile(engine, wasm(), kind)
        self._store(artifact, meta, bytes(compiled.serialize()), expected)
        return compiled

    def bytecode(self, digest: str, make: Callable[[], bytes]) -> bytes:
        """A Python tool's bytecode: `make()` compiles it (in the runtime), once per cache;
        `digest` is the sha256 of what the bytes depend on (runtime, file name, entry, source). An
        exception from `make` stores nothing."""
        if self.directory is None:
            return make()
        path = self.directory / f"bytecode-{digest}.bin"
        meta = path.with_suffix(".json")
        expected = {"source_sha256": digest}
        try:
            record, data = json.loads(meta.read_bytes()), path.read_bytes()
        except (OSError, ValueError):
            pass
        else:
            trusted = _trusted(record, expected, len(data), artifact_digest(data))
            if trusted:
                with self._lock:
                    self.stats.hits += 1
                return data
            with self._lock:
                self.stats.rejected += 1
        data = make()
        with self._lock:
            self.stats.compiles += 1
        self._store(path, meta, data, expected)
        return data

    def _store(self, artifact: Path, meta: Path, data: bytes, expected: dict[str, str]) -> None:
        record = dict(expected, size=len(data), digest=artifact_digest(data))
        try:
            _write_atomic(artifact, data)
            _write_atomic(meta, json.dumps(record).encode())
        except OSError as exc:  # unwritable or full: the compiled artifact is good all the same
            with self._lock:
                self.stats.write_failures += 1
            warnings.warn(
                f"wasmbox: cannot write to the compile cache {self.directory} "
                f"({exc.strerror or exc}); using the compiled code without caching it, so "
                "the next process compiles it again",
                RuntimeWarning, stacklevel=5,
            )  # fmt: skip

    def _compile(self, engine: wasmtime.Engine, wasm: bytes, kind: type[Artifact]) -> Artifact:
        with self._lock:
            self.stats.compiles += 1
        return kind(engine, wasm)

    def _load(
        self,
        engine: wasmtime.Engine,
        artifact: Path,
        meta: Path,
        expected: dict[str, str],
        kind: type[Artifact],
    ) -> Artifact | None:
        try:
            record = json.loads(meta.read_bytes())
            with open(artifact, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                size, digest = len(data), artifact_digest(data)  # no copy into Python
        except (OSError, ValueError):
            return None
        if _trusted(record, expected, size, digest):
            try:
                return kind.deserialize_file(engine, str(artifact))  # Wasmtime maps the file
            except wasmtime.WasmtimeError:
                pass
        with self._lock:
            self.stats.rejected += 1
        return None


def _trusted(record: object, expected: dict[str, str], size: int, digest: str) -> bool:
    """Whether an entry's metadata `record` names what is wanted and the data read back."""
    return (
        isinstance(record, dict)
        and all(record.get(k) == v for k, v in expected.items())
        and record.get("size") == size
        and record.get("digest") == digest
    )


_PIECE = 16 * 1024 * 1024


def artifact_digest(data: bytes | mmap.mmap) -> str:
    """The sha256 of `data`; past 16 MiB, the sha256 of its 16 MiB pieces' sha256s, hashed on
    several threads (hashlib lets go of the GIL), so the ~50 MB Python runtime is checked in
    half the time on two cores."""
    with memoryview(data) as view:
        if len(view) <= _PIECE:
            return hashlib.sha256(view).hexdigest()
        pieces = [view[i : i + _PIECE] for i in range(0, len(view), _PIECE)]
        try:
            with ThreadPoolExecutor(min(len(pieces), os.cpu_count() or 1)) as pool:
                digests = list(pool.map(lambda piece: hashlib.sha256(piece).digest(), pieces))
        finally:
            for piece in pieces:
                piece.release()  # before the caller closes its mmap
    return hashlib.sha256(b"".join(digests)).hexdigest()


def _ensure_private_dir(directory: Path) -> None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = directory.stat()
    except OSError as exc:
        raise WasmboxError(
            f"cache directory {directory} cannot be created: {exc.strerror or exc} "
            "(set WASMBOX_CACHE_DIR, or pass cache_dir=None to compile in memory)"
        ) from None
    if info.st_uid != os.getuid():
        raise WasmboxError(f"cache directory {directory} is owned by another user")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise WasmboxError(f"cache directory {directory} is writable by others; chmod 700 it")


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
