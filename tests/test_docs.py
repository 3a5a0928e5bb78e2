"""The documents: ARCHITECTURE.md's module map names every module of the package."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

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


# -- no journal -----------------------------------------------------------------------------

# what a diary says: a tracker's issue by number, the work that made the text, dated headings
JOURNAL = re.compile(
    r"(?im)\bissue #?\d+|\bthis (?:session|branch)\b|\bwe (?:fixed|added|changed|made|tried)\b"
    r"|\bcoordinat(?:or)\b|^#{1,6} .*\b\d{4}-\d{2}-\d{2}"
)


def test_no_document_or_source_reads_as_a_journal() -> None:
    """The documents and the code speak of the project as it is; its history is in git."""
    code = [p for folder in ("wasmbox", "tests", "bench") for p in (ROOT / folder).rglob("*.py")]
    sources = [*DOCUMENTS, "native/README.md", *(str(p.relative_to(ROOT)) for p in code)]
    found = [
        f"{source}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for source in sources
        for text in [(ROOT / source).read_text()]
        for match in JOURNAL.finditer(text)
    ]
    assert len(sources) > 150 and found == []
    assert JOURNAL.search("## Sessions, 2026-12-01") and JOURNAL.search("as issue " + "25 asks")


def _bench_sections_without_command_or_machine(text: str) -> list[str]:
    """The headings of the sections with figures of their own (text under the heading, or no
    subheading below it) that name no command or no machine."""
    parts = re.split(r"(?m)^(#{2,3}) (.+)$", text)
    sections = [(parts[i], parts[i + 1], parts[i + 2]) for i in range(1, len(parts), 3)]
    bare = []
    for n, (level, title, body) in enumerate(sections):
        nested = n + 1 < len(sections) and len(sections[n + 1][0]) > len(level)
        if (body.strip() or not nested) and not (re.search(r"(?i)\bcommands?\b", body) and "achine" in body):
            bare.append(title)
    return bare


def test_every_bench_section_says_how_to_reproduce_it() -> None:
    """bench/README.md is a section per area, each naming the command behind its figures and the
    machine they were measured on."""
    text = (ROOT / "bench" / "README.md").read_text()
    assert text.count("\n## ") > 10 and _bench_sections_without_command_or_machine(text) == []
    sample = "## Area\n\n### Part\n\nCommand: `x`. Machine A.\n\n## Other\n\nfigures\n"
    assert _bench_sections_without_command_or_machine(sample) == ["Other"]


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


# -- every code block -----------------------------------------------------------------------
#
# A small runner of our own rather than pytest-examples: the blocks need only three things
# (run the front door's Python from the repository root, parse the rest, validate manifests),
# and a dependency for that would not earn its place. A Python block runs when it is complete
# (every name it uses is defined by it); a block that sketches a call (`...` for the elided
# parts, a top-level `await`, names from the prose) is compiled, so a syntax slip still fails.
# A complete block that must not run here (it serves until its client leaves, needs a network)
# says why in a comment before it, `<!-- docs-test: not run: why -->`, shown as the skip reason.
# A TOML block is parsed; one that is a whole manifest (it has a `name`) is validated by
# `wasmbox.Manifest`. A shell block is parsed by `bash -n`.

FENCED = re.compile(r"(?ms)^( *)```(\w*)[^\n]*\n(.*?)^\1```")
DOCUMENTS = ["README.md", "ARCHITECTURE.md", "SECURITY.md", "bench/README.md", *(
    str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")))]  # fmt: skip


NOT_RUN = re.compile(r"<!-- docs-test: not run: (.+?) -->\s*\Z")


def _blocks(language: str) -> list[tuple[str, int, str]]:
    found = []
    for document in DOCUMENTS:
        text = (ROOT / document).read_text()
        for match in FENCED.finditer(text):
            if match.group(2) == language:
                code = "\n".join(line.removeprefix(match.group(1)) for line in match.group(3).splitlines())
                found.append((document, text.count("\n", 0, match.start()) + 1, code))
    return found


def _complete(code: str) -> bool:
    """Whether `code` runs as it stands: no `...` placeholder, no top-level await, and every
    name it reads is bound in it or a builtin."""
    import builtins

    tree = ast.parse(code)
    if any(isinstance(n, ast.Constant) and n.value is Ellipsis for n in ast.walk(tree)):
        return False
    if any(isinstance(n, (ast.Await, ast.AsyncFor, ast.AsyncWith)) for n in ast.walk(tree)):
        return False
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read <= bound


PYTHON = _blocks("python")


def _not_run(document: str, line: int) -> str | None:
    """The reason a comment just before the block at `line` gives for not running it."""
    before = "\n".join((ROOT / document).read_text().splitlines()[: line - 1])
    found = NOT_RUN.search(before)
    return found.group(1) if found else None


RUNNABLE = [
    pytest.param(
        *b, id=f"{b[0]}:{b[1]}", marks=[pytest.mark.skip(reason=why)] if (why := _not_run(*b[:2])) else []
    )
    for b in PYTHON
    if _complete(b[2])
]


@pytest.mark.parametrize(("document", "line", "code"), PYTHON, ids=[f"{d}:{n}" for d, n, _ in PYTHON])
def test_every_python_block_compiles(document: str, line: int, code: str) -> None:
    compile(code, f"{document}:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize(("document", "line", "code"), RUNNABLE)
def test_every_complete_python_block_runs(
    document: str, line: int, code: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the repository root, as the README's quick start has it (its manifests, guests, data)."""
    monkeypatch.chdir(ROOT)
    before = set(ROOT.iterdir())
    namespace: dict[str, object] = {"__name__": "__docs__"}
    try:
        exec(compile(code, f"{document}:{line}", "exec"), namespace)  # noqa: S102 - the docs' own examples
    finally:
        box = namespace.get("box")
        if isinstance(box, wasmbox.Sandbox):
            box.close()
        for made in set(ROOT.iterdir()) - before:  # what an example writes (an audit log) goes
            if made.is_file():
                made.unlink()


def test_the_front_door_examples_all_run() -> None:
    """The README's examples are complete programs, so none of them is only compiled."""
    readme = [b for b in PYTHON if b[0] == "README.md"]
    ran = {(p.values[0], p.values[1]) for p in RUNNABLE if not p.marks}
    assert len(readme) >= 6 and all((d, n) in ran for d, n, _ in readme)


TOML = _blocks("toml")


@pytest.mark.parametrize(("document", "line", "code"), TOML, ids=[f"{d}:{n}" for d, n, _ in TOML])
def test_every_toml_block_parses_and_manifests_validate(
    document: str, line: int, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest's files are placeholders made where it names them (in a folder of its own:
    the checks here are of its fields, not of a module it names)."""
    data = tomllib.loads(code)
    if "name" not in data:
        return
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for field in ("module", "source", "requirements"):
        if isinstance(data.get(field), str) and not Path(data[field]).is_absolute():
            (here / data[field]).parent.mkdir(parents=True, exist_ok=True)
            (here / data[field]).write_bytes(b"")
    for preopen in data.get("preopens", []):
        if not Path(preopen["host"]).is_absolute():
            (here / preopen["host"]).mkdir(parents=True, exist_ok=True)
    wasmbox.Manifest.model_validate(data)


SHELL = _blocks("sh") + _blocks("bash") + _blocks("console")


@pytest.mark.parametrize(("document", "line", "code"), SHELL, ids=[f"{d}:{n}" for d, n, _ in SHELL])
def test_every_shell_block_parses(document: str, line: int, code: str) -> None:
    script = "\n".join(ln.removeprefix("$ ") for ln in code.splitlines())
    parsed = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
