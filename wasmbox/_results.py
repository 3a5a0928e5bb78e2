"""What a call returns: `CallResult`, its `CallError`, and the record of each host call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ._errors import ErrorKind, ToolError

HostCallVerdict = Literal["ok", "invalid_arguments", "denied", "error", "limit", "bad_request"]


class CallError(BaseModel):
    """Why a call failed: a kind from the closed set, and a message fit to show a model."""

    model_config = ConfigDict(frozen=True)

    kind: ErrorKind
    message: str


@dataclass(frozen=True, slots=True)
class HostCallRecord:
    """One guest → host function call, kept host-side (the guest saw only a short reply).

    A dataclass rather than a model: one is made per host call, on the hot path.
    `detail` is host-side detail such as the exception text.
    """

    name: str
    verdict: HostCallVerdict
    duration_s: float
    bytes_in: int
    bytes_out: int
    detail: str | None = None


class CallResult(BaseModel):
    """The outcome of one tool call. `ok` is True exactly when `error` is None.

    `model_dump_json()` is what a router forwards. Bytes (in `value`, `stdout_bytes`,
    `stderr_bytes` and `files`) travel in JSON as URL-safe base64 with padding (`-_` for
    `+/`); `model_validate_json` reads them back as bytes."""

    model_config = ConfigDict(frozen=True, ser_json_bytes="base64", val_json_bytes="base64")

    tool: str
    ok: bool
    value: Any = None
    error: CallError | None = None
    stdout: str = Field("", description="What the guest wrote, as UTF-8 text (U+FFFD where it is not).")
    stderr: str = ""
    stdout_bytes: bytes | None = Field(
        None, description="The exact bytes when `stdout` is not exact (not UTF-8); else None."
    )
    stderr_bytes: bytes | None = Field(None, description="The same for stderr.")
    files: dict[str, bytes] = Field(
        default_factory=dict,
        description="The files the call wrote that its manifest's `outputs` (or `command.outputs`) name, by guest path.",
    )
    media_types: dict[str, str] = Field(
        default_factory=dict,
        description="Media types of 'stdout' and of files by path: declared, else sniffed.",
    )
    truncated: bool = Field(False, description="stdout or stderr was cut at the output cap.")
    fuel_used: int = 0
    duration_s: float = 0.0
    peak_memory: int | None = Field(
        None, description="Bytes of linear memory at the end (it only grows); None for Python."
    )
    host_calls: list[HostCallRecord] = Field(default_factory=list)

    @classmethod
    def failed(cls, tool: str, kind: ErrorKind, message: str, duration_s: float = 0.0) -> CallResult:
        """A result for a call refused before the guest ran."""
        return cls(tool=tool, ok=False, error=CallError(kind=kind, message=message), duration_s=duration_s)

    def unwrap(self) -> Any:
        """The value, or raise the `ToolError` subclass of the error's kind."""
        if self.error is not None:
            raise ToolError.for_kind(self.error.kind, self.error.message)
        return self.value


_FIELDS = frozenset(CallResult.model_fields)
_set = object.__setattr__


def construct_result(**fields: Any) -> CallResult:
    """`CallResult.model_construct(**fields)` for a runner's own values, every field given:
    the same object, made without filling in defaults or mapping aliases, since it is built in
    every call (its cost: bench/README.md, "Core calls"). `tests/test_call_result.py` checks it
    stays equal."""
    result = CallResult.__new__(CallResult)
    _set(result, "__dict__", fields)
    _set(result, "__pydantic_fields_set__", set(_FIELDS))
    _set(result, "__pydantic_extra__", None)
    _set(result, "__pydantic_private__", None)
    return result
