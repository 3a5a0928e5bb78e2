"""Limits per call: `limits=` on a call tightens its manifest's for that call only, through every
API that starts a call (Tool.call and acall, Sandbox.call, run_python, run_javascript, dispatch,
a session's runs); loosening is refused with a LimitsError that names the limit and the fix."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import wasmbox
from wasmbox import CallLimits, ErrorKind, LimitsError

from .conftest import manifest


def kind(result: wasmbox.CallResult) -> str:
    return result.error.kind.value if result.error else "ok"


def test_a_call_runs_under_its_own_tighter_fuel_and_the_next_call_under_the_manifests(
    box: wasmbox.Sandbox,
) -> None:
    spin = box.load(manifest("spin", limits={"fuel": 5_000_000, "timeout": "10s"}))
    tight = spin.call({}, limits={"fuel": 1234})
    assert kind(tight) == "out_of_fuel" and tight.error is not None
    assert tight.error.message == "used all 1,234 units of fuel" and tight.fuel_used == 1234
    again = spin.call({})  # the manifest's own again: nothing of the last call's limits stays
    assert kind(again) == "out_of_fuel" and again.fuel_used == 5_000_000


def test_every_limit_can_be_tightened_for_one_call(box: wasmbox.Sandbox, javascript_runtime: None) -> None:
    grants = {
        "name": "g", "runtime": "python", "host_functions": ["host.fn"],
        "limits": {"memory": "256MiB", "fuel": 10**10},
    }  # fmt: skip
    box.register_host_function("host.fn", lambda: "ok")
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        # (code, the call's limits, its outcome under them, under the grant set's own)
        ("print('x' * 5000)", {"output": 1024}, "output_limit", "ok"),
        ("len(bytearray(64 * 2**20))", {"memory": "32MiB"}, "memory_limit", "ok"),
        ("sum(range(10**6))", {"fuel": 1_000_000}, "out_of_fuel", "ok"),
        ("import wasmbox_guest as g\n[g.call_host('host.fn') for _ in range(3)]", {"host_calls": 2}, "host_error", "ok"),
        # 10G fuel lasts about a second: 100 ms ends it first, on any machine
        ("while True: pass", {"timeout": "100ms"}, "timeout", "out_of_fuel"),
    ]  # fmt: skip
    for code, limits, expected, own in cases:
        assert kind(box.run_python(code, grants, limits=limits)) == expected, (code, limits)
        assert kind(box.run_python(code, grants)) in (own, "timeout" if own != "ok" else "ok"), code
    js = {"name": "j", "runtime": "javascript", "limits": {"fuel": 10**12}}  # minutes of fuel
    assert kind(box.run_javascript("let s = 0; for (;;) s++", js, limits={"timeout": "100ms"})) == "timeout"
    assert kind(box.run_javascript("'x'.repeat(5000)", limits=CallLimits(output=1024))) == "output_limit"
    assert kind(box.run_javascript("'x'.repeat(5000)")) == "ok"


def test_a_spare_made_under_more_memory_does_not_serve_a_call_with_less(box: wasmbox.Sandbox) -> None:
    """The Python runtime makes the next call's instance ahead; a call with its own memory cap
    must not run in one made under the manifest's larger one (its store's limit)."""
    grants = {"name": "g", "runtime": "python", "limits": {"memory": "256MiB"}}
    for _ in range(3):  # a spare is now ready for these grants
        assert kind(box.run_python("1", grants)) == "ok"
    assert (
        kind(box.run_python("len(bytearray(64 * 2**20))", grants, limits={"memory": "32MiB"}))
        == "memory_limit"
    )
    assert kind(box.run_python("len(bytearray(64 * 2**20))", grants)) == "ok"
    # and one made ahead under the manifest's limits serves a call with tighter fuel, fresh
    box.run_python("x = 1", grants)
    served = box.run_python("'x' in dir()", grants, limits={"fuel": 10**9, "timeout": 1})
    assert served.ok and served.value is False


def test_loosening_is_refused_naming_the_limit_both_values_and_the_fix(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo", limits={"fuel": 1000, "memory": "1MiB", "timeout": 1}))
    with pytest.raises(LimitsError) as refused:
        echo.call({}, limits={"fuel": 1001})
    assert str(refused.value) == (
        "echo: limits.fuel = 1,001 is above the manifest's 1,000: a call may only tighten its tool's "
        "limits (ask for less, or raise limits.fuel in the manifest)"
    )
    with pytest.raises(LimitsError, match=r"limits.memory = 2MiB is above the manifest's 1MiB"):
        echo.call({}, limits={"memory": "2MiB"})
    with pytest.raises(LimitsError, match=r"limits.timeout = 1.5 s is above the manifest's 1 s"):
        echo.call({}, limits=CallLimits(timeout=1.5))
    with pytest.raises(LimitsError, match=r"limits.timeout"):
        echo.call({}, limits={"timeout": "soon"})
    with pytest.raises(LimitsError, match=r"limits.cpu: Extra inputs are not permitted"):
        echo.call({}, limits={"cpu": 1})
    with pytest.raises(LimitsError, match=r"limits.fuel"):
        echo.call({}, limits={"fuel": 0})
    with pytest.raises(LimitsError, match="a CallLimits or a mapping"):
        echo.call({}, limits=5)  # type: ignore[arg-type]
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, wasmbox.WasmboxError)
    assert echo.call({}, limits={"fuel": 1000, "timeout": "1s"}).ok  # equal is not looser
    with pytest.raises(LimitsError):
        box.run_python("1", limits={"timeout": 3600})


def test_acall_and_arun_refuse_loosening_before_the_call(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))

    async def main() -> None:
        with pytest.raises(LimitsError):
            await echo.acall({}, limits={"fuel": 10**12})
        with pytest.raises(LimitsError):
            await box.arun_python("1", limits={"output": "1GiB"})
        tight = await box.arun_python("print('x' * 100)", limits={"output": 10})
        assert kind(tight) == "output_limit"
        assert kind(await echo.acall({}, limits={"fuel": 10})) == "out_of_fuel"

    asyncio.run(main())


def test_dispatch_runs_every_call_under_the_limits_and_refuses_loosening_before_any_runs(
    box: wasmbox.Sandbox,
) -> None:
    ran: list[str] = []
    box.register_host_function("host.fn", lambda: ran.append("called") or "ok")
    box.load(manifest("host_thrice", host_functions=["host.fn"]))
    calls = [{"id": "1", "type": "function", "function": {"name": "host_thrice", "arguments": "{}"}}]
    [reply] = box.dispatch(calls, format="openai", limits={"host_calls": 2})
    assert "host-call limit (2) exceeded" in reply["content"] and len(ran) == 2
    with pytest.raises(LimitsError, match="host_thrice: limits.host_calls = 101"):
        box.dispatch(calls * 3, format="openai", limits={"host_calls": 101})
    assert len(ran) == 2  # none of them ran
    [python] = box.dispatch(
        [{"id": "2", "type": "function", "function": {"name": "run_python", "arguments": json.dumps({"code": "print('x' * 99)"})}}],
        format="openai", python=True, limits={"output": 10},
    )  # fmt: skip
    assert "output" in python["content"] and "cap" in python["content"]


def test_a_sessions_run_takes_limits_but_not_another_memory_cap(box: wasmbox.Sandbox) -> None:
    session = box.session()
    assert session.run("x = 41").ok
    with pytest.raises(LimitsError, match="a session's memory cap is fixed when it opens"):
        session.run("1", limits={"memory": "16MiB"})
    with pytest.raises(LimitsError, match="limits.fuel"):
        session.run("1", limits={"fuel": 10**18})
    assert session.run("x + 1", limits={"fuel": 10**8}).value == 42  # refused limits ran nothing
    cut = session.run("print('y' * 500)", limits={"output": 100})
    assert kind(cut) == "output_limit" and session.closed  # the failure rule of any run


def test_the_audit_record_holds_the_limits_the_call_ran_under(box: wasmbox.Sandbox, tmp_path: Any) -> None:
    records: list[wasmbox.AuditRecord] = []
    audited = wasmbox.Sandbox(cache_dir=box._cache.directory, audit=records.append)
    try:
        echo = audited.load(manifest("echo", limits={"fuel": 10**6}))
        echo.call({}, limits={"fuel": 5000, "timeout": "250ms"})
        echo.call({})
    finally:
        audited.close()
    assert [(r.limits.fuel, r.limits.timeout) for r in records] == [(5000, 0.25), (10**6, 2.0)]


def test_a_nested_call_from_code_keeps_its_own_limits(box: wasmbox.Sandbox) -> None:
    """Limits on an outer call do not reach the tools its code calls (each is a call of its
    own, under its manifest): the snippet may make one host call, the tool it calls makes
    three of its own, and both succeed."""
    calls: list[str] = []
    box.register_host_function("host.fn", lambda: calls.append("inner") or "ok")
    box.load(manifest("host_thrice", host_functions=["host.fn"]))
    grants = {"name": "g", "runtime": "python", "tools": ["host_thrice"]}
    result = box.run_python("tools.host_thrice()", grants, limits={"host_calls": 1})
    assert result.ok, result.error
    assert [record.name for record in result.host_calls] == ["wasmbox.call_tool"]
    assert calls == ["inner"] * 3
    # the outer limit holds for the outer call: a second tool call is one host call too many
    twice = box.run_python("tools.host_thrice()\ntools.host_thrice()", grants, limits={"host_calls": 1})
    assert twice.error is not None and twice.error.kind is ErrorKind.HOST_ERROR
