"""`wasmbox.integrations.langchain.tools`: real LangChain StructuredTools invoked with the
ToolCalls a chat model produces."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("langchain_core", reason="langchain-core is in the test extra: pip install -e '.[test]'")

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

import wasmbox
from wasmbox.integrations.langchain import tools

from .conftest import cache_dir, wat  # noqa: F401

ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}


def _call(name: str, args: dict[str, object], call_id: str = "call-1") -> ToolCall:
    return ToolCall(name=name, args=args, id=call_id, type="tool_call")  # type: ignore[typeddict-item]


def test_tool_calls_become_tool_messages(box: wasmbox.Sandbox) -> None:
    box.load(
        {"name": "echo", "description": "Echo the text", "module": wat("echo"), "input_schema": ECHO_SCHEMA}
    )
    box.load({"name": "trap", "description": "Trap", "module": wat("trap")})
    by_name = {tool.name: tool for tool in tools(box)}
    assert list(by_name) == ["echo", "trap"]
    assert by_name["echo"].description == "Echo the text"
    sent = convert_to_openai_tool(by_name["echo"])["function"]  # what bind_tools sends a model
    assert sent["name"] == "echo" and sent["parameters"] == ECHO_SCHEMA

    ok = by_name["echo"].invoke(_call("echo", {"text": "hé"}))
    assert isinstance(ok, ToolMessage)
    assert ok.tool_call_id == "call-1" and ok.status == "success"
    assert json.loads(ok.content) == {"text": "hé"}  # type: ignore[arg-type]

    bad = by_name["echo"].invoke(_call("echo", {"text": 3}, "call-2"))
    assert bad.status == "error" and bad.tool_call_id == "call-2"
    assert json.loads(bad.content)["error"]["kind"] == "invalid_arguments"  # type: ignore[arg-type]
    trapped = asyncio.run(by_name["trap"].ainvoke(_call("trap", {}, "call-3")))
    assert trapped.status == "error" and json.loads(trapped.content)["error"]["kind"] == "trap"
    # input that is no ToolCall: JSON text is parsed as dispatch parses it, the answer is the content
    assert json.loads(by_name["echo"].invoke('{"text": "json text"}')) == {"text": "json text"}


@pytest.mark.parametrize("invoke", ["sync", "async"])
def test_arguments_cannot_route_the_call_or_reach_langchain(cache_dir, invoke: str) -> None:  # noqa: F811
    """A model's call of tool a with arguments named like the parameters a naive adapter binds
    the tool by (or LangChain passes its own values in) runs tool a with those arguments as
    data, and never tool b."""
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        box.load({"name": "a", "module": wat("echo")})
        box.load({"name": "b", "module": wat("echo")})
        by_name = {tool.name: tool for tool in tools(box)}
        args = {"name": "b", "tool": "b", "arguments": {"name": "b"}, "config": {"x": 1},
                "run_manager": "rm", "callbacks": "cb", "tool_call_id": "t"}  # fmt: skip
        call = _call("a", args)
        if invoke == "sync":
            message = by_name["a"].invoke(call)
        else:
            message = asyncio.run(by_name["a"].ainvoke(call))
        assert message.status == "success"
        assert json.loads(message.content) == args  # type: ignore[arg-type]  # intact, as data
    assert [record.tool for record in records] == ["a"]
