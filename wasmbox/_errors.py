"""Errors: the closed set of call-failure kinds, and the exceptions raised at load time."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class ErrorKind(str, Enum):
    """Why a call failed. A closed set: a tool router may switch on it."""

    OUT_OF_FUEL = "out_of_fuel"
    TIMEOUT = "timeout"
    MEMORY_LIMIT = "memory_limit"
    TRAP = "trap"
    GUEST_ERROR = "guest_error"
    CAPABILITY_DENIED = "capability_denied"
    INVALID_ARGUMENTS = "invalid_arguments"
    OUTPUT_LIMIT = "output_limit"
    BAD_RESPONSE = "bad_response"
    HOST_ERROR = "host_error"
    OVER_BUDGET = "over_budget"
    OVERLOADED = "overloaded"

    def __str__(self) -> str:
        return self.value


class WasmboxError(Exception):
    """Base of every exception wasmbox raises."""


class ManifestError(WasmboxError, ValueError):
    """A manifest is malformed: names the file and the field path."""


class CapabilityError(WasmboxError):
    """A module asks for more than its manifest grants, or a grant cannot be honoured."""


class UnknownToolError(WasmboxError, KeyError):
    """No tool of that name is loaded (`Sandbox.tool`, `call`, `acall`). A `KeyError` too;
    `name` is the name asked for, `close` the loaded names closest to it."""

    def __init__(self, name: str, loaded: Iterable[str]) -> None:
        names = sorted(loaded)
        self.name = name
        import difflib  # (only a miss needs it: kept out of `import wasmbox`)

        self.close = difflib.get_close_matches(name, names, n=3)
        if self.close:
            hint = "did you mean " + " or ".join(repr(n) for n in self.close) + "?"
        else:
            shown = ", ".join(names[:_LISTED]) + (", ..." if len(names) > _LISTED else "")
            hint = f"the loaded tools are: {shown}" if names else "no tool is loaded"
        super().__init__(f"no tool named {name[:_NAME_SHOWN]!r} is loaded; {hint}")

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0])


_LISTED = 20  # names listed when none is close
_NAME_SHOWN = 128  # of a name asked for (a model's may be long)


class LimitsError(WasmboxError, ValueError):
    """A call's own limits (`limits=`) are malformed, or would loosen its tool's: a call may
    only tighten what its manifest allows. Names the limit, both values and the fix."""


class SessionError(WasmboxError):
    """A session cannot be opened: too many are live (`max_sessions`), or its name is taken
    by a session under other grants, or the runtime could not make its instance."""


class SessionEndedError(SessionError):
    """The session has ended (closed, failed run, budget spent, idle or too old); `reason`
    says which. Its state is gone: open a new session."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"session {name!r} has ended: {reason}")
        self.reason = reason


class StrictSchemaError(WasmboxError, ValueError):
    """A tool's schema has no form in a provider's strict mode (`Tool.spec(strict=True)`);
    the message names the part of the schema and why."""


class StrictSchemaWarning(UserWarning):
    """`strict="auto"` sent a tool without strict mode; the message says why."""


class ToolError(WasmboxError):
    """A call failed; raised by `CallResult.unwrap()`. One subclass per `ErrorKind`."""

    kind: ErrorKind

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @staticmethod
    def for_kind(kind: ErrorKind, message: str) -> ToolError:
        """The exception of the subclass that matches `kind`."""
        return _BY_KIND[kind](message)


class OutOfFuelError(ToolError):
    """The guest used its fuel (`limits.fuel`)."""

    kind = ErrorKind.OUT_OF_FUEL


class OverBudgetError(ToolError):
    """The call's `Budget` could not admit it: it was not started (the message says which cap
    and when the budget frees up)."""

    kind = ErrorKind.OVER_BUDGET


class OverloadedError(ToolError):
    """The Sandbox's admission control refused the call (`AdmissionLimits`: too many calls in
    flight, or the process's resident memory at its bound): it was not started; retry later
    or on another replica."""

    kind = ErrorKind.OVERLOADED


class ToolTimeoutError(ToolError):
    """The call's wall-clock deadline (`limits.timeout`) passed."""

    kind = ErrorKind.TIMEOUT


class MemoryLimitError(ToolError):
    """Linear memory hit `limits.memory`."""

    kind = ErrorKind.MEMORY_LIMIT


class TrapError(ToolError):
    """A wasm trap other than the limits' (unreachable, divide by zero, stack overflow, ...)."""

    kind = ErrorKind.TRAP


class GuestError(ToolError):
    """The guest reported an error (or a command exited nonzero under `fail_on_exit_code`)."""

    kind = ErrorKind.GUEST_ERROR


class CapabilityDeniedError(ToolError):
    """A request the grants do not allow; a host function raises it to refuse one."""

    kind = ErrorKind.CAPABILITY_DENIED


class InvalidArgumentsError(ToolError):
    """The call's args do not match the tool's schema."""

    kind = ErrorKind.INVALID_ARGUMENTS


class OutputLimitError(ToolError):
    """stdout, stderr, the result or an output file passed `limits.output`."""

    kind = ErrorKind.OUTPUT_LIMIT


class BadResponseError(ToolError):
    """The guest's result is not a valid reply of its ABI."""

    kind = ErrorKind.BAD_RESPONSE


class HostError(ToolError):
    """The host failed the call: a host function raised, or a Sandbox resource ran out."""

    kind = ErrorKind.HOST_ERROR


_BY_KIND: dict[ErrorKind, type[ToolError]] = {
    cls.kind: cls
    for cls in (
        OutOfFuelError,
        ToolTimeoutError,
        MemoryLimitError,
        TrapError,
        GuestError,
        CapabilityDeniedError,
        InvalidArgumentsError,
        OutputLimitError,
        BadResponseError,
        HostError,
        OverBudgetError,
        OverloadedError,
    )
}
assert set(_BY_KIND) == set(ErrorKind)
