"""What guest code imports to reach the host: `call_host(name, **kwargs)`, and `tools`.

    import wasmbox_guest
    value = wasmbox_guest.call_host("kv.get", key="a")
    counts = tools.word_count(text="a b c")        # a tool the manifest's `tools` lists

Only host functions the tool's manifest grants answer; any other name raises HostCallError
here (and the host records the attempt as denied). Values travel as MessagePack: None, bool,
int, float, str, bytes, lists and dicts.

`tools` is a builtin (so a snippet needs no import): `tools.name(**args)` or
`tools["name"](**args)` calls a loaded tool the manifest lists, in that tool's own sandbox, and
returns its value; a failed call raises `ToolCallError` with the error's `kind` and `message`.
"""

from __future__ import annotations

import builtins
from typing import Any

import msgpack
import wit_world

__all__ = ["HostCallError", "ToolCallError", "call_host", "call_tool", "tools"]

CALL_TOOL = "wasmbox.call_tool"  # the host function behind `tools` (granted by the manifest's `tools`)


class HostCallError(Exception):
    """The host refused or failed a host call; the message says why."""


class ToolCallError(HostCallError):
    """A tool called through `tools` failed: `tool` is its name, `kind` the error's kind
    (e.g. "invalid_arguments", "timeout"), `message` what it said."""

    def __init__(self, tool: str, kind: str, message: str) -> None:
        super().__init__(f"{tool}: {kind}: {message}")
        self.tool, self.kind, self.message = tool, kind, message


def call_host(name: str, /, **kwargs: Any) -> Any:
    """Call granted host function `name` with keyword arguments; return its value."""
    request = msgpack.packb(kwargs, use_bin_type=True)
    reply = msgpack.unpackb(wit_world.call_host(name, request), raw=False)
    if isinstance(reply, dict) and "ok" in reply:
        return reply["ok"]
    message = reply.get("error") if isinstance(reply, dict) else None
    raise HostCallError(message or "malformed reply from the host")


def call_tool(name: str, /, **kwargs: Any) -> Any:
    """Call the loaded tool `name` (listed in the manifest's `tools`) with keyword args; return
    its value (a command's: `{"exit_code", "stdout", "stderr"}`). Raises ToolCallError when the
    call fails, HostCallError when the host refuses it (not listed, past a limit)."""
    reply = call_host(CALL_TOOL, name=name, args=kwargs)
    if isinstance(reply, dict) and "ok" in reply:
        return reply["ok"]
    error = reply.get("error") if isinstance(reply, dict) else None
    if not isinstance(error, dict):
        raise HostCallError("malformed reply from the host")
    raise ToolCallError(name, str(error.get("kind")), str(error.get("message")))


class _Tools:
    """`tools.name(**args)` and `tools["name"](**args)`: `call_tool` of that name."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> Any:
        def call(**kwargs: Any) -> Any:
            return call_tool(name, **kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    def __repr__(self) -> str:
        return "<the tools this code may call: tools.name(**args)>"


tools = _Tools()
builtins.tools = tools  # type: ignore[attr-defined]  # (every snippet and tool sees it unimported)
