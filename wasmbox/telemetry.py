"""OpenTelemetry for wasmbox's calls (`pip install 'wasmbox[otel]'`, the official API).

    import wasmbox.telemetry
    wasmbox.telemetry.instrument()            # the global providers, or tracer_provider=/meter_provider=

From then on every tool call in the process is a span `execute_tool {name}` (GenAI semantic
conventions, with wasmbox's own attributes: kind, error kind, fuel, peak memory, host calls),
with a child span per host function that runs and a tool called by code nested under it, and
is counted in metrics (`wasmbox.calls`, `wasmbox.call.duration`, `wasmbox.call.fuel`,
`wasmbox.host_calls`). Spans join the caller's trace, across the Sandbox's worker threads too;
the MCP server's requests carry their client's trace context (the SDK's). Without
`instrument()` nothing of OpenTelemetry is imported and a call pays one check.
"""

from __future__ import annotations

from typing import Any

from . import _telemetry

__all__ = ["instrument", "instrumented", "uninstrument"]


def instrument(*, tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Turn spans and metrics on for every Sandbox of the process (again: with these providers).
    ImportError naming the extra when `opentelemetry-api` is missing."""
    try:
        _telemetry.active = _telemetry.Instruments(tracer_provider, meter_provider)
    except ImportError as exc:
        raise ImportError("wasmbox.telemetry needs opentelemetry-api: pip install 'wasmbox[otel]'") from exc


def uninstrument() -> None:
    """Turn them off again."""
    _telemetry.active = None


def instrumented() -> bool:
    """Whether `instrument` is in effect."""
    return _telemetry.active is not None
