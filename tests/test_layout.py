"""The package's layering rules that ARCHITECTURE.md states, checked on the source."""

from __future__ import annotations

import re
from pathlib import Path

import wasmbox

PACKAGE = Path(wasmbox.__file__).parent
ENGINE_LAYER = PACKAGE / "_wasmtime"
# wasmtime-py's private API: its ctypes declarations, store and instance internals, raw pointers
PRIVATE = re.compile(
    r"wasmtime\._ffi|from wasmtime import _ffi|\._context\(|_Store__|\._consume\(|\.ptr\(\)|\._instance\b"
)


def _host_modules() -> list[Path]:
    guest = {PACKAGE / "_backends" / "python" / "guest", PACKAGE / "_backends" / "python" / "programs"}
    return [p for p in PACKAGE.rglob("*.py") if not guest & set(p.parents)]


def test_only_the_engine_layer_touches_wasmtime_py_private_api() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}"
        for path in _host_modules()
        if ENGINE_LAYER not in path.parents
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE.search(line)
    ]
    assert offenders == []


def test_the_engine_layer_is_where_the_private_api_is_used() -> None:
    """The rule above is not vacuous: the pattern does find the engine layer's own uses."""
    assert any(PRIVATE.search(p.read_text()) for p in ENGINE_LAYER.glob("*.py"))


def test_no_module_cites_a_design_document_outside_the_repository() -> None:
    cited = [
        str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*") if p.is_file() and p.suffix in {".py", ".wit"}
        and "DESIGN.md" in p.read_text()
    ]  # fmt: skip
    assert cited == []
