"""Tools called from guest code: the `wasmbox.call_tool` host function behind a manifest's `tools`.

Python code calls `tools.word_count(text=...)` (JavaScript `tools.word_count({...})`); the
guest sends `{"name", "args"}` to `CALL_TOOL`, which a manifest grants exactly when it lists
tools. Each call is served as any host call (counted against the caller's `limits.host_calls`,
recorded, its reply under the caller's output cap, the caller stopped if its deadline passed
meanwhile) and runs as `Tool.call` runs it: the args checked against that tool's schema, in a
fresh instance of that tool under its own grants and limits (after the args are checked
against what the caller's `tool_args` narrowed that tool to), with its own audit record (which
names the caller's as its parent). What the code gets back is the value, or the error's kind
and message, which the guest raises as `ToolCallError`; a failed inner call is the code's to
handle, not a failure of the host function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import _call
from ._errors import CapabilityDeniedError
from ._inspect import ToolKind

if TYPE_CHECKING:
    from ._tool import Tool


class ToolCaller:
    """The `CALL_TOOL` host function of a Sandbox (`call`): `lookup` gives its loaded tool of a name."""

    def __init__(self, lookup: Callable[[str], Tool | None]) -> None:
        self._lookup = lookup

    def call(self, name: str, args: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """`{"ok": value}` or `{"error": {"kind", "message"}}` of tool `name` called with
        `args`; a command tool's value is `{"exit_code", "stdout", "stderr"}`. Raises
        CapabilityDeniedError when the caller's manifest does not list `name` in `tools`, when
        `args` are outside what its `tool_args` narrowed the tool to (the first violation named;
        the tool does not run), or no such tool is loaded."""
        manifest = _call.current().manifest
        if name not in manifest.tools:
            raise CapabilityDeniedError(
                f"tool {name[:64]!r} is not granted to this code: add it to the manifest's tools"
            )
        narrowed = manifest._narrowing("tool", name)
        problem = narrowed.problem(dict(args or {})) if narrowed is not None else None
        if problem is not None:
            raise CapabilityDeniedError(
                f"tool {name!r} refused: {problem} (the manifest's [tool_args.{name}] narrows what may be passed)"
            )
        tool = self._lookup(name)
        if tool is None or "code" not in tool.manifest.callers:
            raise CapabilityDeniedError(f"tool {name!r} is listed but not loaded here for code to call")
        result = tool.call(args or {})
        if result.error is not None:
            return {"error": {"kind": result.error.kind.value, "message": result.error.message}}
        if tool.kind is ToolKind.COMMAND:  # its value is the exit code; its output is stdout
            value = {**(result.value or {}), "stdout": result.stdout, "stderr": result.stderr}
            return {"ok": {**value, "files": result.files} if result.files else value}
        return {"ok": result.value}
