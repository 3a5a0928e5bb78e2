"""What a Python tool's return value becomes on the host (and in JSON), and the error for one
that cannot be sent."""

from __future__ import annotations

import json
from pathlib import Path

import wasmbox
from wasmbox import ErrorKind

SOURCE = """
import dataclasses, datetime, decimal, enum, fractions, pathlib, uuid

class Color(enum.Enum):
    RED = "red"

@dataclasses.dataclass
class Point:
    x: int
    when: datetime.date

def main(which: str):
    tz = datetime.timezone(datetime.timedelta(hours=2))
    return {
        "datetime": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "aware": datetime.datetime(2024, 1, 2, 3, 4, 5, 600000, tzinfo=tz),
        "date": datetime.date(2024, 1, 2),
        "time": datetime.time(13, 30),
        "timedelta": datetime.timedelta(minutes=1, milliseconds=500),
        "set": {3, 1, 2},
        "frozenset": frozenset({"b", "a"}),
        "mixed_set": {1, "a"},
        "decimal": decimal.Decimal("1.10"),
        "fraction": fractions.Fraction(1, 3),
        "uuid": uuid.UUID(int=1),
        "path": pathlib.PurePosixPath("/data/x.csv"),
        "enum": Color.RED,
        "dataclass": Point(1, datetime.date(2024, 1, 2)),
        "bytes": b"\\x00\\xff",
        "nested": [{"at": datetime.date(2000, 1, 1)}],
    }[which]
"""


def _tool(box: wasmbox.Sandbox, tmp_path: Path, source: str = SOURCE) -> wasmbox.Tool:
    path = tmp_path / "values.py"
    path.write_text(source)
    return box.load({"name": "values", "runtime": "python", "source": str(path)})


def test_values_are_converted_to_what_a_model_reads(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    tool = _tool(box, tmp_path)
    expected = {
        "datetime": "2024-01-02T03:04:05",
        "aware": "2024-01-02T03:04:05.600000+02:00",
        "date": "2024-01-02",
        "time": "13:30:00",
        "timedelta": 60.5,
        "set": [1, 2, 3],
        "frozenset": ["a", "b"],
        "decimal": "1.10",
        "fraction": "1/3",
        "uuid": "00000000-0000-0000-0000-000000000001",
        "path": "/data/x.csv",
        "enum": "red",
        "dataclass": {"x": 1, "when": "2024-01-02"},
        "bytes": b"\x00\xff",
        "nested": [{"at": "2000-01-01"}],
    }
    for which, value in expected.items():
        assert tool.call({"which": which}).unwrap() == value, which
    assert sorted(tool.call({"which": "mixed_set"}).unwrap(), key=str) == [1, "a"]  # unsortable: a list
    dumped = json.loads(tool.call({"which": "bytes"}).model_dump_json())
    assert dumped["value"] == "AP8="  # bytes in JSON: base64


def test_a_value_that_cannot_be_sent_names_its_type(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = (
        "class Opaque: pass\n"
        "def main(which: str):\n"
        "    return {'object': {'deep': [Opaque()]}, 'complex': 1j, 'big': 2**70}[which]\n"
    )
    tool = _tool(box, tmp_path, source)
    result = tool.call({"which": "object"})
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert "contains a value of type __wasmbox_tool__.Opaque, which cannot be sent" in result.error.message
    result = tool.call({"which": "complex"})
    assert result.error is not None and "contains a value of type complex," in result.error.message
    result = tool.call({"which": "big"})
    assert result.error is not None and "64-bit range" in result.error.message


def test_a_snippets_last_value_converts_too_else_is_its_repr(box: wasmbox.Sandbox) -> None:
    assert box.run_python("import datetime\ndatetime.date(2024, 1, 1)").value == "2024-01-01"
    assert box.run_python("{'b', 'a'}").value == ["a", "b"]
    assert box.run_python("1j").value == "1j"  # cannot be sent: its repr


PLAIN_REPLIES = r"""
import msgpack, wasmbox_driver as driver
nest = 1
for _ in range(34):
    nest = [nest]
values = [
    None, True, False, 0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1, 2**64,
    -1, -32, -33, -128, -129, -32768, -32769, -2**31, -2**31 - 1, -2**63, -2**63 - 1,
    0.0, -1.5, float("inf"), 1e300, "", "a", "x" * 31, "x" * 32, "x" * 255, "x" * 256, "é" * 40000,
    "\ud800", [], (), [1, [2, (3,)]], {}, {"a": 1}, {1: 2, "b": [None]}, {str(i): i for i in range(20)},
    list(range(20)), b"x", {1, 2}, [1, b"x"], nest, 3 + 4j,
]
mismatched, fast = [], 0
for value in values:
    packed = driver._pack_plain(value, driver._OK, 0)
    if packed is None:
        continue
    fast += 1
    if packed != msgpack.packb({"ok": value}, use_bin_type=True, default=driver._encode):
        mismatched.append(repr(value)[:40])
[mismatched, fast]
"""


def test_plain_replies_are_packed_as_msgpack_packs_them(box: wasmbox.Sandbox) -> None:
    """The driver's own encoder of plain results (the common case, without msgpack's
    pure-Python Packer) gives msgpack's bytes exactly, at every size boundary; the values it
    leaves to msgpack (bytes, sets, ints past 64 bits, lone surrogates, past 32 levels) are the rest."""
    grants = {"name": "plain", "runtime": "python", "limits": {"fuel": 500_000_000}}
    result = box.run_python(PLAIN_REPLIES, grants)
    assert result.ok, result.error
    assert result.value == [[], 43]
