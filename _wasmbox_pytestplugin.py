"""wasmbox's pytest plugin (entry point `wasmbox`; `-p no:wasmbox` turns it off).

pytest loads this module in every run of every project where wasmbox is installed, so it is a
top-level module that imports nothing of wasmbox (nor wasmtime) until a test uses one of its
fixtures or markers: an unrelated run is unchanged. What the fixtures hand out is documented
in `wasmbox.testing`; docs/testing.md shows them.

Fixtures: `wasmbox_cache_dir` and `wasmbox_sandbox` (one per run), `wasmbox_tool`,
`wasmbox_run`, `wasmbox_bench` (defined once the run's plugins are known: it needs the
`benchmark` fixture of pytest-benchmark or pytest-codspeed). Markers: `wasmbox_runtime("python" | "javascript" |
"scientific", ...)` skips a test whose runtime is not built in the run's cache unless
`--wasmbox-build` builds it; `wasmbox_network` skips a test unless `--wasmbox-network`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from wasmbox import Sandbox
    from wasmbox.testing import SnippetRunner, ToolBench, ToolLoader

_RUNTIMES = ("python", "javascript", "scientific")
_BUILD_TIME = {
    "python": "about a minute",
    "javascript": "seconds, and a 1.5 MB download",
    "scientific": "minutes, and a download of its pinned wheel",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("wasmbox", "wasmbox: testing and benchmarking wasmbox tools")
    group.addoption(
        "--wasmbox-cache-dir", metavar="DIR", default=None,
        help="the compile cache (and runtime builds) of the wasmbox fixtures; default: a folder "
        "in pytest's cache (.pytest_cache/d/wasmbox). Point it at ~/.cache/wasmbox to share "
        "the runtimes wasmbox has built on this machine",
    )  # fmt: skip
    group.addoption(
        "--wasmbox-build", action="store_true",
        help="build the runtimes that tests marked wasmbox_runtime(...) need, instead of "
        "skipping them",
    )  # fmt: skip
    group.addoption(
        "--wasmbox-network", action="store_true",
        help="run the tests marked wasmbox_network (they need the network), instead of skipping them",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "wasmbox_runtime(*names): the test needs these wasmbox runtimes (python, javascript, "
        "scientific); skipped when one is not built in the wasmbox cache, unless --wasmbox-build",
    )
    config.addinivalue_line(
        "markers", "wasmbox_network: the test needs the network; skipped unless --wasmbox-network"
    )
    plugins = config.pluginmanager
    present = plugins.has_plugin("benchmark") or plugins.has_plugin("codspeed")
    plugins.register(_Bench() if present else _NoBench(), "wasmbox-bench")


class _State:
    """The run's wasmbox settings, and what was found or built (nothing until first asked)."""

    def __init__(self, config: pytest.Config) -> None:
        self._config = config
        self._cache_dir: Path | None = None
        self.build_failures: dict[str, str] = {}  # runtime -> why it could not be fetched

    @property
    def cache_dir(self) -> Path:
        if self._cache_dir is None:
            given = self._config.getoption("wasmbox_cache_dir")
            cache = getattr(self._config, "cache", None)  # None under -p no:cacheprovider
            if given:
                self._cache_dir = Path(given).expanduser().resolve()
            elif cache is not None:
                self._cache_dir = cache.mkdir("wasmbox")
            else:
                folder = tempfile.mkdtemp(prefix="wasmbox-pytest-")
                self._config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
                self._cache_dir = Path(folder)
        return self._cache_dir


_STATE = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    if _STATE not in config.stash:
        config.stash[_STATE] = _State(config)
    return config.stash[_STATE]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (before any fixture is made) a marked test whose needs are not met, saying why;
    and give Wasmtime back its trap handlers if the last test let another handler take them
    (a pytest run in-process, as pytester's, enables and disables faulthandler: a guest's trap
    would then kill the test run). Nothing is imported that the run has not imported."""
    signals = sys.modules.get("wasmbox._wasmtime.signals")
    if signals is not None:
        signals.restore()
    if item.get_closest_marker("wasmbox_network") and not item.config.getoption("wasmbox_network"):
        pytest.skip("needs the network (marked wasmbox_network): run pytest with --wasmbox-network")
    for marker in item.iter_markers("wasmbox_runtime"):
        for name in marker.args:
            _need_runtime(item.config, name)


def _need_runtime(config: pytest.Config, name: object) -> None:
    if name not in _RUNTIMES:
        pytest.fail(f"wasmbox_runtime({name!r}): the runtimes are {', '.join(_RUNTIMES)}", pytrace=False)
    from wasmbox._inputs import InputUnavailable
    from wasmbox.testing import build_runtime, runtime_built

    state = _state(config)
    if name in state.build_failures:
        pytest.skip(state.build_failures[name])
    if runtime_built(name, state.cache_dir):  # type: ignore[arg-type]
        return
    if not config.getoption("wasmbox_build"):
        pytest.skip(
            f"needs the {name} runtime, which is not built in {state.cache_dir}: run pytest with "
            f"--wasmbox-build to build it ({_BUILD_TIME[name]}, once per cache), or give "
            "--wasmbox-cache-dir a cache that has it"
        )
    try:
        build_runtime(name, state.cache_dir)  # type: ignore[arg-type]
    except InputUnavailable as exc:  # no registry: a skip, like any missing input
        state.build_failures[name] = f"--wasmbox-build cannot build the {name} runtime: {exc}"
        pytest.skip(state.build_failures[name])


@pytest.fixture(scope="session")
def wasmbox_cache_dir(pytestconfig: pytest.Config) -> Path:
    """The run's wasmbox cache: --wasmbox-cache-dir, else a folder in pytest's cache, so compiles
    and runtime builds happen once, not once per test (nor per run)."""
    return _state(pytestconfig).cache_dir


@pytest.fixture(scope="session")
def wasmbox_sandbox(wasmbox_cache_dir: Path) -> Iterator[Sandbox]:
    """One Sandbox for the run, on `wasmbox_cache_dir`, closed at its end. Override it in a
    conftest.py to register host functions or pass Sandbox options."""
    import wasmbox

    with wasmbox.Sandbox(cache_dir=wasmbox_cache_dir) as sandbox:
        yield sandbox


@pytest.fixture
def wasmbox_tool(wasmbox_sandbox: Sandbox, request: pytest.FixtureRequest) -> ToolLoader:
    """`wasmbox_tool(manifest)` -> Tool: a path (relative to the test file's folder), a dict or
    a Manifest, loaded into `wasmbox_sandbox` (replacing a tool of the same name)."""
    from wasmbox.testing import ToolLoader

    return ToolLoader(wasmbox_sandbox, request.path.parent)


@pytest.fixture
def wasmbox_run(wasmbox_sandbox: Sandbox) -> SnippetRunner:
    """`wasmbox_run.python(code)`, `wasmbox_run.javascript(code)` -> CallResult, in
    `wasmbox_sandbox`."""
    from wasmbox.testing import SnippetRunner

    return SnippetRunner(wasmbox_sandbox)


class _Bench:
    """`wasmbox_bench` where a benchmark plugin is present. It asks for `benchmark` by name, so
    pytest-codspeed, which runs only the tests that use that fixture, runs its tests."""

    @pytest.fixture
    def wasmbox_bench(self, benchmark: object) -> ToolBench:
        """`wasmbox_bench(tool, args, spacing=..., rounds=...)` -> BenchRun: fresh calls timed by
        the `benchmark` fixture (pytest-benchmark's or pytest-codspeed's), their phases in its
        extra_info."""
        from wasmbox.testing import ToolBench

        return ToolBench(benchmark)


class _NoBench:
    """`wasmbox_bench` where no benchmark plugin is: its tests are skipped, saying why."""

    @pytest.fixture
    def wasmbox_bench(self) -> ToolBench:
        """Skips: neither pytest-benchmark nor pytest-codspeed is installed (or enabled)."""
        pytest.skip("wasmbox_bench needs a benchmark fixture: install pytest-benchmark or pytest-codspeed")
