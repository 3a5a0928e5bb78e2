"""examples/agent_server.py, the agent server docs/agent-server.md shows: driven through
Starlette's TestClient (real app, real Sandbox, the SDK's in-memory span exporter)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from types import ModuleType

import pytest

import wasmbox
import wasmbox.telemetry

from .conftest import ROOT

pytest.importorskip("starlette", reason="starlette comes with the mcp SDK of the test extra")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx (the test extra)")
pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is in the test extra")

from starlette.testclient import TestClient

EXAMPLE = ROOT / "examples" / "agent_server.py"


@pytest.fixture
def server() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("agent_server", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)  # makes its Sandbox and turns telemetry on
        yield module
    finally:
        wasmbox.telemetry.uninstrument()
        box = getattr(module, "box", None)
        if isinstance(box, wasmbox.Sandbox):
            box.close()


def call(id: str, name: str, arguments: dict[str, object]) -> dict[str, object]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn(*calls: dict[str, object]) -> dict[str, object]:
    return {"role": "assistant", "tool_calls": list(calls)}


def test_tenants_budgets_sessions_and_traces_together(server: ModuleType) -> None:
    acme = {"authorization": "Bearer key-acme", "x-conversation": "c-1"}
    globex = {"authorization": "Bearer key-globex", "x-conversation": "c-1"}  # the same name
    with TestClient(server.app) as client:
        first = turn(call("1", "word_count", {"text": "to be or not to be"}),
                     call("2", "run_python", {"code": "x = 6 * 7\nx"}))  # fmt: skip
        replies = client.post("/v1/tool-calls", json=first, headers=acme).json()["messages"]
        assert [(r["tool_call_id"], r["content"]) for r in replies] == [
            ("1", '{"words":6,"lines":1,"bytes":18}'), ("2", "42"),
        ]  # fmt: skip
        again = client.post(
            "/v1/tool-calls", json=turn(call("3", "run_python", {"code": "x + 1"})), headers=acme
        )
        assert again.json()["messages"][0]["content"] == "43"  # the conversation's session
        other = client.post(
            "/v1/tool-calls", json=turn(call("4", "run_python", {"code": "x"})), headers=globex
        )
        content = json.loads(other.json()["messages"][0]["content"])
        assert content["error"]["kind"] == "guest_error" and "NameError" in content["error"]["message"]
        assert client.get("/v1/usage", headers=acme).json()["calls"] == 3
        assert client.get("/v1/usage", headers=globex).json()["calls"] == 1  # a budget each
        assert (
            client.post("/v1/tool-calls", json=first, headers={"authorization": "Bearer no"}).status_code
            == 401
        )
        assert client.get("/v1/usage").status_code == 401
        health = client.get("/health").json()
        assert health["admission"]["admitted"] == 4 and health["admission"]["in_flight"] == 0
        assert health["sessions"] == 2
    finished = server.spans.get_finished_spans()
    requests = [s for s in finished if s.name == "POST /v1/tool-calls"]
    calls = [s for s in finished if s.name.startswith("execute_tool")]
    assert [r.attributes["tenant"] for r in requests] == ["acme", "acme", "globex"]
    assert len(calls) == 4 and {c.parent.span_id for c in calls} == {r.context.span_id for r in requests}
    assert server.box.stats().sessions == 0  # the lifespan closed the Sandbox


def test_a_tenant_past_its_plan_and_a_server_past_its_bound(server: ModuleType) -> None:
    acme = {"authorization": "Bearer key-acme"}
    server.PLAN["calls"] = 1  # (the plan a new tenant's budget is made with)
    with TestClient(server.app) as client:
        two = turn(call("1", "word_count", {"text": "a"}), call("2", "word_count", {"text": "b"}))
        kinds = [json.loads(r["content"]).get("error", {}).get("kind")
                 for r in client.post("/v1/tool-calls", json=two, headers=acme).json()["messages"]]  # fmt: skip
        assert sorted(kinds, key=str) == [None, "over_budget"]
        full = wasmbox.Sandbox(admission=wasmbox.AdmissionLimits(resident=1))  # at its bound now
        full.load(ROOT / "capabilities" / "word_count.toml")
        server.box.close()
        server.box = full  # (closed by the lifespan)
        refused = client.post("/v1/tool-calls", json=two, headers={"authorization": "Bearer key-globex"})
        assert refused.headers["retry-after"] == "1"
        assert [json.loads(r["content"])["error"]["kind"] for r in refused.json()["messages"]] == [
            "overloaded"
        ] * 2


def test_the_docs_show_this_file() -> None:
    page = (ROOT / "docs" / "agent-server.md").read_text()
    (shown,) = re.findall(r"```python\n(.*?)```\n", page, re.DOTALL)
    assert shown == EXAMPLE.read_text()
