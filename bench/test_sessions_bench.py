"""A session's `run` against a fresh call (pytest-benchmark). Run: ./dev bench -k sessions

Each pair runs the same snippet both ways in one run: in a fresh instance (`run_python`) and in
a session's instance, where the interpreter, its imports and its namespace are already there.
Opening a session (one instance, made once) and closing it are measured too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox
from wasmbox import SessionLimits

# A module outside the runtime's snapshot: a fresh call imports it from the stdlib preopen.
IMPORT_XML = "import xml.dom.minidom as minidom\nminidom.parseString('<a><b/></a>').documentElement.tagName"
# Totals no benchmark reaches (they are checked per run all the same).
UNBOUNDED = SessionLimits(calls=10**9, fuel=2**62, time=10**9, idle=3600, lifetime=10**9)


@pytest.fixture(scope="module")
def box() -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=Path.home() / ".cache" / "wasmbox-bench") as sandbox:
        sandbox.run_python("1")
        yield sandbox


@pytest.fixture
def session(box: wasmbox.Sandbox) -> Iterator[wasmbox.Session]:
    with box.session(limits=UNBOUNDED) as opened:
        yield opened


def test_sessions_fresh_call_sum(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The baseline: a fresh instance per call."""
    assert benchmark(box.run_python, "sum(range(100))").value == 4950


def test_sessions_run_sum(benchmark, session: wasmbox.Session) -> None:  # type: ignore[no-untyped-def]
    assert benchmark(session.run, "sum(range(100))").value == 4950


def test_sessions_fresh_call_import(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A module the snapshot lacks, imported in every call."""
    assert benchmark(box.run_python, IMPORT_XML).value == "a"


def test_sessions_run_import(benchmark, session: wasmbox.Session) -> None:  # type: ignore[no-untyped-def]
    """The same in a session: imported by its first run, found in sys.modules by the rest."""
    assert benchmark(session.run, IMPORT_XML).value == "a"


def test_sessions_run_uses_state(benchmark, session: wasmbox.Session) -> None:  # type: ignore[no-untyped-def]
    """What a notebook does: work on what an earlier run left (a 10k-item list)."""
    assert session.run("data = list(range(10_000))").ok
    assert benchmark(session.run, "sum(data)").value == 49_995_000


def test_sessions_open_run_close(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A session's whole life with one run: its instance is made in the caller's thread (no
    spare made ahead), and closed there."""

    def life() -> object:
        with box.session() as opened:
            return opened.run("sum(range(100))").value

    assert benchmark(life) == 4950


@pytest.fixture
def js_session(box: wasmbox.Sandbox) -> Iterator[wasmbox.Session]:
    box.prepare_javascript()
    with box.session(limits=UNBOUNDED, runtime="javascript") as opened:
        yield opened


def test_sessions_js_fresh_call_sum(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The JavaScript baseline: a fresh QuickJS instance per call."""
    code = "let s = 0; for (let i = 0; i < 100; i++) s += i; s"
    assert benchmark(box.run_javascript, code).value == 4950


def test_sessions_js_run_sum(benchmark, js_session: wasmbox.Session) -> None:  # type: ignore[no-untyped-def]
    """The same in a JavaScript session (a block scope: `let s` is the block's, not the session's)."""
    code = "{ let s = 0; for (let i = 0; i < 100; i++) s += i; s }"
    assert benchmark(js_session.run, code).value == 4950


def test_sessions_js_open_run_close(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A JavaScript session's whole life with one run."""
    box.prepare_javascript()

    def life() -> object:
        with box.session(runtime="javascript") as opened:
            return opened.run("1 + 2").value

    assert benchmark(life) == 3
