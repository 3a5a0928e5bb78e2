"""Scratch space: one fresh, empty, writable directory per call at `/tmp`, gone afterwards.

Each call's directory lives under one private root per Sandbox (0700). Its size is enforced
while the guest runs, not only after: the store's epoch deadline becomes one tick, and at every
tick (every `EngineSettings.epoch_tick_s`, on the call's own thread) a callback measures the
directory and stops the guest with `output_limit` once it holds more than the cap, or with
`timeout` once the call's deadline has passed. So the host holds at most the cap plus what
the guest writes in one tick, or plus one write: the Python runtime's streams write at most
4 KiB at a time, but a core module's single `fd_write` can carry up to its whole memory
(`limits.memory`), and no tick can stop a write half way (Wasmtime's WASI cannot be wrapped:
its functions need the calling instance's memory).

Removal and measurement never follow symlinks and work relative to directory descriptors, so
a guest's deep trees (deeper than PATH_MAX or the recursion limit) and symlinks cannot make
the host remove, measure or keep anything outside the call's directory.

Input files (a manifest's `inputs`, a call's `files`) are checked by `check_inputs` before the
call starts (names under /tmp/in, no `..`, `.` or empty parts, no NUL, short parts, few and
small enough) and written by `CallScratch.put` before the guest runs: into a folder of their
own, preopened read-only at /tmp/in (Wasmtime's read-only preopen: the guest cannot change
them, whatever the host's file modes say), or with `inputs.writable` into the scratch folder's
`in/`, where they count against its cap. Output files (`outputs`: paths and globs under /tmp)
are found by a walk that follows no link and read like `command.outputs` (`collect`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fnmatch
import os
import re
import stat
import tempfile
import time
import weakref
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from types import MappingProxyType

import wasmtime

from .. import _call, _outcome
from .._errors import ErrorKind
from .._manifest import INPUTS_GUEST_PATH, Inputs
from .._manifest import SCRATCH_GUEST_PATH as GUEST_PATH
from .._outcome import Failure
from .._units import format_size
from .._wasmtime import capi as _capi
from .._wasmtime import store as _store

ENTRY_MIN = 4096  # each file or directory counts at least this much (an inode, a block)


class ScratchSpace:
    """The per-call directories of one Sandbox, under a private root made at once (so grants
    can be checked against it) and removed when the Sandbox closes or is collected."""

    def __init__(self, parent: str | os.PathLike[str] | None = None) -> None:
        if parent is not None:
            Path(parent).mkdir(parents=True, exist_ok=True)
        self.root = Path(os.path.realpath(tempfile.mkdtemp(prefix="wasmbox-scratch-", dir=parent)))
        self._finalizer = weakref.finalize(self, remove, self.root)
        # an empty directory no one may write (0500): the hidden root of core modules' calls
        self.empty = self.root / "empty"
        self.empty.mkdir(mode=0o500)

    def create(self, cap: int, inputs: Inputs | None = None) -> CallScratch:
        """A fresh, empty directory for one call, of at most `cap` bytes; with read-only
        `inputs`, an empty folder beside it for the call's input files."""
        path = Path(tempfile.mkdtemp(prefix="call-", dir=self.root))
        folder = None
        if inputs is not None and not inputs.writable:
            folder = Path(tempfile.mkdtemp(prefix="inputs-", dir=self.root))
        return CallScratch(path, cap, folder)

    def close(self) -> None:
        self._finalizer()


def remove(path: Path) -> None:
    """Delete a directory and everything in it, whatever a guest made there."""
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    try:
        _empty(top)
    finally:
        os.close(top)
    os.rmdir(path)


def _empty(top: int) -> None:
    """Remove everything below the directory `top`, iteratively (no recursion limit)."""
    stack: list[tuple[int, str | None]] = [(os.dup(top), None)]  # (dir fd, its name in the parent)
    while stack:
        fd, _ = stack[-1]
        descended = False
        with os.scandir(fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    try:
                        child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    stack.append((child, entry.name))
                    descended = True
                    break
                os.unlink(entry.name, dir_fd=fd)
        if descended:
            continue
        fd, name = stack.pop()
        os.close(fd)
        if name is not None:
            os.rmdir(name, dir_fd=stack[-1][0])


def usage(path: Path, stop_above: int) -> int:
    """Bytes the directory holds: each entry counts its size or its blocks, at least
    `ENTRY_MIN`. Stops counting once past `stop_above` (that is enough to know)."""
    total = 0
    try:
        top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return 0
    stack = [top]
    try:
        while stack and total <= stop_above:
            fd = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        total += max(info.st_size, info.st_blocks * 512, ENTRY_MIN)
                        if stat.S_ISDIR(info.st_mode):
                            try:
                                stack.append(
                                    os.open(
                                        entry.name,
                                        os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                        dir_fd=fd,
                                    )
                                )
                            except OSError:
                                continue
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return total


class CallScratch:
    """One call's scratch directory: preopened at /tmp, checked with the call's deadline at
    every epoch tick while the guest runs (`arm` .. `settle`), then removed."""

    def __init__(self, path: Path, cap: int, inputs: Path | None = None) -> None:
        self.path = path
        self.cap = cap
        self.inputs = inputs  # the read-only input files' folder, preopened at /tmp/in
        self.preopen = (path, GUEST_PATH, True)  # (host, guest, writable) for `build_wasi`
        self.preopens: tuple[tuple[Path, str, bool], ...] = (
            (self.preopen,) if inputs is None else (self.preopen, (inputs, INPUTS_GUEST_PATH, False))
        )  # (what `build_wasi` takes as extra preopens)
        self._id = 0

    def put(self, files: Mapping[str, bytes]) -> None:
        """Write the call's input files (checked by `check_inputs`: paths below /tmp/in) before
        the guest runs, replacing any of the same name. Raises a `host_error` Failure when one
        cannot be written (e.g. the disk is full)."""
        if not files:
            return
        try:
            root = self.inputs
            if root is None:  # writable: the scratch folder's in/
                root = self.path / "in"
                top = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                try:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir("in", 0o700, dir_fd=top)
                finally:
                    os.close(top)
            for relative, data in files.items():
                write_file(root, relative, data)
        except OSError as exc:
            raise Failure(ErrorKind.HOST_ERROR, f"input files could not be written: {exc.strerror}") from None

    def collect_globs(self, patterns: tuple[str, ...], cap: int) -> dict[str, bytes]:
        """`collect` of the regular files under /tmp that `patterns` (paths and globs) match,
        in path order; at most `MAX_OUTPUTS` of them."""
        return self.collect(tuple(matching(self.path, patterns)), cap)

    def listing(self) -> dict[str, int]:
        """The regular files under /tmp now, by guest path, with their sizes (links not followed)."""
        return dict(_walk(self.path))

    def read(self, guest: str, cap: int) -> bytes | None:
        """The regular file at guest path `guest` under /tmp (at most `cap` + 1 bytes), or None."""
        if not guest.startswith(GUEST_PATH + "/") or not _plain(guest[len(GUEST_PATH) + 1 :]):
            return None
        return read_file(self.path, guest[len(GUEST_PATH) + 1 :], cap)

    def arm(self, store: wasmtime.Store) -> None:
        """Check at every tick of `store` from now until `settle` (on the call's thread)."""
        self._id = _watches.add(self)
        _store.on_epoch_deadline(store, _on_tick, self._id, _capi.NO_FINALIZER)

    def settle(self) -> str | None:
        """Stop checking; once the guest has stopped, why the folder is over its cap, if it is
        (a call shorter than a tick is measured only here): evidence for `_outcome.decide`."""
        _watches.discard(self._id)
        return self.message if self.over() else None

    def over(self) -> bool:
        return usage(self.path, self.cap) > self.cap

    @property
    def message(self) -> str:
        return f"scratch space {GUEST_PATH} exceeded its {format_size(self.cap)} cap"

    def collect(self, paths: tuple[str, ...], cap: int) -> dict[str, bytes]:
        """The regular files at guest `paths` (under /tmp) that the call left, by path. A path
        that is missing, or is not a regular file, is left out. Raises an `output_limit`
        Failure when together they hold more than `cap` bytes."""
        files: dict[str, bytes] = {}
        room = cap
        for guest in paths:
            data = read_file(self.path, guest[len(GUEST_PATH) + 1 :], room)
            if data is None:
                continue
            if len(data) > room:
                message = f"output files exceed the {format_size(cap)} output cap (at {guest})"
                raise _outcome.Failure(ErrorKind.OUTPUT_LIMIT, message)
            files[guest] = data
            room -= len(data)
        return files

    def remove(self) -> None:
        """Delete the directory and all in it (again is a no-op), and the input files' folder."""
        remove(self.path)
        if self.inputs is not None:
            remove(self.inputs)


NO_FILES: Mapping[str, bytes] = MappingProxyType({})


MAX_NAME = 255  # bytes of one part of an input file's path (as most file systems allow)
MAX_PATH = 1024  # bytes of an input file's whole path below /tmp/in
MAX_DEPTH = 16  # folders an input file may be below /tmp/in
MAX_OUTPUTS = 256  # files `outputs` returns at most (the output cap bounds their bytes)


def check_inputs(  # noqa: C901 - a refusal per way a file can be wrong, each naming the fix
    files: object, inputs: Inputs | None
) -> tuple[dict[str, bytes], str | None]:
    """A call's input files by their path below /tmp/in, and None; or nothing and what is wrong
    with them, naming the file and the fix. Names are paths relative to /tmp/in ("data.csv",
    "raw/a.json") or absolute under it ("/tmp/in/data.csv"); contents are bytes or str (UTF-8)."""
    if files is None:
        return {}, None
    if not isinstance(files, Mapping):
        return {}, f"files must be a mapping of path to bytes or str, got {type(files).__name__}"
    if not files:
        return {}, None
    if inputs is None:
        return {}, 'this call takes no files: its manifest has no `inputs` (e.g. inputs = {size = "4MiB"})'
    if len(files) > inputs.count:
        return {}, f"{len(files)} files, more than the {inputs.count} a call may bring (inputs.count)"
    checked: dict[str, bytes] = {}
    total = 0
    for name, content in files.items():
        shown = repr(name)[:80]
        if not isinstance(name, str):
            return {}, f"an input file's name must be a str, got {type(name).__name__}"
        relative = name[len(INPUTS_GUEST_PATH) + 1 :] if name.startswith(INPUTS_GUEST_PATH + "/") else name
        if name.startswith("/") and relative is name:
            return {}, f"input file {shown}: an absolute path must be under {INPUTS_GUEST_PATH}"
        problem = _name_problem(relative)
        if problem is not None:
            return {}, f"input file {shown}: {problem}"
        if isinstance(content, str):
            data = content.encode("utf-8", "surrogatepass")
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        else:
            return {}, f"input file {shown}: its content must be bytes or str, got {type(content).__name__}"
        if relative in checked:
            return {}, f"input file {shown} is given twice"
        checked[relative] = data
        total += len(data)
        if total > inputs.size:
            return (
                {},
                f"the input files hold more than the {format_size(inputs.size)} a call may bring (inputs.size)",
            )
    names = set(checked)
    for relative in checked:  # a file cannot also be a folder of another
        parts = relative.split("/")
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            if folder in names:
                return {}, f"input file {folder!r} is also the folder of {relative!r}"
    return checked, None


def _name_problem(relative: str) -> str | None:
    if not relative:
        return "an empty name"
    if "\0" in relative:
        return "a NUL byte in the name"
    encoded = relative.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_PATH:
        return f"a path longer than {MAX_PATH} bytes"
    parts = relative.split("/")
    if len(parts) > MAX_DEPTH + 1:
        return f"more than {MAX_DEPTH} folders deep"
    for part in parts:
        if part in ("", ".", ".."):
            return "'..', '.' and empty parts are refused: give a plain path below /tmp/in"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME:
            return f"a part longer than {MAX_NAME} bytes"
    if _SURROGATE.search(relative):
        return "a lone surrogate in the name"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _plain(relative: str) -> bool:
    return all(part not in ("", ".", "..") for part in relative.split("/")) and "\0" not in relative


def write_file(root: Path, relative: str, data: bytes) -> None:
    """Write `data` as the regular file `relative` below `root`, making its folders, one
    component at a time without following links; a file of that name is replaced (unlinked
    first: a link to it elsewhere is left as it was)."""
    names = relative.split("/")
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)]
    try:
        for name in names[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=fds[-1])
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        with contextlib.suppress(FileNotFoundError):
            os.unlink(names[-1], dir_fd=fds[-1])
        fd = os.open(names[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fds[-1])
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def matching(root: Path, patterns: tuple[str, ...]) -> list[str]:
    """The guest paths of the regular files below `root` (the call's /tmp) that one of
    `patterns` matches (fnmatch per path part; `**` any number of parts), sorted, at most
    `MAX_OUTPUTS`."""
    if not patterns:
        return []
    found = []
    for guest, _ in _walk(root):
        if any(_matches(guest, pattern) for pattern in patterns):
            found.append(guest)
            if len(found) >= MAX_OUTPUTS:
                break
    return sorted(found)


def _matches(guest: str, pattern: str) -> bool:
    path, want = PurePosixPath(guest).parts, PurePosixPath(pattern).parts
    return _match_parts(path, want)


def _match_parts(path: tuple[str, ...], want: tuple[str, ...]) -> bool:
    if not want:
        return not path
    if want[0] == "**":
        return any(_match_parts(path[i:], want[1:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], want[0]) and _match_parts(path[1:], want[1:])


_WALK_MAX = 10_000  # entries a walk looks at, at most (a guest may have made millions)


def _walk(root: Path) -> list[tuple[str, int]]:
    """(guest path, size) of the regular files below `root`, not following links, looking at
    no more than `_WALK_MAX` entries."""
    found: list[tuple[str, int]] = []
    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return found
    stack = [(top, GUEST_PATH)]
    seen = 0
    try:
        while stack and seen < _WALK_MAX:
            fd, prefix = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        seen += 1
                        if seen >= _WALK_MAX:
                            break
                        try:
                            info = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        guest = f"{prefix}/{entry.name}"
                        if stat.S_ISREG(info.st_mode):
                            found.append((guest, info.st_size))
                        elif stat.S_ISDIR(info.st_mode):
                            try:
                                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                stack.append((os.open(entry.name, flags, dir_fd=fd), guest))
                            except OSError:
                                continue
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)
    return found


def read_file(root: Path, relative: str, cap: int) -> bytes | None:
    """At most `cap` + 1 bytes of the regular file `relative` below `root`, opened one
    component at a time without following symlinks; None if there is none such."""
    names = relative.split("/")
    fds: list[int] = []
    try:
        fds.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))
        for name in names[:-1]:
            fds.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fds[-1]))
        fds.append(os.open(names[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fds[-1]))
        if not stat.S_ISREG(os.fstat(fds[-1]).st_mode):
            return None
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fds[-1], min(cap + 1 - size, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError:  # missing, a symlink, not a directory on the way
        return None
    finally:
        for fd in fds:
            os.close(fd)


_watches: _capi.Handles[CallScratch] = _capi.Handles()  # armed ones, for their stores' callback


@_store.EpochCallback
def _on_tick(
    context: _capi.Context,
    handle: int | None,
    delta: ctypes._Pointer[ctypes.c_uint64],
    kind: ctypes._Pointer[ctypes.c_uint8],
) -> int:
    """Runs on the guest's thread: continue for one more tick, or stop the guest."""
    try:
        watch = _watches.get(handle)
        if watch is None:
            return _stop(context, ErrorKind.HOST_ERROR, "the call's scratch watch is gone")
        state = _call.current()
        if time.perf_counter() > state.deadline:
            return _stop(context, ErrorKind.TIMEOUT, _outcome.deadline_message(state.manifest.limits))
        if watch.over():
            return _stop(context, ErrorKind.OUTPUT_LIMIT, watch.message)
    except BaseException as exc:  # noqa: BLE001 - never unwind into Wasmtime
        return _stop(context, ErrorKind.HOST_ERROR, _call.callback_failed(context, "scratch check", exc))
    delta[0] = 1
    kind[0] = _store.EPOCH_CONTINUE
    return 0


def _stop(context: _capi.Context, kind: ErrorKind, message: str) -> int:
    if _call.inside_call():
        _call.abort(context, kind, message)
    return _capi.error_pointer(message)
