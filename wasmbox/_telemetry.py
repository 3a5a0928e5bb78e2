"""OpenTelemetry spans and metrics of calls, once `wasmbox.telemetry.instrument()` has run.

Until then `active` is None and a call pays one module-global read. Once on: a span per tool
call following the GenAI conventions for tool execution (`execute_tool {name}`,
`gen_ai.operation.name`, `gen_ai.tool.name`, `gen_ai.tool.call.id` when a model's call gave
one, `error.type`), with wasmbox's own attributes (`wasmbox.tool.kind`, `wasmbox.fuel_used`,
`wasmbox.peak_memory`, `wasmbox.host_calls`); a child span per host function that runs
(`host_call {name}`; a tool code calls nests under it), a span event per host call refused
before running; and metrics: `wasmbox.calls` (by tool, kind and `error.type`),
`wasmbox.call.duration` (s), `wasmbox.call.fuel`, `wasmbox.host_calls` (by name and verdict);
and gauges of the process's open Sandboxes, summed when the metrics are collected:
`wasmbox.calls.in_flight`, `wasmbox.admission.in_flight`, `wasmbox.pool.stores`,
`wasmbox.pool.spares`, `wasmbox.sessions`.
Spans join the trace that is current where the call is made: work handed to the Sandbox's
worker threads (acall, dispatch, the MCP server) carries the caller's context there (`carried`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._results import CallResult, HostCallRecord
    from ._sandbox import Sandbox
    from ._stats import SandboxStats

T = TypeVar("T")
R = TypeVar("R")

_log = logging.getLogger(__name__)

_NAME = "wasmbox"
# the id a model gave the tool call being run on this thread (dispatch sets it), for the span
model_call_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "wasmbox_model_call_id", default=None
)


class Instruments:
    """The tracer and the meter's instruments, made once by `instrument`."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        from opentelemetry import metrics, trace

        from . import __version__

        self._trace = trace
        self.tracer = trace.get_tracer(_NAME, __version__, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_NAME, __version__, meter_provider=meter_provider)
        self.calls = meter.create_counter("wasmbox.calls", unit="{call}", description="Tool calls run")
        self.duration = meter.create_histogram(
            "wasmbox.call.duration", unit="s", description="A call's duration"
        )
        self.fuel = meter.create_histogram("wasmbox.call.fuel", unit="{fuel}", description="Fuel a call used")
        self.host_calls = meter.create_counter(
            "wasmbox.host_calls", unit="{call}", description="Host-function calls, refused ones too"
        )
        # the state of the process's open Sandboxes, summed, read when the metrics are collected
        for name, unit, description, read in _GAUGES:
            meter.create_observable_gauge(
                name, callbacks=[functools.partial(_observed, read)], unit=unit, description=description
            )

    def tool_call(
        self, name: str, kind: str, run: Callable[[], CallResult], session: str | None = None
    ) -> CallResult:
        """`run()` (a tool call, or a session's run) inside its span; see `guarded`."""
        return guarded(self.tool_span(name, kind, session), run)

    def host_call(self, name: str, run: Callable[[], R], record: Callable[[R], HostCallRecord]) -> R:
        """`run()` (a host function) inside its span, its verdict from `record(reply)`."""
        return guarded(self.host_span(name), run, record)

    @contextlib.contextmanager
    def tool_span(
        self, name: str, kind: str, session: str | None = None
    ) -> Iterator[Callable[[CallResult], None]]:
        """The span of one tool call (a session's run: `session` names it), current while it
        runs; yields what records its result."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "gen_ai.tool.type": "function",
            "wasmbox.tool.kind": kind,
        }
        if session is not None:
            attributes["wasmbox.session"] = session
        call_id = model_call_id.get()
        if call_id:
            attributes["gen_ai.tool.call.id"] = call_id
        with self.tracer.start_as_current_span(
            f"execute_tool {name}", kind=self._trace.SpanKind.INTERNAL, attributes=attributes
        ) as span:
            yield lambda result: self._ended(span, result, name, kind)

    def _ended(self, span: Any, result: CallResult, name: str, kind: str) -> None:
        span.set_attribute("wasmbox.fuel_used", result.fuel_used)
        span.set_attribute("wasmbox.host_calls", len(result.host_calls))
        if result.peak_memory is not None:
            span.set_attribute("wasmbox.peak_memory", result.peak_memory)
        labels: dict[str, Any] = {"gen_ai.tool.name": name, "wasmbox.tool.kind": kind}
        if result.error is not None:
            error = result.error.kind.value
            span.set_attribute("error.type", error)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, result.error.message[:200]))
            labels["error.type"] = error
        self.calls.add(1, labels)
        self.duration.record(result.duration_s, labels)
        self.fuel.record(result.fuel_used, labels)

    @contextlib.contextmanager
    def host_span(self, name: str) -> Iterator[Callable[[HostCallRecord], None]]:
        """The span of one host function running, current while it runs (a tool its code
        calls nests under it); yields what records its verdict."""
        with self.tracer.start_as_current_span(
            f"host_call {name}", attributes={"wasmbox.host_function.name": name}
        ) as span:

            def ended(record: HostCallRecord) -> None:
                span.set_attribute("wasmbox.host_call.verdict", record.verdict)
                if record.verdict != "ok":
                    span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, record.verdict))
                self.host_calls.add(
                    1, {"wasmbox.host_function.name": name, "wasmbox.host_call.verdict": record.verdict}
                )

            yield ended

    def refused(self, record: HostCallRecord) -> None:
        """A host call refused before its function ran: an event on the call's span."""
        attributes = {
            "wasmbox.host_function.name": record.name[:128],
            "wasmbox.host_call.verdict": record.verdict,
        }
        try:  # (a broken exporter or provider never changes what the guest is told)
            self._trace.get_current_span().add_event("host_call refused", attributes)
            self.host_calls.add(1, attributes)
        except Exception:  # noqa: BLE001 - telemetry failing must not fail the call
            _log.exception("wasmbox telemetry failed; the call goes on without it")


active: Instruments | None = None

_open: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # the Sandboxes the gauges read
_open_lock = threading.Lock()


def observe(box: Sandbox) -> None:
    """Count `box`'s state in the gauges until `forget` (or until it is collected)."""
    with _open_lock:
        _open.add(box)


def forget(box: Sandbox) -> None:
    with _open_lock:
        _open.discard(box)


def _admitted(stats: SandboxStats) -> int:
    return stats.admission.in_flight if stats.admission is not None else 0


_GAUGES: tuple[tuple[str, str, str, Callable[[SandboxStats], int]], ...] = (
    (
        "wasmbox.calls.in_flight",
        "{call}",
        "Calls running (tools code calls among them)",
        lambda stats: stats.in_flight,
    ),
    ("wasmbox.admission.in_flight", "{call}", "Calls admitted and not ended (running or queued)", _admitted),
    (
        "wasmbox.pool.stores",
        "{store}",
        "Stores open: calls', spares', sessions'; each holds pool slots",
        lambda stats: stats.stores,
    ),
    (
        "wasmbox.pool.spares",
        "{instance}",
        "Spare Python instances ready for a next call",
        lambda stats: stats.spares,
    ),
    ("wasmbox.sessions", "{session}", "Sessions open", lambda stats: stats.sessions),
)


def _observed(read: Callable[[SandboxStats], int], options: Any) -> Iterator[Any]:
    """One observation: `read` of every open Sandbox's stats, summed."""
    from opentelemetry.metrics import Observation

    with _open_lock:
        boxes = list(_open)
    yield Observation(sum(read(box.stats()) for box in boxes))


def guarded(
    span: contextlib.AbstractContextManager[Callable[[Any], None]],
    run: Callable[[], R],
    record: Callable[[R], Any] = lambda result: result,
) -> R:
    """`run()` once, inside `span` (whose yielded function is given `record(result)`), where
    telemetry failing (a provider, processor or exporter raising) never fails the call nor
    runs it twice: the failure is logged and the call goes on without its span."""
    try:
        ended = span.__enter__()
    except Exception:  # noqa: BLE001 - telemetry failing must not fail the call
        _log.exception("wasmbox telemetry failed; the call goes on without it")
        return run()
    try:
        result = run()
    except BaseException:
        with contextlib.suppress(Exception):  # the call's own exception is the one raised
            span.__exit__(*sys.exc_info())
        raise
    try:
        ended(record(result))
        span.__exit__(None, None, None)
    except Exception:  # noqa: BLE001 - telemetry failing must not fail the call
        _log.exception("wasmbox telemetry failed; the call goes on without it")
    return result
