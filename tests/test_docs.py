"""The documents: ARCHITECTURE.md's module map names every module of the package."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import wasmbox

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = Path(wasmbox.__file__).parent
# guest programs: CPython 3.14 code compiled into or run inside a runtime, not host modules
GUEST = {PACKAGE / "_backends" / "python" / "guest", PACKAGE / "_backends" / "python" / "programs"}
TICKED = re.compile(r"`([^`]+)`")


def _module_map() -> list[tuple[list[str], str]]:
    """ARCHITECTURE.md's module map: each row's first cell's backticked names, and the row."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Module map") :]
    section = section[: section.index("\n## ", 1)]
    rows = []
    for line in section.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) >= 2:
            rows.append((TICKED.findall(cells[0]), line))
    return rows


def _modules() -> list[Path]:
    return sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if not GUEST & set(p.parents))


def _named(module: Path, rows: list[tuple[list[str], str]]) -> bool:
    """A top-level module is named in a first cell (`_call.py`); a subpackage's module is named
    (`runner`, or `guest_driver.py`) in the row whose first cell is its folder (`_backends/core/`),
    and a subpackage's `__init__.py` by a row of its folder or of a folder inside it."""
    if len(module.parts) == 1:
        return any(module.name in names for names, _ in rows)
    folder = module.parent.as_posix() + "/"
    if module.name == "__init__.py":
        return any(name.startswith(folder) for names, _ in rows for name in names)
    for names, row in rows:
        if folder in names:
            ticked = set(TICKED.findall(row))
            return module.stem in ticked or module.name in ticked
    return False


def test_the_module_map_names_every_module_of_the_package() -> None:
    rows = _module_map()
    assert len(rows) > 10  # the table was found
    missing = [str(m) for m in _modules() if not _named(m, rows)]
    assert missing == [], f"add these to ARCHITECTURE.md's module map: {missing}"


def test_the_module_map_names_no_module_that_is_gone() -> None:
    named = [name for names, _ in _module_map() for name in names]
    gone = [n for n in named if not (PACKAGE / n).exists() and n != "_wasmbox_pytestplugin.py"]
    assert gone == []
    assert (ROOT / "_wasmbox_pytestplugin.py").exists()


# -- SECURITY.md ----------------------------------------------------------------------------

TEST_REF = re.compile(r"`((?:security/)?test_\w+)(?:::(test_\w+))?`")


def test_every_test_security_md_names_exists() -> None:
    """SECURITY.md lists, under each threat, the tests that try it: each names a real file of
    tests/ and, after `::`, a test function defined in it."""
    text = (ROOT / "SECURITY.md").read_text()
    refs = TEST_REF.findall(text)
    assert len(refs) > 200
    sources = {p: p.read_text() for p in (ROOT / "tests").rglob("test_*.py")}
    missing = []
    for file, name in refs:
        path = ROOT / "tests" / f"{file}.py"
        if name:
            if path not in sources or not re.search(rf"\bdef {name}\(", sources[path]):
                missing.append(f"{file}::{name}")
        elif not path.exists() and not any(re.search(rf"\bdef {file}\(", s) for s in sources.values()):
            missing.append(file)
    assert missing == []


def test_security_md_rows_are_short() -> None:
    """The threat table is a short row per threat; the detail is in the threat's section."""
    long = [line[:60] for line in (ROOT / "SECURITY.md").read_text().splitlines() if len(line) > 200]
    assert long == []


# -- the site -------------------------------------------------------------------------------


def test_the_site_builds_with_no_broken_link(tmp_path: Path) -> None:
    """`mkdocs build --strict`: a link to a page or an anchor that does not exist fails it."""
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    for page in ("index", "security", "architecture", "bench", "python"):
        assert (tmp_path / "site" / ("" if page == "index" else page) / "index.html").exists()


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert pages and [p for p in pages if f": {p}" not in nav] == []
