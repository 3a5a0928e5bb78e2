"""A complete tool-calling loop with a scripted fake model, in OpenAI's and Anthropic's formats.

The real `openai` and `anthropic` clients talk to a fake model over httpx.MockTransport (no
network): the model asks for parallel tool calls (one with bad JSON, one unknown tool), wasmbox
runs them and answers, and the next request the SDK sends is printed. Then the model writes one
snippet that calls three tools itself and sends back one answer instead of three results. Last,
the model asks for a chart: matplotlib draws it in the scientific runtime, and the PNG reaches
the next request as an image, in OpenAI Responses', Anthropic's and MCP's shapes (skipped, saying
why, when the scientific runtime cannot be had).

Run it with `./dev demo llm`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

import wasmbox

ROOT = Path(__file__).resolve().parent
CAPS = ROOT / "capabilities"
CALLS = [  # what the fake model asks for: (id, tool, arguments as the model writes them)
    ("call_1", "word_count", '{"path": "/data/sample.txt", "text": null}'),
    ("call_2", "csv_stats", '{"path": "/data/sales.csv", "column": "units", "group_by": "region"}'),
    (
        "call_3",
        "run_python",
        '{"code": "import math\\nprint(\'pi is\', round(math.pi, 4))\\nmath.factorial(20)"}',
    ),
    ("call_4", "word_count", '{"text": "oops, unterminated'),
    ("call_5", "send_email", '{"to": "boss@example.com"}'),
]


def show(title: str, value: Any, limit: int = 1600) -> None:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    print(f"--- {title}")
    print(text if len(text) <= limit else text[:limit] + f"\n... ({len(text) - limit} more characters)")


class FakeModel:
    """Answers the first request with tool calls, the next one (which carries the results)
    with text; prints what it is sent."""

    def __init__(self, first: dict[str, Any], last: dict[str, Any]) -> None:
        self.replies = [first, last]
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(json.loads(request.content))
        return httpx.Response(200, json=self.replies[len(self.requests) - 1])


def openai_loop(box: wasmbox.Sandbox) -> None:
    print("\n======== OpenAI Chat Completions ========")
    tool_calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in CALLS]

    def completion(message: dict[str, Any]) -> dict[str, Any]:
        return {"id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": "fake",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}]}  # fmt: skip

    model = FakeModel(
        completion({"role": "assistant", "content": None, "tool_calls": tool_calls}),
        completion({"role": "assistant", "content": "sample.txt has 30 words; the sales stats are above."}),
    )
    client = openai.OpenAI(api_key="sk-demo", base_url="http://fake-model/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    tools = box.specs("openai", strict=True, python=True)
    messages: list[Any] = [
        {"role": "user", "content": "How many words are in sample.txt? And the sales stats?"}
    ]
    response = client.chat.completions.create(model="fake", messages=messages, tools=tools)
    show("tools sent (strict: " + ", ".join(f"{t['function']['name']}={t['function']['strict']}" for t in tools) + ")",
         tools[0], 900)  # fmt: skip
    message = response.choices[0].message
    print(f"--- the model asks for {len(message.tool_calls or [])} calls at once")
    results = box.dispatch(message, format="openai", python=True, max_calls=10, deadline_s=10)
    messages += [message.model_dump(exclude_none=True), *results]
    final = client.chat.completions.create(model="fake", messages=messages, tools=tools)
    show("the next request's messages (what wasmbox answered)", model.requests[1]["messages"][1:], 4000)
    print(f"--- the model: {final.choices[0].message.content}")


def anthropic_loop(box: wasmbox.Sandbox) -> None:
    print("\n======== Anthropic Messages ========")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "Let me check."}]
    for call_id, name, arguments in CALLS:
        try:
            arguments_value: Any = json.loads(arguments)
        except ValueError:
            arguments_value = {"text": 42}  # Anthropic sends parsed input: a wrong type instead
        blocks.append({"type": "tool_use", "id": f"toolu_{call_id}", "name": name, "input": arguments_value})

    def message(content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
        return {"id": "msg_demo", "type": "message", "role": "assistant", "model": "fake", "content": content,
                "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip

    model = FakeModel(message(blocks, "tool_use"), message([{"type": "text", "text": "Done."}], "end_turn"))
    client = anthropic.Anthropic(api_key="sk-ant-demo", base_url="http://fake-model",
                                 http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    tools = box.specs("anthropic", strict=True, python=True)
    messages: list[Any] = [{"role": "user", "content": "How many words are in sample.txt?"}]
    response = client.messages.create(model="fake", max_tokens=512, messages=messages, tools=tools)
    show("tools sent", tools[1], 900)
    results = box.dispatch(response, format="anthropic", python=True)
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in response.content]},
        {"role": "user", "content": results},
    ]
    final = client.messages.create(model="fake", max_tokens=512, messages=messages, tools=tools)
    show("the next request's last message (the tool results)", model.requests[1]["messages"][-1], 4000)
    print(f"--- the model: {final.content[0].text}")  # type: ignore[union-attr]


# The grant set of run_python when its code may call tools, and the snippet the model writes.
CODE_GRANTS = {"name": "analyst", "runtime": "python", "tools": ["word_count", "csv_stats", "kv_lookup"]}
CODE = """
words = tools.word_count(path="/data/sample.txt")["words"]
stats = tools.csv_stats(path="/data/sales.csv", column="units", group_by="region")
target = int(tools.kv_lookup(key="target")["value"])
regions = stats["by_region"]
best = max(regions, key=lambda region: regions[region]["sum"])
{"words": words, "best_region": best, "units": stats["all"]["sum"], "met_target": stats["all"]["sum"] >= target}
"""


def code_loop(box: wasmbox.Sandbox) -> None:
    print("\n======== Code that calls tools (OpenAI Chat Completions) ========")
    call = {
        "id": "call_code",
        "type": "function",
        "function": {"name": "run_python", "arguments": json.dumps({"code": CODE})},
    }

    def completion(message: dict[str, Any]) -> dict[str, Any]:
        return {"id": "chatcmpl-demo", "object": "chat.completion", "created": 0, "model": "fake",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}]}  # fmt: skip

    model = FakeModel(
        completion({"role": "assistant", "content": None, "tool_calls": [call]}),
        completion(
            {
                "role": "assistant",
                "content": "30 words; north sold the most; 88 units, short of the 100 target.",
            }
        ),
    )
    client = openai.OpenAI(api_key="sk-demo", base_url="http://fake-model/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    tools = box.specs("openai", python=CODE_GRANTS)
    (run_python,) = [t for t in tools if t["function"]["name"] == "run_python"]
    print("--- run_python's description shows the tools its code may call:")
    print(run_python["function"]["description"][:1200])
    messages: list[Any] = [
        {"role": "user", "content": "Words in sample.txt, best region by units, target met?"}
    ]
    response = client.chat.completions.create(model="fake", messages=messages, tools=tools)
    message = response.choices[0].message
    print("--- the model writes one snippet:" + CODE.rstrip())
    results = box.dispatch(message, format="openai", python=CODE_GRANTS)
    show("one answer back, for three tool calls made inside the sandbox", results, 1200)
    messages += [message.model_dump(exclude_none=True), *results]
    final = client.chat.completions.create(model="fake", messages=messages, tools=tools)
    print(f"--- the model: {final.choices[0].message.content}")


# The grant set of a chart: the scientific runtime (matplotlib), a scratch /tmp, the PNGs back.
CHART_GRANTS = {
    "name": "charts", "runtime": "python", "python": "scientific", "scratch": "16MiB",
    "env": {"MPLCONFIGDIR": "/tmp/.matplotlib"}, "outputs": ["/tmp/out/*.png"], "limits": {"fuel": 50_000_000_000, "memory": "1GiB", "timeout": 120, "output": "4MiB"},
}  # fmt: skip
CHART = """
import os
import matplotlib.pyplot as plt
units = {"north": 41, "south": 22, "east": 25}
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
ax.bar(list(units), list(units.values()), color="tab:blue")
ax.set_title("units by region")
os.makedirs("/tmp/out")
fig.savefig("/tmp/out/units.png")
f"north leads with {units['north']} units"
"""


def _image_summary(block: dict[str, Any]) -> dict[str, Any]:
    """An image block with its base64 cut short, to print."""
    shown = dict(block)
    for key in ("image_url", "data"):
        if isinstance(shown.get(key), str):
            shown[key] = shown[key][:48] + f"... ({len(shown[key])} chars)"
    if isinstance(shown.get("source"), dict):
        shown["source"] = _image_summary(shown["source"])
    return shown


def chart_loop(box: wasmbox.Sandbox) -> None:
    print("\n======== A chart: the PNG as an image block ========")
    try:
        box.prepare_scientific()  # (built on first use: minutes, once per cache)
    except (wasmbox.RuntimeBuildError, OSError) as exc:
        print(f"--- skipped: the scientific runtime cannot be had here: {exc}")
        return
    arguments = json.dumps({"code": CHART})
    body = {"id": "resp_demo", "object": "response", "created_at": 0, "model": "fake", "status": "completed",
            "output": [{"type": "function_call", "id": "fc_1", "call_id": "call_chart", "name": "run_python",
                        "arguments": arguments, "status": "completed"}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
    done = {**body, "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                                "content": [{"type": "output_text", "text": "North leads.", "annotations": []}]}]}  # fmt: skip
    model = FakeModel(body, done)
    client = openai.OpenAI(api_key="sk-demo", base_url="http://fake-model/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    inputs: list[Any] = [{"role": "user", "content": "Chart the units by region."}]
    response = client.responses.create(
        model="fake", input=inputs, tools=box.specs("openai-responses", python=CHART_GRANTS)
    )
    inputs += [item.model_dump(exclude_none=True) for item in response.output]
    inputs += box.dispatch(response, format="openai-responses", python=CHART_GRANTS)
    client.responses.create(model="fake", input=inputs)
    (sent,) = [i["output"] for i in model.requests[1]["input"] if i.get("type") == "function_call_output"]
    show(
        "OpenAI Responses: the function_call_output the next request carries",
        [_image_summary(b) for b in sent],
    )

    use = {"type": "tool_use", "id": "toolu_chart", "name": "run_python", "input": {"code": CHART}}
    anthropic_reply = box.dispatch([use], format="anthropic", python=CHART_GRANTS)
    (result,) = anthropic_reply
    show(
        "Anthropic: the tool_result block",
        {**result, "content": [_image_summary(b) for b in result["content"]]},
    )

    try:
        import asyncio

        from mcp import Client

        from wasmbox.integrations import mcp as wasmbox_mcp
    except ImportError:
        print("--- MCP: skipped (pip install 'wasmbox[mcp]')")
        return

    async def over_mcp() -> Any:
        async with Client(wasmbox_mcp.build_server(box, python=CHART_GRANTS)) as client:
            return await client.call_tool("run_python", {"code": CHART})

    called = asyncio.run(over_mcp())
    blocks = [_image_summary(block.model_dump(mode="json", exclude_none=True)) for block in called.content]
    show("MCP: the tools/call result's content", blocks)


def kv_get(key: str) -> str | None:
    """The demo's key-value store, served to kv_lookup as the host function kv.get."""
    return {"target": "100"}.get(key)


def main() -> int:
    with wasmbox.Sandbox() as box:
        box.register_host_function("kv.get", kv_get)
        box.load(CAPS / "word_count.toml")
        box.load(CAPS / "csv_stats.toml")
        box.load(CAPS / "kv_lookup.toml")
        openai_loop(box)
        anthropic_loop(box)
        code_loop(box)
        chart_loop(box)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
