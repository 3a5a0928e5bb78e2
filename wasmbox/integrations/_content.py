"""What goes back to a model for one call: `result_content(result) -> Content`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pydantic_core

from .._results import CallResult


@dataclass(frozen=True, slots=True)
class Content:
    """A tool result as a model reads it: `text`, and whether it reports a failure."""

    text: str
    is_error: bool


def result_content(result: CallResult) -> Content:
    """The text a model gets for `result`, and `is_error` (True exactly when the call failed).

    - Success, nothing printed: the value; a string as is, anything else as JSON (bytes as
      base64, as in `CallResult.model_dump_json`).
    - Success with output: `{"value": v, "stdout": "...", "stderr": "..."}`, each stream only
      when not empty (a WASI command's output is its stdout; its value is `{"exit_code": n}`).
    - Failure: `{"error": {"kind": k, "message": m}}`, with `"stdout"`/`"stderr"` beside
      `"error"` when the guest printed anything before it failed.
    - `"truncated": true` is added to either object when stdout or stderr was cut at the
      tool's output cap (`limits.output`, which also bounds the text's size).

    JSON is compact, non-ASCII kept as is. Never raises for any `CallResult`.
    """
    streams: dict[str, Any] = {}
    if result.stdout:
        streams["stdout"] = result.stdout
    if result.stderr:
        streams["stderr"] = result.stderr
    if result.truncated:
        streams["truncated"] = True
    if result.error is not None:
        error = {"kind": result.error.kind.value, "message": result.error.message}
        return Content(_json({"error": error, **streams}), True)
    if streams:
        return Content(_json({"value": result.value, **streams}), False)
    if isinstance(result.value, str):
        return Content(result.value, False)
    return Content(_json(result.value), False)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):  # bytes, non-string keys, NaN: pydantic's rules (as a router's)
        try:
            return pydantic_core.to_json(value, bytes_mode="base64", inf_nan_mode="null").decode()
        except pydantic_core.PydanticSerializationError:  # (not a value a guest can return)
            return json.dumps(repr(value), ensure_ascii=False)
