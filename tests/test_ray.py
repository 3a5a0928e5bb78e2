"""RaySandboxPool on a real local Ray cluster (one for the module): results equal to in-process
ones, a killed actor, audit records on the driver, grants a node lacks, host functions that
cannot travel. Slow (the cluster and its actors take seconds to start): `-m "not slow"` skips."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import AuditRecord, Budget, CallResult, ErrorKind
from wasmbox._inputs import InputUnavailable

from . import ray_hosts
from .conftest import CAPABILITIES, manifest

pytestmark = pytest.mark.slow

# Ray's node address: the loopback one (Ray takes the address it would reach other machines
# from, unless it believes it is on a laptop); read when Ray is imported, and by its workers.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
if not os.environ.get("CI"):
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'wasmbox[ray]'); CI installs it")
from wasmbox.integrations import ray as ray_pool  # noqa: I001 - before Ray, as docs/ray.md says
from wasmbox.integrations.ray import RaySandboxPool, _File, _remote_actor, _Shipment
import ray

ACTOR = {"num_cpus": 0.25}  # the 2-CPU test cluster holds the module's pool and the short-lived ones
HOSTS = {"kv.get": "tests.ray_hosts:kv_get", "test.nap": "tests.ray_hosts:nap"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    if ray.is_initialized():
        pytest.skip("a Ray cluster is already connected in this process")
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit
    wasmbox.Sandbox(cache_dir=None).close()  # this process's first Engine (if no test made one) before Ray's
    ray.init(
        num_cpus=2, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1",
        log_to_driver=False, configure_logging=False,
    )  # fmt: skip
    try:
        yield
    finally:
        ray_pool.shutdown()  # ray.shutdown, and Wasmtime's trap handlers back (the suite goes on)
        shutil.rmtree(temp, ignore_errors=True)
    with wasmbox.Sandbox(cache_dir=None) as box:  # (with Ray's defaults left, this kills the process)
        assert box.load(manifest("trap")).call().error.kind is ErrorKind.TRAP  # type: ignore[union-attr]


def _sleep_manifest() -> dict[str, Any]:
    return manifest("spin", limits={"timeout": 2, "fuel": 10**15})


# Reads far past its one page of memory: a fault in the guard region (SIGSEGV), which
# Wasmtime's handler makes a trap.
FAULT = """(module (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.load (i32.const 0x7fff0000))))"""


@pytest.fixture(scope="module")
def built(built_examples: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example guests, and fault.wat beside them (in a folder of this module's)."""
    folder = tmp_path_factory.mktemp("ray-guests")
    (folder / "fault.wat").write_text(FAULT)
    for name in ("fsprobe.wasm",):
        shutil.copy(built_examples / name, folder / name)
    return folder


def _manifests(built: Path) -> list[Any]:
    return [
        manifest("echo"),
        manifest("trap"),
        {"name": "fault", "module": str(built / "fault.wat")},
        CAPABILITIES / "word_count.toml",
        CAPABILITIES / "kv_lookup.toml",
        CAPABILITIES / "bar_chart.toml",
        {"name": "probe", "module": str(built / "fsprobe.wasm")},
        CAPABILITIES / "csv_stats.toml",
        _sleep_manifest(),
    ]


@pytest.fixture(scope="module")
def audit() -> list[AuditRecord]:
    return []


@pytest.fixture(scope="module")
def pool(cluster: None, built: Path, cache_dir: Path, audit: list[AuditRecord]) -> Iterator[RaySandboxPool]:
    with RaySandboxPool(
        _manifests(built), actors=2, actor_options=ACTOR, host_functions=HOSTS,
        cache_dir=cache_dir, max_workers=2, audit=audit.append,
    ) as started:  # fmt: skip
        yield started


@pytest.fixture(scope="module")
def local(built: Path, cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        box.register_host_function("kv.get", ray_hosts.kv_get)
        box.register_host_function("test.nap", ray_hosts.nap)
        for source in _manifests(built):
            box.load(source)
        yield box


def check_same(got: CallResult, expected: CallResult) -> None:
    assert same(got).model_dump() == same(expected).model_dump()  # (pytest shows a dict's diff)
    assert same(got) == same(expected)


def same(result: CallResult) -> CallResult:
    """A result without its timings (the only fields two runs of one call may differ in)."""
    calls = [dataclasses.replace(call, duration_s=0.0) for call in result.host_calls]
    return result.model_copy(update={"duration_s": 0.0, "host_calls": calls})


CALLS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("echo", {"n": 1, "s": "hé", "b": b"\x00\xff", "l": [1, 2.5, None]}, {}),
    ("trap", {}, {}),  # a division by zero: SIGFPE, which Wasmtime's handler makes a trap
    ("fault", {}, {}),  # SIGSEGV
    ("word_count", {"path": "/data/sample.txt"}, {}),
    ("word_count", {"path": "/data/../../etc/passwd"}, {}),  # refused by WASI: a guest error
    ("word_count", {"nope": 1}, {}),  # invalid arguments, checked on the actor
    ("kv_lookup", {"key": "greeting"}, {}),  # a host function imported on the actor
    ("kv_lookup", {"key": "secret/x"}, {}),
    ("bar_chart", {"values": [1, -2, 3], "format": "png"}, {}),  # a command with an output file
    ("probe", {}, {"argv": ["argv", "a b", "-c"]}),  # a command with argv
    ("probe", {}, {"argv": ["cat"], "stdin": b"piped \xff"}),
    ("csv_stats", {"path": "/data/sales.csv", "group_by": "region"}, {}),  # Python, a preopen
]


@pytest.mark.parametrize(
    ("name", "args", "kwargs"), CALLS, ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(CALLS)]
)
def test_results_equal_in_process(
    pool: RaySandboxPool, local: wasmbox.Sandbox, name: str, args: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    expected = local.call(name, args, **kwargs)
    got = pool.call(name, args, **kwargs)
    assert type(got) is CallResult
    assert same(got) == same(expected)
    assert same(got).model_dump() == same(expected).model_dump()
    assert pickle.loads(pickle.dumps(expected)) == expected  # (how Ray sends it back)
    assert same(asyncio.run(pool.acall(name, args, **kwargs))) == same(expected)


def test_in_process_traps_survive_ray_init(pool: RaySandboxPool, local: wasmbox.Sandbox) -> None:
    """ray.init (in the fixture, after this process's first Engine) replaced Wasmtime's trap
    signal handlers with Ray's crash reporter; the pool's start put Wasmtime's back, so a
    guest's fault in this process is a trap result, not the end of the process."""
    for name in ("trap", "fault"):
        result = local.call(name)
        assert result.error is not None and result.error.kind is ErrorKind.TRAP, result


def test_run_python_equal_in_process(pool: RaySandboxPool, local: wasmbox.Sandbox) -> None:
    code = "import sys\nprint('out'); print('err', file=sys.stderr)\nsum(range(10)), [1.5, None, b'x']"
    check_same(pool.run_python(code), local.run_python(code))
    assert pool.run_python(code).value == [45, [1.5, None, b"x"]]
    failing = "1/0"
    check_same(asyncio.run(pool.arun_python(failing)), local.run_python(failing))
    grants = {
        "name": "snippet",
        "runtime": "python",
        "preopens": [{"host": str(CAPABILITIES / "data"), "guest": "/data"}],
    }
    reads = "open('/data/sample.txt').read()"
    check_same(pool.run_python(reads, grants), local.run_python(reads, grants))
    with pytest.raises(wasmbox.ManifestError, match="no source"):
        pool.run_python(
            "1", {"name": "t", "runtime": "python", "source": str(CAPABILITIES / "tools" / "csv_stats.py")}
        )


def test_run_javascript_equal_in_process(pool: RaySandboxPool, local: wasmbox.Sandbox) -> None:
    try:
        local.prepare_javascript()
    except InputUnavailable as exc:
        pytest.skip(f"the JavaScript runtime's pinned wheel cannot be fetched: {exc}")
    code = "console.log('out'); console.error('err'); [1.5, null, 'é'].concat([2 ** 10])"
    got = pool.run_javascript(code)
    assert got.value == [1.5, None, "é", 1024] and got.stdout == "out\n" and got.stderr == "err\n"
    check_same(got, local.run_javascript(code))
    failing = "null.x"
    check_same(asyncio.run(pool.arun_javascript(failing)), local.run_javascript(failing))
    grants = {
        "name": "snippet",
        "runtime": "javascript",
        "preopens": [{"host": str(CAPABILITIES / "data"), "guest": "/data"}],
    }
    reads = "std.loadFile('/data/sample.txt')"
    check_same(pool.run_javascript(reads, grants), local.run_javascript(reads, grants))
    with pytest.raises(wasmbox.ManifestError, match="run_javascript takes"):
        pool.run_javascript("1", {"name": "t", "runtime": "python"})
    calls = [
        {
            "id": "1",
            "type": "function",
            "function": {"name": "run_javascript", "arguments": '{"code": "6*7"}'},
        }
    ]
    expected = local.dispatch(calls, format="openai", javascript=True)
    assert pool.dispatch(calls, format="openai", javascript=True) == expected
    assert pool.specs("openai", javascript=True) == local.specs("openai", javascript=True)


def test_tools_specs_and_dispatch_as_the_sandbox(pool: RaySandboxPool, local: wasmbox.Sandbox) -> None:
    assert list(pool.tools) == list(local.tools)
    for name, tool in pool.tools.items():
        assert (tool.kind, tool.code_digest, tool.manifest_digest) == (
            local.tool(name).kind, local.tool(name).code_digest, local.tool(name).manifest_digest,
        )  # fmt: skip
    for format in ("generic", "openai", "anthropic", "mcp"):
        assert pool.specs(format, python=True) == local.specs(format, python=True)  # type: ignore[arg-type]
    calls = [
        {"id": "1", "type": "function", "function": {"name": "echo", "arguments": '{"x": 1}'}},
        {"id": "2", "type": "function", "function": {"name": "word_count", "arguments": '{"text": "a b"}'}},
        {"id": "3", "type": "function", "function": {"name": "run_python", "arguments": '{"code": "6*7"}'}},
        {"id": "4", "type": "function", "function": {"name": "nope", "arguments": "{}"}},
        {"id": "5", "type": "function", "function": {"name": "echo", "arguments": "not json"}},
    ]
    expected = local.dispatch(calls, format="openai", python=True)
    assert pool.dispatch(calls, format="openai", python=True) == expected
    assert asyncio.run(pool.adispatch(calls, format="openai", python=True)) == expected
    with pytest.raises(KeyError, match="nope"):
        pool.call("nope")


def test_calls_spread_by_load(pool: RaySandboxPool) -> None:
    with ThreadPoolExecutor(4) as threads:
        spinning = [threads.submit(pool.call, "spin") for _ in range(2)]
        _until(lambda: pool.in_flight() == [1, 1], "one spinning call on each actor")
        assert all(f.result().error.kind is ErrorKind.TIMEOUT for f in spinning)  # type: ignore[union-attr]


def test_audit_records_reach_the_driver(
    pool: RaySandboxPool, local: wasmbox.Sandbox, audit: list[AuditRecord]
) -> None:
    audit.clear()
    pool.call("kv_lookup", {"key": "greeting"})
    pool.call("kv_lookup", {"key": "secret/x"})
    pool.run_python("2 + 2")
    assert [r.tool for r in audit] == ["kv_lookup", "kv_lookup", "python"]
    kv = local.tool("kv_lookup")
    assert {(r.manifest_digest, r.code_digest) for r in audit[:2]} == {(kv.manifest_digest, kv.code_digest)}
    assert [r.host_calls[0].verdict for r in audit[:2]] == ["ok", "denied"]
    assert audit[1].refused and not audit[0].refused
    assert [r.seq for r in audit] == sorted({r.seq for r in audit})  # one sequence on the driver


def test_a_grant_missing_on_the_node_is_refused_at_start(
    cluster: None, tmp_path: Path, cache_dir: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    grants = wasmbox.Manifest.load(
        manifest("echo", name="reader", preopens=[{"host": str(data), "guest": "/data"}])
    )
    shutil.rmtree(data)  # read where it exists, then gone: as on a node without the folder
    free = ray.available_resources().get("CPU")
    with pytest.raises(
        wasmbox.CapabilityError, match=rf"reader: preopen {data} \(guest /data\) is not a directory on node"
    ):
        RaySandboxPool([manifest("echo"), grants], actors=2, actor_options=ACTOR, cache_dir=cache_dir)
    _until(lambda: ray.available_resources().get("CPU") == free, "the refused pool's actors ended")


def test_code_altered_on_its_way_to_a_node_is_refused(cluster: None, cache_dir: Path) -> None:
    """An actor loads a manifest's module only if its bytes have the sha256 the driver sent."""
    sent = b"(module)"
    other = hashlib.sha256(b"(module (func))").hexdigest()
    shipment = _Shipment(
        "m", {"name": "m", "module": None}, (_File("module", "m.wat", other, ray.put(sent)),), "d"
    )
    actor = _remote_actor().options(**ACTOR).remote()
    try:
        outcome = ray.get(actor.start.remote({"cache_dir": cache_dir}, False, [shipment], {}))
    finally:
        ray.kill(actor)
    assert isinstance(outcome, wasmbox.ManifestError)
    assert "m.wat arrived with another sha256 than it was sent with" in str(outcome)


def test_a_load_failure_fails_the_start(cluster: None, cache_dir: Path) -> None:
    with pytest.raises(wasmbox.CapabilityError, match="kv.get"):  # granted, not registered
        RaySandboxPool([CAPABILITIES / "kv_lookup.toml"], actors=1, actor_options=ACTOR, cache_dir=cache_dir)
    with pytest.raises(wasmbox.ManifestError, match="already loaded"):
        RaySandboxPool([manifest("echo"), manifest("echo")], actors=1)


def test_host_functions_that_cannot_travel_are_refused(pool: RaySandboxPool) -> None:
    store: dict[str, str] = {}

    def local_get(key: str) -> str | None:
        return store.get(key)

    for func in (lambda key: None, local_get):
        with pytest.raises(ValueError, match="cannot travel to the pool's actors"):
            RaySandboxPool([manifest("echo")], host_functions={"kv.get": func})
        with pytest.raises(ValueError, match="cannot travel"):
            pool.register_host_function("kv.local", func)
    with pytest.raises(ValueError, match="cannot import tests.ray_hosts:missing"):
        pool.register_host_function("kv.missing", "tests.ray_hosts:missing")
    with pytest.raises(ValueError, match="already registered"):
        pool.register_host_function("kv.get", ray_hosts.kv_get)
    pool.register_host_function("text.shout", ray_hosts.shout)  # a function object, by its name
    grants = {"name": "shouter", "runtime": "python", "host_functions": ["text.shout"]}
    result = pool.run_python("import wasmbox_guest\nwasmbox_guest.call_host('text.shout', text='hi')", grants)
    assert result.value == "HI", result


def test_an_actor_setup_that_cannot_travel_is_refused(cluster: None) -> None:
    with pytest.raises(ValueError, match="actor_setup: .* cannot travel to the pool's actors"):
        RaySandboxPool([manifest("echo")], actor_setup=lambda: None)
    with pytest.raises(ValueError, match="actor_setup: cannot import tests.ray_hosts:nothing"):
        RaySandboxPool([manifest("echo")], actor_setup="tests.ray_hosts:nothing")


def test_input_ray_cannot_send_is_invalid_arguments_and_frees_its_slot(
    pool: RaySandboxPool, local: wasmbox.Sandbox, audit: list[AuditRecord]
) -> None:
    """Args (or code, or argv) Ray cannot serialize are answered as in-process, with a record,
    and give their actor's slot back: nothing stays counted in flight."""
    unsendable = threading.Lock()
    expected = local.call("word_count", {"path": unsendable})
    assert expected.error is not None and expected.error.kind is ErrorKind.INVALID_ARGUMENTS
    audit.clear()
    answers = [
        pool.call("word_count", {"path": unsendable}),
        asyncio.run(pool.acall("word_count", {"path": unsendable})),
        pool.run_python(unsendable),  # type: ignore[arg-type]
        pool.call("probe", argv=[unsendable]),  # type: ignore[list-item]
    ]
    for result in answers:
        assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS, result
        assert "cannot be sent to a Ray actor" in result.error.message
    assert [(r.tool, r.error_kind) for r in audit] == [
        ("word_count", "invalid_arguments"), ("word_count", "invalid_arguments"),
        ("python", "invalid_arguments"), ("probe", "invalid_arguments"),
    ]  # fmt: skip
    assert pool.in_flight() == [0, 0]
    assert pool.call("echo", {"a": 1}).value == {"a": 1}


def test_a_call_never_answered_is_a_host_error(pool: RaySandboxPool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver waits for an answer its deadline plus the start timeout, not forever (here a
    host function holds the call on the actor for 3 s, past both)."""
    monkeypatch.setattr(pool, "_start_timeout_s", 0.5)
    grants = {
        "name": "napper",
        "runtime": "python",
        "host_functions": ["test.nap"],
        "limits": {"timeout": 0.5},
    }
    code = "import wasmbox_guest\nwasmbox_guest.call_host('test.nap', seconds=3)"
    for result in (pool.run_python(code, grants), asyncio.run(pool.arun_python(code, grants))):
        assert result.error is not None and result.error.kind is ErrorKind.HOST_ERROR, result
        assert "no answer from the Ray actor running this call" in result.error.message
    monkeypatch.undo()
    assert pool.call("echo", {"a": 1}).value == {"a": 1}


def test_a_killed_actor_fails_its_calls_and_is_replaced(
    pool: RaySandboxPool, audit: list[AuditRecord]
) -> None:
    audit.clear()
    victim, survivor = pool.actors
    with ThreadPoolExecutor(2) as threads:
        spinning = [threads.submit(pool.call, "spin") for _ in range(2)]
        _until(lambda: pool.in_flight() == [1, 1], "one spinning call on each actor")
        ray.kill(victim)
        results = [future.result(timeout=60) for future in spinning]
    kinds = sorted(r.error.kind.value for r in results if r.error)
    assert kinds == ["host_error", "timeout"], results
    lost = next(r for r in results if r.error and r.error.kind is ErrorKind.HOST_ERROR)
    assert lost.error is not None and "died before it answered" in lost.error.message
    assert pool.call("echo", {"a": 1}).value == {"a": 1}  # served meanwhile
    _until(lambda: len(pool.actors) == 2, "the replacement actor started")
    assert victim not in pool.actors and survivor in pool.actors
    with ThreadPoolExecutor(4) as threads:
        assert [
            f.result().value for f in [threads.submit(pool.call, "echo", {"i": i}) for i in range(8)]
        ] == [{"i": i} for i in range(8)]
    assert pool.call("kv_lookup", {"key": "greeting"}).value == {
        "key": "greeting",
        "value": "hello",
    }  # host functions too
    assert {"host_error", "timeout"} <= {
        r.error_kind for r in audit if r.tool == "spin"
    }  # the lost call's record


def test_budgets_are_held_on_the_driver(pool: RaySandboxPool, audit: list[AuditRecord]) -> None:
    """One budget across call, acall, run_python and dispatch, decided and charged on the driver
    with what the actors' results say they used; a refused call never reaches an actor."""
    audit.clear()
    budget = Budget(calls=5, name="tenant")
    results = [
        pool.call("echo", {"a": 1}, budget=budget),
        asyncio.run(pool.acall("echo", {"a": 2}, budget=budget)),
        pool.run_python("2 + 2", budget=budget),
    ]
    assert [r.error for r in results] == [None, None, None]
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}} for i in range(3)
    ]
    replies = pool.dispatch(calls, format="openai", budget=budget)
    kinds = sorted(json.loads(r["content"]).get("error", {}).get("kind", "ok") for r in replies)
    assert kinds == ["ok", "ok", "over_budget"]
    refused = asyncio.run(pool.arun_python("1", budget=budget))
    assert refused.error is not None and refused.error.kind is ErrorKind.OVER_BUDGET
    assert refused.error.message == "not run: tenant: its calls (5) is used up"
    used = budget.used()
    assert used["calls"] == 5 and used["running"] == 0
    assert used["fuel"] >= sum(r.fuel_used for r in results) > 0  # (and the dispatched calls')
    # five ran on the actors; the refused run_python is recorded here (dispatch's refusals are
    # its replies, not calls, as in-process)
    assert [r.error_kind for r in audit] == [None] * 5 + ["over_budget"]


def test_the_trace_context_reaches_the_actors(cluster: None, cache_dir: Path, tmp_path: Path) -> None:
    """With telemetry on in the driver and (through `actor_setup`) in the actors, an actor's
    `execute_tool` span is a child of the span current where the call was made: for call,
    acall and dispatch."""
    pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is in the test extra")
    from opentelemetry.sdk.trace import TracerProvider

    import wasmbox.telemetry

    spans = tmp_path / "spans.jsonl"
    tracer = TracerProvider().get_tracer("test")
    options = {**ACTOR, "runtime_env": {"env_vars": {"WASMBOX_TEST_SPANS": str(spans)}}}
    calls = [{"id": "c1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]
    with RaySandboxPool(
        [manifest("echo")], actors=1, actor_options=options, cache_dir=cache_dir, max_workers=1,
        actor_setup="tests.ray_hosts:spans_to_file",
    ) as traced:  # fmt: skip
        wasmbox.telemetry.instrument(tracer_provider=TracerProvider())
        try:
            parents = []
            for make in (
                lambda: traced.call("echo", {"a": 1}),
                lambda: asyncio.run(traced.acall("echo", {"a": 2})),
                lambda: traced.dispatch(calls, format="openai"),
            ):
                with tracer.start_as_current_span("request") as request:
                    make()
                    parents.append(request.get_span_context())
        finally:
            wasmbox.telemetry.uninstrument()
        assert traced.call("echo", {}).ok  # (off in the driver: no context sent)
    remote = [json.loads(line) for line in spans.read_text().splitlines()]
    assert [span["name"] for span in remote] == ["execute_tool echo"] * 4
    joined = [(span["context"]["trace_id"], span["parent_id"]) for span in remote]
    assert joined[:3] == [(f"0x{p.trace_id:032x}", f"0x{p.span_id:016x}") for p in parents]
    assert joined[3][1] is None and joined[3][0] not in {j[0] for j in joined[:3]}


def test_a_closed_pool_refuses_calls(cluster: None, cache_dir: Path) -> None:
    pool = RaySandboxPool([manifest("echo")], actors=1, actor_options=ACTOR, cache_dir=cache_dir)
    assert pool.call("echo", {"x": 1}).value == {"x": 1}
    pool.close()
    with pytest.raises(wasmbox.WasmboxError, match="closed"):
        pool.call("echo", {"x": 1})


def _until(condition: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for: {what}"
        time.sleep(0.05)


def test_limits_per_call_are_checked_on_the_driver_and_run_on_the_actors(
    pool: RaySandboxPool, local: wasmbox.Sandbox
) -> None:
    tight = pool.call("echo", {"text": "x"}, limits={"fuel": 10})
    assert tight.error is not None and tight.error.kind is ErrorKind.OUT_OF_FUEL and tight.fuel_used == 10
    assert same(tight) == same(local.call("echo", {"text": "x"}, limits={"fuel": 10}))
    assert pool.call("echo", {"text": "x"}).ok  # the next call under the manifest's own
    with pytest.raises(wasmbox.LimitsError, match="echo: limits.fuel"):
        pool.call("echo", {}, limits={"fuel": 10**18})
    cut = pool.run_python("print('x' * 100)", limits={"output": 10})
    assert cut.error is not None and cut.error.kind is ErrorKind.OUTPUT_LIMIT
    with pytest.raises(wasmbox.LimitsError, match="limits.timeout"):
        asyncio.run(pool.arun_python("1", limits={"timeout": 3600}))
    calls = [{"id": "1", "type": "function", "function": {"name": "echo", "arguments": "{}"}}]
    [reply] = pool.dispatch(calls, format="openai", limits=wasmbox.CallLimits(fuel=10))
    assert "fuel" in reply["content"]
