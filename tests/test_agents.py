"""`wasmbox.integrations.agents.tools` in a real OpenAI Agents SDK run: its Responses model
talks to a mock HTTP transport (no network) that plays the model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="openai-agents is in the test extra: pip install -e '.[test]'")

import httpx2
from agents import Agent, RunConfig, Runner
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI

import wasmbox
from wasmbox.integrations.agents import tools

ROOT = Path(__file__).resolve().parent.parent


def _response(n: int, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": f"resp_{n}", "object": "response", "created_at": 0, "model": "test-model",
        "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                               "input_tokens_details": {"cached_tokens": 0},
                               "output_tokens_details": {"reasoning_tokens": 0}},
    }  # fmt: skip


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id, "name": name,
            "arguments": json.dumps(arguments), "status": "completed"}  # fmt: skip


def test_agent_runs_sandbox_tools(box: wasmbox.Sandbox) -> None:
    box.load(ROOT / "capabilities" / "word_count.toml")
    requests: list[dict[str, Any]] = []

    def model(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        requests.append(body)
        if len(requests) == 1:  # strict mode: the model sends null for the property it omits
            output = [_call("c1", "word_count", {"text": "a b c", "path": None}),
                      _call("c2", "word_count", {"text": "a", "path": "/data/sample.txt"})]  # fmt: skip
        else:
            output = [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "done", "annotations": []}]}]  # fmt: skip
        return httpx2.Response(200, json=_response(len(requests), output))

    client = AsyncOpenAI(api_key="test", base_url="http://model.test/v1",
                         http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(model)))  # fmt: skip
    agent = Agent(name="counter", tools=tools(box), model=OpenAIResponsesModel("test-model", client))
    result = asyncio.run(Runner.run(agent, "count", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "done"

    (sent,) = requests[0]["tools"]
    assert sent["name"] == "word_count" and sent["strict"] is True
    assert sent["parameters"]["required"] == ["path", "text"]  # strict: all required, nullable
    outputs = {item["call_id"]: item["output"] for item in requests[1]["input"]
               if item.get("type") == "function_call_output"}  # fmt: skip
    assert json.loads(outputs["c1"]) == {"words": 3, "lines": 1, "bytes": 5}
    assert json.loads(outputs["c2"])["error"]["kind"] == "invalid_arguments"  # both given: refused
