"""The on-disk cache of compiled code: trusted, so private and checked.

An entry is `<key>.cwasm` (Wasmtime's serialized module) beside `<key>.json` (the key's inputs,
the artifact's size and digest, `artifact_digest`). The key is sha256(wasm) + Wasmtime version + engine settings.
Python tools' bytecode (compiled by the runtime, which runs it; stored with the entry's
signature) is kept the same way, as `bytecode-<sha256 of runtime, file name, entry and source>.bin`.
Entries are written atomically; one whose metadata, size or digest does not match is rebuilt,
never loaded. A compiled artifact's digest is read in full until a passed check is noted in its
metadata (`checked`: the file's device, inode, size, modification and change times); from then
on that file, unchanged, is loaded without reading it through (`_SETTLED_NS`). The directory is
created 0700 and refused if another user owns it or can write it, or if a folder on its way
from `/` could let another user swap it (see `_ancestors_problem`).
It is opened once, without following a symlink, and every entry is read, written, touched and
removed relative to that descriptor, so renaming the folder away and putting another in its
place later changes nothing this cache loads.
The entries' total size is capped (`max_bytes`): after each store the least recently used go
first, by their `.json`'s mtime, which a hit touches. Removing an entry another process has
loaded is safe on POSIX: Wasmtime's mapping of the `.cwasm` outlives its name. The runtimes'
build folders (`*-runtime-*`), package sets (`packages-*`) and downloaded build inputs
(`inputs/`) are not entries and are not under the cap (`folders` lists them); they are used
by path, which the ancestors' check keeps out of other users' reach.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import secrets
import stat
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

import wasmtime
from wasmtime import component

from ._capabilities.grants import lookup
from ._errors import WasmboxError
from ._files import read_regular_file
from ._units import parse_size
from ._wasmtime.engine import EngineSettings

Artifact = wasmtime.Module | component.Component
OnCompile = Callable[[], AbstractContextManager[object]]  # the context a compile runs in


def default_cache_dir() -> Path:
    """`$WASMBOX_CACHE_DIR`, else `$XDG_CACHE_HOME/wasmbox`, else `~/.cache/wasmbox`."""
    explicit = os.environ.get("WASMBOX_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "wasmbox"


DEFAULT_MAX_BYTES = 2 * 1024**3


def default_max_bytes() -> int:
    """`$WASMBOX_CACHE_MAX` ("4GiB", "500MB", bytes), else 2 GiB. Raises ValueError for a
    value that is not a size."""
    explicit = os.environ.get("WASMBOX_CACHE_MAX")
    if not explicit:
        return DEFAULT_MAX_BYTES
    size = parse_size(explicit)
    if not isinstance(size, int) or size < 0:
        raise ValueError(f"WASMBOX_CACHE_MAX={explicit!r} is not a size")
    return size


@dataclass(frozen=True)
class Entry:
    """One cache entry on disk: its key (the file stem), size in bytes (data and metadata),
    and when it was last used (seconds since the epoch)."""

    key: str
    size: int
    last_used: float
    files: tuple[str, ...]  # names in the cache directory: the metadata, then the data


def entries(directory: Path | int) -> list[Entry]:
    """The cache's entries in `directory` (a path, or a descriptor of it), least recently
    used first."""
    try:
        with _opened(directory) as fd:
            return _entries(fd)
    except OSError:
        return []


def _entries(fd: int) -> list[Entry]:
    found = []
    names = set(os.listdir(fd))
    for meta in names:
        key, dot, suffix = meta.rpartition(".")
        kind = key.split("-", 1)[0]
        if not dot or suffix != "json" or kind not in _KINDS:
            continue
        data = key + _KINDS[kind]
        try:
            info = os.stat(meta, dir_fd=fd, follow_symlinks=False)
        except OSError:  # removed meanwhile
            continue
        try:
            size = info.st_size + os.stat(data, dir_fd=fd, follow_symlinks=False).st_size
        except FileNotFoundError:
            size = info.st_size
        found.append(Entry(key, size, info.st_mtime, (meta, data)))
    return sorted(found, key=lambda e: (e.last_used, e.key))


def folders(directory: Path) -> list[Entry]:
    """What the cache holds besides its entries, each with the size of its files: the runtimes
    built (`*-runtime-*`), the package sets (`packages-*`) and each downloaded build input
    (`inputs/<name-version>`); largest first. These are not under the cap (`prune` leaves them)."""
    found = []
    candidates = [p for p in _listing(directory) if p.name != "inputs"] + _listing(directory / "inputs")
    for folder in candidates:
        try:
            if folder.is_symlink() or not folder.is_dir():
                continue
            used = folder.stat().st_mtime
        except OSError:
            continue
        found.append(Entry(str(folder.relative_to(directory)), tree_size(folder), used, (str(folder),)))
    return sorted(found, key=lambda e: (-e.size, e.key))


def _listing(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if not p.name.startswith(".")]
    except OSError:
        return []


def tree_size(folder: Path) -> int:
    """The size of every file under `folder` (links not followed)."""
    total = 0
    for root, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile
                pass
    return total


def prune(directory: Path | int, max_bytes: int, keep: str | None = None) -> list[Entry]:
    """Remove least recently used entries of `directory` (a path, or a descriptor of it) until
    the rest total `max_bytes` or less (`keep`, a key, goes last). Returns the removed entries."""
    try:
        with _opened(directory) as fd:
            found = _entries(fd)
            if keep is not None:
                found.sort(key=lambda e: e.key == keep)  # stable: LRU order otherwise
            total = sum(e.size for e in found)
            removed = []
            for entry in found:
                if total <= max_bytes:
                    break
                if _remove(fd, entry):
                    total -= entry.size
                    removed.append(entry)
            return removed
    except OSError:
        return []


@contextlib.contextmanager
def _opened(directory: Path | int) -> Iterator[int]:
    """A descriptor of `directory`: the one given, or one opened for the block."""
    if isinstance(directory, int):
        yield directory
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def _remove(fd: int, entry: Entry) -> bool:
    gone = True
    for name in entry.files:  # the metadata first: without it, the data is never trusted
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass
        except OSError:  # e.g. mapped on a system that forbids removing it
            gone = False
    return gone


_KINDS = {"module": ".cwasm", "component": ".cwasm", "bytecode": ".bin"}


@dataclass
class CacheStats:
    """What the cache did in this process."""

    hits: int = 0
    compiles: int = 0
    rejected: int = 0  # entries found but not trusted (corrupt, mismatched), then rebuilt
    write_failures: int = 0  # compiled but not stored (the directory is unwritable or full)
    evicted: int = 0  # entries removed to keep the cache under its size cap
    discarded: int = 0  # entries of refused modules removed after their compile


class ArtifactCache:
    """Compiled modules by content, shared by every Sandbox that uses the same directory."""

    def __init__(
        self,
        directory: Path | None,
        settings: EngineSettings,
        max_bytes: int | None = DEFAULT_MAX_BYTES,
        *,
        _held: ArtifactCache | None = None,
    ) -> None:
        """`max_bytes` caps the entries' total size (None: no cap). Raises WasmboxError for a
        directory that cannot be made, is not private, or lies where another user could swap it."""
        self.stats = CacheStats()
        self._fingerprint = settings.fingerprint()
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._stored: set[str] = set()  # keys of module entries this process compiled and wrote
        self._owner = _held is None
        self._keep = _held  # a sibling's owner, alive while the sibling is (it holds the descriptor)
        self._closer: weakref.finalize[[int], ArtifactCache] | None = None  # closes the descriptor once
        self.directory: Path | None
        self.path_folders: set[Path]
        self._fd: int | None
        if _held is not None:  # a sibling for other engine settings: the same open directory
            self.directory, self.path_folders, self._fd = _held.directory, _held.path_folders, _held._fd
            return
        # resolved once: a symlink on the way, swapped later, cannot move this cache elsewhere;
        # and the folders whose entries spell `directory` as given (through its symlinks), in
        # the same walk: a guest able to write one could swap what that path names for the
        # next process
        found = lookup(directory) if directory is not None else None
        self.directory = found.real if found is not None else None
        self.path_folders = set(map(Path, found.folders)) if found is not None else set()
        self._fd = _open_private_dir(self.directory) if self.directory is not None else None
        if self._fd is not None:
            self._closer = weakref.finalize(self, os.close, self._fd)

    def sibling(self, settings: EngineSettings) -> ArtifactCache:
        """A cache of the same directory (the same descriptor, owned by this one) for an engine
        of other settings."""
        return ArtifactCache(self.directory, settings, self.max_bytes, _held=self)

    def close(self) -> None:
        """Close the directory's descriptor (the owner's; siblings share it). Again is a no-op."""
        with self._lock:
            self._fd = None
        if self._owner and self._closer is not None:
            self._closer()  # (once: a collected cache closes it the same way)

    def module(
        self,
        engine: wasmtime.Engine,
        wasm: bytes,
        digest: str,
        on_compile: OnCompile | None = None,
    ) -> wasmtime.Module:
        """The compiled module for `wasm` (binary) whose sha256 is `digest`, from the cache
        when a trusted entry exists. A compile runs inside `on_compile()` (e.g. a progress
        `Step`)."""
        return self._artifact(engine, digest, lambda: wasm, wasmtime.Module, on_compile)  # type: ignore[return-value]

    def discard_module(self, digest: str) -> None:
        """Remove the entry of the module `digest` if this process compiled and stored it: the
        module was refused after its compile, and its artifact is not kept."""
        key = f"module-{digest}-{self._fingerprint}"
        with self._lock:
            if key not in self._stored or self._fd is None:
                return
            self._stored.discard(key)
        if _remove(self._fd, Entry(key, 0, 0.0, (f"{key}.json", f"{key}.cwasm"))):
            with self._lock:
                self.stats.discarded += 1

    def prune(self, max_bytes: int | None = None, keep: str | None = None) -> list[Entry]:
        """Evict least recently used entries down to `max_bytes` (default: the cap)."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        if self._fd is None or limit is None:
            return []
        removed = prune(self._fd, limit, keep)
        with self._lock:
            self.stats.evicted += len(removed)
            self._stored.difference_update(e.key for e in removed)
        return removed

    def component(
        self,
        engine: wasmtime.Engine,
        wasm: Path,
        digest: str,
        on_compile: OnCompile | None = None,
    ) -> component.Component:
        """The compiled component for the file `wasm` whose sha256 is `digest` (the file is
        read only to compile it). A compile runs inside `on_compile()`, as for `module`."""
        return self._artifact(
            engine, digest, partial(read_regular_file, wasm), component.Component, on_compile
        )  # type: ignore[return-value]

    def _artifact(
        self,
        engine: wasmtime.Engine,
        digest: str,
        wasm: Callable[[], bytes],
        kind: type[Artifact],
        on_compile: OnCompile | None = None,
    ) -> Artifact:
        if self._fd is None:
            return self._compile(engine, wasm(), kind)
        key = f"{kind.__name__.lower()}-{digest}-{self._fingerprint}"
        artifact, meta = f"{key}.cwasm", f"{key}.json"
        expected = {"wasm_sha256": digest, "engine": self._fingerprint}
        loaded = self._load(engine, artifact, meta, expected, kind)
        if loaded is not None:
            with self._lock:
                self.stats.hits += 1
                self._stored.discard(key)  # used again: no longer only this process's compile
            self._touch(meta)
            return loaded
        with on_compile() if on_compile is not None else nullcontext():
            compiled = self._compile(engine, wasm(), kind)
        if self._store(artifact, meta, bytes(compiled.serialize()), expected):
            if kind is wasmtime.Module:
                with self._lock:
                    self._stored.add(key)
            self.prune(keep=key)
        return compiled

    def bytecode(self, digest: str, make: Callable[[], bytes]) -> bytes:
        """A Python tool's bytecode: `make()` compiles it (in the runtime), once per cache;
        `digest` is the sha256 of what the bytes depend on (runtime, file name, entry, source). An
        exception from `make` stores nothing."""
        if self._fd is None:
            return make()
        name = f"bytecode-{digest}"
        path, meta = f"{name}.bin", f"{name}.json"
        expected = {"source_sha256": digest}
        try:
            record, data = json.loads(self._read(meta)), self._read(path)
        except (OSError, ValueError):
            pass
        else:
            trusted = _trusted(record, expected, len(data), artifact_digest(data))
            if trusted:
                with self._lock:
                    self.stats.hits += 1
                self._touch(meta)
                return data
            with self._lock:
                self.stats.rejected += 1
        data = make()
        with self._lock:
            self.stats.compiles += 1
        if self._store(path, meta, data, expected):
            self.prune(keep=name)
        return data

    def _store(self, artifact: str, meta: str, data: bytes, expected: dict[str, str]) -> bool:
        """Write an entry; False (with a warning) when it cannot be written."""
        record = dict(expected, size=len(data), digest=artifact_digest(data))
        try:
            self._write_atomic(artifact, data)
            self._write_atomic(meta, json.dumps(record).encode())
            return True
        except OSError as exc:  # unwritable or full: the compiled artifact is good all the same
            with self._lock:
                self.stats.write_failures += 1
            warnings.warn(
                f"wasmbox: cannot write to the compile cache {self.directory} "
                f"({exc.strerror or exc}); using the compiled code without caching it, so "
                "the next process compiles it again",
                RuntimeWarning,
                stacklevel=5,
            )
            return False

    def _compile(self, engine: wasmtime.Engine, wasm: bytes, kind: type[Artifact]) -> Artifact:
        with self._lock:
            self.stats.compiles += 1
        return kind(engine, wasm)

    def _load(
        self,
        engine: wasmtime.Engine,
        artifact: str,
        meta: str,
        expected: dict[str, str],
        kind: type[Artifact],
    ) -> Artifact | None:
        try:
            record = json.loads(self._read(meta))
            fd = self._open(artifact)
        except (OSError, ValueError):
            return None
        try:
            if self._checked(record, expected, fd, meta):
                # Wasmtime maps the file it opens by this name: the one just checked
                return kind.deserialize_file(engine, f"/proc/self/fd/{fd}")
        except (OSError, ValueError, wasmtime.WasmtimeError):
            pass
        finally:
            os.close(fd)
        with self._lock:
            self.stats.rejected += 1
        return None

    def _checked(self, record: object, expected: dict[str, str], fd: int, meta: str) -> bool:
        """Whether the open artifact `fd` is what its metadata `record` names: the file a
        full check passed before, unchanged since (its `_identity`), or else its size and digest
        read now. A full check that passes on a file whose change time has settled is noted in
        the metadata (`checked`), so later processes skip the digest (tens of MiB for the
        Python runtime) until the file changes. Raises OSError, ValueError."""
        seen = os.fstat(fd)
        if not _names(record, expected):
            return False
        if record.get("checked") == _identity(seen):  # the file a full check passed, unchanged
            return True
        started = time.time_ns()
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as data:
            size, digest = len(data), artifact_digest(data)  # no copy into Python
        if not _trusted(record, expected, size, digest):
            return False
        if _identity(os.fstat(fd)) == _identity(seen) and seen.st_ctime_ns <= started - _SETTLED_NS:
            with contextlib.suppress(OSError):  # a read-only cache checks in full every time
                self._write_atomic(meta, json.dumps(dict(record, checked=_identity(seen))).encode())
        return True

    # -- files, relative to the directory's descriptor --------------------------------------

    def _open(self, name: str) -> int:
        """A descriptor of the regular file `name` in the directory (no symlink followed).
        Raises OSError."""
        assert self._fd is not None
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self._fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{name} is not a regular file")
        return fd

    def _read(self, name: str) -> bytes:
        fd = self._open(name)
        with os.fdopen(fd, "rb") as file:
            return file.read()

    def _touch(self, name: str) -> None:
        """Mark an entry used now (its place in the LRU order)."""
        try:
            os.utime(name, dir_fd=self._fd, follow_symlinks=False)
        except OSError:  # read-only cache or removed meanwhile: the order is a hint
            pass

    def _write_atomic(self, name: str, data: bytes) -> None:
        assert self._fd is not None
        tmp = f".tmp-{secrets.token_hex(8)}"
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self._fd
        )
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(tmp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except BaseException:
            os.unlink(tmp, dir_fd=self._fd)
            raise


def _names(record: object, expected: dict[str, str]) -> TypeGuard[dict[str, Any]]:
    """Whether an entry's metadata `record` names what is wanted (its key's inputs)."""
    return isinstance(record, dict) and all(record.get(k) == v for k, v in expected.items())


def _trusted(record: object, expected: dict[str, str], size: int, digest: str) -> bool:
    """Whether an entry's metadata `record` names what is wanted and the data read back."""
    return _names(record, expected) and record.get("size") == size and record.get("digest") == digest


# An artifact whose full check is noted is trusted while its file is the same one: device,
# inode, size, modification and change times. Writing to a file, renaming it or setting its
# times moves its change time to the moment it happens, which no process can set back on a
# filesystem that keeps change times itself (not vfat, network or FUSE ones: SECURITY.md, known
# gaps); a check is noted only for a file whose change time was at least _SETTLED_NS before
# the check began, so that a change within the clock's granularity of that time cannot share it.
_SETTLED_NS = 2 * 10**9


def _identity(info: os.stat_result) -> list[int]:
    return [info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns]


_PIECE = 16 * 1024 * 1024


def artifact_digest(data: bytes | mmap.mmap) -> str:
    """The sha256 of `data`; past 16 MiB, the sha256 of its 16 MiB pieces' sha256s, hashed on
    several threads (hashlib lets go of the GIL), so a big artifact such as the Python runtime
    is checked on every core."""
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


def _open_private_dir(directory: Path) -> int:
    """`directory` (a real path) made if missing and opened without following a symlink: a
    descriptor of a folder this user owns that others cannot write, on a way from `/` that no
    other user can change. Raises WasmboxError."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise WasmboxError(
            f"cache directory {directory} cannot be created: {exc.strerror or exc} "
            "(set WASMBOX_CACHE_DIR, or pass cache_dir=None to compile in memory)"
        ) from None
    info = os.fstat(fd)  # (the folder held, not what the path names by now)
    if info.st_uid != os.getuid():
        problem: str | None = f"cache directory {directory} is owned by another user"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"cache directory {directory} is writable by others; chmod 700 it"
    else:
        problem = _ancestors_problem(directory)
    if problem is not None:
        os.close(fd)
        raise WasmboxError(problem)
    return fd


def _ancestors_problem(directory: Path) -> str | None:
    """What would let another user swap the cache, or None: each folder on its way from `/`
    must be owned by this user or root, and not writable by group or others unless it is
    sticky (as /tmp is: only an entry's owner may rename it there). The runtimes and package
    sets under the cache are used by path, so this is what keeps them where they were built."""
    me = os.getuid()
    fix = "put the cache elsewhere (WASMBOX_CACHE_DIR, cache_dir=)"
    for folder in reversed(directory.parents):
        try:
            info = os.lstat(folder)
        except OSError as exc:
            return f"cache directory {directory}: {folder} cannot be read: {exc.strerror or exc}"
        if info.st_uid not in (me, 0):
            return (
                f"cache directory {directory}: the folder {folder} on its way is owned by another user "
                f"(uid {info.st_uid}), who could swap the cache for one of their own; {fix}"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return (
                f"cache directory {directory}: the folder {folder} on its way is writable by others "
                f"(mode {stat.filemode(info.st_mode)}), who could swap the cache for one of their own; "
                f"chmod go-w it, or {fix}"
            )
    return None
