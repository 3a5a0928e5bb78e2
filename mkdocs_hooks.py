"""MkDocs hooks (mkdocs.yml): the repository's root documents as pages of the site.

README.md becomes the front page, ARCHITECTURE.md, SECURITY.md and bench/README.md pages of
their own; every link between these and docs/ is pointed at the page it names. A link to
another file of the repository (a manifest, a source file) becomes its text, since the site
holds no such file; a link to something that exists nowhere is left alone, so that
`mkdocs build --strict` fails on it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
# a root document: its page on the site
ROOT_PAGES = {"README.md": "index.md", "ARCHITECTURE.md": "architecture.md",
              "SECURITY.md": "security.md", "bench/README.md": "bench.md"}  # fmt: skip
SOURCES = {page: source for source, page in ROOT_PAGES.items()}
LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"(?ms)^\s*```.*?^\s*```[^\n]*$")


def on_files(files: Files, config: Any) -> Files:
    for source, page in ROOT_PAGES.items():
        files.append(File.generated(config, page, content=(ROOT / source).read_text()))
    return files


def _target(link: str, source: str) -> str | None:
    """Where `link`, written in the repository's `source` file, points on the site; None: keep
    only its text."""
    if re.match(r"[a-z][a-z0-9+.-]*:|#", link):
        return link
    path, _, fragment = link.partition("#")
    repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path)).rstrip("/")
    anchor = f"#{fragment}" if fragment else ""
    if repo in ROOT_PAGES:
        return ROOT_PAGES[repo] + anchor
    if repo.startswith("docs/") and repo.endswith(".md"):
        return repo.removeprefix("docs/") + anchor
    if repo == "docs":
        return "index.md"
    if (ROOT / repo).exists():
        return None
    return link


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    source = SOURCES.get(page.file.src_uri, f"docs/{page.file.src_uri}")

    def relink(match: re.Match[str]) -> str:
        target = _target(match.group(2), source)
        return match.group(1) if target is None else f"[{match.group(1)}]({target})"

    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):
        pieces += [LINK.sub(relink, markdown[last : fence.start()]), fence.group(0)]
        last = fence.end()
    pieces.append(LINK.sub(relink, markdown[last:]))
    return "".join(pieces)
