"""The files a session's interpreter keeps open between runs, counted and capped.

A Python guest opens files through `wasi:filesystem`, which Wasmtime serves with host
descriptors and no cap of its own, and a session's instance lives from run to run: what its
code leaves open stays open in the host process until the session ends. wasmtime-py cannot
put a guard in front of those opens (SECURITY.md, known gaps), so the host counts instead:
the process's open files and folders (`census`, read from `/proc/self/fd`) before and after
each run; those that appeared during the run, and those it held before that are still open,
are the session's. A session may hold `SessionLimits.files`; the sessions of the process
together a quarter of its soft RLIMIT_NOFILE (`process_budget`; the open-file caps of core
guests take half). The run after which either is passed fails, and its session ends, which
closes them all.

The count is of the process's table: a file another call or session of the process opened
while the run ran, and still holds when it ends, is counted as well (each at most once in
the process's total).
"""

from __future__ import annotations

import os
import stat
import threading

from ..._capabilities.wasi_files import process_budget as _core_budget

Descriptor = tuple[int, int, int]  # (number, device, inode): one open file, not its number reused

_FD_DIR = "/proc/self/fd"


def process_budget() -> int:
    """Open files all sessions of this process may hold between runs, together: a quarter of its
    soft RLIMIT_NOFILE, as it was when wasmbox was imported."""
    return max(1, _core_budget() // 2)


def census() -> frozenset[Descriptor]:
    """The process's open descriptors of files and folders (what a guest's opens give it;
    sockets, pipes and the like are the host's own)."""
    found = set()
    try:
        names = os.listdir(_FD_DIR)
    except OSError:  # no /proc: nothing to count with
        return frozenset()
    for name in names:
        try:
            info = os.stat(f"{_FD_DIR}/{name}")
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            continue
        if stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode):
            found.add((int(name), info.st_dev, info.st_ino))
    return frozenset(found)


class Holdings:
    """What each live session holds between runs (by session id), for the process's total."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, frozenset[Descriptor]] = {}
        self._lock = threading.Lock()

    def settle(
        self, session: str, before: frozenset[Descriptor], held: frozenset[Descriptor]
    ) -> tuple[int, int]:
        """Record what `session` holds after a run (`before`: the census at its start): the
        descriptors it held that are still open, and those the run opened. Returns how many it
        holds, and how many all sessions of the process hold together."""
        now = census()
        mine = (held & now) | (now - before)
        with self._lock:
            self._held[session] = mine
            total = len(frozenset().union(*self._held.values()) & now)
        return len(mine), total

    def held(self, session: str) -> frozenset[Descriptor]:
        with self._lock:
            return self._held.get(session, frozenset())

    def forget(self, session: str) -> None:
        """`session` has ended: its instance, and every descriptor it held, is gone."""
        with self._lock:
            self._held.pop(session, None)


holdings = Holdings(process_budget())
