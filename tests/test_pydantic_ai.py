"""`wasmbox.integrations.pydantic_ai.WasmboxToolset` in a real pydantic-ai Agent, driven by its
`FunctionModel` (a model that is a local function: no network)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai is in the test extra: pip install -e '.[test]'")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import wasmbox
from wasmbox.integrations.pydantic_ai import WasmboxToolset

from .conftest import wat

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def _parts(messages: list[ModelMessage]) -> list[Any]:
    return [part for message in messages if isinstance(message, ModelRequest) for part in message.parts]


def test_agent_calls_tools_and_retries_bad_arguments(box: wasmbox.Sandbox) -> None:
    box.load({"name": "echo", "description": "Echo", "module": wat("echo"), "input_schema": ECHO_SCHEMA})
    box.load({"name": "trap", "description": "Trap", "module": wat("trap")})
    seen: list[list[str]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """First bad args, then good ones, then a failing tool, then an answer from what it read."""
        seen.append([tool.name for tool in info.function_tools])
        schemas = {tool.name: tool.parameters_json_schema for tool in info.function_tools}
        assert schemas["echo"] == ECHO_SCHEMA
        turn = len(seen)
        if turn == 1:
            return ModelResponse(parts=[ToolCallPart("echo", {"txt": "hi"}, tool_call_id="c1")])
        if turn == 2:
            return ModelResponse(parts=[ToolCallPart("echo", {"text": "hi"}, tool_call_id="c2")])
        if turn == 3:
            return ModelResponse(parts=[ToolCallPart("trap", {}, tool_call_id="c3")])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), toolsets=[WasmboxToolset(box)])
    run = agent.run_sync("go")
    assert run.output == "done"
    assert seen == [["echo", "trap"]] * 4
    returned = {p.tool_call_id: p for p in _parts(run.all_messages()) if isinstance(p, ToolReturnPart)}
    # bad args: ModelRetry, so the model is asked to correct them
    assert returned["c1"].outcome == "retried" and returned["c1"].retry is not None
    assert returned["c1"].retry.cause == "model_retry"
    assert json.loads(returned["c1"].content)["error"]["kind"] == "invalid_arguments"
    assert returned["c2"].outcome == "success" and json.loads(returned["c2"].content) == {"text": "hi"}
    # a tool's own failure: ToolFailed, a failed result the model is not told to retry
    assert returned["c3"].outcome == "failed" and returned["c3"].retry is None
    assert json.loads(returned["c3"].content)["error"]["kind"] == "trap"


def test_run_python_and_retry_limit(box: wasmbox.Sandbox) -> None:
    calls = iter([
        ToolCallPart("run_python", {"code": "sum(range(10))"}, tool_call_id="p1"),
        ToolCallPart("run_python", {"source": "1"}, tool_call_id="p2"),
        ToolCallPart("run_python", {"source": "1"}, tool_call_id="p3"),
    ])  # fmt: skip

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert [tool.name for tool in info.function_tools] == ["run_python"]
        return ModelResponse(parts=[next(calls)])

    agent = Agent(FunctionModel(model), toolsets=[WasmboxToolset(box, python=True, max_retries=1)])
    with pytest.raises(Exception, match="exceeded max retries") as raised:
        agent.run_sync("go")
    assert type(raised.value).__name__ == "UnexpectedModelBehavior"
    assert next(calls, None) is None  # the second bad call used up the one retry


def test_code_mode_lists_one_tool_whose_code_calls_the_others(box: wasmbox.Sandbox) -> None:
    """pydantic-ai's code mode, in wasmbox: the model sees run_python with the tools as stubs,
    writes one snippet that calls them, and gets one answer."""
    box.load({"name": "echo", "description": "Echo", "module": wat("echo"), "input_schema": ECHO_SCHEMA})
    code = "'-'.join(tools.echo(text=w)['text'].upper() for w in ['a', 'b', 'c'])"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        (tool,) = info.function_tools
        assert tool.name == "run_python"
        assert "def echo(*, text: str) -> Any:" in (tool.description or "")
        returned = [p for p in _parts(messages) if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("run_python", {"code": code}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart(f"got {returned[0].content}")])

    agent = Agent(FunctionModel(model), toolsets=[WasmboxToolset.code_mode(box)])
    assert agent.run_sync("shout a, b and c").output == "got A-B-C"
    with pytest.raises(ValueError, match="language"):
        WasmboxToolset.code_mode(box, language="ruby")
