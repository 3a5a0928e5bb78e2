"""How a call ends: the one table that decides a call's error from everything that happened.

ARCHITECTURE.md ("The outcome table") has the same rows. The evidence comes from:
- the host: it stopped the guest (`CallState.abort`: a host-call cap, a deadline passed in a
  host function, a reply over the output cap, a failure of ours), or a host function failed
  and the guest then reported an error (`CallState.failure`);
- Wasmtime: a trap or error while the guest ran, mapped to a kind by `from_trap`;
- the guest: its error reply (a kind it claims is taken only from `GUEST_CLAIMS`);
- caps measured once the guest has stopped: the scratch folder's size, the memory's size,
  stdout and stderr cut at the output cap.

`decide` reads the rules top to bottom; the first that applies gives the call's error.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import wasmtime

from ._errors import ErrorKind
from ._manifest import Limits
from ._results import CallError
from ._units import format_size
from ._wasmtime.component_io import REPLY_MAX

PAGE = 65536

# A guest that turns a failed allocation into its own error says so in words like these.
_OOM_WORDING = re.compile(r"^\s*(out of memory|memoryerror\b|cannot allocate memory)", re.IGNORECASE)
# Wasmtime's words for a store limit refusing memory (linear, table, or the GC heap).
_OVER_MEMORY_CAP = ("exceeds memory limits", "exceeds table limits", "GC heap out of memory")
# Wasmtime's words when a component hands the host more than its per-call copy budget.
_HOSTCALL_FUEL = "fuel allocated for hostcalls has been exhausted"
# Wasmtime's words when the pooling allocator has no free instance slot.
_POOL_FULL = "maximum concurrent limit"

# The kinds a guest runtime's driver may claim for its own error reply; any other claim is a
# guest error.
GUEST_CLAIMS = {
    "guest_error": ErrorKind.GUEST_ERROR,
    "invalid_arguments": ErrorKind.INVALID_ARGUMENTS,
    "memory_limit": ErrorKind.MEMORY_LIMIT,
    "bad_response": ErrorKind.BAD_RESPONSE,
}

# Errors of compiling a tool's source at load that are the source's own doing (a SyntaxError,
# or a source too big to compile within the compile limits): the load is refused with a
# ManifestError. Any other error is the Sandbox's, and the load may be retried.
SOURCE_FAULTS = frozenset(
    {ErrorKind.GUEST_ERROR, ErrorKind.OUT_OF_FUEL, ErrorKind.MEMORY_LIMIT, ErrorKind.OUTPUT_LIMIT}
)


@dataclass(frozen=True)
class Evidence:
    """Everything a finished call left that bears on its error."""

    limits: Limits
    error: CallError | None  # what the guest's run ended with (trap, guest reply, result cap)
    abort: CallError | None = None  # the host stopped the guest
    failure: ErrorKind | None = None  # a host function's failure, before the guest's error
    peak_memory: int | None = None  # the guest memory's size when it stopped, if known
    truncated: str | None = None  # "stdout" or "stderr" when it was cut at the output cap
    scratch_over: str | None = None  # why the scratch folder ended over its cap


def _guest_failed(e: Evidence) -> bool:
    return e.error is not None and e.error.kind is ErrorKind.GUEST_ERROR


def _failed_or_trapped(e: Evidence) -> bool:
    return e.error is not None and e.error.kind in (ErrorKind.GUEST_ERROR, ErrorKind.TRAP)


def _guest_error(e: Evidence) -> CallError:
    assert e.error is not None
    return e.error


def _with_kind(kind: ErrorKind, suffix: str = "") -> Callable[[Evidence], CallError]:
    return lambda e: CallError(kind=kind, message=_guest_error(e).message + suffix)


# Failures a guest may show because its output was cut: the cut is then the cause.
_MAY_FOLLOW_TRUNCATION = (ErrorKind.GUEST_ERROR, ErrorKind.BAD_RESPONSE, ErrorKind.TRAP)

Rule = tuple[str, Callable[[Evidence], bool], Callable[[Evidence], CallError | None]]

# (what it says, when it applies, the call's error); first match wins.
RULES: tuple[Rule, ...] = (
    (
        "the host stopped the guest: its verdict stands, whatever the guest did after",
        lambda e: e.abort is not None,
        lambda e: e.abort,
    ),
    (
        "the scratch folder ended over its cap, and the guest succeeded or reported an error",
        lambda e: e.scratch_over is not None and (e.error is None or _guest_failed(e)),
        lambda e: CallError(kind=ErrorKind.OUTPUT_LIMIT, message=str(e.scratch_over)),
    ),
    (
        "a host function failed, then the guest reported an error: the host's failure is the cause",
        lambda e: e.failure is not None and _guest_failed(e),
        lambda e: CallError(kind=e.failure or ErrorKind.HOST_ERROR, message=_guest_error(e).message),
    ),
    (
        "the guest reported running out of memory in its own words",
        lambda e: _guest_failed(e) and bool(_OOM_WORDING.search(_guest_error(e).message)),
        _with_kind(ErrorKind.MEMORY_LIMIT),
    ),
    (
        "the guest trapped or failed with its memory at the cap",
        lambda e: _failed_or_trapped(e)
        and e.peak_memory is not None
        and near_cap(e.peak_memory, e.limits.memory),
        _with_kind(ErrorKind.MEMORY_LIMIT, " (memory cap reached)"),
    ),
    (
        "stdout or stderr was cut, and the guest succeeded or failed in a way the cut explains",
        lambda e: e.truncated is not None and (e.error is None or e.error.kind in _MAY_FOLLOW_TRUNCATION),
        lambda e: CallError(
            kind=ErrorKind.OUTPUT_LIMIT,
            message=f"{e.truncated} exceeded the {format_size(e.limits.output)} output cap",
        ),
    ),
    (
        "otherwise: what the guest's run ended with (None: the call succeeded)",
        lambda e: True,
        lambda e: e.error,
    ),
)


def decide(evidence: Evidence) -> CallError | None:
    """The call's error (None: it succeeded), by the first rule of `RULES` that applies."""
    for _, applies, error in RULES:
        if applies(evidence):
            return error(evidence)
    raise AssertionError("the last rule always applies")


def from_trap(exc: wasmtime.WasmtimeError | wasmtime.Trap, limits: Limits) -> CallError:
    """The error of a trap or Wasmtime error (core traps carry a code, component errors only
    text): fuel, deadline, the component copy budget, a store limit, a full instance pool,
    or else a plain trap."""
    text = exc.message if isinstance(exc, wasmtime.Trap) else str(exc)
    code = exc.trap_code if isinstance(exc, wasmtime.Trap) else None
    if code is wasmtime.TrapCode.OUT_OF_FUEL or "all fuel consumed" in text:
        return CallError(kind=ErrorKind.OUT_OF_FUEL, message=f"used all {limits.fuel:,} units of fuel")
    if code is wasmtime.TrapCode.INTERRUPT or "wasm trap: interrupt" in text:
        return CallError(kind=ErrorKind.TIMEOUT, message=deadline_message(limits))
    message = cause(text)
    if _HOSTCALL_FUEL in message:  # a list<u8> from a component over what Wasmtime copies
        return CallError(
            kind=ErrorKind.OUTPUT_LIMIT,
            message=f"the guest handed the host more than the {REPLY_MAX} bytes Wasmtime copies "
            "from a component at once",
        )
    if any(words in message for words in _OVER_MEMORY_CAP):
        return CallError(kind=ErrorKind.MEMORY_LIMIT, message=message)
    if _POOL_FULL in message:
        return CallError(
            kind=ErrorKind.HOST_ERROR,
            message=f"the Sandbox is at capacity ({message}; see EngineSettings.pool_slots)",
        )
    return CallError(kind=ErrorKind.TRAP, message=message)


def deadline_message(limits: Limits) -> str:
    return f"exceeded the {limits.timeout:g}s deadline"


def cause(text: str) -> str:
    """The line of a Wasmtime error that says what went wrong (not the backtrace)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Caused by:" in lines:
        rest = lines[lines.index("Caused by:") + 1 :]
        if rest:
            return re.sub(r"^\d+:\s*", "", rest[0])[:500]
    return (lines[0] if lines else "unknown error")[:500]


def near_cap(memory_size: int, cap: int) -> bool:
    """A memory of `memory_size` bytes cannot grow by another page under `cap`."""
    return memory_size + PAGE > cap
