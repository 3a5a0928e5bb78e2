"""The package's layering rules that ARCHITECTURE.md states, checked on the source; and the test
suites' one rule of layout, that a test's name says which test it is."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import wasmbox

PACKAGE = Path(wasmbox.__file__).parent
ROOT = Path(__file__).resolve().parent.parent
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


def _test_names(path: Path) -> list[str]:
    """The tests pytest collects from `path`: its module-level `test_*` functions and those of its
    `Test*` classes (a test written inside a string, for pytester, is not one)."""
    tree = ast.parse(path.read_text())
    scopes = [tree, *(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test"))]
    return [
        node.name for scope in scopes for node in scope.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    ]  # fmt: skip


def test_no_test_name_is_repeated_across_files() -> None:
    """A failure, a `-k` selection or SECURITY.md's list names a test by its name alone: two files
    defining the same name make that ambiguous. The test suites and the benchmarks together."""
    files = sorted([*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "bench").glob("test_*.py")])
    where: dict[str, list[str]] = defaultdict(list)
    for path in files:
        for name in _test_names(path):
            where[name].append(str(path.relative_to(ROOT)))
    assert len(files) > 50 and len(where) > 500  # the suites were found
    repeated = {name: paths for name, paths in where.items() if len(set(paths)) > 1}
    assert repeated == {}, f"rename these to say what each checks: {repeated}"
