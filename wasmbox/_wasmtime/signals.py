"""Wasmtime's trap signal handlers, kept so that they can be put back.

Wasmtime turns a guest's faults (an out-of-bounds access, `unreachable`, a division by zero)
into traps with handlers for SIGSEGV, SIGILL, SIGFPE and SIGBUS, installed once per process
when the first Engine is made. A library that installs its own handlers afterwards (Ray's
`ray.init` installs a crash reporter for them; `faulthandler.enable()`, which a pytest run
in-process calls, installs its own) takes those faults away from Wasmtime, and the next trap
kills the process. `keep` saves Wasmtime's handlers (after the first Engine); `restore` puts
them back where another library replaced them: at every new Engine (so every new Sandbox),
after `ray.init`, and before each test under wasmbox's pytest plugin. Between those points a
library that takes the handlers leaves traps fatal (SECURITY.md, known gaps).
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading

_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGSEGV", "SIGILL", "SIGFPE", "SIGBUS") if hasattr(signal, name)
)
_SIZE = 512  # bytes: more than any libc's struct sigaction (glibc x86-64: 152), read and written whole
_POINTER = ctypes.sizeof(ctypes.c_void_p)
_saved: dict[int, bytes] = {}
_lock = threading.Lock()


def _libc() -> ctypes.CDLL | None:
    if sys.platform not in ("linux", "darwin"):
        return None
    return ctypes.CDLL(None, use_errno=True)


def _read(libc: ctypes.CDLL, number: int) -> bytes | None:
    action = ctypes.create_string_buffer(_SIZE)
    return action.raw if libc.sigaction(number, None, action) == 0 else None


def _handler(action: bytes | None) -> bytes | None:
    """The handler's address: the struct's first field (the rest holds bytes of the mask that
    the kernel does not fill, which differ from one read to the next)."""
    return action[:_POINTER] if action is not None else None


def keep() -> None:
    """Save the process's handlers of the trap signals, once (call it after an Engine is made)."""
    with _lock:
        if _saved:
            return
        libc = _libc()
        if libc is None:
            return
        for number in _SIGNALS:
            action = _read(libc, number)
            if action is not None:
                _saved[number] = action


def restore() -> list[str]:
    """Put back the saved handlers that another library replaced; the names of those signals."""
    with _lock:
        libc = _libc()
        if libc is None or not _saved:
            return []
        restored = []
        for number, action in _saved.items():
            if (
                _handler(_read(libc, number)) != _handler(action)
                and libc.sigaction(number, action, None) == 0
            ):
                restored.append(signal.Signals(number).name)
        return restored
