"""Limits on a WASI preview1 guest's files: capped open descriptors, no symlinks.

Wasmtime's WASI has no cap on descriptors: a guest with a preopen could open files until the
host process ran out of them, and every other call on the host with it. Our `path_open`,
`fd_close` and `fd_renumber` keep the set of descriptors the call has opened and refuse an
open with EMFILE past `MAX_OPEN_FILES` for the call, or past `process_budget()` for all calls
of the process together (half its descriptor limit: the rest stays the host's).

They cannot call Wasmtime's functions themselves: a WASI function finds the guest's memory
through its caller's exports, and a call from the host has no caller. So at a call's first
file operation a tiny forwarding module is instantiated in the call's store: it imports the
guest's memory and re-exports it as `memory`, and its functions call Wasmtime's (instantiated
through the engine layer's `capi.instantiate_with`). Calls that
never touch a file pay nothing. A trap in a forwarded call stops the guest at once, as it
would have unforwarded.

A core module's calls also have a hidden root (`FileGuard`): an empty read-only preopen at `/`
after the manifest's, so that an open of a path no grant covers reaches the host, which
refuses it as wasi-libc would have (ENOENT) and keeps the path, for the runner to say that
no preopen covers it. The other path calls that could reach that root are forwarded too.

`path_symlink` is refused outright (EPERM). A guest-made link may point out of its writable
grant; no guest can follow it out, but the host or another program reading the directory
later could.
"""

from __future__ import annotations

import ctypes
import posixpath
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import wasmtime

from .. import _abi, _call, _outcome
from .._wasmtime import capi as _capi
from .._wasmtime import store as _store

MAX_OPEN_FILES = 128  # descriptors one call may have open from path_open at once
FIRST_PREOPEN_FD = 3  # WASI numbers preopens from 3, in the order the config added them
MAX_NOTED = 8  # distinct paths one call records as landing on the hidden root
_NOTED_CHARS = 256  # of each recorded path
_PATH_OPEN, _FD_CLOSE, _FD_RENUMBER, _PATH_SYMLINK = "path_open", "fd_close", "fd_renumber", "path_symlink"
# The forwarded functions' parameter types (each returns an errno) ...
_SIGNATURES = {
    _PATH_OPEN: "i32 i32 i32 i32 i32 i64 i64 i32 i32",
    _FD_CLOSE: "i32",
    _FD_RENUMBER: "i32 i32",
    "path_create_directory": "i32 i32 i32",
    "path_remove_directory": "i32 i32 i32",
    "path_unlink_file": "i32 i32 i32",
    "path_rename": "i32 i32 i32 i32 i32 i32",
    "path_link": "i32 i32 i32 i32 i32 i32 i32",
    "path_filestat_set_times": "i32 i32 i32 i32 i64 i64 i32",
}
# ... and, for those that name a path, where its (directory fd, path pointer) arguments are
# (the path's length follows its pointer): a path on the hidden root is refused here.
_PATHS = {
    _PATH_OPEN: ((0, 2),),
    "path_create_directory": ((0, 1),),
    "path_remove_directory": ((0, 1),),
    "path_unlink_file": ((0, 1),),
    "path_rename": ((0, 1), (3, 4)),
    "path_link": ((0, 2), (4, 5)),
    "path_filestat_set_times": ((0, 2),),
}
# The reads a taped call's guest makes of the clock and of randomness (`_replay`): shadowed
# only in a runner's taped linker, so an untaped call reaches Wasmtime's own directly.
_CLOCK_TIME_GET, _RANDOM_GET = "clock_time_get", "random_get"
_TAPED_SIGNATURES = {_CLOCK_TIME_GET: "i32 i64 i32", _RANDOM_GET: "i32 i32"}
_EVERY_SIGNATURE = {**_SIGNATURES, **_TAPED_SIGNATURES}
_FORWARDED = tuple(_EVERY_SIGNATURE)
_SYMLINK_PARAMS = "i32 i32 i32 i32 i32"  # path_symlink: refused, not forwarded


def _forwarder_wat() -> str:
    """The forwarding module: each forwarded function imported from Wasmtime's WASI and
    re-exported as a function calling it, and the guest's memory re-exported."""
    imports, exports = [], []
    for name, params in _EVERY_SIGNATURE.items():
        args = " ".join(f"(local.get {i})" for i in range(len(params.split())))
        imports.append(f'(import "{_abi.WASI_MODULE}" "{name}" (func ${name} (param {params}) (result i32)))')
        exports.append(f'(func (export "{name}") (param {params}) (result i32) (call ${name} {args}))')
    memory = f'(import "guest" "memory" (memory 0)) (export "{_abi.EXPORT_MEMORY}" (memory 0))'
    return "(module\n  " + "\n  ".join([*imports, memory, *exports]) + ")"


_FORWARDER = _forwarder_wat()
_EXPORTS = {name: _capi.ExportName(name) for name in _FORWARDED}


def process_budget() -> int:
    """Descriptors all calls of this process may hold at once: half its soft RLIMIT_NOFILE,
    as it was when wasmbox was imported."""
    try:
        import resource
    except ImportError:  # not a Unix: no limit to read
        return 1 << 20
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (1 << 20) if soft == resource.RLIM_INFINITY else max(1, soft // 2)


@dataclass
class OpenFiles:
    """One call's forwarder functions, the descriptors its guest opened and holds, and how
    much of the process budget it has taken (what it gives back at the end, whatever
    happened in between: an interrupt may leave `fds` short, never the budget)."""

    functions: dict[str, _capi.Extern]
    memory: _capi.Extern
    root: int | None = None  # the hidden root's descriptor now (the guest may move or close it)
    fds: set[int] = field(default_factory=set)
    taken: int = 0
    noted: list[str] = field(default_factory=list)  # paths refused on the hidden root, first seen first
    more: bool = False  # a path past MAX_NOTED was refused too

    def note(self, path: str) -> None:
        """A path on the hidden root was refused: keep it, once, up to MAX_NOTED paths."""
        if path in self.noted:
            return
        if len(self.noted) < MAX_NOTED:
            self.noted.append(path)
        else:
            self.more = True

    def release(self) -> None:
        """The call is over and its store closed: every descriptor went with it."""
        _budget.give_back(self, self.taken)
        self.fds.clear()


class _Budget:
    """Open descriptors held by all calls of the process (those opened through `path_open`):
    always the sum of the live calls' `taken`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def take(self, files: OpenFiles) -> bool:
        with self._lock:
            if self.held >= self.limit:
                return False
            self.held += 1
            files.taken += 1
            return True

    def give_back(self, files: OpenFiles, count: int = 1) -> None:
        with self._lock:
            count = min(count, files.taken)
            self.held -= count
            files.taken -= count


_budget = _Budget(process_budget())


def take_refused(state: _call.CallState) -> tuple[list[str], bool]:
    """The paths the call's guest was refused on the hidden root (`FileGuard`'s `hidden_root`),
    at most MAX_NOTED, and whether there were more; taken, so that asking again gives only
    what was refused since."""
    files: OpenFiles | None = state.files
    if files is None:
        return [], False
    taken = files.noted, files.more
    files.noted, files.more = [], False
    return taken


class FileGuard:
    """The forwarding module and Wasmtime's own WASI functions, for one module's calls; its
    owner (the runner) keeps it alive for as long as its linker may call it.

    `hidden_root`: the descriptor of an empty read-only preopen at `/` that the runner adds
    after the manifest's, so that wasi-libc hands an open of a path no grant covers to the
    host instead of failing it itself. Every path call on it (open, mkdir, unlink, rename,
    link, set times) is refused here with ENOENT, as wasi-libc would have, without Wasmtime
    seeing it, and its path is kept (`take_refused`) for the runner to explain."""

    def __init__(self, engine: wasmtime.Engine, hidden_root: int | None = None) -> None:
        self.hidden_root = hidden_root
        self._module = wasmtime.Module(engine, _FORWARDER)
        self._wasi = wasmtime.Linker(engine)  # Wasmtime's WASI, unshadowed
        self._wasi.define_wasi()
        self._handle = _guards.add(weakref.ref(self))
        weakref.finalize(self, _guards.discard, self._handle)

    def define(self, linker: wasmtime.Linker, *, taped: bool = False) -> None:
        """Shadow `path_open`, `fd_close`, `fd_renumber` and `path_symlink` on `linker`, and,
        with a hidden root, the other path calls that could reach it; with `taped` (the linker
        of calls a recording or replay tapes), `clock_time_get` and `random_get` too."""
        types = {"i32": wasmtime.ValType.i32(), "i64": wasmtime.ValType.i64()}
        shadowed = (
            tuple(_SIGNATURES) if self.hidden_root is not None else (_PATH_OPEN, _FD_CLOSE, _FD_RENUMBER)
        )
        if taped:
            shadowed = (*shadowed, *_TAPED_SIGNATURES)
        for name in (*shadowed, _PATH_SYMLINK):
            params = [types[t] for t in _EVERY_SIGNATURE.get(name, _SYMLINK_PARAMS).split()]
            functype = wasmtime.FuncType(params, [types["i32"]])
            callback = _CALLBACKS.get(name, _path_symlink)
            _capi.define_func(linker, _abi.WASI_MODULE, name, functype, callback, self._handle)

    def forwarder(self, caller: _capi.Caller, context: _capi.Context) -> OpenFiles:
        """A forwarder instance in the caller's store, around the caller's memory."""
        memory = _capi.MEMORY.from_caller(caller, _capi.EXTERN_MEMORY)
        if memory is None:
            raise wasmtime.WasmtimeError("missing required memory export")  # as Wasmtime's WASI says
        linked = tuple((_abi.WASI_MODULE, name) for name in _FORWARDED)
        functions = _capi.instantiate_with(context, self._module, self._wasi, linked, memory, _EXPORTS)
        return OpenFiles(functions, memory, root=self.hidden_root)


_guards: _capi.Handles[weakref.ref[FileGuard]] = _capi.Handles()


def _forward(
    handle: int | None,
    caller: _capi.Caller,
    context: _capi.Context,
    values: _capi.Values,
    count: int,
    name: str,
) -> int:
    """Serve `name` for the guest: its bookkeeping (`_BOOKKEEPING`) around Wasmtime's own
    function. Returns 0; a trap or Wasmtime error (in Wasmtime's function, or finding the
    guest's memory) stops the guest as if it had trapped."""
    state = _call.current()
    try:
        if state.files is None:
            ref = _guards.get(handle)
            guard = ref() if ref is not None else None
            assert guard is not None  # its runner is alive while its calls run
            state.files = guard.forwarder(caller, context)
        _BOOKKEEPING[name](state.files, _Wasi(context, state.files.functions[name], values, count))
    except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
        error = _outcome.from_trap(exc, state.manifest.limits)
        _call.abort(context, error.kind, error.message)  # the callback then traps
    return 0


@dataclass(frozen=True)
class _Wasi:
    """One guest call of a forwarded function: its raw arguments, and Wasmtime's function."""

    context: _capi.Context
    function: _capi.Extern
    values: _capi.Values
    count: int

    def arg(self, index: int) -> int:
        return cast(int, self.values[index].i32) & 0xFFFF_FFFF

    def call(self) -> int:
        """Wasmtime's function on the guest's arguments; its errno (also the guest's result)."""
        return _capi.call_raw(self.context, self.function, self.values, self.count) & 0xFFFF

    def path(self, memory: _capi.Extern, at: int) -> str | None:
        """The path whose pointer is argument `at` (its length the next), as an absolute guest
        path on `/` (its first `_NOTED_CHARS` bytes); None if it is not in the guest's memory."""
        ptr, length = self.arg(at), self.arg(at + 1)
        base, size = _capi.memory_view(self.context, memory)
        if ptr + length > size:
            return None
        raw = ctypes.string_at(base + ptr, min(length, _NOTED_CHARS)).decode("utf-8", "replace")
        return posixpath.normpath("/" + raw.lstrip("/"))


def _on_hidden_root(name: str, files: OpenFiles, wasi: _Wasi) -> bool:
    """Whether the call names a path on the hidden root; if so it fails with ENOENT (what
    wasi-libc says of a path no preopen covers) and its path is noted, unless it is not in
    the guest's memory (then EFAULT, as Wasmtime says)."""
    if files.root is None:
        return False
    for fd_at, path_at in _PATHS[name]:
        if wasi.arg(fd_at) == files.root:
            path = wasi.path(files.memory, path_at)
            if path is not None:
                files.note(path)
            wasi.values[0].i32 = _abi.Errno.NOENT if path is not None else _abi.Errno.FAULT
            return True
    return False


def _path_kept(name: str, files: OpenFiles, wasi: _Wasi) -> None:
    """A path call other than `path_open`: Wasmtime's, unless it is on the hidden root."""
    if not _on_hidden_root(name, files, wasi):
        wasi.call()


def _path_open_kept(files: OpenFiles, wasi: _Wasi) -> None:
    if _on_hidden_root(_PATH_OPEN, files, wasi):
        return
    if len(files.fds) >= MAX_OPEN_FILES or not _budget.take(files):
        wasi.values[0].i32 = _abi.Errno.MFILE
        return
    fd_out = wasi.arg(8)  # read before the result overwrites the arguments
    try:
        errno = wasi.call()
    except BaseException:
        _budget.give_back(files)
        raise
    if errno != 0:
        _budget.give_back(files)
        return
    base, _ = _capi.memory_view(wasi.context, files.memory)  # WASI checked fd_out's bounds
    files.fds.add(int.from_bytes(ctypes.string_at(base + fd_out, 4), "little"))


def _fd_close_kept(files: OpenFiles, wasi: _Wasi) -> None:
    fd = wasi.arg(0)
    if wasi.call() == 0:
        _closed(files, fd)


def _fd_renumber_kept(files: OpenFiles, wasi: _Wasi) -> None:
    fd, to = wasi.arg(0), wasi.arg(1)
    if wasi.call() == 0 and fd != to:  # `to`'s old file is closed, and `fd` moves there
        _closed(files, to)
        if fd in files.fds:
            files.fds.discard(fd)
            files.fds.add(to)
        if files.root == fd:
            files.root = to


def _closed(files: OpenFiles, fd: int) -> None:
    """Descriptor `fd` was closed (or replaced): it no longer counts, if it did, and is no
    longer the hidden root, if it was."""
    if files.root == fd:
        files.root = None
    if fd in files.fds:
        files.fds.discard(fd)
        _budget.give_back(files)


def _clock_taped(files: OpenFiles, wasi: _Wasi) -> None:
    """`clock_time_get` of a taped call: Wasmtime's reading (or its errno), kept by the call's
    tape; or the recorded one, written where the guest asked."""
    clock, out = wasi.arg(0), wasi.arg(2)
    tape = _call.current().tape
    if tape is None:
        wasi.call()
        return
    value = tape.clock(f"clock {clock}", partial(_read_clock, files, wasi, out))
    if value < 0:
        wasi.values[0].i32 = -value
        return
    wasi.values[0].i32 = _put(files, wasi, out, value.to_bytes(8, "little"))


def _read_clock(files: OpenFiles, wasi: _Wasi, out: int) -> int:
    errno = _unmetered(wasi)
    if errno != 0:
        return -errno
    base, _ = _capi.memory_view(wasi.context, files.memory)  # WASI checked out's bounds
    return int.from_bytes(ctypes.string_at(base + out, 8), "little")


def _random_taped(files: OpenFiles, wasi: _Wasi) -> None:
    """`random_get` of a taped call: Wasmtime's bytes, kept by the call's tape; or the
    recorded ones, written where the guest asked."""
    buf, size = wasi.arg(0), wasi.arg(1)
    tape = _call.current().tape
    if tape is None or buf + size > _capi.memory_view(wasi.context, files.memory)[1]:
        wasi.call()  # (Wasmtime's own answer: EFAULT for a buffer outside the memory)
        return
    wasi.values[0].i32 = _put(files, wasi, buf, tape.random(size, partial(_draw, files, wasi, buf, size)))


def _draw(files: OpenFiles, wasi: _Wasi, buf: int, size: int) -> bytes:
    _unmetered(wasi)
    base, _ = _capi.memory_view(wasi.context, files.memory)
    return ctypes.string_at(base + buf, size)


def _unmetered(wasi: _Wasi) -> int:
    """`wasi.call()` with the fuel the forwarder's own code burns given back, so a recorded
    call's fuel is what its replay's is (which serves the reading without calling it)."""
    left = _store.fuel_left(wasi.context)
    errno = wasi.call()
    _store.set_fuel(wasi.context, left)
    return errno


def _put(files: OpenFiles, wasi: _Wasi, at: int, data: bytes) -> int:
    """Write `data` into the guest's memory at `at`: the errno (EFAULT outside it)."""
    base, size = _capi.memory_view(wasi.context, files.memory)
    if at + len(data) > size:
        return _abi.Errno.FAULT
    ctypes.memmove(base + at, data, len(data))
    return _abi.Errno.SUCCESS


_BOOKKEEPING: dict[str, Callable[[OpenFiles, _Wasi], None]] = {
    _CLOCK_TIME_GET: _clock_taped,
    _RANDOM_GET: _random_taped,
    _PATH_OPEN: _path_open_kept,
    _FD_CLOSE: _fd_close_kept,
    _FD_RENUMBER: _fd_renumber_kept,
    **{name: partial(_path_kept, name) for name in _PATHS if name != _PATH_OPEN},
}


def _forwarding(name: str) -> Any:
    """The C callback that forwards `name` (kept alive as a module global)."""

    @_call.host_callback(name)
    def forward(
        handle: int | None, caller: _capi.Caller, context: _capi.Context, values: _capi.Values, count: int
    ) -> int:
        return _forward(handle, caller, context, values, count, name)

    return forward


_CALLBACKS = {name: _forwarding(name) for name in _FORWARDED}


@_capi.HostCallback
def _path_symlink(handle: int | None, caller: _capi.Caller, values: _capi.Values, count: int) -> int:
    values[0].i32 = _abi.Errno.PERM
    return 0
