"""Sandbox.dispatch / adispatch: a model's tool calls in, the provider's tool results out."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox.integrations import result_content

from .conftest import manifest

SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["text"],
    "additionalProperties": False,
}


@pytest.fixture
def echo_box(box: wasmbox.Sandbox) -> wasmbox.Sandbox:
    box.load(manifest("echo", input_schema=SCHEMA))
    return box


def openai_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def error_of(text: str) -> dict[str, str]:
    return json.loads(text)["error"]


def test_openai_calls_answered_in_order_with_their_ids(echo_box: wasmbox.Sandbox) -> None:
    calls = [
        openai_call("c1", "echo", '{"text": "one"}'),
        openai_call("c2", "echo", "{not json"),
        openai_call("c3", "nope", "{}"),
        openai_call("c4", "echo", '{"text": 4}'),
        openai_call("c5", "echo", '["text"]'),
        openai_call("c6", "echo", '{"text": "six", "n": null}'),  # null as strict mode sends it
    ]
    replies = echo_box.dispatch(calls, format="openai")
    assert [r["tool_call_id"] for r in replies] == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert all(r["role"] == "tool" and set(r) == {"role", "tool_call_id", "content"} for r in replies)
    assert json.loads(replies[0]["content"]) == {"text": "one"}
    assert error_of(replies[1]["content"])["kind"] == "invalid_arguments"
    assert "not valid JSON" in error_of(replies[1]["content"])["message"]
    assert error_of(replies[2]["content"]) == {
        "kind": "invalid_arguments", "message": "no tool named 'nope'; the tools are: echo",
    }  # fmt: skip
    assert error_of(replies[3]["content"]) == {
        "kind": "invalid_arguments", "message": "args.text: expected string, got integer",
    }  # fmt: skip
    assert error_of(replies[4]["content"])["message"] == "arguments must be a JSON object, got array"
    assert json.loads(replies[5]["content"]) == {"text": "six"}  # the introduced null removed


def test_responses_and_anthropic_formats(echo_box: wasmbox.Sandbox) -> None:
    items = [
        {"type": "reasoning", "id": "rs_1", "summary": []},  # not a call: skipped
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "echo", "arguments": '{"text": "r"}'},
        {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "echo", "arguments": "{}"},
    ]  # fmt: skip
    replies = echo_box.dispatch({"output": items}, format="openai-responses")
    assert replies[0] == {"type": "function_call_output", "call_id": "call_1", "output": '{"text":"r"}'}
    assert replies[1]["call_id"] == "call_2" and error_of(replies[1]["output"])["kind"] == "invalid_arguments"
    blocks = [
        {"type": "text", "text": "Let me echo that."},
        {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"text": "a"}},
        {"type": "tool_use", "id": "toolu_2", "name": "echo", "input": {"text": None}},
    ]
    replies = echo_box.dispatch(blocks, format="anthropic")
    assert replies[0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": '{"text":"a"}',
        "is_error": False,
    }
    assert replies[1]["tool_use_id"] == "toolu_2" and replies[1]["is_error"] is True


def test_content_of_strings_output_and_failures(box: wasmbox.Sandbox, built_examples: Path) -> None:
    def content(result: wasmbox.CallResult) -> tuple[str, bool]:
        c = result_content(result)
        return c.text, c.is_error

    ok = wasmbox.CallResult(tool="t", ok=True, value="plain text")
    assert content(ok) == ("plain text", False)
    assert content(ok.model_copy(update={"value": {"b": b"\x00\xff", "n": 1.5, "s": "é"}})) == (
        '{"b":"AP8=","n":1.5,"s":"é"}', False,
    )  # fmt: skip
    printed = ok.model_copy(update={"value": {"exit_code": 0}, "stdout": "out", "truncated": True})
    assert content(printed) == ('{"value":{"exit_code":0},"stdout":"out","truncated":true}', False)
    failed = wasmbox.CallResult.failed("t", wasmbox.ErrorKind.OUT_OF_FUEL, "used 5 fuel")
    assert content(failed.model_copy(update={"stderr": "warn"})) == (
        '{"error":{"kind":"out_of_fuel","message":"used 5 fuel"},"stderr":"warn"}', True,
    )  # fmt: skip
    # a WASI command's output is what the model needs to see
    box.load(Path(built_examples).parent.parent.parent / "capabilities" / "fsprobe.toml")
    text, is_error = content(box.call("fsprobe", argv=["ls", "/data"]))
    assert not is_error and "sample.txt" in json.loads(text)["stdout"]


def test_run_python_is_dispatched_only_when_asked(box: wasmbox.Sandbox) -> None:
    calls = [openai_call("p1", "run_python", '{"code": "print(\'hi\')\\n6 * 7"}')]
    assert error_of(box.dispatch(calls, format="openai")[0]["content"])["message"].startswith(
        "no tool named 'run_python'"
    )
    (reply,) = box.dispatch(calls, format="openai", python=True)
    assert json.loads(reply["content"]) == {"value": 42, "stdout": "hi\n"}
    bad = [openai_call("p2", "run_python", '{"code": 1}'), openai_call("p3", "run_python", '{"code": "1/0"}')]
    replies = box.dispatch(bad, format="openai", python=True)
    assert error_of(replies[0]["content"])["kind"] == "invalid_arguments"
    assert error_of(replies[1]["content"])["kind"] == "guest_error"
    assert "ZeroDivisionError" in error_of(replies[1]["content"])["message"]


def test_calls_past_max_calls_come_back_as_errors(echo_box: wasmbox.Sandbox) -> None:
    calls = [openai_call(f"c{i}", "echo", json.dumps({"text": str(i)})) for i in range(500)]
    replies = echo_box.dispatch(calls, format="openai", max_calls=3)
    assert len(replies) == 500 and [r["tool_call_id"] for r in replies] == [f"c{i}" for i in range(500)]
    assert [json.loads(r["content"]) for r in replies[:3]] == [{"text": "0"}, {"text": "1"}, {"text": "2"}]
    refused = error_of(replies[3]["content"])
    assert refused["kind"] == "host_error" and "at most 3 tool calls" in refused["message"]
    assert all("error" in json.loads(r["content"]) for r in replies[3:])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_deadline_answers_for_unfinished_and_unstarted_calls(cache_dir: Path, mode: str) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, max_workers=1) as box:  # one worker: "queued" waits
        box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "1s"}))
        box.load(manifest("echo"))
        calls = [openai_call("slow", "spin", "{}"), openai_call("queued", "echo", "{}")]
        if mode == "sync":
            replies = box.dispatch(calls, format="openai", deadline_s=0.1)
        else:
            replies = asyncio.run(box.adispatch(calls, format="openai", deadline_s=0.1))
        slow, queued = (error_of(r["content"]) for r in replies)
        assert slow["kind"] == "timeout" and "before this call finished" in slow["message"]
        assert queued == {
            "kind": "timeout",
            "message": "not run: the dispatch deadline passed before this call started",
        }


def test_adispatch_runs_calls_concurrently_and_matches_dispatch(echo_box: wasmbox.Sandbox) -> None:
    calls = [openai_call(f"c{i}", "echo", json.dumps({"text": str(i)})) for i in range(20)]
    calls.append(openai_call("bad", "echo", "{"))
    assert asyncio.run(echo_box.adispatch(calls, format="openai")) == echo_box.dispatch(
        calls, format="openai"
    )


def test_wiring_errors_raise(echo_box: wasmbox.Sandbox) -> None:
    with pytest.raises(ValueError, match="unknown call format"):
        echo_box.dispatch([], format="gemini")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a openai tool call"):
        echo_box.dispatch([{"function": {"name": "echo"}}], format="openai")
    with pytest.raises(TypeError, match="list of anthropic tool calls"):
        echo_box.dispatch("tool_use", format="anthropic")
    with pytest.raises(ValueError, match="max_calls"):
        echo_box.dispatch([], format="openai", max_calls=-1)
    with pytest.raises(ValueError, match="deadline_s"):
        echo_box.dispatch([], format="openai", deadline_s=0)
    assert echo_box.dispatch([], format="openai") == []
    assert echo_box.dispatch({"tool_calls": None}, format="openai") == []


def test_hostile_arguments_are_error_results(echo_box: wasmbox.Sandbox) -> None:
    deep = '{"text": "x", "n": ' + "[" * 200 + "null" + "]" * 200 + "}"
    calls = [
        openai_call("c1", "echo", "[" * 100_000),  # past the JSON parser's recursion limit
        openai_call("c2", "echo", deep),  # parses, but deeper than any args may be
        openai_call("c3", "echo", '{"text": "\\ud800"}'),  # a lone surrogate
        openai_call("c4", "echo", "x" * 1_000_000),
        openai_call("c5", "n" * 1_000_000, "{}"),
    ]
    replies = echo_box.dispatch(calls, format="openai")
    kinds = [json.loads(r["content"]).get("error", {}).get("kind") for r in replies]
    assert kinds[0] == kinds[1] == kinds[3] == kinds[4] == "invalid_arguments"
    assert kinds[2] in (None, "invalid_arguments")  # either way an answer, not an exception
    assert all(len(r["content"]) < 2000 for r in replies)  # the message does not echo the input


def test_dispatch_from_inside_a_call_runs_on_its_thread(cache_dir: Path) -> None:
    """A host function that dispatches calls, itself running on the only worker thread: the
    calls run one by one on that thread instead of waiting for a worker that never frees."""
    with wasmbox.Sandbox(cache_dir=cache_dir, max_workers=1) as box:
        box.load(manifest("echo"))

        @box.host_function("host.fn")
        def host_fn(n: int) -> list[str]:
            calls = [openai_call(f"c{i}", "echo", json.dumps({"i": i})) for i in range(n)]
            # (the deadline: were they queued for the busy worker, the test fails rather than hangs)
            return [r["content"] for r in box.dispatch(calls, format="openai", deadline_s=10)]

        box.load(manifest("forward", host_functions=["host.fn"], limits={"timeout": "5s"}))
        result = asyncio.run(box.acall("forward", {"n": 3}))
        assert result.unwrap() == ['{"i":0}', '{"i":1}', '{"i":2}']
