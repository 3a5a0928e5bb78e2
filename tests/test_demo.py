"""demo.py's rows say what happened: its load line adds up, and a command that exited nonzero
is shown with its exit code, not as ok."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import wasmbox

from .conftest import ROOT


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("wasmbox_demo", ROOT / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_load_line_adds_up_to_the_tools_loaded(
    demo: ModuleType, cache_dir: Path, built_examples: Path
) -> None:
    for _ in range(2):  # the first Sandbox compiles (or finds some in the cache), the second loads
        with wasmbox.Sandbox(cache_dir=cache_dir, progress=None) as box:
            box.host_function("kv.get")(lambda key: None)
            box.host_function("host.fn")(lambda fail=False, sleep=0.0: "pong")
            tools, line = demo.load_tools(box)
        match = re.fullmatch(r"loaded (\d+) tools in [0-9.]+ ms \((.*)\)", line)
        assert match is not None, line
        compiled, cached = re.fullmatch(r"compiled (\d+), from cache (\d+)", match[2]).groups()  # type: ignore[union-attr]
        assert int(match[1]) == len(tools) == int(compiled) + int(cached)
    assert line.endswith("(compiled 0, from cache 13)")  # the second process compiles nothing


def test_a_refused_dot_dot_escape_is_not_shown_as_ok(
    demo: ModuleType, box: wasmbox.Sandbox, built_examples: Path
) -> None:
    fsprobe = box.load(ROOT / "capabilities" / "fsprobe.toml")
    escape = fsprobe.call(argv=["read", "/data/../../etc/passwd"])
    assert escape.ok and escape.value["exit_code"] != 0  # the guest's open was refused
    assert demo.outcome(escape) == f"exit {escape.value['exit_code']}"
    assert demo.outcome(fsprobe.call(argv=["ls", "/data"])) == "ok"
    assert demo.outcome(fsprobe.call({"x": 1})) == "invalid_arguments"
