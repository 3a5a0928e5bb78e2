"""A deadline-aware `poll_oneoff` for WASI preview1 guests.

Wasmtime's own `poll_oneoff` sleeps inside the host for as long as the guest asks, and epoch
interruption cannot stop host code: `sleep(3600)` would hold the calling thread for an hour
whatever the manifest's timeout. This replacement sleeps at most until the call's deadline,
then stops the guest with `timeout`. Clock subscriptions (what `sleep`/`nanosleep` use) are
served; fd subscriptions are reported ready at once (stdin, stdout and files never block here).
"""

from __future__ import annotations

import struct
import time

import wasmtime

from . import _abi, _call
from ._errors import ErrorKind

_SUBSCRIPTION = struct.Struct("<QB7xIxxxxQQH6x")  # userdata, tag, clock id, timeout, precision, flags
_EVENT = struct.Struct("<QHB5xQH6x")  # userdata, error, type, nbytes, flags
_IN, _OUT = _SUBSCRIPTION.size, _EVENT.size  # 48 and 32 bytes
_CLOCK, _FD_READ, _FD_WRITE = 0, 1, 2
_ABSTIME = 1
_MAX_SUBSCRIPTIONS = 64  # libc asks for one or two; more is only work for the host


def poll_type() -> wasmtime.FuncType:
    i32 = wasmtime.ValType.i32()
    return wasmtime.FuncType([i32, i32, i32, i32], [i32])


def poll_oneoff(caller: wasmtime.Caller, in_ptr: int, out_ptr: int, count: int, nevents_ptr: int) -> int:
    try:
        return _poll(caller, in_ptr & 0xFFFF_FFFF, out_ptr & 0xFFFF_FFFF, count & 0xFFFF_FFFF,
                     nevents_ptr & 0xFFFF_FFFF)  # fmt: skip
    except BaseException as exc:  # never raise into wasmtime-py's trampoline (e.g. Ctrl-C in a sleep)
        _call.callback_failed(caller._context(), "poll_oneoff", exc)
        return _abi.Errno.FAULT


def _poll(caller: wasmtime.Caller, in_ptr: int, out_ptr: int, count: int, nevents_ptr: int) -> int:
    memory = caller.get(_abi.EXPORT_MEMORY)
    if not isinstance(memory, wasmtime.Memory) or count == 0 or count > _MAX_SUBSCRIPTIONS:
        return _abi.Errno.INVAL
    size = memory.data_len(caller)
    if in_ptr + count * _IN > size or out_ptr + count * _OUT > size or nevents_ptr + 4 > size:
        return _abi.Errno.FAULT
    raw = memory.read(caller, in_ptr, in_ptr + count * _IN)
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
            _call.abort(caller._context(), ErrorKind.TIMEOUT, "slept past the deadline")
        ready.append(_EVENT.pack(sleeper, 0, _CLOCK, 0, 0))
    memory.write(caller, b"".join(ready), out_ptr)
    memory.write(caller, len(ready).to_bytes(4, "little"), nevents_ptr)
    return _abi.Errno.SUCCESS
