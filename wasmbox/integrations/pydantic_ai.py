"""A pydantic-ai toolset of a Sandbox's tools (`pip install wasmbox[pydantic-ai]`).

    agent = pydantic_ai.Agent(model, toolsets=[WasmboxToolset(box, python=True)])

Each call runs as `Sandbox.dispatch` runs one. The model gets `result_content`'s text (and a
`BinaryContent` per image or PDF the call returned, after the text); a call
refused for its arguments (`invalid_arguments`) raises `ModelRetry`, so the model is asked to
correct them (within the toolset's `max_retries`); any other failed call raises `ToolFailed`,
which the model sees as a failed result without being asked to retry it.

Code mode (as pydantic-ai's `CodeMode` capability, with wasmbox's interpreter in place of
monty): `WasmboxToolset.code_mode(box)` lists only `run_python`, whose code calls the loaded
tools as functions (`tools.word_count(text=...)`, each in its own sandbox; the description
shows them as typed stubs), so one model step can make many tool calls.
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

from .. import _dispatch
from .._content import result_content
from .._errors import ErrorKind
from .._manifest import ManifestSource
from .._sandbox import Sandbox

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
        code_only: bool = False,
    ) -> None:
        """`code_only` lists only run_python and run_javascript (their grant sets' `tools` are
        what the model reaches, from code), not the loaded tools themselves."""
        self._box = box
        self._python = python
        self._javascript = javascript
        self._code_only = code_only
        self._max_retries = max_retries
        self._id = id

    @classmethod
    def code_mode(
        cls,
        box: Sandbox,
        tools: list[str] | None = None,
        *,
        language: str = "python",
        max_retries: int = 1,
        id: str | None = None,
    ) -> WasmboxToolset:
        """A toolset of one tool, `run_python` (or `run_javascript` with `language`), whose code
        may call `tools` (default: every tool loaded now) as functions. ValueError for another
        `language`; CapabilityError (when listed) for a tool that is not loaded."""
        if language not in ("python", "javascript"):
            raise ValueError(f"language must be 'python' or 'javascript', got {language!r}")
        names = list(box.tools) if tools is None else list(tools)
        grants = {"name": "code_mode", "runtime": language, "tools": names}
        chosen = {"python": grants} if language == "python" else {"javascript": grants}
        return cls(box, max_retries=max_retries, id=id, code_only=True, **chosen)

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = {}
        hidden = set(self._box.tools) if self._code_only else set()
        for spec in self._box.specs("generic", python=self._python, javascript=self._javascript):
            if spec["name"] in hidden:
                continue
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
                for part in content.parts
                if part.is_image or part.is_pdf
            ]
            return [content.text, *binaries] if binaries else content.text
        if result.error.kind is ErrorKind.INVALID_ARGUMENTS:
            raise ModelRetry(content.text)
        raise ToolFailed(content.text)
