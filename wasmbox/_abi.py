"""The wasmbox ABI v1 framing: MessagePack payloads and packed (ptr, len) results.

ARCHITECTURE.md, "Guest contracts", has the whole contract.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import msgpack

ABI_MODULE = "wasmbox"  # host functions are imported from this module, named as granted
EXPORT_ALLOC = "wasmbox_alloc"
EXPORT_CALL = "wasmbox_call"
EXPORT_MEMORY = "memory"
EXPORT_START = "_start"
EXPORT_INITIALIZE = "_initialize"
WASI_MODULE = "wasi_snapshot_preview1"


class Errno(enum.IntEnum):
    """The WASI preview1 errno values our own WASI functions return."""

    SUCCESS = 0
    FAULT = 21
    INVAL = 28
    MFILE = 33
    NOENT = 44
    NOTSUP = 58
    PERM = 63


class FramingError(ValueError):
    """A payload that is not a valid wasmbox message."""


def pack(value: Any) -> bytes:
    """MessagePack bytes of `value`; TypeError/ValueError if it cannot be encoded."""
    packed: bytes = msgpack.packb(value, use_bin_type=True, datetime=False)
    return packed


MAX_DEPTH = 64  # deeper values break json.dumps, pydantic and the models that read them


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """The value of a single MessagePack object; FramingError on anything else."""
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext)
    except FramingError:
        raise
    except Exception as exc:  # noqa: BLE001 - msgpack raises many unrelated types on garbage
        detail = f": {exc}" if str(exc) else ""
        raise FramingError(f"not MessagePack: {type(exc).__name__}{detail}"[:200]) from None
    check_depth(value)
    return value


def check_depth(value: Any) -> None:
    """Refuse values nested deeper than MAX_DEPTH, and timestamps: msgpack decodes extension
    type -1 itself, without asking `ext_hook`, and a Timestamp in a value breaks its JSON.
    (Every call's args and reply are walked: a plain value is one check.)"""
    if not isinstance(value, _WALKED):
        return
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if isinstance(item, msgpack.Timestamp):
            raise FramingError("MessagePack extension type -1 (timestamp) is not allowed")
        if depth > MAX_DEPTH:  # (only lists and dicts are walked past the first check)
            raise FramingError(f"nested deeper than {MAX_DEPTH} levels")
        depth += 1
        children: Iterable[Any]
        if isinstance(item, dict):
            for child in item:
                if isinstance(child, _WALKED):
                    push((child, depth))
            children = item.values()
        else:
            children = item
        for child in children:
            if isinstance(child, _WALKED):
                push((child, depth))


_WALKED = (list, dict, msgpack.Timestamp)


def unpack_reply(data: bytes | bytearray | memoryview) -> tuple[bool, Any]:
    """`(True, value)` for `{"ok": value}`, `(False, message)` for `{"error": message}`."""
    message = unpack(data)
    if isinstance(message, dict) and len(message) == 1:
        if "ok" in message:
            return True, message["ok"]
        error = message.get("error")
        if isinstance(error, str):
            return False, error
    raise FramingError('expected a map {"ok": value} or {"error": "message"}')


def ok(value: Any) -> bytes:
    return pack({"ok": value})


def error(message: str) -> bytes:
    return pack({"error": message})


def split(packed: int) -> tuple[int, int]:
    """`(ptr, len)` from the i64 `(ptr << 32) | len` a guest returns."""
    packed &= 0xFFFF_FFFF_FFFF_FFFF
    return packed >> 32, packed & 0xFFFF_FFFF


def join(ptr: int, length: int) -> int:
    """The i64 (as a signed Python int) that carries `(ptr, len)` back to a guest."""
    packed = (ptr << 32) | length
    return packed - (1 << 64) if packed >= 1 << 63 else packed


def _no_ext(code: int, data: bytes) -> Any:
    raise FramingError(f"MessagePack extension type {code} is not allowed")
