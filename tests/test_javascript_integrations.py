"""`run_javascript` offered to models through each integration: the MCP server (a real MCP
client over stdio), LangChain tools, a pydantic-ai Agent and an OpenAI Agents SDK run (each SDK
real, its model a local function or a mock HTTP transport)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._inputs import InputUnavailable


@pytest.fixture
def js_box(cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        try:
            box.prepare_javascript()
        except InputUnavailable as exc:
            pytest.skip(f"the JavaScript runtime's pinned wheel cannot be fetched: {exc}")
        yield box


def test_mcp_stdio_server_serves_run_javascript(js_box: wasmbox.Sandbox, cache_dir: Path) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    import mcp_types as types
    from mcp import ClientSession, StdioServerParameters, stdio_client

    env = {"WASMBOX_CACHE_DIR": str(cache_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "wasmbox", "mcp", "serve", "--javascript"], env=env
    )

    def text(result: types.CallToolResult) -> str:
        assert isinstance(result.content[0], types.TextContent)
        return result.content[0].text

    async def run() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            listed = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(listed) == {"run_javascript"}
            assert listed["run_javascript"].input_schema["required"] == ["code"]
            ok = await session.call_tool("run_javascript", {"code": "console.log('hi'); 6 * 7"})
            assert ok.is_error is False and json.loads(text(ok)) == {"value": 42, "stdout": "hi\n"}
            thrown = await session.call_tool("run_javascript", {"code": "throw new RangeError('no')"})
            assert thrown.is_error is True
            assert json.loads(text(thrown))["error"]["kind"] == "guest_error"
            assert "RangeError: no" in text(thrown)

    asyncio.run(asyncio.wait_for(run(), 300))


def test_mcp_build_server_refuses_a_tool_named_run_javascript(
    js_box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from wasmbox.integrations import mcp as wasmbox_mcp

    source = tmp_path / "tool.js"
    source.write_text("function main() { return 1 }")
    js_box.load({"name": "run_javascript", "runtime": "javascript", "source": str(source)})
    with pytest.raises(ValueError, match="run_javascript"):
        wasmbox_mcp.build_server(js_box, javascript=True)


def test_langchain_tools_run_javascript(js_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("langchain_core", reason="langchain-core is in the test extra")
    from langchain_core.messages import ToolCall, ToolMessage

    from wasmbox.integrations.langchain import tools

    (tool,) = tools(js_box, javascript=True)
    assert tool.name == "run_javascript"
    call = ToolCall(name="run_javascript", args={"code": "[1, 2].map(x => x * 3)"}, id="c1", type="tool_call")
    message = tool.invoke(call)
    assert isinstance(message, ToolMessage) and message.status == "success"
    assert json.loads(message.content) == [3, 6]  # type: ignore[arg-type]
    bad = tool.invoke(ToolCall(name="run_javascript", args={"code": "nope("}, id="c2", type="tool_call"))
    assert bad.status == "error" and json.loads(bad.content)["error"]["kind"] == "guest_error"  # type: ignore[arg-type]


def test_pydantic_ai_agent_calls_run_javascript(js_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("pydantic_ai", reason="pydantic-ai is in the test extra")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from wasmbox.integrations.pydantic_ai import WasmboxToolset

    returned: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert [tool.name for tool in info.function_tools] == ["run_javascript"]
        parts = [part for m in messages if isinstance(m, ModelRequest) for part in m.parts]
        results = [part.content for part in parts if part.part_kind == "tool-return"]
        if not results:
            return ModelResponse(parts=[ToolCallPart("run_javascript", {"code": "'a,b,c'.split(',')"})])
        returned.extend(results)
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), toolsets=[WasmboxToolset(js_box, javascript=True)])
    assert agent.run_sync("split it").output == "done"
    assert [json.loads(r) for r in returned] == [["a", "b", "c"]]


def test_agents_sdk_run_calls_run_javascript(js_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("agents", reason="openai-agents is in the test extra")
    import httpx2
    from agents import Agent, RunConfig, Runner
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    from wasmbox.integrations.agents import tools

    requests: list[dict[str, Any]] = []

    def respond(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        requests.append(body)
        if len(requests) == 1:
            output: list[dict[str, Any]] = [{
                "type": "function_call", "id": "fc_1", "call_id": "c1", "name": "run_javascript",
                "arguments": json.dumps({"code": "JSON.stringify({n: 2 ** 10})"}), "status": "completed",
            }]  # fmt: skip
        else:
            output = [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "done", "annotations": []}]}]  # fmt: skip
        return httpx2.Response(200, json={
            "id": f"resp_{len(requests)}", "object": "response", "created_at": 0, "model": "test-model",
            "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                                   "input_tokens_details": {"cached_tokens": 0},
                                   "output_tokens_details": {"reasoning_tokens": 0}},
        })  # fmt: skip

    client = AsyncOpenAI(api_key="test", base_url="http://model.test/v1",
                         http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(respond)))  # fmt: skip
    agent = Agent(
        name="js", tools=tools(js_box, javascript=True), model=OpenAIResponsesModel("test-model", client)
    )
    result = asyncio.run(Runner.run(agent, "go", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "done"
    (sent,) = requests[0]["tools"]
    assert sent["name"] == "run_javascript" and sent["strict"] is True
    outputs = [item["output"] for item in requests[1]["input"] if item.get("type") == "function_call_output"]
    assert outputs == ['{"n":1024}']
