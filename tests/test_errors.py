"""Every error kind, produced by a real guest, and the Tool serving the next call afterwards."""

from __future__ import annotations

import time
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import manifest, outlast_the_deadline


def test_error_kinds_are_exactly_the_documented_set() -> None:
    assert {k.value for k in ErrorKind} == {
        "out_of_fuel", "timeout", "memory_limit", "trap", "guest_error", "capability_denied",
        "invalid_arguments", "output_limit", "bad_response", "host_error", "over_budget", "overloaded",
    }  # fmt: skip


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_each_kind_has_its_tool_error_subclass(kind: ErrorKind) -> None:
    error = wasmbox.ToolError.for_kind(kind, "msg")
    assert isinstance(error, wasmbox.ToolError)
    assert type(error) is not wasmbox.ToolError
    assert error.kind is kind and error.message == "msg"


def _registered(box: wasmbox.Sandbox) -> None:
    @box.host_function("host.fn")
    def host_fn(x: int = 0, sleep: float = 0.0, fail: bool = False, deny: bool = False) -> Any:
        if sleep:
            time.sleep(sleep)
        if fail:
            raise RuntimeError("connection string postgres://admin:hunter2@db")
        if deny:
            raise wasmbox.CapabilityDeniedError("key 'secret/*' is not readable")
        return x * 2


# (module, manifest fields, call args, expected kind, words expected in the message)
CASES: list[tuple[str, dict[str, Any], dict[str, Any], ErrorKind, str]] = [
    ("spin", {"limits": {"fuel": 1_000_000}}, {}, ErrorKind.OUT_OF_FUEL, "fuel"),
    ("spin", {"limits": {"fuel": 10**15, "timeout": "200ms"}}, {}, ErrorKind.TIMEOUT, "deadline"),
    ("grow", {"limits": {"memory": "2MiB"}}, {}, ErrorKind.MEMORY_LIMIT, "memory"),
    ("bigalloc", {"limits": {"memory": "2MiB"}}, {}, ErrorKind.MEMORY_LIMIT, "out of memory"),
    ("trap", {}, {}, ErrorKind.TRAP, "divide by zero"),
    ("deep_recursion", {}, {}, ErrorKind.TRAP, "stack"),
    ("guest_error", {}, {}, ErrorKind.GUEST_ERROR, "boom"),
    ("forward", {"host_functions": ["host.fn"]}, {"x": 1, "deny": True},
     ErrorKind.CAPABILITY_DENIED, "not readable"),
    ("echo", {"input_schema": {"type": "object", "required": ["text"]}}, {},
     ErrorKind.INVALID_ARGUMENTS, "text"),
    ("huge_result", {}, {}, ErrorKind.OUTPUT_LIMIT, "output cap"),
    ("spam", {"limits": {"output": "1KiB"}}, {}, ErrorKind.OUTPUT_LIMIT, "stdout"),
    ("garbage", {}, {}, ErrorKind.BAD_RESPONSE, "MessagePack"),
    ("out_of_bounds", {}, {}, ErrorKind.BAD_RESPONSE, "outside"),
    ("forward", {"host_functions": ["host.fn"]}, {"x": 1, "fail": True},
     ErrorKind.HOST_ERROR, "host.fn failed"),
    ("forward", {"host_functions": ["host.fn"], "limits": {"timeout": "100ms"}},
     {"sleep": 0.3}, ErrorKind.TIMEOUT, "deadline"),
    ("forward_loop", {"host_functions": ["host.fn"], "limits": {"host_calls": 10}}, {"x": 1},
     ErrorKind.HOST_ERROR, "host-call limit"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "fields", "args", "kind", "words"), CASES, ids=[f"{c[0]}-{c[3].value}" for c in CASES]
)
def test_failure_is_a_typed_result_and_the_tool_keeps_serving(
    box: wasmbox.Sandbox,
    module: str,
    fields: dict[str, Any],
    args: dict[str, Any],
    kind: ErrorKind,
    words: str,
) -> None:
    _registered(box)
    tool = box.load(manifest(module, **fields))
    result = tool.call(args)
    assert not result.ok
    assert result.value is None
    assert result.error is not None
    assert result.error.kind is kind, result.error
    assert words.lower() in result.error.message.lower()
    with pytest.raises(wasmbox.ToolError) as raised:
        result.unwrap()
    assert raised.value.kind is kind
    # The same tool answers the next call the same way: nothing is left broken.
    again = tool.call(args)
    assert again.error is not None and again.error.kind is kind
    # ...and the Sandbox keeps serving other tools.
    echo = box.load(manifest("echo", name=f"echo_after_{module}"))
    assert echo.call({"still": "alive"}).unwrap() == {"still": "alive"}


def test_host_error_detail_stays_on_the_host(box: wasmbox.Sandbox) -> None:
    _registered(box)
    result = box.load(manifest("forward", host_functions=["host.fn"])).call({"fail": True})
    assert result.error is not None
    assert "hunter2" not in result.error.message  # the guest (and the model) never see it
    (record,) = result.host_calls
    assert record.verdict == "error" and "hunter2" in (record.detail or "")


def test_host_function_argument_validation(box: wasmbox.Sandbox) -> None:
    _registered(box)
    tool = box.load(manifest("forward", host_functions=["host.fn"]))
    assert tool.call({"x": 21}).unwrap() == 42
    bad = tool.call({"x": "twenty"})
    assert bad.error is not None and bad.error.kind is ErrorKind.GUEST_ERROR
    assert "invalid arguments for host.fn" in bad.error.message
    assert [r.verdict for r in bad.host_calls] == ["invalid_arguments"]
    unknown = tool.call({"x": 1, "rm_rf": True})
    assert unknown.error is not None and [r.verdict for r in unknown.host_calls] == ["invalid_arguments"]


def test_host_function_returning_unencodable_value_is_a_host_error(box: wasmbox.Sandbox) -> None:
    @box.host_function("host.fn")
    def host_fn(**kwargs: Any) -> Any:
        return object()

    result = box.load(manifest("forward", host_functions=["host.fn"])).call({})
    assert result.error is not None and result.error.kind is ErrorKind.HOST_ERROR


def test_host_call_cap_counts_calls(box: wasmbox.Sandbox) -> None:
    _registered(box)
    tool = box.load(manifest("forward_loop", host_functions=["host.fn"], limits={"host_calls": 5}))
    result = tool.call({"x": 1})
    assert [r.verdict for r in result.host_calls] == ["ok"] * 5 + ["limit"]
    generous = box.load(
        manifest("forward_loop", name="loop2", host_functions=["host.fn"], limits={"host_calls": 1000})
    )
    assert generous.call({"x": 4}).unwrap() == 8


def test_out_of_fuel_reports_fuel_used(box: wasmbox.Sandbox) -> None:
    result = box.load(manifest("spin", limits={"fuel": 12345})).call({})
    assert result.fuel_used == 12345


def test_timeout_is_prompt(box: wasmbox.Sandbox) -> None:
    result = box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "100ms"})).call({})
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    # generous bound: the deadline is enforced, not merely noticed at the end of a long run
    assert result.duration_s < 5


def test_args_must_be_a_mapping(box: wasmbox.Sandbox) -> None:
    tool = box.load(manifest("echo"))
    result = tool.call(["not", "a", "map"])  # type: ignore[arg-type]
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    unencodable = tool.call({"x": object()})
    assert unencodable.error is not None and unencodable.error.kind is ErrorKind.INVALID_ARGUMENTS
    argv = tool.call({}, argv=["--flag"])
    assert argv.error is not None and argv.error.kind is ErrorKind.INVALID_ARGUMENTS


def test_input_schema_checks_types_and_extra_keys(box: wasmbox.Sandbox) -> None:
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    tool = box.load(manifest("echo", input_schema=schema))
    assert tool.call({"text": "hi", "n": 3}).unwrap() == {"text": "hi", "n": 3}
    for args, words in [
        ({"text": 5}, "expected string"),
        ({"text": "x" * 11}, "longer"),
        ({"text": "hi", "n": 1.5}, "expected integer"),
        ({"text": "hi", "extra": 1}, "unexpected property"),
        ({"n": 1}, "missing required"),
    ]:
        result = tool.call(args)
        assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
        assert words in result.error.message


def test_results_serialize_to_json_whatever_the_value(box: wasmbox.Sandbox) -> None:
    import base64
    import json

    result = box.load(manifest("echo")).call({"blob": b"\xff\x00", "text": "\x1b[2J", "n": [1.5, None]})
    data = json.loads(result.model_dump_json())
    assert data["value"]["blob"] == base64.urlsafe_b64encode(b"\xff\x00").decode()
    assert data["value"]["text"] == "\x1b[2J" and data["value"]["n"] == [1.5, None]
    assert json.loads(wasmbox.CallResult.failed("t", ErrorKind.TRAP, "x").model_dump_json())["error"] == {
        "kind": "trap",
        "message": "x",
    }


def test_host_reply_over_the_output_cap_stops_the_guest(box: wasmbox.Sandbox) -> None:
    @box.host_function("host.fn")
    def big(**_: Any) -> str:
        return "x" * 100_000

    tool = box.load(manifest("forward", host_functions=["host.fn"], limits={"output": "16KiB"}))
    result = tool.call({})
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT
    assert [r.verdict for r in result.host_calls] == ["limit"]


def test_no_host_call_is_served_after_the_deadline(box: wasmbox.Sandbox) -> None:
    calls = []

    @box.host_function("host.fn")
    def slow(**_: object) -> int:
        calls.append(1)
        outlast_the_deadline()
        return 1

    # a deadline the first call surely reaches on a busy machine; the host function outlasts it
    tool = box.load(manifest("host_thrice", host_functions=["host.fn"], limits={"timeout": "1s"}))
    result = tool.call({})
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert len(calls) == 1  # straight-line code asked twice more; neither ran


def test_deeply_nested_result_is_a_bad_response(box: wasmbox.Sandbox) -> None:
    result = box.load(manifest("deep_result")).call({})
    assert result.error is not None and result.error.kind is ErrorKind.BAD_RESPONSE
    assert "nested" in result.error.message


def test_a_trap_in_a_module_whose_memory_cannot_grow_is_a_trap_not_a_memory_limit(
    box: wasmbox.Sandbox,
) -> None:
    fixed = box.load(manifest("fixed_memory_trap")).call({})
    assert fixed.error is not None and fixed.error.kind is ErrorKind.TRAP  # not memory_limit


def test_a_guest_error_that_mentions_out_of_memory_is_a_guest_error(box: wasmbox.Sandbox) -> None:
    words = box.load(manifest("oom_words")).call({})
    assert words.error is not None and words.error.kind is ErrorKind.GUEST_ERROR
