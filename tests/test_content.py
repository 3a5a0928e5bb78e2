"""Binary output on its way to a model: `result_content`'s parts, and how each channel carries
them (Anthropic, OpenAI Chat and Responses through the real SDK clients over a mock HTTP
transport; MCP through the real client, over stdio and in-process; the framework adapters).
Every image or blob is decoded where it arrives and compared with the tool's own bytes."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._content import INLINE_BASE64, result_content

from .conftest import CAPABILITIES

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

ALL_BYTES = bytes(range(256)) * 4  # not UTF-8; within INLINE_BASE64
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
PNG_ARGS = {"values": [3, -1.5, 2], "width": 64, "height": 48}
SVG_ARGS = {"values": [1, 2], "labels": ["a", "b"], "format": "svg"}
CALLS = [("c_png", "bar_chart", PNG_ARGS), ("c_svg", "bar_chart", SVG_ARGS), ("c_blob", "blob", {}),
         ("c_pdf", "pdf", {})]  # fmt: skip
PDF_TEXT = "%PDF-1.4 tiny"


@pytest.fixture
def media_box(box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path) -> wasmbox.Sandbox:
    """bar_chart; `blob`, whose stdout is ALL_BYTES (fsprobe reads a file to stdout); and
    `pdf`, which writes an output file declared application/pdf."""
    fsprobe = str(built_examples / "fsprobe.wasm")
    box.load(CAPABILITIES / "bar_chart.toml")
    box.load(_blob_manifest(built_examples, tmp_path))
    box.load({"name": "pdf", "module": fsprobe, "args": ["write", "/tmp/doc.pdf", PDF_TEXT], "scratch": "1MiB",
              "input_schema": NO_ARGS, "command": {"outputs": [{"path": "/tmp/doc.pdf", "media_type": "application/pdf"}]}})  # fmt: skip
    return box


def _blob_manifest(built_examples: Path, folder: Path) -> dict[str, Any]:
    (folder / "blob.bin").write_bytes(ALL_BYTES)
    return {"name": "blob", "module": str(built_examples / "fsprobe.wasm"), "args": ["read", "/data/blob.bin"],
            "input_schema": NO_ARGS, "preopens": [{"host": str(folder), "guest": "/data"}]}  # fmt: skip


def _png(box: wasmbox.Sandbox) -> bytes:
    """The chart's PNG as the tool itself returns it."""
    data = box.tools["bar_chart"].call(PNG_ARGS).files["/tmp/chart.png"]
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return data


def _note(text: str, name: str) -> dict[str, Any]:
    (note,) = [n for n in json.loads(text)["attachments"] if n["name"] == name]
    return note


def test_result_content_lists_binary_parts_and_keeps_text_files(media_box: wasmbox.Sandbox) -> None:
    png = _png(media_box)
    content = result_content(media_box.tools["bar_chart"].call(PNG_ARGS))
    assert not content.is_error
    ((part),) = content.parts
    assert (part.name, part.media_type, part.data) == ("/tmp/chart.png", "image/png", png)
    body = json.loads(content.text)
    assert body["stdout"].startswith("wrote /tmp/chart.png") and body["value"] == {"exit_code": 0}
    # the text names the image; its bytes are never in it (an image is not inlined as base64)
    assert body["attachments"] == [{"name": "/tmp/chart.png", "media_type": "image/png", "size": len(png)}]

    svg = media_box.tools["bar_chart"].call(SVG_ARGS)
    content = result_content(svg)  # UTF-8 text: whole in the text, not a part
    assert content.parts == () and json.loads(content.text)["files"] == {
        "/tmp/chart.svg": svg.files["/tmp/chart.svg"].decode()
    }

    blob = result_content(media_box.tools["blob"].call())  # not UTF-8: a part, small: inlined
    assert [(p.name, p.media_type, p.data) for p in blob.parts] == [
        ("stdout", "application/octet-stream", ALL_BYTES)
    ]
    body = json.loads(blob.text)
    assert "stdout" not in body  # (the lossy U+FFFD view is not sent)
    assert base64.b64decode(_note(blob.text, "stdout")["base64"], validate=True) == ALL_BYTES


def test_large_binaries_are_named_not_inlined(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    data = bytes([0xFF]) * (INLINE_BASE64 + 1)
    (tmp_path / "big.bin").write_bytes(data)
    tool = box.load({"name": "big", "module": str(built_examples / "fsprobe.wasm"), "args": ["read", "/d/big.bin"],
                     "preopens": [{"host": str(tmp_path), "guest": "/d"}]})  # fmt: skip
    content = result_content(tool.call())
    assert content.parts[0].data == data
    assert _note(content.text, "stdout") == {"name": "stdout", "media_type": "application/octet-stream",
                                            "size": INLINE_BASE64 + 1}  # fmt: skip
    assert len(content.text) < 500


def _reader(
    box: wasmbox.Sandbox, built_examples: Path, folder: Path, data: bytes, **fields: Any
) -> wasmbox.Tool:
    """A tool whose stdout is `data` (fsprobe reads it from a file)."""
    (folder / "out").write_bytes(data)
    return box.load({"name": "reader", "module": str(built_examples / "fsprobe.wasm"), "args": ["read", "/d/out"],
                     "preopens": [{"host": str(folder), "guest": "/d"}], **fields})  # fmt: skip


def test_mostly_text_that_is_not_utf8_stays_text(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    latin1 = "café au lait, crème brûlée\n".encode("latin-1") * 20
    result = _reader(box, built_examples, tmp_path, latin1).call()
    assert result.stdout_bytes == latin1  # (the exact bytes stay in the CallResult)
    content = result_content(result)
    assert content.parts == () and json.loads(content.text)["stdout"] == result.stdout  # lossy, but readable


def test_a_stream_cut_mid_character_at_the_cap_stays_text(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    result = _reader(box, built_examples, tmp_path, "é".encode() * 600, limits={"output": "1001"}).call()
    assert result.truncated and result.stdout_bytes is not None and result.stdout.endswith("\ufffd")
    body = json.loads(result_content(result).text)
    assert body["stdout"] == "é" * 500 + "\ufffd" and body["truncated"] is True and "attachments" not in body


def test_an_ascii_pdf_on_stdout_is_a_part(box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path) -> None:
    result = _reader(box, built_examples, tmp_path, b"%PDF-1.4 ascii only").call()
    assert result.stdout_bytes is None and result.media_types == {"stdout": "application/pdf"}
    content = result_content(result)
    assert [(p.name, p.media_type, p.data) for p in content.parts] == [
        ("stdout", "application/pdf", b"%PDF-1.4 ascii only")
    ]
    assert "stdout" not in json.loads(content.text)


# -- Anthropic ----------------------------------------------------------------------------------


class FakeModel:
    """An HTTP handler that records each request body and replies with the next scripted one."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, json=self.replies.pop(0))


def test_anthropic_gets_image_and_document_blocks(media_box: wasmbox.Sandbox) -> None:
    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": [{"type": "tool_use", "id": i, "name": n, "input": a} for i, n, a in CALLS],
        "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
    }  # fmt: skip
    done = {**message, "id": "msg_2", "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}
    model = FakeModel([message, done])
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url="http://model.test",
                                 http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    tools = media_box.specs("anthropic")
    messages: list[Any] = [{"role": "user", "content": "Chart 3, -1.5, 2."}]
    response = client.messages.create(model="claude-test", max_tokens=100, messages=messages, tools=tools)
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in response.content]}
    )
    messages.append({"role": "user", "content": media_box.dispatch(response, format="anthropic")})
    client.messages.create(model="claude-test", max_tokens=100, messages=messages, tools=tools)

    sent = {r["tool_use_id"]: r for r in model.bodies[1]["messages"][2]["content"]}
    text, image = sent["c_png"]["content"]  # what went over the wire, as the API reads it
    assert text["type"] == "text" and _note(text["text"], "/tmp/chart.png")["media_type"] == "image/png"
    assert image["type"] == "image" and image["source"]["type"] == "base64"
    assert image["source"]["media_type"] == "image/png"
    assert base64.b64decode(image["source"]["data"], validate=True) == _png(media_box)
    assert "<svg" in json.loads(sent["c_svg"]["content"])["files"]["/tmp/chart.svg"]  # SVG is text
    blob = sent["c_blob"]["content"]  # no block for arbitrary bytes: base64 in the text
    assert isinstance(blob, str) and base64.b64decode(_note(blob, "stdout")["base64"]) == ALL_BYTES
    text, document = sent["c_pdf"]["content"]
    assert document["type"] == "document" and document["title"] == "/tmp/doc.pdf"
    assert document["source"]["media_type"] == "application/pdf"
    assert base64.b64decode(document["source"]["data"]) == PDF_TEXT.encode()
    assert [r["is_error"] for r in sent.values()] == [False] * 4


# -- OpenAI -------------------------------------------------------------------------------------


def test_openai_chat_carries_the_note_and_small_blobs(media_box: wasmbox.Sandbox) -> None:
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in CALLS
    ]
    completion = {
        "id": "c1", "object": "chat.completion", "created": 0, "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None,
                     "message": {"role": "assistant", "content": None, "tool_calls": calls}}],
    }  # fmt: skip
    model = FakeModel([completion, completion])
    client = openai.OpenAI(api_key="sk-test", base_url="http://model.test/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "chart"}]
    message = client.chat.completions.create(model="gpt-test", messages=messages).choices[0].message
    messages += [message.model_dump(exclude_none=True), *media_box.dispatch(message, format="openai")]
    client.chat.completions.create(model="gpt-test", messages=messages)

    sent = {m["tool_call_id"]: m["content"] for m in model.bodies[1]["messages"] if m["role"] == "tool"}
    assert all(isinstance(content, str) for content in sent.values())  # a tool message is text only
    png = _png(media_box)
    assert _note(sent["c_png"], "/tmp/chart.png") == {"name": "/tmp/chart.png", "media_type": "image/png",
                                                       "size": len(png)}  # fmt: skip
    assert base64.b64encode(png).decode()[:40] not in sent["c_png"]
    assert base64.b64decode(_note(sent["c_blob"], "stdout")["base64"]) == ALL_BYTES
    assert base64.b64decode(_note(sent["c_pdf"], "/tmp/doc.pdf")["base64"]) == PDF_TEXT.encode()


def test_openai_responses_gets_input_image_and_input_file(media_box: wasmbox.Sandbox) -> None:
    output = [{"type": "function_call", "id": f"fc_{i}", "call_id": i, "name": n, "arguments": json.dumps(a),
               "status": "completed"} for i, n, a in CALLS]  # fmt: skip
    body = {"id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-test", "status": "completed",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
    model = FakeModel([body, body])
    client = openai.OpenAI(api_key="sk-test", base_url="http://model.test/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    inputs: list[Any] = [{"role": "user", "content": "chart"}]
    response = client.responses.create(model="gpt-test", input=inputs)
    inputs += [item.model_dump(exclude_none=True) for item in response.output]
    inputs += media_box.dispatch(response, format="openai-responses")
    client.responses.create(model="gpt-test", input=inputs)

    sent = {
        i["call_id"]: i["output"] for i in model.bodies[1]["input"] if i.get("type") == "function_call_output"
    }
    text, image = sent["c_png"]
    assert text["type"] == "input_text" and "/tmp/chart.png" in text["text"]
    assert image["type"] == "input_image" and image["image_url"].startswith("data:image/png;base64,")
    assert base64.b64decode(image["image_url"].split(",", 1)[1], validate=True) == _png(media_box)
    text, document = sent["c_pdf"]
    assert document["type"] == "input_file" and document["filename"] == "doc.pdf"
    assert (
        base64.b64decode(document["file_data"].removeprefix("data:application/pdf;base64,"))
        == PDF_TEXT.encode()
    )
    assert isinstance(sent["c_blob"], str) and isinstance(sent["c_svg"], str)


# -- MCP ----------------------------------------------------------------------------------------


def _check_mcp(png: bytes, chart: Any, blob: Any) -> None:
    import mcp_types as types

    text, image = chart.content
    assert isinstance(text, types.TextContent) and isinstance(image, types.ImageContent)
    assert image.mime_type == "image/png" and base64.b64decode(image.data, validate=True) == png
    assert _note(text.text, "/tmp/chart.png")["size"] == len(png)
    text, resource = blob.content
    assert isinstance(resource, types.EmbeddedResource)
    assert isinstance(resource.resource, types.BlobResourceContents)
    assert resource.resource.uri == "wasmbox:stdout"
    assert resource.resource.mime_type == "application/octet-stream"
    assert base64.b64decode(resource.resource.blob, validate=True) == ALL_BYTES


def test_mcp_in_process_gets_image_and_blob_content(media_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("mcp")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    async def run() -> tuple[Any, Any]:
        async with Client(wasmbox_mcp.build_server(media_box)) as client:
            return await client.call_tool("bar_chart", PNG_ARGS), await client.call_tool("blob", {})

    _check_mcp(_png(media_box), *asyncio.run(asyncio.wait_for(run(), 60)))


def test_mcp_stdio_gets_the_png_byte_identical(
    media_box: wasmbox.Sandbox, built_examples: Path, cache_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("mcp")
    from mcp import ClientSession, StdioServerParameters, stdio_client

    manifest = tmp_path / "blob.json"
    manifest.write_text(json.dumps(_blob_manifest(built_examples, tmp_path)))
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "wasmbox", "mcp", "serve", str(CAPABILITIES / "bar_chart.toml"), str(manifest)],
        env={"WASMBOX_CACHE_DIR": str(cache_dir), "PYTHONPATH": os.pathsep.join(sys.path)},
    )

    async def run() -> tuple[Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool("bar_chart", PNG_ARGS), await session.call_tool("blob", {})

    _check_mcp(_png(media_box), *asyncio.run(asyncio.wait_for(run(), 300)))


# -- framework adapters -------------------------------------------------------------------------


def test_langchain_tool_message_has_an_image_block(media_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import ToolCall

    from wasmbox.integrations.langchain import tools

    by_name = {tool.name: tool for tool in tools(media_box)}
    call = ToolCall(name="bar_chart", args=PNG_ARGS, id="call-1", type="tool_call")
    message = by_name["bar_chart"].invoke(call)
    text, image = message.content
    assert text["type"] == "text" and "/tmp/chart.png" in text["text"]
    assert image == {"type": "image", "base64": image["base64"], "mime_type": "image/png"}
    assert base64.b64decode(image["base64"]) == _png(media_box)
    blob = by_name["blob"].invoke(ToolCall(name="blob", args={}, id="call-2", type="tool_call"))
    assert base64.b64decode(_note(blob.content, "stdout")["base64"]) == ALL_BYTES
    _, document = by_name["pdf"].invoke(ToolCall(name="pdf", args={}, id="call-3", type="tool_call")).content
    assert document["type"] == "file" and document["mime_type"] == "application/pdf"
    assert base64.b64decode(document["base64"]) == PDF_TEXT.encode()


def test_pydantic_ai_returns_binary_content(media_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent, BinaryContent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from wasmbox.integrations.pydantic_ai import WasmboxToolset

    received: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("bar_chart", PNG_ARGS, tool_call_id="c1"),
                                        ToolCallPart("pdf", {}, tool_call_id="c2")])  # fmt: skip
        for message in messages[1:]:
            if isinstance(message, ModelRequest):
                for part in message.parts:
                    content = getattr(part, "content", None)
                    received.extend(content if isinstance(content, list) else [content])
        return ModelResponse(parts=[TextPart("done")])

    run = Agent(FunctionModel(model), toolsets=[WasmboxToolset(media_box)]).run_sync("chart")
    assert run.output == "done"
    images = [item for item in received if isinstance(item, BinaryContent)]
    assert sorted((i.media_type, i.data) for i in images) == [
        ("application/pdf", PDF_TEXT.encode()),
        ("image/png", _png(media_box)),
    ]
    assert any(isinstance(item, str) and "/tmp/chart.png" in item for item in received)


def test_agents_sdk_sends_input_image(media_box: wasmbox.Sandbox) -> None:
    pytest.importorskip("agents")
    import httpx2
    from agents import Agent, RunConfig, Runner
    from agents.models.openai_responses import OpenAIResponsesModel

    from wasmbox.integrations.agents import tools

    bodies: list[dict[str, Any]] = []

    def handler(request: Any) -> Any:
        bodies.append(json.loads(request.content))
        if len(bodies) == 1:
            output: list[Any] = [{"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "bar_chart",
                       "arguments": json.dumps(PNG_ARGS), "status": "completed"}]  # fmt: skip
        else:
            output = [{"type": "message", "id": "m1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": "done", "annotations": []}]}]  # fmt: skip
        return httpx2.Response(200, json={
            "id": f"resp_{len(bodies)}", "object": "response", "created_at": 0, "model": "m",
            "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": [], "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                                   "input_tokens_details": {"cached_tokens": 0},
                                   "output_tokens_details": {"reasoning_tokens": 0}},
        })  # fmt: skip

    client = openai.AsyncOpenAI(api_key="test", base_url="http://model.test/v1",
                                http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))  # fmt: skip
    agent = Agent(name="a", tools=tools(media_box), model=OpenAIResponsesModel("m", client))
    result = asyncio.run(Runner.run(agent, "chart", run_config=RunConfig(tracing_disabled=True)))
    assert result.final_output == "done"
    (output,) = [i["output"] for i in bodies[1]["input"] if i.get("type") == "function_call_output"]
    text, image = output
    assert text["type"] == "input_text" and "/tmp/chart.png" in text["text"]
    assert image["type"] == "input_image"
    assert base64.b64decode(image["image_url"].removeprefix("data:image/png;base64,")) == _png(media_box)
