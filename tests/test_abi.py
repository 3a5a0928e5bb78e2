"""The ABI v1 framing: packed pointers and reply maps, including hostile input."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from wasmbox import _abi

u32 = st.integers(min_value=0, max_value=2**32 - 1)


@given(u32, u32)
def test_join_split_round_trip(ptr: int, length: int) -> None:
    packed = _abi.join(ptr, length)
    assert -(2**63) <= packed < 2**63  # fits a wasm i64
    assert _abi.split(packed) == (ptr, length)


values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(values)
def test_ok_reply_round_trip(value: object) -> None:
    assert _abi.unpack_reply(_abi.ok(value)) == (True, value)


def test_error_reply() -> None:
    assert _abi.unpack_reply(_abi.error("boom")) == (False, "boom")


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"ok": 1, "error": "x"}),
        msgpack.packb({"error": 5}),
        msgpack.packb({"result": 1}),
        msgpack.packb({"ok": 1}) + b"trailing",
        msgpack.packb(msgpack.ExtType(5, b"x")),
        b"\xdd\xff\xff\xff\xff",  # an array header claiming 4 billion items
    ],
)
def test_malformed_replies_raise_framing_error(payload: bytes) -> None:
    with pytest.raises(_abi.FramingError):
        _abi.unpack_reply(payload)


@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_raise_anything_else(data: bytes) -> None:
    try:
        _abi.unpack_reply(data)
    except _abi.FramingError:
        pass
