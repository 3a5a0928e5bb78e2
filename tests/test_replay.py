"""Record and replay of host-function replies: a call replayed offline gets the result it got
when recorded, on each backend with host calls (core, Python, JavaScript); a replay that
diverges says where; `redact` changes what is kept, not what the guest got."""

from __future__ import annotations

from typing import Any

import pytest

import wasmbox
from wasmbox import CallResult, ErrorKind

from .conftest import wat

GRANTS_PY = {"name": "py", "runtime": "python", "host_functions": ["kv.get"]}
GRANTS_JS = {"name": "js", "runtime": "javascript", "host_functions": ["kv.get"]}


class World:
    """The outside a host function reads: changed between the recording and the replay."""

    def __init__(self) -> None:
        self.values = {"a": "first", "token": "s3cret"}
        self.calls = 0

    def get(self, key: str) -> str | None:
        self.calls += 1
        return self.values.get(key)


@pytest.fixture
def world(box: wasmbox.Sandbox) -> World:
    world = World()
    box.register_host_function("kv.get", world.get)
    box.register_host_function("host.fn", world.get)  # what forward.wat imports
    return world


def same(result: CallResult, fuel: bool = True) -> dict[str, Any]:
    """A result but for its duration (and, `fuel=False`, its fuel: the Python runtime's may
    differ by a fraction between two runs of the same code, as the interpreter's state around
    the host calls, e.g. its hash seed, is not recorded)."""
    return result.model_dump(exclude={"duration_s"} if fuel else {"duration_s", "fuel_used"})


def check_replayed(box: wasmbox.Sandbox, world: World, run: Any, fuel: bool = True) -> None:
    with wasmbox.recording() as recorded:
        original = run()
    assert original.ok, original.error
    world.values["a"] = "changed"  # the world moved on: a live call now differs
    assert same(run(), fuel) != same(original, fuel)
    calls = world.calls
    with wasmbox.replaying(wasmbox.Recording.from_json(recorded.to_json())) as replay:
        again = run()
    assert replay.divergence is None and world.calls == calls  # no host function ran
    assert same(again, fuel) == same(original, fuel)


def test_a_core_call_replays_offline(box: wasmbox.Sandbox, world: World) -> None:
    forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    check_replayed(box, world, lambda: forward.call({"key": "a"}))


def test_a_python_call_replays_offline(box: wasmbox.Sandbox, world: World) -> None:
    code = "import wasmbox_guest\n[wasmbox_guest.call_host('kv.get', key=k) for k in ('a', 'a', 'b')]"
    check_replayed(box, world, lambda: box.run_python(code, GRANTS_PY), fuel=False)


def test_a_javascript_call_replays_offline(
    box: wasmbox.Sandbox, world: World, javascript_runtime: None
) -> None:
    code = "[wasmbox.callHost('kv.get', {key: 'a'}), wasmbox.callHost('kv.get', {key: 'b'})]"
    check_replayed(box, world, lambda: box.run_javascript(code, GRANTS_JS))


def test_a_javascript_calls_random_seed_is_replayed(
    box: wasmbox.Sandbox, world: World, javascript_runtime: None
) -> None:
    code = "[Math.random(), Math.random(), wasmbox.callHost('kv.get', {key: 'a'})]"
    check_replayed(box, world, lambda: box.run_javascript(code, GRANTS_JS))
    with wasmbox.recording() as recorded:
        box.run_javascript("Math.random()")
    assert len(recorded.seeds) == 1 and len(recorded.seeds[0]) == 8
    with wasmbox.replaying(recorded) as replay:
        box.run_javascript("Math.random()")
        box.run_javascript("Math.random()")  # one more than recorded: a fresh seed
    assert replay.divergence == "seed 2: a runtime asked for one more random seed than recorded"


def test_a_replay_that_diverges_says_where(box: wasmbox.Sandbox, world: World) -> None:
    forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    with wasmbox.recording() as recorded:
        assert forward.call({"key": "a"}).ok
    with wasmbox.replaying(recorded) as replay:
        other = forward.call({"key": "b"})  # other arguments than recorded
    assert replay.divergence == "host call 1: host.fn was called with other arguments than recorded"
    assert other.error is not None and other.error.kind is ErrorKind.HOST_ERROR
    assert other.host_calls[0].detail == f"replay diverged at {replay.divergence}"
    with wasmbox.replaying(recorded) as replay:
        assert forward.call({"key": "a"}).ok
        extra = forward.call({"key": "a"})  # one more than recorded
    assert replay.divergence == "host call 2: host.fn was called; the recording has 1"
    assert extra.error is not None
    with wasmbox.replaying(recorded) as replay:
        pass  # none of the recorded calls made
    assert replay.divergence == "the calls ended with 1 recorded host call(s) not made"
    assert world.calls == 1


def test_redact_changes_what_is_kept_not_what_the_guest_got(box: wasmbox.Sandbox, world: World) -> None:
    forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})

    def redact(name: str, payload: bytes) -> bytes:
        return payload.replace(b"s3cret", b"******")

    with wasmbox.recording(redact=redact) as recorded:
        live = forward.call({"key": "token"})
    assert live.value == "s3cret"  # the guest got the real reply
    assert b"s3cret" not in recorded.to_json().encode() and b"s3cret" not in recorded.exchanges[0].payload
    with wasmbox.replaying(recorded):
        assert forward.call({"key": "token"}).value == "******"


def test_a_tool_code_calls_is_replayed_as_its_callers_reply(box: wasmbox.Sandbox, world: World) -> None:
    box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    grants = {"name": "s", "runtime": "python", "tools": ["forward"]}
    with wasmbox.recording() as recorded:
        original = box.run_python("tools.forward(key='a')", grants)
    assert original.value == "first", original.error
    assert [e.name for e in recorded.exchanges] == ["wasmbox.call_tool"]  # the inner kv.get is its
    world.values["a"] = "changed"
    before = box.stats().calls
    with wasmbox.replaying(recorded) as replay:
        again = box.run_python("tools.forward(key='a')", grants)
    assert replay.divergence is None and same(again, fuel=False) == same(original, fuel=False)
    assert box.stats().calls == before + 1  # the snippet ran; the inner tool did not


def test_tapes_do_not_nest() -> None:
    inner = wasmbox.replaying(wasmbox.Recording())
    with wasmbox.recording(), pytest.raises(RuntimeError, match="already open on this thread"):
        inner.__enter__()
