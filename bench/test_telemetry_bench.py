"""What `wasmbox.telemetry` costs a call (pytest-benchmark). Run:
./dev bench bench/test_telemetry_bench.py

The trivial echo call three ways in one run: telemetry off (the baseline: one check), on with
the API's default providers (no SDK configured: non-recording spans), and on with the SDK's
tracer and meter providers (spans recorded by a batch processor into an in-memory exporter,
metrics aggregated for an in-memory reader): what an instrumented agent server pays per call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import wasmbox
import wasmbox.telemetry

from .dispatch_overhead import ARGS, SCHEMA, WAT

sdk = pytest.importorskip("opentelemetry.sdk", reason="opentelemetry-sdk is in the test extra")


@pytest.fixture(scope="module")
def echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Tool]:
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache")) as box:
        yield box.load({"name": "echo", "module": str(WAT / "echo.wat"), "input_schema": SCHEMA})


def test_call_telemetry_off(benchmark: Any, echo: wasmbox.Tool) -> None:
    """The baseline."""
    wasmbox.telemetry.uninstrument()
    assert benchmark(echo.call, ARGS).ok


def test_call_telemetry_default_providers(benchmark: Any, echo: wasmbox.Tool) -> None:
    """Instrumented, no SDK configured."""
    wasmbox.telemetry.instrument()
    try:
        assert benchmark(echo.call, ARGS).ok
    finally:
        wasmbox.telemetry.uninstrument()


def test_call_telemetry_sdk(benchmark: Any, echo: wasmbox.Tool) -> None:
    """Instrumented with the SDK's providers."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    wasmbox.telemetry.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        assert benchmark(echo.call, ARGS).ok
    finally:
        wasmbox.telemetry.uninstrument()
        tracer_provider.shutdown()
