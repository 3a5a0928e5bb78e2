"""LangChain tools for a Sandbox's tools (`pip install wasmbox[langchain]`).

    tools = wasmbox.integrations.langchain.tools(box, python=True)
    model.bind_tools(tools); tools_by_name[call["name"]].invoke(call)  # a ToolCall -> ToolMessage

Each is a `StructuredTool` whose name is fixed when it is made: the model's arguments reach
the tool as one dict, never as keywords, so no argument ("name", "config", "run_manager", ...)
can pick another tool or reach LangChain's own parameters. Each call runs as
`Sandbox.dispatch` runs one; the ToolMessage's content is `result_content`'s text, with
`status="error"` when the call failed; with images or PDFs, it is a list of standard content
blocks: the text, then an `image` or `file` block (base64) each.
"""

from __future__ import annotations

from typing import Any

try:
    from langchain_core.tools import StructuredTool, ToolException
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "wasmbox.integrations.langchain needs langchain-core: pip install 'wasmbox[langchain]'"
    ) from exc

from .. import _dispatch
from .._content import result_content
from .._manifest import ManifestSource
from .._results import CallResult
from .._sandbox import Sandbox


class WasmboxTool(StructuredTool):
    """A StructuredTool that hands the call's input to its function whole, as `arguments`."""

    def _to_args_and_kwargs(
        self, tool_input: str | dict[str, Any], tool_call_id: str | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        # StructuredTool would spread the dict into keywords, beside LangChain's own `config`
        # and `run_manager`; a JSON string (a ToolCall's args may be one) is parsed by dispatch.
        return (), {"arguments": tool_input}


def tools(
    box: Sandbox, *, python: bool | ManifestSource = False, javascript: bool | ManifestSource = False
) -> list[StructuredTool]:
    """One tool per tool loaded in `box` now, in load order, and `run_python` with `python`
    (True, or the grants manifest `Sandbox.run_python` takes), `run_javascript` with
    `javascript` (the same)."""
    return [
        _tool(box, spec["name"], spec["description"], spec["parameters"], python, javascript)
        for spec in box.specs("generic", python=python, javascript=javascript)
    ]


def _tool(
    box: Sandbox,
    name: str,
    description: str,
    parameters: dict[str, Any],
    python: bool | ManifestSource,
    javascript: bool | ManifestSource,
) -> StructuredTool:
    """The tool that calls `name` in `box`, and nothing else: `name` is bound here."""

    def run(arguments: Any) -> str | list[Any]:
        return _answer(_dispatch.call_one(box, name, arguments, python=python, javascript=javascript))

    async def arun(arguments: Any) -> str | list[Any]:
        return _answer(await _dispatch.acall_one(box, name, arguments, python=python, javascript=javascript))

    return WasmboxTool(
        name=name,
        description=description,
        args_schema=parameters,
        func=run,
        coroutine=arun,
        handle_tool_error=True,
    )


def _answer(result: CallResult) -> str | list[Any]:
    content = result_content(result)
    if content.is_error:
        raise ToolException(content.text)  # handle_tool_error: a ToolMessage with status="error"
    blocks: list[dict[str, Any]] = []
    for part in content.parts:  # standard content blocks; other parts are in the text
        if part.is_image:
            blocks.append({"type": "image", "base64": part.base64(), "mime_type": part.media_type})
        elif part.is_pdf:
            blocks.append({"type": "file", "base64": part.base64(), "mime_type": part.media_type})
    return [{"type": "text", "text": content.text}, *blocks] if blocks else content.text
