"""A pydantic-ai toolset of a Sandbox's tools (`pip install wasmbox[pydantic-ai]`).

    agent = pydantic_ai.Agent(model, toolsets=[WasmboxToolset(box, python=True)])

Each call runs as `Sandbox.dispatch` runs one. The model gets `result_content`'s text (and a
`BinaryContent` per image or PDF the call returned, after the text); a call
refused for its arguments (`invalid_arguments`) raises `ModelRetry`, so the model is asked to
correct them (within the toolset's `max_retries`); any other failed call raises `ToolFailed`,
which the model sees as a failed result without being asked to retry it.
"""

from __future__ import annotations

from typing import Any

try:
    from pydantic_ai import BinaryContent, ModelRetry, RunContext, ToolFailed
    from pydantic_ai.tools import ToolDefinition
    from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "wasmbox.integrations.pydantic_ai needs pydantic-ai: pip install 'wasmbox[pydantic-ai]'"
    ) from exc
from pydantic_core import SchemaValidator, core_schema

from .._errors import ErrorKind
from .._manifest import ManifestSource
from .._sandbox import Sandbox
from . import _dispatch
from ._content import result_content

# The args arrive as the model's JSON object; wasmbox checks them against the tool's schema.
_ARGS = SchemaValidator(core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))


class WasmboxToolset(AbstractToolset[Any]):
    """The tools loaded in `box` (and `run_python` with `python`: True, or the grants manifest
    `Sandbox.run_python` takes; `run_javascript` with `javascript`, the same), listed afresh at
    each run step, so tools loaded later appear."""

    def __init__(
        self,
        box: Sandbox,
        *,
        python: bool | ManifestSource = False,
        max_retries: int = 1,
        id: str | None = None,
        javascript: bool | ManifestSource = False,
    ) -> None:
        self._box = box
        self._python = python
        self._javascript = javascript
        self._max_retries = max_retries
        self._id = id

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = {}
        offered = {"python": self._python is not False, "javascript": self._javascript is not False}
        for spec in self._box.specs("generic", **offered):
            definition = ToolDefinition(
                name=spec["name"], description=spec["description"], parameters_json_schema=spec["parameters"]
            )
            tools[spec["name"]] = ToolsetTool(
                toolset=self, tool_def=definition, max_retries=self._max_retries, args_validator=_ARGS
            )
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> str | list[Any]:
        result = await _dispatch.acall_one(
            self._box, name, tool_args, python=self._python, javascript=self._javascript
        )
        content = result_content(result)
        if result.error is None:
            binaries = [
                BinaryContent(data=part.data, media_type=part.media_type)
                for part in content.parts if part.is_image or part.is_pdf
            ]  # fmt: skip
            return [content.text, *binaries] if binaries else content.text
        if result.error.kind is ErrorKind.INVALID_ARGUMENTS:
            raise ModelRetry(content.text)
        raise ToolFailed(content.text)
