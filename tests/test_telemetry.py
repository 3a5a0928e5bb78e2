"""`wasmbox.telemetry`: spans and metrics of calls, read back through the OpenTelemetry SDK's
in-memory exporters (real providers, no mock of the API)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "opentelemetry.sdk", reason="opentelemetry-sdk is in the test extra: pip install -e '.[test]'"
)

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import wasmbox
import wasmbox.telemetry

from .conftest import wat


class Recorded:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.metrics = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metrics])

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self, name: str) -> list[Any]:
        data = self.metrics.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    got = Recorded()
    wasmbox.telemetry.instrument(tracer_provider=got.tracer_provider, meter_provider=got.meter_provider)
    try:
        yield got
    finally:
        wasmbox.telemetry.uninstrument()


def test_a_call_is_an_execute_tool_span_with_wasmboxs_attributes(
    box: wasmbox.Sandbox, recorded: Recorded
) -> None:
    echo = box.load({"name": "echo", "module": wat("echo")})
    trap = box.load({"name": "trap", "module": wat("trap")})
    assert echo.call({"a": 1}).ok and not trap.call().ok
    ok, failed = recorded.finished()
    assert ok.name == "execute_tool echo" and failed.name == "execute_tool trap"
    assert ok.attributes is not None and failed.attributes is not None
    assert ok.attributes["gen_ai.operation.name"] == "execute_tool"
    assert ok.attributes["gen_ai.tool.name"] == "echo" and ok.attributes["wasmbox.tool.kind"] == "abi"
    assert ok.attributes["wasmbox.fuel_used"] > 0 and "error.type" not in ok.attributes
    assert ok.status.status_code is StatusCode.UNSET
    assert failed.attributes["error.type"] == "trap" and failed.status.status_code is StatusCode.ERROR
    calls = {
        (p.attributes["gen_ai.tool.name"], p.attributes.get("error.type")): p.value
        for p in recorded.points("wasmbox.calls")
    }
    assert calls == {("echo", None): 1, ("trap", "trap"): 1}
    (duration,) = [
        p for p in recorded.points("wasmbox.call.duration") if p.attributes["gen_ai.tool.name"] == "echo"
    ]
    assert duration.count == 1 and duration.sum > 0


def test_host_calls_are_child_spans_and_code_called_tools_nest(
    box: wasmbox.Sandbox, recorded: Recorded, tmp_path: Path
) -> None:
    box.register_host_function("host.fn", lambda i: i * 2)
    box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
    (tmp_path / "twice.py").write_text("def main(i: int) -> int:\n    return tools.forward(i=i) + 1\n")
    box.load(
        {"name": "twice", "runtime": "python", "source": str(tmp_path / "twice.py"), "tools": ["forward"]}
    )
    with recorded.tracer_provider.get_tracer("test").start_as_current_span("agent turn") as turn:
        assert box.tool("twice").call({"i": 20}).value == 41
    spans = {span.name: span for span in recorded.finished()}
    assert set(spans) == {
        "agent turn", "execute_tool twice", "host_call wasmbox.call_tool", "execute_tool forward", "host_call host.fn",
    }  # fmt: skip
    chain = ["execute_tool twice", "host_call wasmbox.call_tool", "execute_tool forward", "host_call host.fn"]
    parent = spans["agent turn"]
    for name in chain:  # each the child of the one before, in the caller's trace
        span = spans[name]
        assert span.parent is not None and span.parent.span_id == parent.context.span_id, name
        assert span.context.trace_id == turn.get_span_context().trace_id
        parent = span
    assert spans["host_call host.fn"].attributes["wasmbox.host_call.verdict"] == "ok"  # type: ignore[index]
    verdicts = {
        p.attributes["wasmbox.host_function.name"]: p.value for p in recorded.points("wasmbox.host_calls")
    }
    assert verdicts == {"wasmbox.call_tool": 1, "host.fn": 1}


def test_refused_host_calls_are_events_on_the_calls_span(box: wasmbox.Sandbox, recorded: Recorded) -> None:
    result = box.run_python("import wasmbox_guest\nwasmbox_guest.call_host('kv.get', key='a')")
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.CAPABILITY_DENIED
    (span,) = recorded.finished()
    assert span.name == "execute_tool python" and span.attributes["error.type"] == "capability_denied"  # type: ignore[index]
    (event,) = span.events
    assert event.name == "host_call refused" and event.attributes == {
        "wasmbox.host_function.name": "kv.get", "wasmbox.host_call.verdict": "denied",
    }  # fmt: skip


def test_dispatch_and_acall_carry_the_trace_to_the_worker_threads(
    box: wasmbox.Sandbox, recorded: Recorded
) -> None:
    box.load({"name": "echo", "module": wat("echo")})
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}}
        for i in range(3)
    ]
    tracer = recorded.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("turn") as turn:
        replies = box.dispatch(calls, format="openai")  # three calls: on the worker threads
    assert [json.loads(r["content"]) for r in replies] == [{}] * 3

    async def awaited() -> None:
        with tracer.start_as_current_span("async turn"):
            await box.acall("echo", {})
            await box.adispatch(calls[:2], format="openai")

    asyncio.run(awaited())
    spans = recorded.finished()
    by_trace: dict[int, list[str]] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span.name)
    assert sorted(by_trace[turn.get_span_context().trace_id]) == ["execute_tool echo"] * 3 + ["turn"]
    assert len(by_trace) == 2 and all(len(names) in (4,) for names in by_trace.values())
    ids = sorted(s.attributes.get("gen_ai.tool.call.id", "") for s in spans if s.name == "execute_tool echo")  # type: ignore[union-attr]
    assert ids == ["", "call_0", "call_0", "call_1", "call_1", "call_2"]  # acall has no model id


def test_session_runs_have_spans_and_off_means_off(box: wasmbox.Sandbox, recorded: Recorded) -> None:
    with box.session() as session:
        assert session.run("x = 1").ok
    (span,) = recorded.finished()
    assert span.name == "execute_tool python" and span.attributes["wasmbox.session"] == session.name  # type: ignore[index]
    wasmbox.telemetry.uninstrument()
    assert not wasmbox.telemetry.instrumented()
    box.run_python("1")
    assert len(recorded.finished()) == 1  # nothing more once off


def test_mcp_calls_join_the_clients_trace(box: wasmbox.Sandbox, recorded: Recorded) -> None:
    """The mcp client sends its trace context in `_meta`; the server's call joins that trace."""
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    box.load({"name": "echo", "module": wat("echo")})
    tracer = recorded.tracer_provider.get_tracer("test")

    async def run() -> int:
        async with Client(wasmbox_mcp.build_server(box)) as client:
            with tracer.start_as_current_span("client turn") as turn:
                assert (await client.call_tool("echo", {"a": 1})).is_error is False
                return turn.get_span_context().trace_id

    trace_id = asyncio.run(asyncio.wait_for(run(), 60))
    (call,) = [span for span in recorded.finished() if span.name == "execute_tool echo"]
    assert call.context.trace_id == trace_id


def _gauge(recorded: Recorded, name: str) -> int:
    (point,) = recorded.points(name)
    return int(point.value)


def test_pool_state_is_in_stats_and_in_gauges(cache_dir: Path, recorded: Recorded) -> None:
    """A call held in a host function is one call in flight and one store open, in `stats()`
    and in the gauges (which sum the process's open Sandboxes: read as differences); its store
    is freed when it ends; a Python call leaves a spare instance ready for the next."""
    import threading

    inside, release = threading.Event(), threading.Event()

    def hold(x: int) -> int:
        inside.set()
        assert release.wait(60)
        return x

    with wasmbox.Sandbox(cache_dir=cache_dir, admission=wasmbox.AdmissionLimits(in_flight=8)) as box:
        box.register_host_function("host.fn", hold)
        forward = box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"],
                            "limits": {"timeout": "60s"}})  # fmt: skip
        idle = box.stats()
        assert (idle.in_flight, idle.stores, idle.spares) == (0, 0, 0)
        before = {name: _gauge(recorded, name) for name in (
            "wasmbox.calls.in_flight", "wasmbox.admission.in_flight", "wasmbox.pool.stores"
        )}  # fmt: skip
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(forward.call, {"x": 7})
            assert inside.wait(60)
            busy = box.stats()
            assert (busy.in_flight, busy.stores) == (1, 1)
            assert busy.admission is not None and busy.admission.in_flight == 1
            during = {name: _gauge(recorded, name) - was for name, was in before.items()}
            assert during["wasmbox.calls.in_flight"] == during["wasmbox.admission.in_flight"] == 1
            # (another open Sandbox may make or free a spare meanwhile: this one's store is in it)
            assert _gauge(recorded, "wasmbox.pool.stores") >= busy.stores
            release.set()
            assert running.result().value == 7
        done = box.stats()
        assert (done.in_flight, done.stores) == (0, 0)
        assert box.run_python("1").ok  # the Python runtime makes a spare for the next call
        deadline = time.monotonic() + 60
        while box.stats().spares < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        ready = box.stats()
        assert ready.spares == 1 and ready.stores >= 1  # the spare's store
        assert _gauge(recorded, "wasmbox.pool.spares") >= 1


def test_stores_freed_by_the_python_housekeeper_are_counted_closed(cache_dir: Path) -> None:
    """Back-to-back Python calls hand their stores to the runtime's housekeeping thread; once
    it has freed them, `stats().stores` holds only the spares' (one per grant set here)."""
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        for _ in range(30):
            assert box.run_python("1").ok
        deadline = time.monotonic() + 60
        while box.stats().stores > box.stats().spares and time.monotonic() < deadline:
            time.sleep(0.01)
        settled = box.stats()
        assert settled.stores == settled.spares <= 1, settled


def test_an_overloaded_call_is_traced_and_counted(cache_dir: Path, recorded: Recorded) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, admission=wasmbox.AdmissionLimits(resident=1)) as box:
        echo = box.load({"name": "echo", "module": wat("echo")})
        assert echo.call({}).error.kind is wasmbox.ErrorKind.OVERLOADED  # type: ignore[union-attr]
    (span,) = recorded.finished()
    assert span.attributes is not None and span.attributes["error.type"] == "overloaded"
    (point,) = [p for p in recorded.points("wasmbox.calls") if p.attributes.get("error.type") == "overloaded"]
    assert point.value == 1
