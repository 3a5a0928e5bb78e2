"""Tools that declare what they return (`output_schema`), example args and `defer_loading`:
checked at load and on every call, and carried into each provider's format, the real SDKs'
types, and MCP's `outputSchema`/`structuredContent` through the real `mcp` client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, get_type_hints

import pytest
from pydantic import BaseModel

import wasmbox
from wasmbox.integrations import strict_schema

from .conftest import manifest

ECHOED = {  # what the echo module returns (its args) must look like
    "type": "object",
    "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["text"],
}
ARGS = {
    "type": "object",
    "properties": {"text": {"type": "string"}, "n": {"type": "integer"}},
    "required": ["text"],
    "additionalProperties": False,
}
STATS_PY = '''
def main(text: str, as_bytes: bool = False) -> dict[str, int]:
    """Count words and lines."""
    if as_bytes:
        return {"words": text.encode()}  # breaks its own annotation
    return {"words": len(text.split()), "lines": text.count("\\n") + 1}
'''
WRONG_PY = """
def main(n: int) -> list[int]:
    return [n, "not an int"] if n < 0 else [n, n * 2]
"""
BLOB_PY = """
def main() -> dict:
    return {"raw": b"\\xff\\xfe", "n": 1}

def nan() -> dict[str, float]:
    return {"x": float("nan")}
"""


class Summary(BaseModel):
    words: int
    top: list[str]


def _python_tool(box: wasmbox.Sandbox, tmp_path: Path, name: str, source: str, **fields: Any) -> wasmbox.Tool:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return box.load({"name": name, "runtime": "python", "source": str(path), **fields})


def test_a_core_tools_value_is_checked_against_its_output_schema(box: wasmbox.Sandbox) -> None:
    tool = box.load(manifest("echo", output_schema=ECHOED))
    assert tool.output_schema == ECHOED
    ok = tool.call({"text": "hi", "n": 2})
    assert ok.ok and ok.value == {"text": "hi", "n": 2}
    broken = tool.call({"n": "two"})  # echoed back: no `text`, `n` not an integer
    assert not broken.ok and broken.value is None
    assert broken.error is not None and broken.error.kind is wasmbox.ErrorKind.BAD_RESPONSE
    assert broken.error.message.startswith("the value breaks the tool's output_schema: result")
    assert "'text'" in broken.error.message or "result.n" in broken.error.message
    assert broken.fuel_used > 0  # the call ran; only its value was refused
    assert tool.call({"text": "again"}).ok  # and the Sandbox keeps serving


def test_a_python_tool_takes_its_output_schema_from_the_return_annotation(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    stats = _python_tool(box, tmp_path, "stats", STATS_PY)
    assert stats.output_schema == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert stats.call({"text": "a b\nc"}).value == {"words": 3, "lines": 2}
    broken = stats.call({"text": "a", "as_bytes": True})
    assert broken.error is not None and broken.error.kind is wasmbox.ErrorKind.BAD_RESPONSE
    assert "result.words: expected integer, got string" in broken.error.message  # bytes as base64 text

    wrong = _python_tool(box, tmp_path, "pairs", WRONG_PY)
    assert wrong.output_schema == {"type": "array", "items": {"type": "integer"}}
    assert wrong.call({"n": 2}).value == [2, 4]
    failed = wrong.call({"n": -1})
    assert failed.error is not None and failed.error.kind is wasmbox.ErrorKind.BAD_RESPONSE
    assert "result[1]: expected integer, got string" in failed.error.message

    # bytes in a value are checked as the JSON a router forwards (base64 text), not refused
    blob = _python_tool(box, tmp_path, "blob", BLOB_PY)
    assert blob.output_schema == {"type": "object"}
    assert blob.call().value == {"raw": b"\xff\xfe", "n": 1}
    # a value JSON cannot hold as it is cannot slip past the check: it is checked as forwarded
    nan = _python_tool(box, tmp_path, "nan", BLOB_PY, entry="nan")
    refused = nan.call()
    assert refused.error is not None and refused.error.kind is wasmbox.ErrorKind.BAD_RESPONSE
    assert "result.x: expected number, got null (checked as JSON" in refused.error.message


def test_the_manifests_output_schema_wins_over_the_annotation(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    stats = _python_tool(box, tmp_path, "stats", STATS_PY, output_schema={"type": "string"})
    assert stats.output_schema == {"type": "string"}
    result = stats.call({"text": "a"})
    assert result.error is not None and "result: expected string, got object" in result.error.message


def test_a_pydantic_model_is_an_output_schema(box: wasmbox.Sandbox) -> None:
    tool = box.load(manifest("echo", output_schema=Summary))
    assert tool.output_schema == Summary.model_json_schema(mode="serialization")
    assert tool.call({"words": 2, "top": ["a", "b"]}).ok
    broken = tool.call({"words": 2})
    assert broken.error is not None and "missing required property 'top'" in broken.error.message


def test_bad_output_schemas_and_examples_are_refused_at_load(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    with pytest.raises(wasmbox.ManifestError, match="output_schema.*nullable"):
        box.load(manifest("echo", output_schema={"type": "string", "nullable": True}))
    with pytest.raises(
        wasmbox.ManifestError, match=r"examples\[1\] breaks the args schema: args.n: expected integer"
    ):
        box.load(manifest("echo", input_schema=ARGS, examples=[{"text": "a"}, {"text": "b", "n": "2"}]))
    # a Python tool's examples are checked against the schema its signature gives
    with pytest.raises(wasmbox.ManifestError, match=r"examples\[0\].*missing required property 'text'"):
        _python_tool(box, tmp_path, "stats", STATS_PY, examples=[{"as_bytes": True}])
    box.register_host_function("host.fn", lambda: None)
    with pytest.raises(wasmbox.ManifestError, match="a WASI command's value is"):
        box.load(manifest("command_host", host_functions=["host.fn"], output_schema={"type": "object"}))
    with pytest.raises(wasmbox.ManifestError, match="grant set"):
        box.load({"name": "grants", "runtime": "python", "output_schema": {"type": "object"}})
    assert box.tools == {}  # nothing half-loaded


def test_each_format_carries_what_it_has_a_field_for(box: wasmbox.Sandbox) -> None:
    examples = [{"text": "hello"}, {"text": "hi", "n": 3}]
    tool = box.load(manifest(
        "echo", description="Echo", input_schema=ARGS, output_schema=ECHOED, examples=examples,
        defer_loading=True,
    ))  # fmt: skip
    described = 'Echo\n\nExample args:\n{"text":"hello"}\n{"text":"hi","n":3}'
    assert tool.spec() == {
        "name": "echo", "description": "Echo", "parameters": ARGS, "output_schema": ECHOED,
        "examples": examples, "defer_loading": True,
    }  # fmt: skip
    assert tool.spec("openai")["function"]["description"] == described
    assert set(tool.spec("openai")["function"]) == {"name", "description", "parameters", "strict"}
    responses = tool.spec("openai-responses")
    assert responses["output_schema"] == ECHOED and responses["defer_loading"] is True
    assert responses["description"] == described
    anthropic = tool.spec("anthropic")
    assert anthropic["input_examples"] == examples and anthropic["defer_loading"] is True
    assert anthropic["description"] == "Echo"
    # in strict mode every property is required: an example gives the ones it leaves out as null
    strict = tool.spec("anthropic", strict=True)
    assert strict["input_schema"] == strict_schema(ARGS)
    assert strict["input_examples"] == [{"text": "hello", "n": None}, {"text": "hi", "n": 3}]
    mcp = tool.spec("mcp")
    assert mcp["outputSchema"] == ECHOED and mcp["description"] == described
    plain = box.load(manifest("echo", name="plain"))  # nothing declared: nothing added
    assert plain.spec() == {"name": "plain", "description": "", "parameters": {"type": "object"}}
    assert "output_schema" not in plain.spec("openai-responses") and "outputSchema" not in plain.spec("mcp")


def test_strict_examples_are_filled_at_any_depth() -> None:
    from wasmbox._formats import filled

    schema = {
        "type": "object",
        "properties": {
            "where": {"$ref": "#/$defs/Place"},
            "stops": {"type": "array", "items": {"$ref": "#/$defs/Place"}},
        },
        "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                            "required": ["city"], "additionalProperties": False}},
    }  # fmt: skip
    converted = strict_schema(schema)
    got = filled(
        {"where": {"city": "Oslo"}, "stops": [{"city": "Bergen", "zip": "5003"}, {"city": "Tromsø"}]},
        converted,
    )
    assert got == {
        "where": {"city": "Oslo", "zip": None},
        "stops": [{"city": "Bergen", "zip": "5003"}, {"city": "Tromsø", "zip": None}],
    }
    assert wasmbox._schema.validate(got, converted) is None


def test_the_real_sdks_take_the_new_fields(box: wasmbox.Sandbox) -> None:
    """Every key sent is a field of the SDK's own tool type, with a value that type takes, and
    the SDK's client sends it as is (over a mock transport)."""
    httpx = pytest.importorskip("httpx")
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    from anthropic.types import ToolParam
    from openai.types.responses import FunctionToolParam
    from pydantic import TypeAdapter

    box.load(
        manifest(
            "echo", input_schema=ARGS, output_schema=ECHOED, examples=[{"text": "a"}], defer_loading=True
        )
    )
    for format, param in (("openai-responses", FunctionToolParam), ("anthropic", ToolParam)):
        for strict in (False, True):
            (spec,) = box.specs(format, strict=strict)  # type: ignore[arg-type]
            assert set(spec) <= set(get_type_hints(param)), (format, strict)
            checked = dict(TypeAdapter(param).validate_python(spec))
            if "input_examples" in checked:
                checked["input_examples"] = list(checked["input_examples"])
            assert checked == spec, (format, strict)

    sent: list[dict[str, Any]] = []

    def model(request: Any) -> Any:
        sent.append(json.loads(request.content))
        return httpx.Response(400, json={"error": {"type": "invalid_request_error", "message": "stop here"}})

    transport = httpx.MockTransport(model)
    with pytest.raises(anthropic.BadRequestError):
        anthropic.Anthropic(api_key="k", base_url="http://m.test", max_retries=0,
                            http_client=httpx.Client(transport=transport)).messages.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}], tools=box.specs("anthropic"))  # fmt: skip
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(api_key="k", base_url="http://m.test/v1", max_retries=0,
                      http_client=httpx.Client(transport=transport)).responses.create(
            model="m", input="hi", tools=box.specs("openai-responses"))  # fmt: skip
    (to_anthropic,), (to_openai,) = (body["tools"] for body in sent)
    assert to_anthropic["input_examples"] == [{"text": "a"}] and to_anthropic["defer_loading"] is True
    assert to_openai["output_schema"] == ECHOED and to_openai["defer_loading"] is True


def test_mcp_lists_output_schemas_and_returns_structured_content(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    box.load(manifest("echo", output_schema=ECHOED))
    _python_tool(box, tmp_path, "pairs", WRONG_PY)  # a list: wrapped as {"result": [...]}
    box.load(manifest("echo", name="plain"))

    async def run() -> None:
        async with Client(wasmbox_mcp.build_server(box)) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert listed["echo"].output_schema == ECHOED
            assert listed["pairs"].output_schema == {
                "type": "object", "properties": {"result": {"type": "array", "items": {"type": "integer"}}},
                "required": ["result"],
            }  # fmt: skip
            assert listed["plain"].output_schema is None
            # the client checks structuredContent against the listed outputSchema itself
            echoed = await client.call_tool("echo", {"text": "hi"})
            assert echoed.is_error is False and echoed.structured_content == {"text": "hi"}
            pairs = await client.call_tool("pairs", {"n": 3})
            assert pairs.structured_content == {"result": [3, 6]}
            assert json.loads(pairs.content[0].text) == [3, 6]  # type: ignore[union-attr]
            broken = await client.call_tool("pairs", {"n": -1})
            assert broken.is_error is True and broken.structured_content is None
            assert "bad_response" in broken.content[0].text  # type: ignore[union-attr]
            plain = await client.call_tool("plain", {"x": 1})
            assert plain.is_error is False and plain.structured_content is None

    asyncio.run(asyncio.wait_for(run(), 120))
