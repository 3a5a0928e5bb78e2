"""OpenAI Agents SDK tools for a Sandbox's tools (`pip install wasmbox[agents]`).

    agent = agents.Agent(name="a", tools=wasmbox.integrations.agents.tools(box, python=True))

Each is a `FunctionTool` with the tool's schema, strict where it has a strict form
(`strict="auto"`, see `Tool.spec`). Each call runs as `Sandbox.dispatch` runs one (the nulls
strict mode makes the model send for omitted properties are removed first); the model gets
`result_content`'s text, failures included (the SDK has no error flag for a function's output),
then a `ToolOutputImage` per image and a `ToolOutputFileContent` per PDF the call returned.
"""

from __future__ import annotations

from typing import Any

try:
    from agents import (
        FunctionTool,
        ToolOutputFileContent,
        ToolOutputImage,
        ToolOutputText,
    )
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "wasmbox.integrations.agents needs the OpenAI Agents SDK: pip install 'wasmbox[agents]'"
    ) from exc

from .. import _dispatch
from .._content import result_content
from .._formats import StrictMode
from .._manifest import ManifestSource
from .._sandbox import Sandbox


def tools(
    box: Sandbox,
    *,
    python: bool | ManifestSource = False,
    strict: StrictMode = "auto",
    javascript: bool | ManifestSource = False,
) -> list[FunctionTool]:
    """One tool per tool loaded in `box` now, in load order, and `run_python` with `python`
    (True, or the grants manifest `Sandbox.run_python` takes), `run_javascript` with
    `javascript` (the same)."""
    made = []
    for spec in box.specs("openai-responses", strict=strict, python=python, javascript=javascript):
        invoke = _invoker(box, spec["name"], python, javascript)
        made.append(
            FunctionTool(
                name=spec["name"],
                description=spec["description"],
                params_json_schema=spec["parameters"],
                on_invoke_tool=invoke,
                strict_json_schema=spec["strict"],
            )
        )
    return made


def _invoker(
    box: Sandbox, name: str, python: bool | ManifestSource, javascript: bool | ManifestSource
) -> Any:
    async def invoke(context: ToolContext[Any], arguments: str) -> str | list[Any]:
        called = _dispatch.acall_one(box, name, arguments, python=python, javascript=javascript)
        content = result_content(await called)
        outputs: list[Any] = []
        for part in content.parts:  # images and PDFs as the SDK's own outputs; the rest is in the text
            if part.is_image:
                outputs.append(ToolOutputImage(image_url=part.data_url()))
            elif part.is_pdf:
                outputs.append(ToolOutputFileContent(file_data=part.data_url(), filename=part.filename))
        return [ToolOutputText(text=content.text), *outputs] if outputs else content.text

    return invoke
