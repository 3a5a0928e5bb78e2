"""What the host must make of a guest's raw ABI v1 reply: shared by the hypothesis properties
(tests/test_fuzz.py) and the atheris harness (fuzz/abi_fuzz.py)."""

from __future__ import annotations

from typing import Any

import msgpack

import wasmbox
from wasmbox import ErrorKind, _abi
from wasmbox._outcome import _OOM_WORDING


def expected_outcome(reply: bytes, cap: int) -> tuple[ErrorKind | None, Any]:
    """(None, value) for a good reply, else (the error kind, the guest's message or None).

    Decided from the ABI's rules, not by the host's own decoder (`_abi.unpack_reply`), so a bug
    there cannot agree with itself: one MessagePack object, no extension types (timestamps
    included), lists and maps nested at most 64 deep, and exactly {"ok": v} or {"error": str}.
    """
    if len(reply) > cap:
        return ErrorKind.OUTPUT_LIMIT, None
    try:
        message = msgpack.unpackb(reply, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - anything msgpack refuses
        return ErrorKind.BAD_RESPONSE, None
    if not _within_the_rules(message) or not isinstance(message, dict) or len(message) != 1:
        return ErrorKind.BAD_RESPONSE, None
    if "ok" in message:
        return None, message["ok"]
    error = message.get("error")
    if not isinstance(error, str):
        return ErrorKind.BAD_RESPONSE, None
    return (ErrorKind.MEMORY_LIMIT if _OOM_WORDING.search(error) else ErrorKind.GUEST_ERROR), error


def _within_the_rules(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (msgpack.ExtType, msgpack.Timestamp)):
            return False
        if isinstance(item, (list, dict)):
            if depth > 64:
                return False
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def check_reply(result: wasmbox.CallResult, reply: bytes, cap: int) -> None:
    """AssertionError unless `result` is what the host must make of `reply`."""
    kind, value = expected_outcome(reply, cap)
    if kind is None:
        assert result.ok, (result.error, reply)
        assert _abi.pack(result.value) == _abi.pack(value), (result.value, value)  # NaN != NaN
    else:
        assert result.error is not None and result.error.kind is kind, (result.error, kind, reply)
        if kind is ErrorKind.GUEST_ERROR:
            assert result.error.message == value


def check_pointer(result: wasmbox.CallResult, packed: int, cap: int) -> None:
    """A guest's packed `(ptr << 32) | len` result: over the cap is `output_limit`; in bounds it
    reads the guest's own memory, so a value is possible; else a typed refusal."""
    _, length = _abi.split(packed)
    if length > cap:
        assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT, result.error
    elif not result.ok:
        assert result.error is not None
        assert result.error.kind in (ErrorKind.BAD_RESPONSE, ErrorKind.GUEST_ERROR), result.error


def check_echo(result: wasmbox.CallResult, args: object, *refusals: ErrorKind) -> None:
    """An echo guest's call with `args`: the args back unchanged, or one of `refusals`."""
    if result.ok:
        assert _abi.pack(result.value) == _abi.pack(args), (result.value, args)
    else:
        assert result.error is not None and result.error.kind in refusals, result.error
