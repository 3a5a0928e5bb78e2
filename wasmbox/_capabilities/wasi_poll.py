"""A deadline-aware `poll_oneoff` for WASI preview1 guests.

Wasmtime's own `poll_oneoff` sleeps inside the host for as long as the guest asks, and epoch
interruption cannot stop host code: `sleep(3600)` would hold the calling thread for an hour
whatever the manifest's timeout. This replacement sleeps at most until the call's deadline,
then stops the guest with `timeout`. Clock subscriptions (what `sleep`/`nanosleep` use) are
served; fd subscriptions are reported ready at once (stdin, stdout and files never block here).
"""

from __future__ import annotations

import ctypes
import struct
import time

import wasmtime

from .. import _abi, _call
from .._errors import ErrorKind
from .._wasmtime import capi as _capi

_SUBSCRIPTION = struct.Struct("<QB7xIxxxxQQH6x")  # userdata, tag, clock id, timeout, precision, flags
_EVENT = struct.Struct("<QHB5xQH6x")  # userdata, error, type, nbytes, flags
_IN, _OUT = _SUBSCRIPTION.size, _EVENT.size  # 48 and 32 bytes
_CLOCK, _FD_READ, _FD_WRITE = 0, 1, 2
_ABSTIME = 1
_MAX_SUBSCRIPTIONS = 64  # libc asks for one or two; more is only work for the host


def define(linker: wasmtime.Linker) -> None:
    """Shadow WASI's `poll_oneoff` on `linker` (which has WASI and allows shadowing)."""
    i32 = wasmtime.ValType.i32()
    functype = wasmtime.FuncType([i32, i32, i32, i32], [i32])
    _capi.define_func(linker, _abi.WASI_MODULE, "poll_oneoff", functype, _poll_oneoff)


@_call.host_callback("poll_oneoff")
def _poll_oneoff(
    _handle: int | None, caller: _capi.Caller, context: _capi.Context, values: _capi.Values, _count: int
) -> int:
    """A stop (the deadline passed while sleeping, or Ctrl-C in a sleep) is a trap, so the
    guest runs nothing after it."""
    values[0].i32 = _poll(caller, context, *(values[i].i32 & 0xFFFF_FFFF for i in range(4)))
    return 0


def _poll(
    caller: _capi.Caller,
    context: _capi.Context,
    in_ptr: int,
    out_ptr: int,
    count: int,
    nevents_ptr: int,
) -> int:
    memory = _capi.MEMORY.from_caller(caller, _capi.EXTERN_MEMORY)
    if memory is None or count == 0 or count > _MAX_SUBSCRIPTIONS:
        return _abi.Errno.INVAL
    base, size = _capi.memory_view(context, memory)
    if in_ptr + count * _IN > size or out_ptr + count * _OUT > size or nevents_ptr + 4 > size:
        return _abi.Errno.FAULT
    raw = ctypes.string_at(base + in_ptr, count * _IN)
    ready: list[bytes] = []
    sleep_ns: int | None = None
    sleeper: int = 0
    for i in range(count):
        entry = raw[i * _IN : (i + 1) * _IN]
        userdata, tag = entry[0:8], entry[8]
        if tag in (_FD_READ, _FD_WRITE):
            ready.append(_EVENT.pack(int.from_bytes(userdata, "little"), 0, tag, 0, 0))
        elif tag == _CLOCK:
            _, _, _, timeout, _, flags = _SUBSCRIPTION.unpack(entry)
            if flags & _ABSTIME:
                return _abi.Errno.NOTSUP  # absolute deadlines on the guest's clock: not served
            if sleep_ns is None or timeout < sleep_ns:
                sleep_ns, sleeper = timeout, int.from_bytes(userdata, "little")
        else:
            return _abi.Errno.INVAL
    if not ready and sleep_ns is not None:
        state = _call.current()
        left = state.deadline - time.perf_counter()
        wanted = sleep_ns / 1e9
        time.sleep(max(0.0, min(wanted, left)))
        if wanted > left:
            _call.abort(context, ErrorKind.TIMEOUT, "slept past the deadline")
            return _abi.Errno.SUCCESS  # unseen: the caller traps
        ready.append(_EVENT.pack(sleeper, 0, _CLOCK, 0, 0))
    events = b"".join(ready)
    base, _ = _capi.memory_view(context, memory)  # no guest code ran: the same memory
    ctypes.memmove(base + out_ptr, events, len(events))
    ctypes.memmove(base + nevents_ptr, len(ready).to_bytes(4, "little"), 4)
    return _abi.Errno.SUCCESS
