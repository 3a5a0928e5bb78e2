"""Coverage-guided fuzzing of the ABI v1 path with atheris (libFuzzer), against real guests.

Run: ./dev fuzz [SECONDS]   (installs the `fuzz` extra; default 60 s; corpus in fuzz/corpus/)
or:  .venv/bin/python fuzz/abi_fuzz.py -max_total_time=60 fuzz/corpus

Each input drives one of four paths, chosen by its first byte:
  0  the rest is a guest's raw reply: returned by runtimes/examples/wat/reflect.wat from its
     own memory, then framed and decoded by the host (`_abi.split`, `unpack_reply`);
  1  the rest is the guest's packed (ptr << 32) | len result itself: the host bounds-checks it
     and reads wherever it points;
  2  the rest is decoded as MessagePack and, if it is a map, sent as a call's args to the echo
     guest (args encoding, then the reply decoded again);
  3  the rest goes to `_abi.unpack_reply` directly (no wasm: the fastest path to new code).
Every outcome is checked against what the host must do; anything else (an exception that is not
a typed result, a wrong value) is a crash that libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import atheris

with atheris.instrument_imports(include=["wasmbox"]):
    import wasmbox
    from wasmbox import ErrorKind, _abi

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.abi_oracle import (  # (needs ROOT on the path)
    check_echo,
    check_pointer,
    check_reply,
)

WAT = ROOT / "runtimes" / "examples" / "wat"
CAP = 4096  # the guests' output cap: big enough to decode, small enough to hit

BOX = wasmbox.Sandbox(cache_dir=None)
REFLECT = BOX.load({"name": "reflect", "module": str(WAT / "reflect.wat"), "limits": {"output": CAP}})
ECHO = BOX.load({"name": "echo", "module": str(WAT / "echo.wat"), "limits": {"output": CAP}})


def check_args(data: bytes) -> None:
    try:
        args = _abi.unpack(data)
    except _abi.FramingError:
        return
    if not isinstance(args, dict):
        return
    refusals = (ErrorKind.INVALID_ARGUMENTS, ErrorKind.BAD_RESPONSE, ErrorKind.OUTPUT_LIMIT)
    check_echo(ECHO.call(args), args, *refusals)


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0] % 4, data[1:]
    if mode == 0:
        check_reply(REFLECT.call({"r": rest}), rest, CAP)
    elif mode == 1:
        packed = struct.unpack("<q", rest[:8].ljust(8, b"\0"))[0]
        check_pointer(REFLECT.call({"p": struct.pack("<q", packed)}), packed, CAP)
    elif mode == 2:
        check_args(rest)
    else:
        try:
            _abi.unpack_reply(rest)
        except _abi.FramingError:
            pass


def seed(corpus: Path) -> None:
    """A few valid inputs per mode, so the fuzzer starts from replies that decode."""
    corpus.mkdir(parents=True, exist_ok=True)
    samples = {
        "ok_map": b"\x00" + _abi.ok({"a": [1, 2.5, None, True, b"x"], "b": {"c": "d"}}),
        "error": b"\x00" + _abi.error("boom"),
        "pointer": b"\x01" + struct.pack("<q", _abi.join(1024, 16)),
        "args": b"\x02" + _abi.pack({"text": "hello", "n": [1, 2, {"k": b"\xff"}]}),
        "direct": b"\x03" + _abi.ok([[[1]]]),
    }
    for name, sample in samples.items():
        path = corpus / f"seed-{name}"
        if not path.exists():
            path.write_bytes(sample)


def main() -> None:
    corpora = [Path(a) for a in sys.argv[1:] if not a.startswith("-")]
    for corpus in corpora:
        seed(corpus)
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
