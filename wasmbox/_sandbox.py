"""The public façade: one Sandbox owns the engine, the cache, host functions and loaded tools."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import wasmtime

from ._cache import ArtifactCache, CacheStats, default_cache_dir
from ._engine import EngineSettings, EpochTicker, make_engine
from ._errors import CapabilityError, ManifestError
from ._hostfuncs import HostFunction
from ._inspect import abi_problem, check_grants, inspect_module, read_wasm
from ._manifest import Manifest, ManifestSource
from ._results import CallResult
from ._runner import ModuleRunner
from ._tool import Tool

F = TypeVar("F", bound=Callable[..., Any])
_DEFAULT = object()


class Sandbox:
    """Loads tools from capability manifests and runs each call in a fresh Wasmtime instance.

    One per process is the normal case. `cache_dir=None` disables the on-disk compile cache;
    by default it is `$WASMBOX_CACHE_DIR` or `~/.cache/wasmbox`. `max_workers` sizes the thread
    pool that `acall` uses.
    """

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str] | None | object = _DEFAULT,
        max_workers: int | None = None,
        settings: EngineSettings | None = None,
    ) -> None:
        self.settings = settings or EngineSettings()
        self.engine = make_engine(self.settings)
        directory = default_cache_dir() if cache_dir is _DEFAULT else cache_dir
        self._cache = ArtifactCache(
            Path(directory) if directory is not None else None,  # type: ignore[arg-type]
            self.settings,
        )
        self._ticker = EpochTicker(self.engine, self.settings.epoch_tick_s)
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers or os.cpu_count() or 2, thread_name_prefix="wasmbox-call"
        )
        self._host_functions: dict[str, HostFunction] = {}
        self._tools: dict[str, Tool] = {}
        self._lock = threading.Lock()

    # -- host functions -------------------------------------------------------------------

    def host_function(self, name: str) -> Callable[[F], F]:
        """Decorator: register `func` as host function `name` (grantable in manifests)."""

        def register(func: F) -> F:
            self.register_host_function(name, func)
            return func

        return register

    def register_host_function(self, name: str, func: Callable[..., Any]) -> None:
        """Register `func` under `name`. Arguments are validated against its signature."""
        function = HostFunction(name, func)
        with self._lock:
            if name in self._host_functions:
                raise ValueError(f"host function {name!r} is already registered")
            self._host_functions[name] = function

    # -- tools ----------------------------------------------------------------------------

    def load(self, source: ManifestSource, *, replace: bool = False) -> Tool:
        """Check and compile the manifest's tool; it is then callable by name.

        Raises ManifestError for a malformed manifest or module, CapabilityError when the
        module imports anything its manifest does not grant or a grant cannot be honoured.
        """
        manifest = Manifest.load(source)
        origin = manifest.name
        if manifest.runtime is not None:
            raise ManifestError(f"{origin}: runtime: the {manifest.runtime!r} runtime is not available yet")
        missing = [n for n in manifest.host_functions if n not in self._host_functions]
        if missing:
            raise CapabilityError(
                f"{origin}: grants host function(s) {missing} that this Sandbox has not registered"
            )
        assert manifest.module is not None
        wasm = read_wasm(manifest.module)
        try:
            module = self._cache.module(self.engine, wasm)
        except wasmtime.WasmtimeError as exc:
            raise ManifestError(f"{manifest.module}: module: not a valid module: {exc}") from None
        info = inspect_module(module)
        problem = abi_problem(info)
        if problem is not None:
            raise ManifestError(f"{manifest.module}: module: {problem}")
        check_grants(info, manifest.host_functions, str(manifest.module))
        runner = ModuleRunner(
            self.engine, module, info, manifest, self._host_functions, self._ticker
        )
        tool = Tool(manifest, info, runner, self._executor)
        with self._lock:
            if manifest.name in self._tools and not replace:
                raise ManifestError(f"{origin}: a tool with this name is already loaded")
            self._tools[manifest.name] = tool
        return tool

    @property
    def tools(self) -> Mapping[str, Tool]:
        return dict(self._tools)

    def tool(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"no tool named {name!r} is loaded") from None

    def call(self, name: str, args: Mapping[str, Any] | None = None, **kwargs: Any) -> CallResult:
        """`Tool.call` of the loaded tool `name`."""
        return self.tool(name).call(args, **kwargs)

    async def acall(
        self, name: str, args: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> CallResult:
        """`Tool.acall` of the loaded tool `name`: runs off the event loop."""
        return await self.tool(name).acall(args, **kwargs)

    @property
    def cache_stats(self) -> CacheStats:
        return self._cache.stats

    def close(self) -> None:
        """Stop the epoch ticker and the worker threads. Loaded tools stop working."""
        self._ticker.close()
        self._executor.shutdown(wait=True)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
