"""The real openai and anthropic SDK clients, over a mock HTTP transport (no network).

A scripted model answers the first request with parallel tool calls (one with bad JSON, one of
an unknown tool, one strict-mode call with a null for an omitted property) in the provider's
wire format; wasmbox dispatches them; the test reads the follow-up request the SDK sends and
checks that it carries each tool result under its call's id, and that every `tools` entry of
both requests passes the provider's strict rules (tests/strict_rules.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox

from .conftest import CAPABILITIES
from .strict_rules import strict_problems

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

CALLS = [  # (id, tool, arguments as the model writes them)
    ("call_wc", "word_count", '{"path": null, "text": "the quick brown fox"}'),
    ("call_kv", "kv_lookup", '{"key": "greeting"}'),
    ("call_bad", "word_count", '{"text": "unterminated'),
    ("call_unknown", "delete_everything", "{}"),
    ("call_py", "run_python", '{"code": "sum(range(10))"}'),
    ("call_both", "word_count", '{"path": "/data/sample.txt", "text": "x"}'),  # maxProperties: 1
]


def check_results(by_id: dict[str, str]) -> None:
    """The content each call's result must carry, whatever the provider."""
    assert set(by_id) == {call_id for call_id, _, _ in CALLS}
    assert json.loads(by_id["call_wc"]) == {"words": 4, "lines": 1, "bytes": 19}
    assert json.loads(by_id["call_kv"]) == {"key": "greeting", "value": "hello"}
    assert json.loads(by_id["call_bad"])["error"]["kind"] == "invalid_arguments"
    assert "not valid JSON" in json.loads(by_id["call_bad"])["error"]["message"]
    assert json.loads(by_id["call_unknown"])["error"] == {
        "kind": "invalid_arguments",
        "message": "no tool named 'delete_everything'; the tools are: kv_lookup, word_count, run_python",
    }
    assert by_id["call_py"] == "45"
    assert json.loads(by_id["call_both"])["error"] == {
        "kind": "invalid_arguments", "message": "args: more than 1 properties",
    }  # fmt: skip


class FakeModel:
    """An HTTP handler that records each request and replies with the next scripted body."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append({"path": request.url.path, "body": json.loads(request.content)})
        return httpx.Response(200, json=self.replies.pop(0))

    async def handle_async(self, request: Any) -> Any:
        return self(request)


@pytest.fixture
def tools_box(box: wasmbox.Sandbox, built_examples: Path) -> Iterator[wasmbox.Sandbox]:
    box.register_host_function("kv.get", lambda key: {"greeting": "hello"}.get(key))
    box.load(CAPABILITIES / "word_count.toml")
    box.load(CAPABILITIES / "kv_lookup.toml")
    yield box


def assert_strict(tools: list[dict[str, Any]], schema_of: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    assert tools
    for tool in tools:
        assert strict_problems(schema_of(tool)) == [], tool


# -- OpenAI Chat Completions ---------------------------------------------------------------------


def chat_completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_000, "model": "gpt-test",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }  # fmt: skip


def openai_chat_script() -> FakeModel:
    tool_calls = [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        for call_id, name, arguments in CALLS
    ]
    return FakeModel([
        chat_completion({"role": "assistant", "content": None, "tool_calls": tool_calls}, "tool_calls"),
        chat_completion({"role": "assistant", "content": "The text has 4 words."}, "stop"),
    ])  # fmt: skip


def check_openai_chat(model: FakeModel) -> None:
    first, second = (r["body"] for r in model.requests)
    assert [r["path"] for r in model.requests] == ["/v1/chat/completions"] * 2
    assert first["parallel_tool_calls"] is True
    for body in (first, second):
        assert all(t["type"] == "function" and t["function"]["strict"] is True for t in body["tools"])
        assert_strict(body["tools"], lambda t: t["function"]["parameters"])
    assistant, *results = second["messages"][1:]
    assert [c["id"] for c in assistant["tool_calls"]] == [call_id for call_id, _, _ in CALLS]
    assert all(r["role"] == "tool" and set(r) == {"role", "tool_call_id", "content"} for r in results)
    check_results({r["tool_call_id"]: r["content"] for r in results})


def test_openai_chat_completions_round_trip(tools_box: wasmbox.Sandbox) -> None:
    model = openai_chat_script()
    client = openai.OpenAI(
        api_key="sk-test", base_url="http://model.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(model)),
    )  # fmt: skip
    tools = tools_box.specs("openai", strict=True, python=True)
    messages: list[Any] = [{"role": "user", "content": "Count the words in 'the quick brown fox'."}]
    response = client.chat.completions.create(
        model="gpt-test", messages=messages, tools=tools, parallel_tool_calls=True
    )
    message = response.choices[0].message
    assert isinstance(message.tool_calls[0], openai.types.chat.ChatCompletionMessageToolCall)
    messages.append(message.model_dump(exclude_none=True))
    messages += tools_box.dispatch(message.tool_calls, format="openai", python=True)
    final = client.chat.completions.create(model="gpt-test", messages=messages, tools=tools)
    assert final.choices[0].message.content == "The text has 4 words."
    check_openai_chat(model)


def test_openai_async_client_with_adispatch(tools_box: wasmbox.Sandbox) -> None:
    model = openai_chat_script()

    async def run() -> None:
        client = openai.AsyncOpenAI(
            api_key="sk-test", base_url="http://model.test/v1",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(model.handle_async)),
        )  # fmt: skip
        tools = tools_box.specs("openai", strict=True, python=True)
        messages: list[Any] = [{"role": "user", "content": "Count."}]
        response = await client.chat.completions.create(
            model="gpt-test", messages=messages, tools=tools, parallel_tool_calls=True
        )
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        messages += await tools_box.adispatch(message, format="openai", python=True)
        await client.chat.completions.create(model="gpt-test", messages=messages, tools=tools)

    asyncio.run(run())
    check_openai_chat(model)


# -- OpenAI Responses ----------------------------------------------------------------------------


def response_body(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_1", "object": "response", "created_at": 1_700_000_000, "status": "completed",
        "model": "gpt-test", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "error": None, "incomplete_details": None, "instructions": None,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0,
    }  # fmt: skip


def test_openai_responses_round_trip(tools_box: wasmbox.Sandbox) -> None:
    output = [{"type": "reasoning", "id": "rs_1", "summary": []}] + [
        {"type": "function_call", "id": f"fc_{i}", "call_id": call_id, "name": name,
         "arguments": arguments, "status": "completed"}
        for i, (call_id, name, arguments) in enumerate(CALLS)
    ]  # fmt: skip
    text = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "4 words.", "annotations": []}]}  # fmt: skip
    model = FakeModel([response_body(output), response_body([text])])
    client = openai.OpenAI(
        api_key="sk-test", base_url="http://model.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(model)),
    )  # fmt: skip
    tools = tools_box.specs("openai-responses", strict=True, python=True)
    inputs: list[Any] = [{"role": "user", "content": "Count the words."}]
    response = client.responses.create(model="gpt-test", input=inputs, tools=tools)
    inputs += [item.model_dump(exclude_none=True) for item in response.output]
    inputs += tools_box.dispatch(response, format="openai-responses", python=True)
    final = client.responses.create(model="gpt-test", input=inputs, tools=tools)
    assert final.output_text == "4 words."

    first, second = (r["body"] for r in model.requests)
    assert [r["path"] for r in model.requests] == ["/v1/responses"] * 2
    for body in (first, second):
        assert all(t["type"] == "function" and t["strict"] is True for t in body["tools"])
        assert_strict(body["tools"], lambda t: t["parameters"])
    outputs = [item for item in second["input"] if item.get("type") == "function_call_output"]
    calls = [item for item in second["input"] if item.get("type") == "function_call"]
    assert [o["call_id"] for o in outputs] == [c["call_id"] for c in calls] == [c for c, _, _ in CALLS]
    check_results({o["call_id"]: o["output"] for o in outputs})


# -- Anthropic Messages --------------------------------------------------------------------------


# the SDK's own model of the block warns when it echoes back the scripted non-object input
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
def test_anthropic_messages_round_trip(tools_box: wasmbox.Sandbox) -> None:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "I'll use the tools."}]
    for call_id, name, arguments in CALLS:
        try:  # Anthropic sends parsed input; the bad-JSON call becomes a non-object input
            parsed: Any = json.loads(arguments)
        except ValueError:
            parsed = arguments
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": parsed})
    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": blocks, "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }  # fmt: skip
    done = {
        **message,
        "id": "msg_2",
        "content": [{"type": "text", "text": "4 words."}],
        "stop_reason": "end_turn",
    }
    model = FakeModel([message, done])
    client = anthropic.Anthropic(
        api_key="sk-ant-test", base_url="http://model.test",
        http_client=httpx.Client(transport=httpx.MockTransport(model)),
    )  # fmt: skip
    tools = tools_box.specs("anthropic", strict=True, python=True)
    messages: list[Any] = [{"role": "user", "content": "Count the words."}]
    response = client.messages.create(model="claude-test", max_tokens=1024, messages=messages, tools=tools)
    assert isinstance(response.content[1], anthropic.types.ToolUseBlock)
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in response.content]}
    )
    messages.append(
        {"role": "user", "content": tools_box.dispatch(response, format="anthropic", python=True)}
    )
    final = client.messages.create(model="claude-test", max_tokens=1024, messages=messages, tools=tools)
    assert final.content[0].text == "4 words."

    first, second = (r["body"] for r in model.requests)
    assert [r["path"] for r in model.requests] == ["/v1/messages"] * 2
    for body in (first, second):
        assert all(t["strict"] is True for t in body["tools"])
        assert_strict(body["tools"], lambda t: t["input_schema"])
    uses = [b for b in second["messages"][1]["content"] if b["type"] == "tool_use"]
    results = second["messages"][2]["content"]
    assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses] == [c for c, _, _ in CALLS]
    assert [r["is_error"] for r in results] == [False, False, True, True, False, True]
    by_id = {r["tool_use_id"]: r["content"] for r in results}
    bad = json.loads(by_id["call_bad"])["error"]
    assert bad == {"kind": "invalid_arguments", "message": "arguments must be a JSON object, got string"}
    by_id["call_bad"] = json.dumps({"error": {"kind": "invalid_arguments", "message": "not valid JSON"}})
    check_results(by_id)
