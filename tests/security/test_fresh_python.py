"""A fresh Python call cannot observe what the call before it did, however that call ended.

A call writes a marker of its own making (never in any request: it is derived inside the guest)
into everything it can reach: a large buffer (past the part of a pooled memory the reset copies
back, `EngineSettings.pool_keep_resident`, and within it), the interpreter's objects (builtins,
a module of the snapshot, an object frozen in the snapshot's collector generation, the random
state), its scratch folder and the environment. Then it ends: normally, with an error, out of fuel, at
its deadline, out of memory while writing, or with a trap. The next calls look for the marker
from inside (every object the collector knows, the random state, /tmp, the environment), and
the host scans every pooled memory slot the Python runtime has used, byte by byte, once the
marker's store is freed: nothing is found.
"""

from __future__ import annotations

import hashlib
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import QUICK, Guarded

# the marking call: fuel to write ~48 MiB, memory for it (the deadline only a backstop, as in QUICK)
MARKING = {"fuel": 2_000_000_000, "memory": "256MiB", "timeout": "60s"}

WRITE = """
import builtins, gc, hashlib, json, os, random, sys
marker = hashlib.sha256(b"wasmbox-fresh-" + {nonce!r}.encode()).hexdigest()
builtins.LEFT = marker
json.LEFT = marker
sys.modules["wasmbox_driver"].__dict__["LEFT"] = [marker]
random.seed(marker)
os.environ["LEFT"] = marker
with open("/tmp/left.txt", "w") as handle:
    handle.write(marker)
unit = (marker + "|").encode()
held = [bytearray(unit * (4096 * 1024 // len(unit) + 1)) for _ in range(12)]  # ~48 MiB
import wasmbox_guest
wasmbox_guest.call_host("scan")  # the host sees the marker in the slot now
{end}
"""
# (id, how the marking call ends, its limits, the error it ends with)
ENDINGS: list[Any] = [
    pytest.param("1", MARKING, None, id="ok"),
    pytest.param("raise ValueError(marker)", MARKING, ErrorKind.GUEST_ERROR, id="error"),
    pytest.param("while True:\n    pass", MARKING, ErrorKind.OUT_OF_FUEL,
                 id="out-of-fuel"),
    pytest.param("while True:\n    pass", MARKING | {"fuel": 10**15, "timeout": "500ms"}, ErrorKind.TIMEOUT, id="timeout"),
    pytest.param("while True:\n    held.append(bytearray(unit * 100000))", MARKING | {"memory": "96MiB"},
                 ErrorKind.MEMORY_LIMIT, id="memory-mid-write"),
    pytest.param("sys.setrecursionlimit(10**6)\ndef f(n):\n    return list(map(f, [n]))\nf(0)", MARKING, ErrorKind.TRAP,
                 id="trap"),
]  # fmt: skip

LOOK = """
import builtins, gc, hashlib, os, random, sys

def look(nonce):  # (the marker only in a local: no object of this code holds it)
    marker = hashlib.sha256(b"wasmbox-fresh-" + nonce.encode()).hexdigest()
    probe = marker.encode()[:32]
    found = []
    if getattr(builtins, "LEFT", None) is not None or "LEFT" in sys.modules["json"].__dict__:
        found.append("module attribute")
    if "LEFT" in sys.modules["wasmbox_driver"].__dict__ or "LEFT" in os.environ:
        found.append("driver global or environment")
    if os.path.exists("/tmp/left.txt"):
        found.append("scratch file")
    state = random.getstate()
    random.seed(marker)
    if random.getstate() == state:
        found.append("random state")
    for obj in gc.get_objects():
        items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
        for item in items:
            data = item.encode("utf-8", "replace") if isinstance(item, str) else item
            if isinstance(data, (bytes, bytearray)) and probe in data:
                found.append(type(obj).__name__)
    return found

look({nonce!r})
"""


@pytest.mark.skipif(
    sys.platform != "linux", reason="the host's scan reads /proc/self/maps and /proc/self/mem"
)
@pytest.mark.parametrize(("end", "limits", "kind"), ENDINGS)
def test_a_python_call_leaves_nothing_for_the_next(
    guarded: Guarded, end: str, limits: dict[str, Any], kind: ErrorKind | None
) -> None:
    nonce = uuid.uuid4().hex
    marker = hashlib.sha256(b"wasmbox-fresh-" + nonce.encode()).hexdigest()
    seen: list[bool] = []

    @guarded.box.host_function("scan")
    def scan() -> bool:
        seen.append(any(marker.encode() in data for _, data in _slot_memory()))
        return True

    grants = {"scratch": "16MiB", "env": {"X": "1"}, "host_functions": ["scan"]}
    first = guarded.python(WRITE.format(nonce=nonce, end=end), limits=limits, **grants)
    assert seen == [True], "the scan does not see the guest's memory: it would prove nothing"
    if kind is None:
        assert first.ok, first.error
    else:
        assert first.error is not None and first.error.kind is kind, first.error
    for _ in range(6):  # the spare made meanwhile, then new instances in the slots just reset
        look = guarded.python(LOOK.format(nonce=nonce), limits=QUICK | {"fuel": 2_000_000_000}, **grants)
        assert look.ok, look.error
        assert look.value == [], look.value
    _assert_no_slot_holds(guarded.box, marker.encode())
    guarded.assert_untouched()


def _assert_no_slot_holds(box: wasmbox.Sandbox, marker: bytes) -> None:
    """Every pooled memory slot the Python runtime's image is mapped in (and the rest of each
    slot's accessible memory after it) holds no copy of `marker`, once the stores that wrote it
    are freed (on the housekeeping thread: waited for, up to 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        held = [hex(start) for start, data in _slot_memory() if marker in data]
        if not held or time.monotonic() > deadline:
            break
        box.run_python("1")  # (a retired store is freed after the calls queued before it)
        time.sleep(0.2)
    assert held == [], f"the marker is still in pooled memory at {held}"


def _slot_memory() -> list[tuple[int, bytes]]:
    regions: list[tuple[int, int]] = []
    after_image = False
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        start, end = (int(x, 16) for x in fields[0].split("-"))
        path = fields[5] if len(fields) >= 6 else ""
        if fields[1] == "rw-p" and path.endswith(".cwasm"):
            regions.append((start, end))  # a slot's image, mapped copy-on-write from the artifact
            after_image = True
        elif after_image and fields[1] == "rw-p" and not path and regions and start == regions[-1][1]:
            regions.append((start, end))  # the rest of that slot's accessible memory
        else:
            after_image = False
    out = []
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        for start, end in regions:
            mem.seek(start)
            out.append((start, mem.read(end - start)))
    return out


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps and /proc/self/pagemap")
def test_the_pool_resets_a_python_memory_by_copying_the_whole_image_back(guarded: Guarded) -> None:
    """A freed slot's image is copied back whole (the first `pool_keep_resident` bytes), not
    only the pages the kernel reports dirty: Wasmtime's `PAGEMAP_SCAN` reset is off, the reset
    SECURITY.md ("Pooled memory and swapped-out pages") relies on. After a reset every page of
    the image in the slot is the copy's (present, no longer the artifact file's); a scanning
    reset would leave the pages no call wrote mapped from the file. Fails if a Wasmtime upgrade
    turns that reset on by default."""
    for _ in range(8):
        assert guarded.python("sum(range(100))").ok
    deadline = time.monotonic() + 30
    copied = 0.0
    while copied < 0.99 and time.monotonic() < deadline:  # (stores are freed on a thread)
        copied = max(_copied_share(start, end) for start, end in _image_regions())
        time.sleep(0.1)
    assert copied >= 0.99, f"at most {copied:.0%} of a slot's image pages were copied back"
    guarded.assert_untouched()


def _image_regions() -> list[tuple[int, int]]:
    regions = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "rw-p" and fields[5].endswith(".cwasm"):
            regions.append(tuple(int(x, 16) for x in fields[0].split("-")))
    return regions  # type: ignore[return-value]


def _copied_share(start: int, end: int) -> float:
    """The share of the pages in [start, end) present and not the file's (bits 63 and 61)."""
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(start // 4096 * 8)
        entries = pagemap.read((end - start) // 4096 * 8)
    flags = [entry >> 61 for (entry,) in struct.iter_unpack("<Q", entries)]
    return sum(1 for f in flags if f & 0b100 and not f & 0b001) / max(1, len(flags))
