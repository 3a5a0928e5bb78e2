"""A Sandbox's API over a Ray cluster (`pip install wasmbox[ray]`; docs/ray.md).

    pool = RaySandboxPool(["capabilities/word_count.toml"], actors=4)
    pool.call("word_count", {"text": "a b c"}).unwrap()

Each actor is an async Ray actor holding one Sandbox with every manifest loaded, serving as many
calls at once as its Sandbox has threads. The manifests' module and Python source files travel
through Ray's object store with their sha256, checked on the actor and written to its own
private folder; each node compiles them once into its own compile cache. Preopens name host
folders: every node needs the same folders, and an actor that finds one missing fails the
pool's start (`CapabilityError` naming the manifest and the grant).

Host functions run on the actors' nodes: they are registered on the pool as importable
references ("package.module:function", or a module-level function, which is turned into
one), and each actor imports them. A lambda, closure, local function or a `functools.partial`
is refused (ValueError): copied by value into each actor, its state would be split N ways.

Stateless calls go to the actor with the fewest calls in flight. An actor that dies is
replaced; its calls in flight return a `host_error` result saying so. The actors' audit
records come back with their results and reach the pool's `audit` sinks.

Import this module before `ray`, and end Ray with `shutdown()` in a process that goes on
running Sandboxes: Ray's crash reporter and `ray.shutdown` take the signals Wasmtime turns
guests' faults into (see `_wasmtime.signals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import itertools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Self, TypeVar, cast

# Ray's C++ crash reporter takes SIGSEGV, SIGILL, SIGFPE and SIGBUS from Wasmtime, whose trap
# handlers need them, and `ray.shutdown` leaves them at their defaults: a guest's next fault
# in this process would kill it. Read when Ray is imported (and by the workers it starts).
os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("wasmbox.integrations.ray needs Ray: pip install 'wasmbox[ray]'") from exc

from .. import _dispatch, _formats, _telemetry
from .._admission import Gate
from .._audit import AuditLog, Auditor, AuditRecord, AuditSink
from .._budget import Budget
from .._capabilities.hostfuncs import HostFunction
from .._dispatch import CallFormat
from .._errors import CapabilityError, ErrorKind, ManifestError, UnknownToolError, WasmboxError
from .._files import read_regular_file
from .._formats import SpecFormat, StrictMode
from .._inspect import ToolKind
from .._manifest import CallLimits, Limits, Manifest, ManifestSource
from .._results import CallResult
from .._sandbox import (
    _NO_GRANTS,
    _NO_GRANTS_DIGEST,
    _NO_GRANTS_JAVASCRIPT,
    _NO_GRANTS_JAVASCRIPT_DIGEST,
    Sandbox,
)
from .._wasmtime import signals

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger("wasmbox.ray")
_CONTROL = "control"  # the actors' concurrency group for start, registration and close
_CODE_FIELDS = ("module", "source")  # a manifest's files that travel with it
_Send = Callable[[Any, dict[str, str]], Any]  # (actor handle, trace carrier) -> the call's ObjectRef


# -- what travels to the actors -----------------------------------------------------------


@dataclass(frozen=True)
class _File:
    """One of a manifest's files in the object store: its name, sha256 and object."""

    field: str
    filename: str
    sha256: str
    data: Any  # ray.ObjectRef[bytes]


@dataclass(frozen=True)
class _Shipment:
    """A manifest as it travels: its JSON form without its files' paths, and the files."""

    name: str
    data: dict[str, Any]
    files: tuple[_File, ...]
    digest: str  # the driver's `Manifest.digest()`, which the audit trail names


@dataclass(frozen=True)
class _ToolInfo:
    """What the driver keeps of a tool an actor loaded."""

    name: str
    kind: ToolKind
    description: str
    parameters: dict[str, Any]
    output_schema: dict[str, Any] | None
    code_digest: str


@dataclass(frozen=True)
class _Started:
    node: str
    tools: tuple[_ToolInfo, ...]


@dataclass(frozen=True)
class _Outcome:
    """One call's answer from an actor: its result, or what it raised; and its audit records."""

    result: CallResult | None
    error: BaseException | None
    records: tuple[AuditRecord, ...]


def _travelling(manifest: Manifest) -> dict[str, Any]:
    """The manifest's JSON form with its files' paths taken out (each actor writes its own) and
    `requirements` gone (its pins are in `packages` already)."""
    data = manifest.model_dump(mode="json")
    for name in (*_CODE_FIELDS, "requirements"):
        data[name] = None
    return data


def _host_reference(name: str, func: Callable[..., Any] | str) -> str:
    """The "module:qualname" each actor imports for host function `name`. ValueError for a
    function no other process can import by name, or a reference that does not import here."""
    return _reference(f"host function {name!r}", func, partial(_import_reference, name))


def _setup_reference(func: Callable[[], object] | str) -> str:
    """The "module:qualname" of `actor_setup`, checked as a host function's is."""
    return _reference("actor_setup", func, partial(_imported, "actor_setup"))


def _reference(what: str, func: Callable[..., Any] | str, load: Callable[[str], Callable[..., Any]]) -> str:
    if isinstance(func, str):
        load(func)
        return func
    module, qualname = getattr(func, "__module__", None), getattr(func, "__qualname__", None)
    if (
        not isinstance(module, str)
        or not isinstance(qualname, str)
        or "<" in qualname
        or module == "__main__"
    ):
        raise ValueError(
            f"{what}: {func!r} cannot travel to the pool's actors: register a "
            "function defined at the top level of an importable module (or its 'module:qualname'), "
            "which each actor imports; a lambda, closure, local function, partial or a function "
            "of __main__ has no name another process can import, and copied by value its state "
            "would be split between the actors"
        )
    reference = f"{module}:{qualname}"
    if load(reference) is not func:
        raise ValueError(f"{what}: {reference} imports as another object than {func!r}")
    return reference


def _import_reference(name: str, reference: str) -> Callable[..., Any]:
    target = _imported(f"host function {name!r}", reference)
    HostFunction(name, target)  # the name and the signature, checked as a Sandbox checks them
    return target


def _imported(what: str, reference: str) -> Callable[..., Any]:
    """The callable `reference` ("module:qualname") names; ValueError, or TypeError when it
    is not callable."""
    module, colon, qualname = reference.partition(":")
    if not colon or not module or not qualname:
        raise ValueError(f"{what}: {reference!r} is not a 'module:qualname' reference")
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except Exception as exc:  # noqa: BLE001 - whatever importing it raised, say which reference
        raise ValueError(f"{what}: cannot import {reference}: {type(exc).__name__}: {exc}") from None
    if not callable(target):
        raise TypeError(f"{what}: {reference} is not callable")
    return cast("Callable[..., Any]", target)


def _carrier() -> dict[str, str]:
    """The caller's trace context for the actor (W3C `traceparent`, ...), when telemetry is on."""
    if _telemetry.active is None:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def _joined(carrier: dict[str, str]) -> Iterator[None]:
    """The driver's trace context current on this thread while a call runs on the actor (its
    spans then join the driver's trace), when telemetry is on here too."""
    if not carrier or _telemetry.active is None:
        yield
        return
    from opentelemetry import context, propagate

    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


# -- the actor ----------------------------------------------------------------------------


class _SandboxActor:
    """One Sandbox on one node (made async by Ray: it serves many calls at once)."""

    def __init__(self) -> None:
        self._box: Sandbox | None = None
        self._folder = tempfile.mkdtemp(prefix="wasmbox-ray-")  # the manifests' files
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._folder, True)
        self._local = threading.local()  # the audit records of the call on this thread
        self._stray: list[AuditRecord] = []  # records made outside a call: sent with the next one
        self._stray_lock = threading.Lock()
        self._digests: dict[str, str] = {}  # this node's manifest digests -> the driver's
        self._grant_sets: dict[str, Manifest] = {}  # run_python grant sets by the driver's digest
        self._node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # (Ray's own, untyped)

    @ray.method(concurrency_group=_CONTROL)
    async def start(
        self,
        sandbox_kwargs: dict[str, Any],
        audit: bool,
        shipments: list[_Shipment],
        host_functions: dict[str, str],
        setup: str | None = None,
    ) -> _Started | BaseException:
        """Run `setup` (the pool's `actor_setup`), make the Sandbox, register the host
        functions and load every manifest; what it raised is returned (the driver raises it)."""
        try:
            blobs = await asyncio.gather(*(file.data for shipment in shipments for file in shipment.files))
            if setup is not None:
                await asyncio.to_thread(_imported("actor_setup", setup))
            return await asyncio.to_thread(
                self._start, sandbox_kwargs, audit, shipments, host_functions, blobs
            )
        except Exception as exc:  # noqa: BLE001 - handed back whole to the driver
            return _portable(exc)

    def _start(
        self,
        sandbox_kwargs: dict[str, Any],
        audit: bool,
        shipments: list[_Shipment],
        host_functions: dict[str, str],
        blobs: list[bytes],
    ) -> _Started:
        box = self._box = Sandbox(**sandbox_kwargs, audit=self._collect if audit else None)
        for name, reference in host_functions.items():
            self._register(name, reference)
        blob = iter(blobs)
        tools = []
        for shipment in shipments:
            data = dict(shipment.data)
            for file in shipment.files:
                data[file.field] = str(self._write(shipment.name, file, next(blob)))
            tool = box.load(self._manifest(shipment.name, data))
            self._digests[tool.manifest_digest] = shipment.digest
            tools.append(
                _ToolInfo(
                    tool.name,
                    tool.kind,
                    tool.description,
                    tool.parameters,
                    tool.output_schema,
                    tool.code_digest,
                )
            )
        return _Started(self._node, tuple(tools))

    def _write(self, manifest: str, file: _File, data: bytes) -> Path:
        if hashlib.sha256(data).hexdigest() != file.sha256:
            raise ManifestError(
                f"{manifest}: {file.field}: {file.filename} arrived with another sha256 than it was sent with"
            )
        folder = Path(self._folder) / file.sha256
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / file.filename
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        return path

    def _manifest(self, name: str, data: dict[str, Any]) -> Manifest:
        """The manifest validated on this node; CapabilityError for a preopen folder this node
        does not have."""
        for preopen in data.get("preopens", ()):
            if not os.path.isdir(preopen["host"]):
                raise CapabilityError(
                    f"{name}: preopen {preopen['host']} (guest {preopen['guest']}) is not a directory "
                    f"on node {self._node}: every node running the pool's actors needs the folders "
                    "its manifests grant"
                )
        return Manifest.load(data)

    def _register(self, name: str, reference: str) -> None:
        assert self._box is not None
        try:
            func = _import_reference(name, reference)
        except ValueError as exc:
            raise WasmboxError(f"on node {self._node}: {exc}") from None
        self._box.register_host_function(name, func)

    @ray.method(concurrency_group=_CONTROL)
    async def register(self, name: str, reference: str) -> BaseException | None:
        try:
            self._register(name, reference)
        except Exception as exc:  # noqa: BLE001 - handed back to the driver
            return _portable(exc)
        return None

    async def call(
        self, name: str, args: Any, argv: Any, stdin: Any, carrier: dict[str, str], limits: Any = None
    ) -> _Outcome:
        assert self._box is not None
        call = partial(self._box.call, name, args, argv=argv, stdin=stdin, limits=limits)
        return await self._run(call, carrier)

    async def run_python(
        self,
        code: Any,
        grants: tuple[str, dict[str, Any]] | None,
        carrier: dict[str, str],
        limits: Any = None,
    ) -> _Outcome:
        assert self._box is not None
        return await self._snippet(partial(self._box.run_python, limits=limits), code, grants, carrier)

    async def run_javascript(
        self,
        code: Any,
        grants: tuple[str, dict[str, Any]] | None,
        carrier: dict[str, str],
        limits: Any = None,
    ) -> _Outcome:
        assert self._box is not None
        return await self._snippet(partial(self._box.run_javascript, limits=limits), code, grants, carrier)

    async def _snippet(
        self,
        run: Callable[[Any, ManifestSource | None], CallResult],
        code: Any,
        grants: tuple[str, dict[str, Any]] | None,
        carrier: dict[str, str],
    ) -> _Outcome:
        if grants is None:
            return await self._run(partial(run, code, None), carrier)
        digest, data = grants
        manifest = self._grant_sets.get(digest)
        if manifest is None:
            try:
                manifest = self._manifest(data.get("name", "?"), data)
            except WasmboxError as exc:
                return _Outcome(None, _portable(exc), ())
            self._grant_sets[digest] = manifest
            self._digests[manifest.digest()] = digest
        return await self._run(partial(run, code, manifest), carrier)

    async def _run(self, run: Callable[[], CallResult], carrier: dict[str, str]) -> _Outcome:
        assert self._box is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._box._executor, self._traced, run, carrier)

    def _traced(self, run: Callable[[], CallResult], carrier: dict[str, str]) -> _Outcome:
        """`run()` in the driver's trace, with the audit records it made."""
        records: list[AuditRecord] = []
        self._local.records = records
        try:
            with _joined(carrier):
                result, error = run(), None
        except Exception as exc:  # noqa: BLE001 - what the Sandbox raised, raised on the driver
            result, error = None, _portable(exc)
        finally:
            self._local.records = None
        if self._stray:
            with self._stray_lock:
                records[:0], self._stray = self._stray, []
        return _Outcome(result, error, tuple(records))

    def _collect(self, record: AuditRecord) -> None:
        """The Sandbox's audit sink: the record goes back with its call's result, naming the
        grant set by the driver's digest."""
        digest = self._digests.get(record.manifest_digest, record.manifest_digest)
        records = getattr(self._local, "records", None)
        if records is not None:
            records.append(replace(record, manifest_digest=digest))
        else:
            with self._stray_lock:
                self._stray.append(replace(record, manifest_digest=digest))

    @ray.method(concurrency_group=_CONTROL)
    async def close(self) -> None:
        if self._box is not None:
            await asyncio.to_thread(self._box.close)
        self._cleanup()


def _sent_limits(limits: CallLimits | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A call's limits as they travel to an actor (a plain mapping, read there again)."""
    if limits is None:
        return None
    return CallLimits.of(limits).model_dump(exclude_none=True)


def _portable(exc: BaseException) -> BaseException:
    """`exc` if the driver can raise it as it is (wasmbox's errors, ValueError, TypeError,
    KeyError), else a WasmboxError naming it."""
    if isinstance(exc, (WasmboxError, ValueError, TypeError, KeyError)) and len(exc.args) <= 1:
        return exc
    return WasmboxError(f"{type(exc).__name__}: {exc}")


_REMOTE: Any = None  # the Ray actor class, made once


def _remote_actor() -> Any:
    global _REMOTE
    if _REMOTE is None:
        _REMOTE = ray.remote(concurrency_groups={_CONTROL: 2})(_SandboxActor)  # type: ignore[call-overload, unused-ignore]
    return _REMOTE


# -- the driver ---------------------------------------------------------------------------


@dataclass(eq=False)
class _Slot:
    """One actor place in the pool; its actor is replaced when it dies."""

    index: int
    handle: Any = None
    node: str = ""
    ready: bool = False
    replacing: bool = False
    generation: int = 0
    in_flight: int = 0
    last_pick: int = 0
    failure: str | None = None  # why its last replacement failed


@dataclass(frozen=True)
class _Lost:
    """What the driver records for a call whose actor died (its own record died with it)."""

    tool: str
    manifest_digest: str
    code_digest: str
    args: object
    limits: Limits


class RemoteTool:
    """A tool loaded on every actor of a `RaySandboxPool`: `Tool`'s surface, calls on the pool."""

    def __init__(self, pool: RaySandboxPool, manifest: Manifest, info: _ToolInfo) -> None:
        self._pool = pool
        self.manifest = manifest
        self.kind = info.kind
        self.description = info.description
        self.parameters = info.parameters
        self.output_schema = info.output_schema
        self.manifest_digest = manifest.digest()
        self.code_digest = info.code_digest

    @property
    def name(self) -> str:
        return self.manifest.name

    def spec(self, format: SpecFormat = "generic", *, strict: StrictMode = False) -> dict[str, Any]:
        """As `Tool.spec`."""
        return _formats.spec_of(self, format, strict)

    def call(
        self,
        args: Mapping[str, Any] | None = None,
        *,
        argv: list[str] | tuple[str, ...] = (),
        stdin: bytes | str = b"",
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> CallResult:
        """`Tool.call` on the actor with the fewest calls in flight; with `budget`, admitted
        and charged here on the driver (as `Tool.call`); `limits` as `Tool.call`'s (checked
        here: LimitsError)."""
        tightened = self.limits_for(limits)
        send, lost = self._send(args, argv, stdin, limits), self._lost(args, argv, stdin, tightened)
        return self._pool._call(send, lost, budget)

    async def acall(
        self,
        args: Mapping[str, Any] | None = None,
        *,
        argv: list[str] | tuple[str, ...] = (),
        stdin: bytes | str = b"",
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> CallResult:
        """`call` awaited: the event loop keeps running."""
        tightened = self.limits_for(limits)
        send, lost = self._send(args, argv, stdin, limits), self._lost(args, argv, stdin, tightened)
        return await self._pool._acall(send, lost, budget)

    def limits_for(self, limits: CallLimits | Mapping[str, Any] | None) -> Limits | None:
        """As `Tool.limits_for`: the limits a call with `limits` runs under (LimitsError)."""
        return None if limits is None else CallLimits.of(limits).applied_to(self.manifest.limits, self.name)

    def _send(self, args: Any, argv: Any, stdin: Any, limits: Any) -> _Send:
        name = self.name
        sent = _sent_limits(limits)
        return lambda actor, carrier: actor.call.remote(name, args, argv, stdin, carrier, sent)

    def _lost(self, args: Any, argv: Any, stdin: Any, limits: Limits | None) -> _Lost:
        given = (args, argv, stdin) if self.kind is ToolKind.COMMAND else args
        return _Lost(self.name, self.manifest_digest, self.code_digest, given, limits or self.manifest.limits)

    def __repr__(self) -> str:
        return f"<RemoteTool {self.name!r} {self.kind.value}>"


class RaySandboxPool:
    """`Sandbox`'s calls over `actors` Ray actors, each holding a Sandbox with `manifests` loaded.

    `sandbox_kwargs` are the Sandbox's (`cache_dir` names a folder on each node; default: each
    node's `~/.cache/wasmbox`); `audit` stays on the driver and gets every actor's records.
    `max_workers` (default: this machine's CPU count) sizes each actor's threads and how many
    calls it serves at once. `actor_options` go to Ray's `.options()` (`num_cpus`, `resources`,
    `scheduling_strategy`, ...). `host_functions` maps names to importable functions or
    "module:qualname" references (see the module's docstring). `actor_setup` (a function or
    reference that travels the same way) runs on each actor before its Sandbox is made: e.g.
    `wasmbox.telemetry.instrument()` with that process's exporters, whose spans then join the
    driver's traces. Ray must be reachable: an initialized `ray.init()`, or Ray starts a local
    cluster.

    Raises ValueError for bad arguments or a host function that cannot travel, ManifestError
    for a malformed manifest, and what an actor's `Sandbox.load` raised (CapabilityError for a
    grant its node lacks, ...), or WasmboxError when the actors do not start within
    `start_timeout_s`; on any of them the actors started are killed.
    """

    def __init__(
        self,
        manifests: Iterable[ManifestSource],
        *,
        actors: int = 2,
        actor_options: Mapping[str, Any] | None = None,
        host_functions: Mapping[str, Callable[..., Any] | str] | None = None,
        start_timeout_s: float = 600.0,
        actor_setup: Callable[[], object] | str | None = None,
        **sandbox_kwargs: Any,
    ) -> None:
        if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
            raise ValueError(f"actors must be a positive integer, got {actors!r}")
        audit: AuditSink | AuditLog | Iterable[AuditSink | AuditLog] | None = sandbox_kwargs.pop(
            "audit", None
        )
        self._auditor = Auditor(audit)
        self._threads = int(sandbox_kwargs.get("max_workers") or os.cpu_count() or 2)
        self._sandbox_kwargs = {**sandbox_kwargs, "max_workers": self._threads}
        self._actor_options = {"max_concurrency": self._threads, **(actor_options or {})}
        self._start_timeout_s = start_timeout_s
        self._host_functions = {
            name: _host_reference(name, func) for name, func in (host_functions or {}).items()
        }
        self._setup = _setup_reference(actor_setup) if actor_setup is not None else None
        self._manifests: dict[str, Manifest] = {}
        for source in manifests:
            manifest = Manifest.load(source)
            if manifest.name in self._manifests:
                raise ManifestError(f"{manifest.name}: a tool with this name is already loaded")
            self._manifests[manifest.name] = manifest
        if not ray.is_initialized():
            ray.init()  # (what Ray's first call would do)
        restored = signals.restore()  # ray.init replaces them: the next in-process trap would kill us
        if restored:
            _log.info(
                "wasmbox pool: Wasmtime's handlers of %s put back after Ray replaced them",
                ", ".join(restored),
            )
        self._shipments = self._ship(self._manifests.values())
        self._cond = threading.Condition()
        self._ticks = itertools.count(1)
        self._closed = False
        self._slots = [_Slot(index) for index in range(actors)]
        self._tools: dict[str, RemoteTool] = {}
        self._gate = Gate(None)  # dispatch's admission: the actors' Sandboxes admit their calls
        # dispatch's worker threads: each waits on one call in the pool
        self._executor = ThreadPoolExecutor(
            max_workers=actors * self._threads, thread_name_prefix="wasmbox-ray"
        )
        started = time.perf_counter()
        handles = [self._new_actor() for _ in self._slots]
        try:
            outcomes = self._wait_started(
                [self._start(handle, dict(self._host_functions)) for handle in handles]
            )
        except BaseException:
            for handle in handles:
                _kill(handle)
            self._executor.shutdown(wait=False)
            raise
        for slot, handle, outcome in zip(self._slots, handles, outcomes, strict=True):
            slot.handle, slot.node, slot.ready = handle, outcome.node, True
        infos = {info.name: info for info in outcomes[0].tools}
        self._tools = {
            name: RemoteTool(self, manifest, infos[name]) for name, manifest in self._manifests.items()
        }
        self.start_s = time.perf_counter() - started  # how long the actors took to start

    # -- starting actors -------------------------------------------------------------------

    @staticmethod
    def _ship(manifests: Iterable[Manifest]) -> list[_Shipment]:
        """Each manifest's files put in the object store once (by sha256)."""
        stored: dict[str, Any] = {}
        shipments = []
        for manifest in manifests:
            files = []
            for name in _CODE_FIELDS:
                path: Path | None = getattr(manifest, name)
                if path is None:
                    continue
                try:
                    data = read_regular_file(path)
                except OSError as exc:
                    raise ManifestError(
                        f"{manifest.name}: {name}: cannot read {path}: {exc.strerror or exc}"
                    ) from None
                digest = hashlib.sha256(data).hexdigest()
                if digest not in stored:
                    stored[digest] = ray.put(data)
                files.append(_File(name, path.name, digest, stored[digest]))
            shipments.append(_Shipment(manifest.name, _travelling(manifest), tuple(files), manifest.digest()))
        return shipments

    def _new_actor(self) -> Any:
        return _remote_actor().options(**self._actor_options).remote()

    def _start(self, handle: Any, host_functions: dict[str, str]) -> Any:
        return handle.start.remote(
            self._sandbox_kwargs, self._auditor.enabled, self._shipments, host_functions, self._setup
        )

    def _wait_started(self, refs: list[Any]) -> list[_Started]:
        """The actors' start outcomes; raises the first failure (or WasmboxError on timeout)."""
        try:
            outcomes = ray.get(refs, timeout=self._start_timeout_s)
        except GetTimeoutError:
            raise WasmboxError(
                f"the pool's actors did not start within {self._start_timeout_s} s (has the cluster "
                "the resources actor_options asks for? a first start on a node builds the Python runtime)"
            ) from None
        except RayError as exc:
            raise WasmboxError(f"a pool actor failed to start: {exc}") from None
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return list(outcomes)

    def _replace(self, slot: _Slot) -> None:
        """Start a new actor in `slot` (on its own thread); a failure is logged and kept."""
        handle = self._new_actor()
        try:
            with self._cond:
                registered = dict(self._host_functions)
            started = self._wait_started([self._start(handle, registered)])[0]
            with self._cond:
                later = [(n, r) for n, r in self._host_functions.items() if n not in registered]
            for name, reference in later:  # registered on the pool meanwhile
                error = ray.get(handle.register.remote(name, reference), timeout=self._start_timeout_s)
                if error is not None:
                    raise error
        except Exception as exc:  # noqa: BLE001 - the pool goes on with its other actors
            _kill(handle)
            _log.error("wasmbox pool: the replacement of actor %d failed: %s", slot.index, exc)
            with self._cond:
                slot.replacing, slot.failure = False, f"{type(exc).__name__}: {exc}"
                self._cond.notify_all()
            return
        with self._cond:
            slot.replacing = False
            if self._closed:
                _kill(handle)
            else:
                slot.handle, slot.node, slot.ready, slot.failure = handle, started.node, True, None
            self._cond.notify_all()

    # -- routing ---------------------------------------------------------------------------

    def _acquire(self, wait: bool) -> tuple[_Slot, int, Any] | None:
        """The ready actor with the fewest calls in flight (the least recently picked of those),
        counted in; with `wait`, waits for a replacement when none is ready. None: no actor."""
        deadline = time.monotonic() + self._start_timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise WasmboxError("the pool is closed")
                ready = [slot for slot in self._slots if slot.ready]
                if ready:
                    slot = min(ready, key=lambda s: (s.in_flight, s.last_pick))
                    slot.in_flight += 1
                    slot.last_pick = next(self._ticks)
                    return slot, slot.generation, slot.handle
                left = deadline - time.monotonic()
                if not wait or not any(slot.replacing for slot in self._slots) or left <= 0:
                    return None
                self._cond.wait(left)

    def _release(self, slot: _Slot) -> None:
        with self._cond:
            slot.in_flight -= 1
            self._cond.notify_all()

    def _died(self, slot: _Slot, generation: int, exc: BaseException) -> None:
        """The actor of `slot` died: kill what is left of it, start its replacement (once)."""
        with self._cond:
            if slot.generation != generation or self._closed:
                return
            old, slot.handle = slot.handle, None
            slot.ready, slot.replacing, slot.generation = False, True, generation + 1
        _log.warning(
            "wasmbox pool: actor %d on %s died (%s); starting a replacement",
            slot.index,
            slot.node,
            _first_line(exc),
        )
        _kill(old)
        threading.Thread(target=self._replace, args=(slot,), name="wasmbox-ray-replace", daemon=True).start()

    def _call(self, send: _Send, lost: _Lost, budget: Budget | None = None) -> CallResult:
        """The call on an actor; with `budget`, only if it admits it (else `over_budget`,
        recorded here), charged what the actor's result says it used."""
        if budget is None:
            return self._sent(send, lost)
        refused = budget.admit()
        if refused is not None:
            return self._failed(lost, f"not run: {refused}", ErrorKind.OVER_BUDGET)
        result = None
        try:
            result = self._sent(send, lost)
        finally:
            budget.charge(result)
        return result

    async def _acall(self, send: _Send, lost: _Lost, budget: Budget | None = None) -> CallResult:
        """`_call` awaited."""
        if budget is None:
            return await self._asent(send, lost)
        refused = budget.admit()
        if refused is not None:
            return self._failed(lost, f"not run: {refused}", ErrorKind.OVER_BUDGET)
        result = None
        try:
            result = await self._asent(send, lost)
        finally:
            budget.charge(result)
        return result

    def _sent(self, send: _Send, lost: _Lost) -> CallResult:
        picked = self._acquire(wait=True)
        if picked is None:
            return self._failed(lost, self._no_actor())
        sent = self._send(send, picked, lost)
        if isinstance(sent, CallResult):
            return sent
        slot, generation, ref = sent
        try:
            outcome = ray.get(ref, timeout=self._answer_s(lost))
        except RayActorError as exc:
            self._died(slot, generation, exc)
            return self._failed(lost, _died_message(slot, exc))
        except GetTimeoutError:
            return self._failed(lost, self._unanswered(slot, ref, lost))
        except RayError as exc:
            return self._failed(lost, f"the Ray task running this call failed: {_first_line(exc)}")
        finally:
            self._release(slot)
        return self._finish(outcome)

    async def _asent(self, send: _Send, lost: _Lost) -> CallResult:
        picked = self._acquire(wait=False)
        if picked is None:  # every actor is being replaced: wait off the event loop
            picked = await asyncio.to_thread(self._acquire, True)
        if picked is None:
            return self._failed(lost, self._no_actor())
        sent = self._send(send, picked, lost)
        if isinstance(sent, CallResult):
            return sent
        slot, generation, ref = sent
        try:
            outcome = await asyncio.wait_for(ref, self._answer_s(lost))
        except RayActorError as exc:
            self._died(slot, generation, exc)
            return self._failed(lost, _died_message(slot, exc))
        except TimeoutError:
            return self._failed(lost, self._unanswered(slot, ref, lost))
        except RayError as exc:
            return self._failed(lost, f"the Ray task running this call failed: {_first_line(exc)}")
        finally:
            self._release(slot)
        return self._finish(outcome)

    def _send(
        self, send: _Send, picked: tuple[_Slot, int, Any], lost: _Lost
    ) -> tuple[_Slot, int, Any] | CallResult:
        """The call sent to the picked actor with the caller's trace context: its slot,
        generation and object ref. When Ray
        cannot send it (its input does not serialize), the slot is given back and the answer
        is the call's failed result, recorded: `invalid_arguments`, as in-process for input
        MessagePack cannot take, or `host_error` for a failure of Ray's own."""
        slot, generation, handle = picked
        try:
            return slot, generation, send(handle, _carrier())
        except RayError as exc:
            self._release(slot)
            return self._failed(lost, f"Ray could not send this call: {_first_line(exc)}")
        except Exception as exc:  # noqa: BLE001 - what pickling the input raised (TypeError, PicklingError, ...)
            self._release(slot)
            message = f"the call's input cannot be sent to a Ray actor: {_first_line(exc)}"
            return self._failed(lost, message, ErrorKind.INVALID_ARGUMENTS)

    def _answer_s(self, lost: _Lost) -> float:
        """How long a call's answer is waited for: its own deadline, and the start timeout for
        what a first call on an actor may do first (load the Python runtime, install packages)."""
        return lost.limits.timeout + self._start_timeout_s

    def _unanswered(self, slot: _Slot, ref: Any, lost: _Lost) -> str:
        with contextlib.suppress(RayError):
            ray.cancel(ref)
        return (
            f"no answer from the Ray actor running this call (pool actor {slot.index}, node "
            f"{slot.node}) within {self._answer_s(lost):.0f} s, its limits.timeout and the pool's "
            "start_timeout_s; the call may still run there"
        )

    def _finish(self, outcome: _Outcome) -> CallResult:
        for record in outcome.records:
            self._auditor.deliver(record)
        if outcome.error is not None:
            raise outcome.error
        assert outcome.result is not None
        return outcome.result

    def _failed(self, lost: _Lost, message: str, kind: ErrorKind = ErrorKind.HOST_ERROR) -> CallResult:
        result = CallResult.failed(lost.tool, kind, message)
        if self._auditor.enabled:
            self._auditor.record(result, lost.manifest_digest, lost.code_digest, lost.args, lost.limits)
        return result

    def _no_actor(self) -> str:
        with self._cond:
            failures = [f"actor {s.index}: {s.failure}" for s in self._slots if s.failure]
        return "not run: the pool has no live Ray actor" + (
            f" (replacements failed: {'; '.join(failures)})" if failures else ""
        )

    # -- the Sandbox's surface -------------------------------------------------------------

    @property
    def tools(self) -> Mapping[str, RemoteTool]:
        return dict(self._tools)

    def tool(self, name: str) -> RemoteTool:
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(name, self._tools) from None

    def call(self, name: str, args: Mapping[str, Any] | None = None, **kwargs: Any) -> CallResult:
        """`Sandbox.call` on the actor with the fewest calls in flight."""
        return self.tool(name).call(args, **kwargs)

    async def acall(self, name: str, args: Mapping[str, Any] | None = None, **kwargs: Any) -> CallResult:
        """`call` awaited."""
        return await self.tool(name).acall(args, **kwargs)

    def run_python(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> CallResult:
        """`Sandbox.run_python` on an actor; `manifest`'s preopens must exist on its node. With
        `budget`, admitted and charged on the driver."""
        send, lost = self._python(code, manifest, limits=limits)
        return self._call(send, lost, budget)

    async def arun_python(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> CallResult:
        """`run_python` awaited."""
        send, lost = self._python(code, manifest, limits=limits)
        return await self._acall(send, lost, budget)

    def run_javascript(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> CallResult:
        """`Sandbox.run_javascript` on an actor; `manifest`'s preopens must exist on its node.
        With `budget`, admitted and charged on the driver."""
        send, lost = self._python(code, manifest, "javascript", limits=limits)
        return self._call(send, lost, budget)

    async def arun_javascript(
        self,
        code: str,
        manifest: ManifestSource | None = None,
        *,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> CallResult:
        """`run_javascript` awaited."""
        send, lost = self._python(code, manifest, "javascript", limits=limits)
        return await self._acall(send, lost, budget)

    def _python(
        self,
        code: Any,
        manifest: ManifestSource | None,
        runtime: Literal["python", "javascript"] = "python",
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> tuple[_Send, _Lost]:
        """How to send a run_python (or run_javascript) call, and its record should its actor
        die. Raises ManifestError for a grant set that is not one, LimitsError as `Tool.call`."""
        unset, unset_digest = (
            (_NO_GRANTS, _NO_GRANTS_DIGEST)
            if runtime == "python"
            else (_NO_GRANTS_JAVASCRIPT, _NO_GRANTS_JAVASCRIPT_DIGEST)
        )
        grants, sent = unset, None
        if manifest is not None:
            grants = Manifest.load(manifest)
            if grants.runtime != runtime or grants.source is not None:
                raise ManifestError(
                    f'{grants.name}: run_{runtime} takes a manifest with runtime = "{runtime}" and no source'
                )
        digest = grants.digest() if grants is not unset else unset_digest
        if grants is not unset:
            sent = (digest, _travelling(grants))
        code_digest = (
            hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest() if isinstance(code, str) else ""
        )
        tightened = (
            grants.limits if limits is None else CallLimits.of(limits).applied_to(grants.limits, grants.name)
        )
        lost = _Lost(grants.name, digest, code_digest, code, tightened)
        given = _sent_limits(limits)
        if runtime == "javascript":
            return (lambda actor, carrier: actor.run_javascript.remote(code, sent, carrier, given)), lost
        return (lambda actor, carrier: actor.run_python.remote(code, sent, carrier, given)), lost

    def specs(
        self,
        format: SpecFormat = "generic",
        *,
        strict: StrictMode = False,
        python: bool = False,
        javascript: bool = False,
    ) -> list[dict[str, Any]]:
        """As `Sandbox.specs`."""
        return _formats.tools_specs(self._tools, format, strict, python, javascript=javascript)

    def dispatch(
        self,
        calls: Any,
        *,
        format: CallFormat,
        python: bool | ManifestSource = False,
        max_calls: int | None = None,
        deadline_s: float | None = None,
        javascript: bool | ManifestSource = False,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """`Sandbox.dispatch`, each call on the pool (with `budget`, admitted and charged here;
        `limits` as `Sandbox.dispatch`'s)."""
        return _dispatch.dispatch(
            self,
            calls,
            format,
            _dispatch.Options(
                python=python,
                max_calls=max_calls,
                deadline_s=deadline_s,
                javascript=javascript,
                budget=budget,
                limits=limits,
            ),
        )

    async def adispatch(
        self,
        calls: Any,
        *,
        format: CallFormat,
        python: bool | ManifestSource = False,
        max_calls: int | None = None,
        deadline_s: float | None = None,
        javascript: bool | ManifestSource = False,
        budget: Budget | None = None,
        limits: CallLimits | Mapping[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """`Sandbox.adispatch`, each call on the pool (with `budget`, admitted and charged here;
        `limits` as `Sandbox.dispatch`'s)."""
        return await _dispatch.adispatch(
            self,
            calls,
            format,
            _dispatch.Options(
                python=python,
                max_calls=max_calls,
                deadline_s=deadline_s,
                javascript=javascript,
                budget=budget,
                limits=limits,
            ),
        )

    # -- host functions --------------------------------------------------------------------

    def host_function(self, name: str) -> Callable[[F], F]:
        """Decorator: `register_host_function(name, func)`."""

        def register(func: F) -> F:
            self.register_host_function(name, func)
            return func

        return register

    def register_host_function(self, name: str, func: Callable[..., Any] | str) -> None:
        """Register host function `name` on every actor (and on their replacements): `func` is
        a module-level function or its "module:qualname", which each actor imports. Manifests
        granting it must be loaded after: pass `host_functions=` to the pool for its own.
        ValueError for a function that cannot travel or a name already registered."""
        reference = _host_reference(name, func)
        with self._cond:
            if name in self._host_functions:
                raise ValueError(f"host function {name!r} is already registered")
            self._host_functions[name] = reference
            handles = [slot.handle for slot in self._slots if slot.ready]
        for error in ray.get([handle.register.remote(name, reference) for handle in handles]):
            if error is not None:
                raise error

    # -- the pool itself -------------------------------------------------------------------

    @property
    def actors(self) -> list[Any]:
        """The live actors' handles (e.g. for `ray.kill` in a test), in pool order."""
        with self._cond:
            return [slot.handle for slot in self._slots if slot.ready]

    @property
    def nodes(self) -> list[str]:
        """The node address of each live actor, in pool order."""
        with self._cond:
            return [slot.node for slot in self._slots if slot.ready]

    def in_flight(self) -> list[int]:
        """Calls in flight on each live actor, in pool order."""
        with self._cond:
            return [slot.in_flight for slot in self._slots if slot.ready]

    def close(self, timeout_s: float = 60.0) -> None:
        """Refuse new calls, wait (up to `timeout_s`) for the ones in flight, close each actor's
        Sandbox and end the actors; then flush the audit sinks."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.wait_for(lambda: not any(slot.in_flight for slot in self._slots), timeout_s)
            handles = [slot.handle for slot in self._slots if slot.handle is not None]
            for slot in self._slots:
                slot.ready, slot.handle = False, None
        with contextlib.suppress(RayError):
            ray.get([handle.close.remote() for handle in handles], timeout=timeout_s)
        for handle in handles:
            _kill(handle)
        self._executor.shutdown(wait=False)
        self._auditor.flush()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shutdown() -> None:
    """`ray.shutdown()`, then Wasmtime's trap signal handlers put back (Ray's shutdown resets
    them to the defaults, after which an in-process guest's fault kills the process): use it
    instead of `ray.shutdown` in a process that goes on running Sandboxes."""
    ray.shutdown()
    restored = signals.restore()
    if restored:
        _log.info("wasmbox: Wasmtime's handlers of %s put back after ray.shutdown", ", ".join(restored))


def _kill(handle: Any) -> None:
    if handle is not None:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _died_message(slot: _Slot, exc: BaseException) -> str:
    return (
        f"the Ray actor running this call (pool actor {slot.index}, node {slot.node}) died before it "
        f"answered ({_first_line(exc)}); the call may have run in part; the pool replaces the actor"
    )
