"""Exhausting the host: infinite loops, deep recursion, memory/table/GC growth bombs, output
floods, from core modules, WASI commands and Python. Each ends with its exact error kind and
a host that is untouched and still serving."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from ..conftest import wat
from .conftest import HOSTILE_CMD, QUICK, Guarded, named, security_wat

FOREVER = {"fuel": 10**15, "timeout": "300ms"}  # a deadline, not fuel, stops these

# (id, module, limits, kind, words in the message)
CORE_CASES: list[tuple[str, str, dict[str, Any], ErrorKind, str]] = [
    ("spin-fuel", wat("spin"), QUICK, ErrorKind.OUT_OF_FUEL, "fuel"),
    ("spin-deadline", wat("spin"), FOREVER, ErrorKind.TIMEOUT, "deadline"),
    ("tail-calls-forever", security_wat("tail_call_loop"), QUICK, ErrorKind.OUT_OF_FUEL, "fuel"),
    ("tail-calls-deadline", security_wat("tail_call_loop"), FOREVER, ErrorKind.TIMEOUT, "deadline"),
    ("start-function-spins", security_wat("start_loop"), QUICK, ErrorKind.OUT_OF_FUEL, "fuel"),
    ("start-function-deadline", security_wat("start_loop"), FOREVER, ErrorKind.TIMEOUT, "deadline"),
    ("alloc-never-returns", security_wat("alloc_loop"), FOREVER, ErrorKind.TIMEOUT, "deadline"),
    ("sleep-10s", wat("sleep"), {"timeout": "200ms"}, ErrorKind.TIMEOUT, "deadline"),
    ("deep-recursion", wat("deep_recursion"), QUICK, ErrorKind.TRAP, "stack"),
    ("memory-grow-loop", wat("grow"), {**QUICK, "memory": "2MiB"}, ErrorKind.MEMORY_LIMIT, "memory"),
    ("malloc-until-oom", wat("bigalloc"), {**QUICK, "memory": "2MiB"}, ErrorKind.MEMORY_LIMIT, "memory"),
    ("table-grow-loop", security_wat("table_bomb"), QUICK, ErrorKind.TRAP, "unreachable"),
    ("gc-heap-bomb", security_wat("gc_bomb"), {**QUICK, "memory": "16MiB"}, ErrorKind.MEMORY_LIMIT, "GC heap"),
    ("data-past-memory", security_wat("huge_data_offset"), QUICK, ErrorKind.TRAP, "out of bounds"),
    ("uncaught-exception", security_wat("throw"), QUICK, ErrorKind.TRAP, "exception"),
    ("stdout-flood", wat("spam"), {**QUICK, "output": "4KiB"}, ErrorKind.OUTPUT_LIMIT, "stdout"),
    # ignores the failed writes past the cap: ends at its deadline, its output cut (truncated)
    ("stderr-flood-ignoring-errors", security_wat("stderr_flood"), {**FOREVER, "output": "4KiB"},
     ErrorKind.TIMEOUT, "deadline"),
    ("huge-result", wat("huge_result"), QUICK, ErrorKind.OUTPUT_LIMIT, "output cap"),
]  # fmt: skip


@pytest.mark.parametrize(("module", "limits", "kind", "words"), named(CORE_CASES))
def test_core_module_cannot_exhaust_the_host(
    guarded: Guarded, module: str, limits: dict[str, Any], kind: ErrorKind, words: str
) -> None:
    result = guarded.box.load({"name": "bomb", "module": module, "limits": limits}).call({})
    assert result.error is not None and result.error.kind is kind, result.error
    assert words.lower() in result.error.message.lower(), result.error.message
    assert len(result.stdout) <= 64 * 1024 and len(result.stderr) <= 64 * 1024
    guarded.assert_untouched()


def test_stderr_flood_is_cut_at_the_cap(guarded: Guarded) -> None:
    limits = {**FOREVER, "timeout": "30s", "output": "4KiB"}
    tool = guarded.box.load({"name": "flood", "module": security_wat("stderr_flood"), "limits": limits})
    result = guarded.end_once_cut(partial(tool.call, {}))
    del tool
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.truncated and result.stderr == "E" * 4096 and result.stdout == ""
    guarded.assert_untouched()


COMMAND_CASES = [
    ("stdin-echoed-past-the-cap", ["cat"], b"x" * 100_000, ErrorKind.OUTPUT_LIMIT),
    # keeps printing after its writes fail: ends at its deadline, its output cut
    ("read-loop-forever", ["readloop", "/data/inside.txt", "100000000"], b"", ErrorKind.TIMEOUT),
]


@pytest.mark.parametrize(("argv", "stdin", "kind"), named(COMMAND_CASES))
def test_command_cannot_exhaust_the_host(
    guarded: Guarded, argv: list[str], stdin: bytes, kind: ErrorKind
) -> None:
    module = HOSTILE_CMD.with_name("fsprobe.wasm" if argv[0] == "cat" else "hostile_cmd.wasm")
    manifest = {"name": "cmd", "module": str(module), "limits": {**FOREVER, "timeout": "30s", "output": "8KiB"},
                "preopens": guarded.preopen()}  # fmt: skip
    tool = guarded.box.load(manifest)
    if kind is ErrorKind.TIMEOUT:  # it goes on past the cap: cut, then ended at its deadline
        result = guarded.end_once_cut(partial(tool.call, argv=argv, stdin=stdin))
    else:
        result = tool.call(argv=argv, stdin=stdin)
    del tool
    assert result.error is not None and result.error.kind is kind, result.error
    assert result.truncated and len(result.stdout) == 8192
    guarded.assert_untouched()


PY_BIG = {"fuel": 10**9, "timeout": "60s"}  # (the deadline only a backstop, as in QUICK)
# (id, code, limits, kind, words in the message)
PYTHON_CASES: list[tuple[str, str, dict[str, Any], ErrorKind, str]] = [
    ("while-true-fuel", "while True:\n    pass", QUICK, ErrorKind.OUT_OF_FUEL, "fuel"),
    ("while-true-deadline", "while True:\n    pass", {"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT,
     "deadline"),
    ("recursion", "def f():\n    return f()\nf()", PY_BIG, ErrorKind.GUEST_ERROR, "RecursionError"),
    ("recursion-limit-raised", "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)",
     PY_BIG, ErrorKind.TRAP, "stack"),
    ("bytearray-1GiB", "x = bytearray(1 << 30)", QUICK, ErrorKind.MEMORY_LIMIT, "memory"),
    ("list-growth", "x = []\nwhile True:\n    x.append(' ' * 100000)", {**PY_BIG, "memory": "64MiB"},
     ErrorKind.MEMORY_LIMIT, "memory"),
    ("print-flood", "while True:\n    print('x' * 1000)", {**PY_BIG, "output": "8KiB"}, ErrorKind.OUTPUT_LIMIT,
     "stdout"),
    ("stderr-flood", "import sys\nwhile True:\n    sys.stderr.write('e' * 1000)", {**PY_BIG, "output": "8KiB"},
     ErrorKind.OUTPUT_LIMIT, "stderr"),
    ("huge-result", "'z' * 1_000_000", {**PY_BIG, "output": "8KiB"}, ErrorKind.OUTPUT_LIMIT, "output cap"),
    ("deeply-nested-result", "x = None\nfor _ in range(100):\n    x = [x]\nx", QUICK, ErrorKind.BAD_RESPONSE,
     "nested"),
    ("sleep", "import time\ntime.sleep(60)", QUICK, ErrorKind.GUEST_ERROR, "sleeping"),
    ("threads", "import threading\nthreading.Thread(target=print).start()", QUICK, ErrorKind.GUEST_ERROR,
     "can't start new thread"),
    ("fork", "import os\nos.fork()", QUICK, ErrorKind.GUEST_ERROR, "no attribute 'fork'"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "limits", "kind", "words"), named(PYTHON_CASES))
def test_python_cannot_exhaust_the_host(
    guarded: Guarded, code: str, limits: dict[str, Any], kind: ErrorKind, words: str
) -> None:
    result = guarded.python(code, limits=limits)
    assert result.error is not None and result.error.kind is kind, result.error
    assert words.lower() in result.error.message.lower(), result.error.message[-500:]
    guarded.assert_untouched()


def test_a_second_memory_cannot_get_past_the_memory_cap(guarded: Guarded) -> None:
    """One memory per core instance: the pooling allocator refuses the module at load; without
    pooling, the store's `memories: 1` limit refuses its instantiation."""
    module = {"name": "two_memories", "module": security_wat("two_memories")}
    with pytest.raises(wasmbox.ManifestError, match="defined memories count of 2"):
        guarded.box.load(module)
    with wasmbox.Sandbox(cache_dir=None, settings=wasmbox.EngineSettings(pooling=False)) as box:
        result = box.load(module).call({})
    assert result.error is not None and result.error.kind is ErrorKind.TRAP
    assert "memory count too high" in result.error.message
    guarded.assert_untouched()
