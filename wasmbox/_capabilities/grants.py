"""Granted directories: how a preopen's path is resolved, which grants this process holds, and
opening a granted directory at each call as exactly the directory that was resolved.

wasmtime-py takes a preopen as a path and opens it when the WASI config is built. A path can
be redirected between a check and that open (a symlink swapped in by anyone who can write a
folder on it), so a preopen is never handed over by its own path: its real path is walked from
`/` one component at a time without following any symlink, the directory reached must be the
one (device, inode) resolved when the manifest was read, and Wasmtime is given
`/proc/self/fd/N` for that descriptor, a link to exactly that directory that no rename or
symlink can redirect.

The grants of every live Sandbox in the process are held here (`reserve`), so that no two of
them nest through a writable one (`overlapping_preopens`) and no writable one holds the path
to a loaded tool's module or source, in one Sandbox or across several.
"""

from __future__ import annotations

import itertools
import os
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._manifest import Preopen

# O_PATH: a walk needs only search permission on each folder, as a lookup by path does.
_WALK = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FD_DIR = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"


@dataclass(frozen=True)
class Lookup:
    """What a lookup of a path read on its way, as `os.path.realpath` walks it."""

    real: Path  # where it led
    folders: frozenset[str]  # the real folders whose entries it read
    links: tuple[str, ...]  # the symlinks it followed, as spelled on the way


def lookup(path: str | os.PathLike[str]) -> Lookup:
    """The lookup of `path` through every symlink on the way (a loop stops it, as realpath):
    whoever can write one of its `folders` can make `path` name something else. OSError when
    an entry on the way cannot be read (e.g. EACCES)."""
    text = os.fspath(path)
    folders: set[str] = set()
    links: list[str] = []
    current = "/" if text.startswith("/") else os.path.realpath(os.getcwd())
    pending = list(reversed(_parts(text)))
    followed: set[str] = set()
    while pending:
        part = pending.pop()
        if part == "/":
            current = "/"
        elif part == "..":
            current = os.path.dirname(current)
        else:
            folders.add(current)
            entry = current + part if current == "/" else f"{current}/{part}"
            if entry not in followed and _is_symlink(entry):  # (a loop: as realpath, stop)
                followed.add(entry)
                links.append(entry)
                pending.extend(reversed(_parts(os.readlink(entry))))
            else:
                current = entry
    return Lookup(Path(current), frozenset(folders), tuple(links))


def _parts(path: str) -> list[str]:
    """`path`'s components, "/" first when it is absolute ("//" is read as "/", as Linux does)."""
    return (["/"] if path.startswith("/") else []) + [p for p in path.split("/") if p and p != "."]


def _is_symlink(path: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


@dataclass(frozen=True)
class Resolved:
    """A preopen's host directory as found when its manifest was read."""

    lookup: Lookup
    identity: tuple[int, int]  # (st_dev, st_ino) of the directory reached

    @property
    def real(self) -> Path:
        return self.lookup.real


def resolve(path: Path) -> Resolved:
    """Resolve the granted directory given as `path` (absolute; not the root, which the caller
    refuses first). OSError when it is not a directory, or changed while being resolved."""
    found = lookup(path)
    fd = open_walk(found.real)
    try:
        return Resolved(found, identity(fd))
    finally:
        os.close(fd)


def open_walk(real: Path) -> int:
    """A descriptor of the directory `real` (an absolute path without symlinks), reached
    from `/` one component at a time without following a symlink: OSError (ENOTDIR) when a
    component is a symlink or not a directory."""
    fd = os.open("/", _WALK)
    try:
        for part in real.parts[1:]:
            child = os.open(part, _WALK, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def identity(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


class GrantMoved(OSError):
    """The path of a grant leads to another directory than the one granted."""


def open_granted(preopen: Preopen) -> int:
    """A descriptor of `preopen`'s directory, reached as `open_walk` does and checked to be
    the directory resolved with its manifest. OSError when it is gone or is another one."""
    resolved = preopen._resolved
    if resolved is None or resolved.real != preopen.host:  # e.g. a copy with another host
        raise GrantMoved(f"{preopen.host} was not resolved as a grant")
    fd = open_walk(preopen.host)
    try:
        if identity(fd) != resolved.identity:
            raise GrantMoved(f"{preopen.host} is no longer the directory that was granted")
    except BaseException:
        os.close(fd)
        raise
    return fd


def fd_path(fd: int) -> str:
    """A path naming exactly the open directory `fd` (for as long as `fd` is open)."""
    return f"{_FD_DIR}/{fd}"


def overlapping_preopens(ours: Iterable[Preopen], theirs: Iterable[Preopen]) -> str | None:
    """Why two sets of grants must not coexist, or None.

    A guest with a writable directory can rename and replace anything in it. So no writable
    grant may contain another grant (its own, or another tool's): it could swap that one for
    a folder of its choice. Nor may a writable grant hold a symlink that another grant's path
    was given through: the guest chose where that path leads.
    """
    ours, theirs = tuple(ours), tuple(theirs)
    pairs = [(a, b) for a in ours for b in (*ours, *theirs)] + [(a, b) for a in theirs for b in ours]
    for a, b in pairs:
        if not a.writable:
            continue
        if a.host in b.host.parents:
            return f"writable preopen {a.host} contains another granted directory {b.host}"
        if b._resolved is not None:
            through = {Path(f) for f in b._resolved.lookup.folders} - set(b.host.parents)  # (by a symlink)
            if any(a.host == folder or a.host in folder.parents for folder in through):
                links = ", ".join(b._resolved.lookup.links)
                return (
                    f"preopen {b.host} is given through a symlink ({links}) that writable "
                    f"preopen {a.host} holds: a guest could have chosen where it leads"
                )
    return None


def _reaches_tool_file(writable: Iterable[Preopen], files: Iterable[Lookup]) -> str | None:
    """Why a tool's file (module, source), read by path at load, could be swapped or
    redirected by a guest: a writable grant holds a folder its path reads."""
    for a in writable:
        for file in files:
            if a.writable and any(a.host == Path(f) or a.host in Path(f).parents for f in file.folders):
                return f"writable preopen {a.host} holds the path to the tool's file {file.real}"
    return None


# The grants of every live Sandbox in this process (and the lookups of their tools' files):
# reservation token -> (owner, preopens, files).
_lock = threading.Lock()
_held: dict[int, tuple[int, tuple[Preopen, ...], tuple[Lookup, ...]]] = {}
_tokens = itertools.count(1)
# Owners released while `_lock` was held: a Sandbox's finalizer runs when the garbage collector
# does, which may be inside `reserve` on the same thread (waiting for the lock would deadlock,
# and `_held` may be mid-iteration). Dropped by whoever holds the lock next, before it reads.
_released: list[int] = []


class GrantConflict(Exception):
    """`reserve` refused: the message says which grants would overlap."""


def new_owner() -> int:
    """A fresh owner id (one per Sandbox) for `reserve` and `release_owner`."""
    return next(_tokens)


def reserve(
    owner: int, preopens: tuple[Preopen, ...], besides: int | None = None, files: tuple[Lookup, ...] = ()
) -> int:
    """Hold `preopens` for `owner` if they may coexist with every grant held in the process
    (but reservation `besides`, which they are to replace), and no writable grant holds a
    folder on the way to a tool's `files` (theirs or these): checked and held in one step, so
    two loads cannot both pass the check. Returns the reservation's token; GrantConflict."""
    with _lock:
        _drop_released()
        others = [held for token, held in _held.items() if token != besides]
        theirs = [p for _, held, _ in others for p in held]
        their_files = [f for _, _, held_files in others for f in held_files]
        problem = (
            overlapping_preopens(preopens, theirs)
            or _reaches_tool_file((*preopens, *theirs), files)
            or _reaches_tool_file(preopens, their_files)
        )
        if problem is not None:
            raise GrantConflict(problem)
        token = next(_tokens)
        _held[token] = (owner, preopens, files)
    return token


def release(token: int | None) -> None:
    """Give back the grants of reservation `token` (again, or None, is a no-op)."""
    if token is not None:
        with _lock:
            _drop_released()
            _held.pop(token, None)


def release_owner(owner: int) -> None:
    """Give back every grant `owner` holds (a Sandbox closed or collected). Never waits: with
    the lock held (by this thread, under a finalizer, or another), the owner is dropped by the
    next `reserve` or `release`, before it reads what is held."""
    _released.append(owner)
    if _lock.acquire(blocking=False):
        try:
            _drop_released()
        finally:
            _lock.release()


def _drop_released() -> None:
    """Drop the grants of the owners released so far (under `_lock`)."""
    while _released:
        owner = _released.pop()
        for token in [t for t, (o, _, _) in _held.items() if o == owner]:
            del _held[token]
