"""An agent server: per-tenant API keys and budgets, admission control, sessions per
conversation, OpenTelemetry and dispatch, in one Starlette app (docs/agent-server.md shows
this file). Serve `app` with any ASGI server (`uvicorn examples.agent_server:app`); run the
file to drive it once with Starlette's TestClient, as tests/test_agent_server.py does.
"""

import contextlib
import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import wasmbox
import wasmbox.telemetry

# Telemetry: here an in-memory exporter, to look at; in production an OTLP exporter behind a
# BatchSpanProcessor. Every call is an `execute_tool` span under the request's span.
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
wasmbox.telemetry.instrument(tracer_provider=provider)
tracer = provider.get_tracer("agent-server")

# One Sandbox for the process: calls past 64 in flight (or with the process at 6 GiB resident)
# are refused at once as `overloaded` rather than queued.
box = wasmbox.Sandbox(admission=wasmbox.AdmissionLimits(in_flight=64, resident="6GiB"))
box.load(Path(__file__).parent.parent / "capabilities" / "word_count.toml")

API_KEYS = {"key-acme": "acme", "key-globex": "globex"}  # your key store: API key -> tenant
PLAN = {"calls": 1000, "fuel": 50_000_000_000, "wall_s": 600, "concurrent": 8, "window_s": 3600}
budgets: dict[str, wasmbox.Budget] = {}
budgets_lock = threading.Lock()


def budget_of(tenant: str) -> wasmbox.Budget:
    with budgets_lock:
        if tenant not in budgets:
            budgets[tenant] = wasmbox.Budget(**PLAN, name=tenant)
        return budgets[tenant]


def tenant_of(request: Request) -> str | None:
    key = request.headers.get("authorization", "").removeprefix("Bearer ")
    return API_KEYS.get(key)


async def tool_calls(request: Request) -> JSONResponse:
    """POST an assistant message (OpenAI's format); get back the tool messages to append."""
    tenant = tenant_of(request)
    if tenant is None:
        return JSONResponse({"error": "unknown API key"}, status_code=401)
    message = await request.json()
    # run_python's state is kept per conversation, under a name the server makes: a tenant
    # reaches only its own conversations' sessions, whatever the client sends
    conversation = request.headers.get("x-conversation")
    session = f"{tenant}/{conversation}"[:200] if conversation else None
    with tracer.start_as_current_span("POST /v1/tool-calls", attributes={"tenant": tenant}):
        replies = await box.adispatch(
            message, format="openai", python=True, session=session, budget=budget_of(tenant), deadline_s=30
        )
    overloaded = any(_kind(reply) == "overloaded" for reply in replies)
    return JSONResponse({"messages": replies}, headers={"Retry-After": "1"} if overloaded else None)


def _kind(reply: dict[str, Any]) -> str | None:
    """The error kind of a dispatch reply (its content is the error as JSON), or None."""
    try:
        content = json.loads(reply["content"])
    except ValueError:
        return None
    error = content.get("error") if isinstance(content, dict) else None
    return error.get("kind") if isinstance(error, dict) else None


async def usage(request: Request) -> JSONResponse:
    tenant = tenant_of(request)
    if tenant is None:
        return JSONResponse({"error": "unknown API key"}, status_code=401)
    return JSONResponse(budget_of(tenant).used())


async def health(request: Request) -> JSONResponse:
    return JSONResponse(dataclasses.asdict(box.stats()))


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    yield
    box.close(timeout=10)  # calls in flight get 10 s to finish, then are stopped as `timeout`
    wasmbox.telemetry.uninstrument()


app = Starlette(
    routes=[
        Route("/v1/tool-calls", tool_calls, methods=["POST"]),
        Route("/v1/usage", usage),
        Route("/health", health),
    ],
    lifespan=lifespan,
)


def main() -> None:
    """One model turn from a client's side: a message with two tool calls, then the next turn
    reading the conversation's state, then the tenant's usage and the server's health."""
    from starlette.testclient import TestClient  # (needs httpx; the server itself does not)

    turn = {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "word_count", "arguments": '{"text": "to be or not to be"}'}},
            {"id": "call_2", "type": "function",
             "function": {"name": "run_python", "arguments": '{"code": "x = 6 * 7\\nx"}'}},
        ],
    }  # fmt: skip
    later = {"role": "assistant", "tool_calls": [
        {"id": "call_3", "type": "function", "function": {"name": "run_python", "arguments": '{"code": "x + 1"}'}},
    ]}  # fmt: skip
    acme = {"authorization": "Bearer key-acme", "x-conversation": "c-1"}
    with TestClient(app) as client:
        for message in (turn, later):
            for reply in client.post("/v1/tool-calls", json=message, headers=acme).json()["messages"]:
                print(reply["tool_call_id"], reply["content"])
        print("usage:", client.get("/v1/usage", headers=acme).json())
        print("health:", client.get("/health").json())
    for span in spans.get_finished_spans():
        print("span:", span.name, "parent:", span.parent.span_id if span.parent else None)


if __name__ == "__main__":
    main()
