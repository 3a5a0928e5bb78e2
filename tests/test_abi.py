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


@given(st.binary(min_size=65, max_size=4096))
def test_longer_arbitrary_bytes_never_raise_anything_else(data: bytes) -> None:
    try:
        _abi.unpack_reply(data)
    except _abi.FramingError:
        pass


hostile_values = st.recursive(
    values | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4) | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=4)
                      | st.none() | st.booleans() | st.floats(), inner, max_size=4),
    max_leaves=30,
)  # fmt: skip


@given(hostile_values | st.dictionaries(st.sampled_from(["ok", "error", "kind"]), hostile_values, max_size=3))
def test_arbitrary_structures_are_a_reply_or_a_framing_error(value: object) -> None:
    """Whatever MessagePack a guest builds: exactly `{"ok": v}` gives v, `{"error": str}` the
    message, and anything else (extension types, other maps) a FramingError."""
    data = msgpack.packb(value, use_bin_type=True)
    try:
        reply = _abi.unpack_reply(data)
    except _abi.FramingError:
        return
    assert isinstance(value, dict) and len(value) == 1
    if "ok" in value:
        assert reply[0] is True and _abi.pack(reply[1]) == _abi.pack(value["ok"])
    else:
        assert reply == (False, value["error"]) and isinstance(value["error"], str)


def _lists(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


# the reply map is one level, so {"ok": value} may hold MAX_DEPTH - 1 levels of lists
@pytest.mark.parametrize(
    ("levels", "ok"), [(_abi.MAX_DEPTH - 1, True), (_abi.MAX_DEPTH, False), (10_000, False)]
)
def test_nesting_limit(levels: int, ok: bool) -> None:
    data = _abi.ok(_lists(levels)) if levels < 500 else b"\x81\xa2ok" + b"\x91" * levels + b"\x01"
    if ok:
        assert _abi.unpack_reply(data)[0] is True
    else:
        with pytest.raises(_abi.FramingError):
            _abi.unpack_reply(data)
