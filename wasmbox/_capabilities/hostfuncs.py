"""Host functions: the registry on a Sandbox, argument validation, and the guest-visible reply.

A host function runs with the host's authority, so its arguments are checked before it runs:
against what the calling tool's grant narrowed them to (`host_function_args`), then against its
Python signature (pydantic); and what it raises never reaches the guest as a
traceback: the guest gets a short message, the host keeps the detail in the call record.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic

from .. import _abi, _telemetry
from .._errors import CapabilityDeniedError, ErrorKind, ToolError
from .._manifest import HOST_FUNCTION_NAME
from .._results import HostCallRecord, HostCallVerdict
from .._schema import Validator

_NAME = re.compile(HOST_FUNCTION_NAME)

# How a host function's own ToolError (e.g. CapabilityDeniedError) is recorded.
_VERDICTS: dict[ErrorKind, HostCallVerdict] = {
    ErrorKind.CAPABILITY_DENIED: "denied",
    ErrorKind.INVALID_ARGUMENTS: "invalid_arguments",
}


@dataclass(frozen=True)
class HostReply:
    """What one host call produced: the guest's reply bytes and the host-side record."""

    payload: bytes
    record: HostCallRecord
    failure: ErrorKind | None  # the kind this host call would make a failed call


class HostFunction:
    """A Python callable a guest may call by name, once a manifest grants it."""

    def __init__(self, name: str, func: Callable[..., Any]) -> None:
        if not _NAME.match(name):
            raise ValueError(f"invalid host function name {name!r} (use e.g. 'kv.get')")
        self.name = name
        self._validated = pydantic.validate_call(func)

    def invoke(self, request: bytes, narrowed: Validator | None = None) -> HostReply:
        """Decode the guest's request, run the function, encode the reply. Never raises.

        `narrowed` is the check of the args the calling tool's grant allows: args it refuses
        (the first violation named) are `capability_denied` and the function does not run."""
        start = time.perf_counter()
        try:
            args = _abi.unpack(request)
        except _abi.FramingError as exc:
            return self._reply(start, request, "bad_request", "request is not MessagePack", exc)
        if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
            return self._reply(start, request, "bad_request", "request must be a map of str keys")
        if narrowed is not None:
            problem = narrowed.problem(args)
            if problem is not None:
                refused = CapabilityDeniedError(
                    f"host function {self.name!r} refused: {problem} (the manifest's "
                    f'[host_function_args."{self.name}"] narrows what may be passed)'
                )
                return self._reply(start, request, "denied", refused.message, refused, refused.kind)
        try:
            value = self._validated(**args)
        except pydantic.ValidationError as exc:
            message = f"invalid arguments for {self.name}: " + _summary(exc)
            return self._reply(start, request, "invalid_arguments", message, exc)
        except ToolError as exc:
            verdict = _VERDICTS.get(exc.kind, "error")
            return self._reply(start, request, verdict, exc.message, exc, exc.kind)
        except Exception as exc:  # noqa: BLE001 - a host function's failure must not take the host down
            return self._reply(start, request, "error", f"host function {self.name} failed", exc)
        try:
            payload = _abi.ok(value)
        except (TypeError, ValueError, OverflowError) as exc:
            message = f"host function {self.name} returned a value that cannot be sent"
            return self._reply(start, request, "error", message, exc)
        return self._reply(start, request, "ok", payload=payload)

    def _reply(
        self,
        start: float,
        request: bytes,
        verdict: HostCallVerdict,
        message: str = "",
        exc: BaseException | None = None,
        kind: ErrorKind | None = None,
        payload: bytes | None = None,
    ) -> HostReply:
        if payload is None:
            payload = _abi.error(message)
        if verdict == "error" and kind is None:
            kind = ErrorKind.HOST_ERROR
        detail = f"{type(exc).__name__}: {exc}" if exc is not None else None
        record = HostCallRecord(
            name=self.name,
            verdict=verdict,
            duration_s=time.perf_counter() - start,
            bytes_in=len(request),
            bytes_out=len(payload),
            detail=detail,
        )
        return HostReply(payload, record, kind if verdict != "ok" else None)


def not_granted(name: str) -> str:
    """What a guest (and the call's record) is told of a host function its manifest does not grant."""
    return f"host function {name!r} is not granted to this tool: add it to the manifest's host_functions"


def refusal(
    name: str,
    verdict: HostCallVerdict,
    message: str,
    request_size: int,
    kind: ErrorKind | None = ErrorKind.HOST_ERROR,
) -> HostReply:
    """A reply for a host call refused before the function ran (ungranted, past the cap, a
    malformed request); `kind` is what it makes a call that then fails (None: the guest's own)."""
    payload = _abi.error(message)
    record = HostCallRecord(
        name=name,
        verdict=verdict,
        duration_s=0.0,
        bytes_in=request_size,
        bytes_out=len(payload),
        detail=message,
    )
    if _telemetry.active is not None:  # (a host function that ran has a span of its own)
        _telemetry.active.refused(record)
    return HostReply(payload, record, kind)


def _summary(exc: pydantic.ValidationError) -> str:
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(p) for p in error["loc"])
        parts.append(f"{where}: {error['msg']}" if where else error["msg"])
    return "; ".join(parts)
