"""Oversized and malformed results from a core module: bad MessagePack, lengths past memory,
pointers out of bounds, hostile shapes. The guest (security/result_bytes.wat) returns exactly
the bytes, pointer and length each case names."""

from __future__ import annotations

import struct

import msgpack
import pytest

from wasmbox import ErrorKind

from .conftest import Guarded, security_wat

ARGS_AT = 1024  # result_bytes.wat's first allocation, where the host writes the args
AT_REPLY = -1  # "the address of the reply bytes"


def call_returning(guarded: Guarded, reply: bytes, ptr: int = AT_REPLY, length: int | None = None,
                   output: str = "64KiB"):  # fmt: skip
    """Make result_bytes.wat return (ptr << 32) | length, with `reply` in its memory."""
    args = {"r": reply, "p": b"\0" * 8}
    offset = (
        msgpack.packb(args, use_bin_type=True).index(b"\xc4" + bytes([len(reply)]) + reply) + 2
        if len(reply) < 256
        else None
    )
    if ptr == AT_REPLY:
        assert offset is not None
        ptr = ARGS_AT + offset
    args["p"] = struct.pack("<II", ptr & 0xFFFFFFFF, (len(reply) if length is None else length) & 0xFFFFFFFF)
    tool = guarded.box.load({"name": "result_bytes", "module": security_wat("result_bytes"),
                             "limits": {"output": output}}, replace=True)  # fmt: skip
    return tool.call(args)


def nested(depth: int) -> bytes:
    return b"\x81\xa2ok" + b"\x91" * depth + b"\xc0"


# (id, reply bytes, ptr, length, kind, words in the message)
CASES = [
    ("not-msgpack", b"\xc1\xc1", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "MessagePack"),
    ("empty", b"", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "incomplete"),
    ("truncated-map", b"\x81\xa2o", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "incomplete"),
    ("trailing-bytes", b"\x81\xa2ok\xc0\xc0", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "extra data"),
    ("not-a-map", b"\xc0", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "expected a map"),
    ("two-keys", b"\x82\xa2ok\xc0\xa5error\xa1x", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "expected a map"),
    ("error-not-str", b"\x81\xa5error\x05", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "expected a map"),
    ("unhashable-key", b"\x81\x91\x01\x02", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "unhashable"),
    ("bad-utf8", b"\x81\xa2ok\xa2\xff\xfe", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "utf-8"),
    ("ext-type", b"\x81\xa2ok\xd4\x05\x00", AT_REPLY, None, ErrorKind.BAD_RESPONSE, "extension type 5"),
    (
        "timestamp-ext",
        b"\x81\xa2ok\xd6\xff\x00\x00\x00\x00",
        AT_REPLY,
        None,
        ErrorKind.BAD_RESPONSE,
        "timestamp",
    ),
    (
        "timestamp-in-key",
        b"\x81\xa2ok\x81\xd6\xff\x00\x00\x00\x00\x01",
        AT_REPLY,
        None,
        ErrorKind.BAD_RESPONSE,
        "timestamp",
    ),
    (
        "array32-claims-4G-items",
        b"\x81\xa2ok\xdd\xff\xff\xff\xff",
        AT_REPLY,
        None,
        ErrorKind.BAD_RESPONSE,
        "max_array_len",
    ),
    (
        "map32-claims-4G-pairs",
        b"\x81\xa2ok\xdf\xff\xff\xff\xff",
        AT_REPLY,
        None,
        ErrorKind.BAD_RESPONSE,
        "max_map_len",
    ),
    (
        "str32-claims-4GB",
        b"\x81\xa2ok\xdb\xff\xff\xff\xff",
        AT_REPLY,
        None,
        ErrorKind.BAD_RESPONSE,
        "incomplete",
    ),
    (
        "bin32-claims-4GB",
        b"\x81\xa2ok\xc6\xff\xff\xff\xff",
        AT_REPLY,
        None,
        ErrorKind.BAD_RESPONSE,
        "incomplete",
    ),
    ("nested-65", nested(64), AT_REPLY, None, ErrorKind.BAD_RESPONSE, "nested deeper"),
    ("nested-200", nested(200), AT_REPLY, None, ErrorKind.BAD_RESPONSE, "nested deeper"),
    ("length-past-memory", b"\x81\xa2ok\xc0", 65530, 100, ErrorKind.BAD_RESPONSE, "outside"),
    ("pointer-past-memory", b"", 0x10000, 5, ErrorKind.BAD_RESPONSE, "outside"),
    ("pointer-wraps", b"", 0xFFFFFFF0, 0x20, ErrorKind.BAD_RESPONSE, "outside"),
    ("length-4GB", b"", 16, 0xFFFFFFFF, ErrorKind.OUTPUT_LIMIT, "output cap"),
    ("length-over-cap", b"", 0, 1025, ErrorKind.OUTPUT_LIMIT, "output cap"),
]


@pytest.mark.parametrize(("reply", "ptr", "length", "kind", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_malformed_result_is_refused(
    guarded: Guarded, reply: bytes, ptr: int, length: int | None, kind: ErrorKind, words: str
) -> None:
    result = call_returning(guarded, reply, ptr, length, output="1KiB" if length == 1025 else "64KiB")
    assert result.error is not None and result.error.kind is kind, result.error
    assert words.lower() in result.error.message.lower(), result.error.message
    assert result.value is None
    result.model_dump_json()  # whatever the guest sent, the result serializes
    guarded.assert_untouched()


def test_nested_64_deep_is_the_limit_and_fine(guarded: Guarded) -> None:
    result = call_returning(guarded, nested(63))
    assert result.ok, result.error
    result.model_dump_json()
    guarded.assert_untouched()
