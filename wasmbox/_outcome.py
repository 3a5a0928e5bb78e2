"""How a call ends: the one table that decides a call's error from everything that happened.

ARCHITECTURE.md ("The outcome table") has the same rows. The evidence comes from:
- the host: it stopped the guest (`CallState.abort`: a host-call cap, a deadline passed in a
  host function, a reply over the output cap, a failure of ours), or a host function failed
  and the guest then reported an error (`CallState.failure`);
- Wasmtime: a trap or error while the guest ran, mapped to a kind by `from_trap`;
- the guest: its error reply (a kind it claims is taken only from `GUEST_CLAIMS`);
- caps measured once the guest has stopped: the scratch folder's size, the memory's size,
  stdout and stderr cut at the output cap, and the guard below a runtime's C stack.

`decide` reads the rules top to bottom; the first that applies gives the call's error, and then
`CUT`: stdout or stderr cut at the cap explains a success or an error the cut can cause, whoever
reported it (the guest, the host's stop, a host function's failure).
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

# A guest that turns a failed allocation into its own error says so in words like these (a
# command's or reactor's exit message quotes its stderr: "exited with code 1: InternalError: out
# of memory").
_OOM_WORDING = re.compile(
    r"^\s*(exited with code -?\d+: )?(\w*error: )?(out of memory|memoryerror\b|cannot allocate memory)",
    re.IGNORECASE,
)
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


class Failure(Exception):
    """Raised inside a runner to end the call with `kind` (what the guest's run ended with)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.error = CallError(kind=kind, message=message)


# What a guest's run may raise to end the call; `ended_with` says with which error.
RUN_ENDS = (Failure, wasmtime.Trap, wasmtime.WasmtimeError)


def ended_with(
    exc: Failure | wasmtime.Trap | wasmtime.WasmtimeError, limits: Limits, *, exit_is_an_end: bool
) -> CallError:
    """The error a guest's run ended with, from what it raised: a runner's own `Failure`, a
    WASI exit (with `exit_is_an_end`, as for a command or a C entry: `guest_error`; else, as in
    a runtime whose driver never exits, a trap), or a trap or Wasmtime error (`from_trap`)."""
    if isinstance(exc, Failure):
        return exc.error
    if exit_is_an_end and isinstance(exc, wasmtime.ExitTrap):
        return CallError(kind=ErrorKind.GUEST_ERROR, message=f"exited with code {exc.code}")
    return from_trap(exc, limits)


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
    overflowed: str | None = None  # the guest's stack ran past its guard (its reply is not to be trusted)


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
        "the guest's stack ran past its guard: whatever it returned or reported is not to be trusted",
        lambda e: e.overflowed is not None,
        lambda e: CallError(kind=ErrorKind.TRAP, message=str(e.overflowed)),
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
        lambda e: (
            _failed_or_trapped(e) and e.peak_memory is not None and near_cap(e.peak_memory, e.limits.memory)
        ),
        _with_kind(ErrorKind.MEMORY_LIMIT, " (memory cap reached)"),
    ),
    (
        "otherwise: what the guest's run ended with (None: the call succeeded)",
        lambda e: True,
        lambda e: e.error,
    ),
)


CUT = "stdout or stderr was cut at the cap, and the error so far is none or one the cut explains"


def decide(evidence: Evidence) -> CallError | None:
    """The call's error (None: it succeeded): the first rule of `RULES` that applies, then `CUT`."""
    error = next(error(evidence) for _, applies, error in RULES if applies(evidence))
    if evidence.truncated is not None and (error is None or error.kind in _MAY_FOLLOW_TRUNCATION):
        return CallError(
            kind=ErrorKind.OUTPUT_LIMIT,
            message=f"{evidence.truncated} exceeded the {format_size(evidence.limits.output)} output cap",
        )
    return error


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


def broken_output(problem: str) -> CallError:
    """The error of a call that succeeded with a value its tool's `output_schema` forbids: the
    tool broke its own contract (the model cannot fix it by changing args), a `bad_response`."""
    return CallError(
        kind=ErrorKind.BAD_RESPONSE, message=f"the value breaks the tool's output_schema: {problem}"
    )


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
