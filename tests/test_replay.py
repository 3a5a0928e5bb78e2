"""Record and replay: a call replayed offline gets the result it got when recorded (value,
error, output and fuel), on each backend (a core module with a host function, a WASI command
reading the clock, randomness and a file, Python, JavaScript, the scientific runtime), through
`acall`, `dispatch`'s concurrent calls, `adispatch` and sessions (of Python and JavaScript,
opened inside the recording or before it); a replay that diverges says where; `redact`
changes what is kept, not what the guest got; an audited call's record names its tape."""

from __future__ import annotations

import asyncio
import http.server
import itertools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
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
        self._ticks = itertools.count(1)
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            self.calls += 1
        return self.values.get(key)

    def tick(self) -> int:
        """A different reply every call (what concurrent calls get depends on their order)."""
        with self._lock:
            self.calls += 1
            return next(self._ticks)


@pytest.fixture
def world(box: wasmbox.Sandbox) -> World:
    world = World()
    box.register_host_function("kv.get", world.get)
    box.register_host_function("host.fn", world.get)  # what forward.wat imports
    return world


def same(result: CallResult) -> dict[str, Any]:
    """A result but for its duration: value, error, output, fuel and host calls."""
    return result.model_dump(exclude={"duration_s"})


def check_replayed(world: World, run: Callable[[], Any], change: Callable[[], None] | None = None) -> Any:
    """`run()` recorded, then, the world changed (a live run now differs), replayed offline
    to an equal result with no host function run. Returns the recording."""
    with wasmbox.recording() as recorded:
        original = run()
    (change or _change_world(world))()
    assert live_differs(run(), original)
    calls = world.calls
    with wasmbox.replaying(wasmbox.Recording.from_json(recorded.to_json())) as replay:
        again = run()
    assert replay.divergence is None, replay.divergence
    assert world.calls == calls  # no host function ran
    assert comparable(again) == comparable(original)
    return recorded


def _change_world(world: World) -> Callable[[], None]:
    def change() -> None:
        world.values["a"] = "changed"

    return change


def comparable(outcome: Any) -> Any:
    """A CallResult, or a list of them or of a dispatch's replies, as compared."""
    if isinstance(outcome, CallResult):
        assert outcome.ok, outcome.error
        return same(outcome)
    return [comparable(item) for item in outcome] if isinstance(outcome, list) else outcome


def live_differs(live: Any, original: Any) -> bool:
    return bool(comparable(live) != comparable(original))


def test_a_core_call_replays_offline(box: wasmbox.Sandbox, world: World) -> None:
    forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    check_replayed(world, lambda: forward.call({"key": "a"}))


def test_a_wasi_commands_clock_randomness_and_file_replay(
    box: wasmbox.Sandbox, world: World, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_bytes(b"hello")
    tool = box.load({"name": "clock_file", "module": wat("clock_file"),
                     "preopens": [{"host": str(tmp_path), "guest": "/data"}]})  # fmt: skip
    recorded = check_replayed(world, tool.call, change=lambda: None)  # the clock moved on
    (call,) = recorded.calls
    assert [kind for kind, _ in call.clock] == ["clock 0"] and [len(r) for r in call.random] == [8]
    assert call.files["/data/in.txt"][1] == 5
    assert tool.call().stdout_bytes.endswith(b"hello")  # type: ignore[union-attr]
    (tmp_path / "in.txt").write_bytes(b"HELLO")
    with wasmbox.replaying(recorded) as replay:
        tool.call()
    assert replay.divergence == "call 1 (clock_file): file /data/in.txt changed since the recording"


@pytest.fixture
def server() -> Iterator[str]:
    """A loopback HTTP server whose answer changes with every request."""
    served = itertools.count(1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"served": next(served)}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


PYTHON_OUTSIDE = """
import os, random, time, uuid, wasmbox_guest
page = wasmbox_guest.call_host('http.fetch', url='http://{server}/')
print(time.time(), time.monotonic(), random.random(), flush=True)
[page['body'], open('/data/in.txt').read(), os.urandom(4).hex(), uuid.uuid4().hex,
 wasmbox_guest.call_host('kv.get', key='a'), time.time_ns(), open('/tmp/in/x.txt').read()]
"""


def test_a_python_call_replays_offline_with_its_clock_randomness_files_and_fetch(
    box: wasmbox.Sandbox, world: World, server: str, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("data")
    grants = {"name": "py", "runtime": "python", "host_functions": ["kv.get", "http.fetch"],
              "network": {"allow": [server]}, "scratch": "1MiB", "inputs": {"size": "1KiB"},
              "preopens": [{"host": str(tmp_path), "guest": "/data"}]}  # fmt: skip
    code = PYTHON_OUTSIDE.format(server=server)
    run = lambda: box.run_python(code, grants, files={"x.txt": "input"})
    recorded = check_replayed(world, run)
    (call,) = recorded.calls
    assert {"wall", "monotonic"} <= {kind for kind, _ in call.clock} and call.random
    assert [e.name for e in call.exchanges] == ["http.fetch", "kv.get"]
    with wasmbox.replaying(recorded) as replay:
        box.run_python(code, grants, files={"x.txt": "other input"})
    assert replay.divergence == "call 1 (py): input file x.txt differs from the recorded one"


def test_a_javascript_call_replays_offline_with_its_clock_and_random(
    box: wasmbox.Sandbox, world: World, javascript_runtime: None
) -> None:
    code = ("[Date.now(), performance.now(), Math.random(), Math.random(),"
            " wasmbox.callHost('kv.get', {key: 'a'})]")  # fmt: skip
    recorded = check_replayed(world, lambda: box.run_javascript(code, GRANTS_JS))
    (call,) = recorded.calls
    assert len(call.random) == 1 and len(call.random[0]) == 8 and len(call.clock) >= 2
    with wasmbox.replaying(recorded) as replay:
        box.run_javascript(code, GRANTS_JS)
        box.run_javascript(code, GRANTS_JS)  # one call more than recorded: served live
    assert replay.divergence == "call 2 (js): it is not in the recording"


def test_acall_and_adispatch_replay_concurrent_calls_each_their_own(
    box: wasmbox.Sandbox, world: World
) -> None:
    box.register_host_function("tick", world.tick)
    forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    grants = {"name": "py", "runtime": "python", "host_functions": ["tick"]}

    async def calls() -> list[Any]:
        results = await asyncio.gather(
            *(forward.acall({"key": k}) for k in ("a", "token", "b")),
            *(
                box.arun_python("import wasmbox_guest\nwasmbox_guest.call_host('tick')", grants)
                for _ in range(3)
            ),
        )
        replies = await box.adispatch(
            [_openai(f"c{i}", "forward", {"key": "a"}) for i in range(3)], format="openai"
        )
        return [*results, *[reply["content"] for reply in replies]]

    recorded = check_replayed(world, lambda: asyncio.run(calls()))
    assert [call.place for call in recorded.calls] == list(range(1, 10))


def test_dispatchs_concurrent_calls_replay_each_their_own(box: wasmbox.Sandbox, world: World) -> None:
    box.register_host_function("tick", world.tick)
    box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    snippet = "import wasmbox_guest\nwasmbox_guest.call_host('tick')"
    grants = {"name": "run_python", "runtime": "python", "host_functions": ["tick"]}
    turn = [*(_openai(f"f{i}", "forward", {"key": "a"}) for i in range(2)),
            *(_openai(f"p{i}", "run_python", {"code": snippet}) for i in range(4))]  # fmt: skip

    def run() -> list[Any]:
        return [reply["content"] for reply in box.dispatch(turn, format="openai", python=grants)]

    check_replayed(world, run)


SESSION_RUNS = {  # (a first run, then runs reading the clock, randomness and a host function)
    "javascript": (
        "var kept = 2",
        "var n = Math.random(); [Date.now(), performance.now(), n, wasmbox.callHost('kv.get', {key: 'a'})]",
        "await new Promise((done) => setTimeout(done, 1)); [n, Math.random(), Date.now(), kept]",
    ),
    "python": (
        "import random, time, uuid, wasmbox_guest\nkept = 2",
        "[random.random(), time.time(), time.monotonic(), wasmbox_guest.call_host('kv.get', key='a')]",
        "[random.random(), uuid.uuid4().hex, time.time(), kept]",
    ),
}


def open_session(box: wasmbox.Sandbox, runtime: str) -> wasmbox.Session:
    grants = GRANTS_JS if runtime == "javascript" else GRANTS_PY
    return box.session(grants, runtime="javascript" if runtime == "javascript" else None)


def session_runs(box: wasmbox.Sandbox, runtime: str) -> list[CallResult]:
    """A session's runs of `SESSION_RUNS[runtime]`, all in a session opened here."""
    with open_session(box, runtime) as session:
        return [session.run(code) for code in SESSION_RUNS[runtime]]


@pytest.mark.parametrize("runtime", ["python", "javascript"])
def test_a_sessions_runs_replay_with_their_clock_and_random(
    box: wasmbox.Sandbox, world: World, javascript_runtime: None, runtime: str
) -> None:
    recorded = check_replayed(world, lambda: session_runs(box, runtime))
    assert all(call.clock and call.random for call in recorded.calls[1:]), recorded.calls


@pytest.mark.parametrize("runtime", ["python", "javascript"])
def test_a_session_opened_before_a_recording_tapes_the_runs_made_inside(
    box: wasmbox.Sandbox, world: World, javascript_runtime: None, runtime: str
) -> None:
    before, *taped = SESSION_RUNS[runtime]

    def opened() -> wasmbox.Session:  # (each replay starts from a session in the same state)
        session = open_session(box, runtime)
        assert session.run(before).ok
        return session

    def runs(session: wasmbox.Session) -> list[CallResult]:
        with session:
            return [session.run(code) for code in taped]

    session = opened()
    with wasmbox.recording() as recorded:
        original = runs(session)
    assert all(call.clock and call.random for call in recorded.calls), recorded.calls
    world.values["a"] = "changed"
    assert live_differs(runs(opened()), original)
    session, calls = opened(), world.calls
    with wasmbox.replaying(wasmbox.Recording.from_json(recorded.to_json())) as replay:
        again = runs(session)
    assert replay.divergence is None, replay.divergence
    assert world.calls == calls and comparable(again) == comparable(original)
    with opened() as session, wasmbox.replaying(recorded) as replay:
        session.run(taped[0])
        session.run(taped[1] + "\n")  # other code
    name = "js" if runtime == "javascript" else "py"
    assert replay.divergences == [f"call 2 ({name}): its args differ from the recorded call's"]


SCIENTIFIC_OUTSIDE = """
import os, random, time, uuid
import numpy as np
print(time.time(), flush=True)
[time.time_ns(), time.monotonic(), random.random(), float(np.random.rand()),
 int(np.random.default_rng().integers(1 << 30)), os.urandom(4).hex(), uuid.uuid4().hex,
 open('/data/in.txt').read()]
"""


@pytest.mark.slow
def test_a_scientific_call_replays_with_its_clock_randomness_and_files(
    scientific_box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("data")
    grants = {"name": "sci", "runtime": "python", "python": "scientific",
              "limits": {"fuel": 5_000_000_000, "memory": "512MiB", "timeout": 20},
              "preopens": [{"host": str(tmp_path), "guest": "/data"}]}  # fmt: skip

    def run() -> CallResult:
        return scientific_box.run_python(SCIENTIFIC_OUTSIDE, grants)

    recorded = check_replayed(World(), run, change=lambda: None)  # the clock moved on
    (call,) = recorded.calls
    assert call.clock and len(call.random) >= 3  # (the driver reseeds random and numpy)
    assert call.files["/data/in.txt"][1] == 4
    (tmp_path / "in.txt").write_text("DATA")
    with wasmbox.replaying(recorded) as replay:
        run()
    assert replay.divergence == "call 1 (sci): file /data/in.txt changed since the recording"


def test_an_audited_call_names_its_tape(cache_dir: Path, world: World) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        box.register_host_function("host.fn", world.get)
        forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
        forward.call({"key": "a"})
        with wasmbox.recording() as recorded:
            forward.call({"key": "a"})
            forward.call({"key": "b"})
        with wasmbox.replaying(recorded):
            forward.call({"key": "b"})  # served the second recorded call
    assert [r.recording for r in records] == [
        None,
        f"{recorded.id}#1",
        f"{recorded.id}#2",
        f"{recorded.id}#2",
    ]


def test_a_replay_that_diverges_says_where(box: wasmbox.Sandbox, world: World) -> None:
    forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    with wasmbox.recording() as recorded:
        assert forward.call({"key": "a"}).ok
    with wasmbox.replaying(recorded) as replay:
        other = forward.call({"key": "b"})  # other arguments than recorded
    assert replay.divergences == [
        "call 1 (forward): its args differ from the recorded call's",
    ]
    assert other.error is not None and other.error.kind is ErrorKind.HOST_ERROR
    assert other.host_calls[0].detail == (
        "replay diverged at call 1 (forward): host call 1: host.fn was called with other arguments than recorded"
    )
    with wasmbox.replaying(recorded) as replay:
        assert forward.call({"key": "a"}).ok
        extra = forward.call({"key": "a"})  # one more than recorded
    assert replay.divergence == "call 2 (forward): it is not in the recording"
    assert extra.error is not None
    with wasmbox.replaying(recorded) as replay:
        pass  # none of the recorded calls made
    assert replay.divergence == "call 1 (forward) was recorded and not made"
    assert world.calls == 1


def test_a_python_call_with_other_code_diverges(box: wasmbox.Sandbox, world: World) -> None:
    code = "import wasmbox_guest\n[wasmbox_guest.call_host('kv.get', key=k) for k in KEYS]"
    with wasmbox.recording() as recorded:
        box.run_python("KEYS = ['a']\n" + code, GRANTS_PY)
    with wasmbox.replaying(recorded) as replay:
        box.run_python("KEYS = ['a']\n" + code, GRANTS_PY)
    assert replay.divergence is None
    with wasmbox.replaying(recorded) as replay:
        box.run_python("KEYS = ['a', 'a']\n" + code, GRANTS_PY)
    assert replay.divergences == ["call 1 (py): its args differ from the recorded call's"]
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
    assert replay.divergence is None and same(again) == same(original)
    assert box.stats().calls == before + 1  # the snippet ran; the inner tool did not


def test_tapes_do_not_nest() -> None:
    inner = wasmbox.replaying(wasmbox.Recording())
    with wasmbox.recording(), pytest.raises(RuntimeError, match="already open here"):
        inner.__enter__()


def _openai(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
