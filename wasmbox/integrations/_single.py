"""One model tool call by name, with `Sandbox.dispatch`'s rules: its arguments' nulls removed
by `prepare_args`, `run_python` routed when `python` is given, an unknown name or arguments that
are no JSON object an `invalid_arguments` result. Used by the adapters (MCP, pydantic-ai,
LangChain), which each get calls one at a time."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from .._manifest import ManifestSource
from .._results import CallResult
from . import _dispatch

if TYPE_CHECKING:
    from .._sandbox import Sandbox


def call(box: Sandbox, name: str, args: Any, *, python: bool | ManifestSource = False) -> CallResult:
    """Run the call `name(args)`; never raises for the call's own faults. `args`: a mapping,
    JSON text, or None."""
    job = _dispatch._Job("", name)
    _dispatch._plan(job, args, "openai", box.tools, box, python)  # ("openai": JSON text is parsed)
    if job.result is not None:
        return job.result
    assert job.run is not None
    return job.run()


async def acall(box: Sandbox, name: str, args: Any, *, python: bool | ManifestSource = False) -> CallResult:
    """`call` on the Sandbox's worker threads."""
    import asyncio

    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(box._executor, partial(call, box, name, args, python=python))
