"""Runs Python tools and snippets in the CPython runtime component, one fresh instance a call.

The component is shared by every Python tool of a Sandbox; what differs per call is the
manifest (preopens, env, limits, granted host functions) and the request (a tool's source and
args, or a snippet). The one host import, `call-host`, checks the name against the current
call's manifest every time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import wasmtime
from wasmtime import component

from . import _abi, _call
from ._call import CallInput, Failure
from ._engine import EpochTicker
from ._errors import ErrorKind
from ._hostfuncs import HostFunction, HostReply, refusal
from ._inspect import ToolKind
from ._manifest import Manifest
from ._output import Output
from ._pyruntime import STDLIB_GUEST_PATH, PythonRuntime
from ._results import CallError, CallResult
from ._units import format_size

# Kinds the driver may report; anything else a guest claims is a guest error.
_DRIVER_KINDS = {
    "guest_error": ErrorKind.GUEST_ERROR,
    "invalid_arguments": ErrorKind.INVALID_ARGUMENTS,
    "memory_limit": ErrorKind.MEMORY_LIMIT,
    "bad_response": ErrorKind.BAD_RESPONSE,
}


class PythonRuntimeRunner:
    """The Sandbox's CPython runtime: a compiled component and its linker. Thread-safe."""

    def __init__(
        self,
        engine: wasmtime.Engine,
        compiled: component.Component,
        runtime: PythonRuntime,
        host_functions: Mapping[str, HostFunction],
        ticker: EpochTicker,
        *,
        stdlib_writable: bool = False,
    ) -> None:
        self._engine = engine
        self._component = compiled
        self._runtime = runtime
        self._host_functions = host_functions
        self._ticker = ticker
        self._linker = component.Linker(engine)
        self._linker.add_wasip2()
        with self._linker.root() as root:
            root.add_func("call-host", self._call_host)
        run = compiled.get_export_index("run")
        if run is None:
            raise RuntimeError("the Python runtime component exports no `run`")
        self._run = run
        self._stdlib = ((runtime.stdlib, STDLIB_GUEST_PATH, stdlib_writable),)

    @property
    def component_path(self) -> str:
        """Where the built component lives (its compiled form is in the artifact cache)."""
        return str(self._runtime.component)

    def call(self, manifest: Manifest, request: dict[str, Any]) -> CallResult:
        """Send one request to a fresh instance under `manifest`'s grants and limits."""
        started = time.perf_counter()
        limits = manifest.limits
        state = _call.CallState.start(manifest, started)
        stdout, stderr = Output(limits.output), Output(limits.output)
        store = _call.new_store(self._engine, limits, self._ticker)
        value: Any = None
        error: CallError | None = None
        try:
            payload = _abi.pack(request)
        except (TypeError, ValueError, OverflowError) as exc:
            return CallResult.failed(
                manifest.name, ErrorKind.INVALID_ARGUMENTS, f"args cannot be encoded: {exc}",
                time.perf_counter() - started,
            )  # fmt: skip
        try:
            store.set_wasi(_call.build_wasi(manifest, CallInput({}), stdout, stderr, self._stdlib))
            with _call.running(state):
                instance = self._linker.instantiate(store, self._component)
                run = instance.get_func(store, self._run)
                assert run is not None
                response = run(store, payload)
                run.post_return(store)
            value = self._decode(response, limits.output)
        except Failure as failure:
            error = failure.error
        except (wasmtime.Trap, wasmtime.WasmtimeError) as exc:
            error = _call.classify(exc, limits)
        finally:
            stdout.detach()
            stderr.detach()
        return _call.finish(
            state, store, started, value, error, stdout, stderr, lambda: False, close_later=True
        )

    @staticmethod
    def _decode(response: object, cap: int) -> Any:
        if not isinstance(response, (bytes, bytearray)):
            raise Failure(ErrorKind.BAD_RESPONSE, "the runtime returned no bytes")
        if len(response) > cap:
            raise Failure(
                ErrorKind.OUTPUT_LIMIT,
                f"result of {len(response)} bytes exceeds the {format_size(cap)} output cap",
            )
        try:
            message = _abi.unpack(response)
        except _abi.FramingError as exc:
            raise Failure(ErrorKind.BAD_RESPONSE, str(exc)) from None
        if isinstance(message, dict) and "ok" in message:
            return message["ok"]
        if isinstance(message, dict) and isinstance(message.get("error"), str):
            kind = _DRIVER_KINDS.get(message.get("kind", ""), ErrorKind.GUEST_ERROR)
            trace = message.get("traceback")
            raise Failure(kind, trace if isinstance(trace, str) and trace else message["error"])
        raise Failure(ErrorKind.BAD_RESPONSE, "the runtime's response is not an ok/error map")

    def _call_host(self, store: wasmtime.StoreContext, name: str, args: bytes) -> bytes:
        """The `call-host` import. Never raises (see `_call.abort`)."""
        state = _call.current()
        try:
            reply = self._serve(store, state, name, bytes(args))
        except Exception as exc:  # a bug of ours must not escape into wasmtime-py
            _call.abort(store._context(), ErrorKind.HOST_ERROR, f"{name}: internal error: {exc!r}")
            return _abi.error("internal error")
        except BaseException as exc:  # e.g. KeyboardInterrupt: re-raised on this call's thread
            state.reraise = exc
            _call.abort(store._context(), ErrorKind.HOST_ERROR, f"{name}: interrupted")
            return _abi.error("interrupted")
        state.records.append(reply.record)
        if reply.failure is not None and state.failure is None:
            state.failure = reply.failure
        return reply.payload

    def _serve(
        self, store: wasmtime.StoreContext, state: _call.CallState, name: str, args: bytes
    ) -> HostReply:
        if state.abort is not None:  # the guest is being stopped: serve nothing more
            return refusal(name, "limit", "the call is being stopped", len(args))
        if time.perf_counter() > state.deadline:
            _call.abort(store._context(), ErrorKind.TIMEOUT, f"{name} called after the deadline")
            return refusal(name, "limit", "the deadline has passed", len(args))
        function = self._host_functions.get(name)
        if name not in state.manifest.host_functions or function is None:
            return refusal(
                name, "denied", f"host function {name!r} is not granted to this tool",
                len(args), ErrorKind.CAPABILITY_DENIED,
            )  # fmt: skip
        if state.host_calls_left <= 0:
            message = f"host-call limit ({len(state.records)}) exceeded"
            _call.abort(store._context(), ErrorKind.HOST_ERROR, message)
            return refusal(name, "limit", message, len(args))
        state.host_calls_left -= 1
        reply = function.invoke(args)
        if time.perf_counter() > state.deadline:
            _call.abort(store._context(), ErrorKind.TIMEOUT, f"{name} ran past the deadline")
        return reply


class PythonToolRunner:
    """A Python tool: its manifest and source, run by the shared runtime."""

    kind = ToolKind.PYTHON

    def __init__(self, runtime: PythonRuntimeRunner, manifest: Manifest, source: str) -> None:
        self._runtime = runtime
        self._manifest = manifest
        assert manifest.source is not None
        self._request = {
            "mode": "tool", "source": source, "filename": manifest.source.name,
            "entry": manifest.entry,
        }  # fmt: skip

    def call(self, call: CallInput) -> CallResult:
        if call.argv or call.stdin:
            return CallResult.failed(
                self._manifest.name, ErrorKind.INVALID_ARGUMENTS,
                "argv and stdin are for WASI command tools",
            )  # fmt: skip
        return self._runtime.call(self._manifest, {**self._request, "args": dict(call.args)})
