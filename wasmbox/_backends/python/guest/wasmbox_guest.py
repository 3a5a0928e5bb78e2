"""What guest code imports to reach the host: `call_host(name, **kwargs)`.

    import wasmbox_guest
    value = wasmbox_guest.call_host("kv.get", key="a")

Only host functions the tool's manifest grants answer; any other name raises HostCallError
here (and the host records the attempt as denied). Values travel as MessagePack: None, bool,
int, float, str, bytes, lists and dicts.
"""

from __future__ import annotations

from typing import Any

import msgpack
import wit_world

__all__ = ["HostCallError", "call_host"]


class HostCallError(Exception):
    """The host refused or failed a host call; the message says why."""


def call_host(name: str, /, **kwargs: Any) -> Any:
    """Call granted host function `name` with keyword arguments; return its value."""
    request = msgpack.packb(kwargs, use_bin_type=True)
    reply = msgpack.unpackb(wit_world.call_host(name, request), raw=False)
    if isinstance(reply, dict) and "ok" in reply:
        return reply["ok"]
    message = reply.get("error") if isinstance(reply, dict) else None
    raise HostCallError(message or "malformed reply from the host")
