"""What the host must make of a guest's raw ABI v1 reply: shared by the hypothesis properties
(tests/test_fuzz.py) and the atheris harness (fuzz/abi_fuzz.py)."""

from __future__ import annotations

from typing import Any

import wasmbox
from wasmbox import ErrorKind, _abi
from wasmbox._call import _OOM_WORDING


def expected_outcome(reply: bytes, cap: int) -> tuple[ErrorKind | None, Any]:
    """(None, value) for a good reply, else (the error kind, the guest's message or None)."""
    if len(reply) > cap:
        return ErrorKind.OUTPUT_LIMIT, None
    try:
        ok, value = _abi.unpack_reply(reply)
    except _abi.FramingError:
        return ErrorKind.BAD_RESPONSE, None
    if ok:
        return None, value
    return (ErrorKind.MEMORY_LIMIT if _OOM_WORDING.search(value) else ErrorKind.GUEST_ERROR), value


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
