"""Host functions for tests/test_ray.py and tests/security/test_ray_pool.py, importable by the Ray actors (they import them by name)."""

from __future__ import annotations

import os
import time

import wasmbox

_STORE = {"greeting": "hello", "empty": ""}


def kv_get(key: str) -> str | None:
    if key.startswith("secret/"):
        raise wasmbox.CapabilityDeniedError("secret keys are not readable")
    return _STORE.get(key)


def shout(text: str) -> str:
    return text.upper()


def nap(seconds: float) -> None:
    time.sleep(seconds)


def environ(name: str) -> str | None:
    """The actor process's own environment variable `name` (so a test can show what it holds)."""
    return os.environ.get(name)


def spans_to_file() -> None:
    """A pool's `actor_setup`: wasmbox's telemetry on in the actor, its spans written by the
    SDK's console exporter as JSON lines to the file `$WASMBOX_TEST_SPANS` names."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    import wasmbox.telemetry

    out = open(os.environ["WASMBOX_TEST_SPANS"], "a")  # noqa: SIM115 - the exporter's for the process's life
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(indent=None) + "\n")
        )
    )
    wasmbox.telemetry.instrument(tracer_provider=provider)
