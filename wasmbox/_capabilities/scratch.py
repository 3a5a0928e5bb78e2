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
"""

from __future__ import annotations

import ctypes
import os
import stat
import tempfile
import time
import weakref
from pathlib import Path

import wasmtime

from .. import _call, _outcome
from .._errors import ErrorKind
from .._manifest import SCRATCH_GUEST_PATH as GUEST_PATH
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

    def create(self, cap: int) -> CallScratch:
        """A fresh, empty directory for one call, of at most `cap` bytes."""
        return CallScratch(Path(tempfile.mkdtemp(prefix="call-", dir=self.root)), cap)

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
                                stack.append(os.open(
                                    entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd,
                                ))  # fmt: skip
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

    def __init__(self, path: Path, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.preopen = (path, GUEST_PATH, True)  # (host, guest, writable) for `build_wasi`
        self._id = 0

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
        """Delete the directory and all in it (again is a no-op)."""
        remove(self.path)


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
