"""Budgets: caps on what many calls use together, decided before each call and charged after,
exact under concurrent threads and asyncio, through calls, run_python, dispatch, sessions and
the MCP server."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import wasmbox
from wasmbox import Budget, ErrorKind

from .conftest import manifest, wat


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def kind(result: wasmbox.CallResult) -> str:
    return result.error.kind.value if result.error else "ok"


def test_calls_per_window_are_capped_and_free_up_as_the_window_moves(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))
    clock = Clock()
    budget = Budget(calls=3, window_s=60, name="tenant-a", clock=clock)
    assert [kind(echo.call({"i": i}, budget=budget)) for i in range(4)] == ["ok", "ok", "ok", "over_budget"]
    refused = echo.call({}, budget=budget)
    assert refused.error is not None and refused.fuel_used == 0  # not started
    assert (
        refused.error.message == "not run: tenant-a: its calls for 60 s (3) is used up; some frees in 60.0 s"
    )
    with pytest.raises(wasmbox.OverBudgetError):
        refused.unwrap()
    clock.now += 59.9
    assert kind(echo.call({}, budget=budget)) == "over_budget"
    clock.now += 0.2  # the first calls (all made at one clock reading) have left the window
    assert kind(echo.call({}, budget=budget)) == "ok"
    assert budget.used()["calls"] == 1


def test_fuel_and_output_are_charged_exactly_what_the_calls_used(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))
    budget = Budget()
    results = [echo.call({"text": "x" * i}, budget=budget) for i in range(5)]
    used = budget.used()
    assert used["calls"] == 5 and used["running"] == 0
    assert used["fuel"] == sum(r.fuel_used for r in results) > 0
    assert used["wall_s"] == pytest.approx(sum(r.duration_s for r in results))
    capped = Budget(fuel=1)  # admitted while nothing is spent; any call then spends more
    assert kind(echo.call({}, budget=capped)) == "ok"
    refused = echo.call({}, budget=capped)
    assert (
        refused.error is not None
        and "its fuel" in refused.error.message
        and "used up" in refused.error.message
    )
    printed = Budget(output=10)
    assert box.run_python("print('x' * 20)", budget=printed).ok  # admitted, then charged 21 bytes
    assert kind(box.run_python("1", budget=printed)) == "over_budget"
    assert printed.used()["output"] == 21


def test_a_call_budget_is_spent_exactly_under_concurrent_threads(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))
    budget = Budget(calls=100)
    with ThreadPoolExecutor(8) as pool:
        kinds = list(pool.map(lambda i: kind(echo.call({"i": i}, budget=budget)), range(200)))
    assert kinds.count("ok") == 100 and kinds.count("over_budget") == 100
    assert budget.used()["calls"] == 100 and budget.used()["running"] == 0


def test_concurrent_calls_are_capped(box: wasmbox.Sandbox) -> None:
    """Two calls held inside a host function fill a budget of two at once; a third is refused
    until one of them ends."""
    inside = threading.Semaphore(0)
    release = threading.Event()

    def hold(x: int) -> int:
        inside.release()
        assert release.wait(60)
        return x

    box.register_host_function("host.fn", hold)
    held = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"],
                     "limits": {"timeout": "60s"}})  # fmt: skip
    budget = Budget(concurrent=2)
    with ThreadPoolExecutor(2) as pool:
        running = [pool.submit(held.call, {"x": i}, budget=budget) for i in range(2)]
        assert inside.acquire(timeout=60) and inside.acquire(timeout=60)
        refused = held.call({"x": 9}, budget=budget)
        assert refused.error is not None and refused.error.kind is ErrorKind.OVER_BUDGET
        assert "2 calls are running, the most this budget allows at once" in refused.error.message
        release.set()
        assert [f.result().value for f in running] == [0, 1]
    assert kind(held.call({"x": 3}, budget=budget)) == "ok"


def test_dispatch_and_asyncio_share_one_budget(box: wasmbox.Sandbox) -> None:
    box.load(manifest("echo"))
    budget = Budget(calls=4)
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}} for i in range(3)
    ]
    replies = box.dispatch(calls, format="openai", budget=budget)
    assert [json.loads(r["content"]) for r in replies] == [{}, {}, {}]

    async def rest() -> list[str]:
        replies = await box.adispatch(calls, format="openai", budget=budget)
        return [json.loads(r["content"]).get("error", {}).get("kind", "ok") for r in replies]

    kinds = asyncio.run(rest())
    assert sorted(kinds) == ["ok", "over_budget", "over_budget"]  # one left, whichever came first
    assert kind(asyncio.run(box.acall("echo", {}, budget=budget))) == "over_budget"


def test_sessions_and_run_javascript_take_budgets(box: wasmbox.Sandbox) -> None:
    budget = Budget(calls=2)
    with box.session() as session:
        assert session.run("x = 1", budget=budget).ok
        assert session.run("x + 1", budget=budget).value == 2
        refused = session.run("x = 99", budget=budget)
        assert refused.error is not None and refused.error.kind is ErrorKind.OVER_BUDGET
        assert session.run("x").value == 1  # the refused run never ran


def test_the_mcp_server_charges_its_calls(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    box.load(manifest("echo"))
    budget = Budget(calls=1)

    async def run() -> None:
        async with Client(wasmbox_mcp.build_server(box, budget=budget)) as client:
            assert (await client.call_tool("echo", {})).is_error is False
            refused = await client.call_tool("echo", {})
            assert refused.is_error is True and "over_budget" in refused.content[0].text  # type: ignore[union-attr]

    asyncio.run(asyncio.wait_for(run(), 60))


def test_bad_caps_are_refused() -> None:
    for bad in ({"calls": 0}, {"fuel": -1}, {"window_s": True}, {"concurrent": "2"}):
        with pytest.raises(ValueError, match="Budget"):
            Budget(**bad)  # type: ignore[arg-type]
