"""What the pytest plugin's fixtures hand out (`wasmbox.testing` is the public face)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from ._manifest import ManifestSource
from ._phases import CallPhases
from ._phases import record as record_phases
from ._results import CallResult
from ._sandbox import PythonRuntimeName, Sandbox
from ._tool import Tool
from ._units import parse_duration

RuntimeName = Literal["python", "javascript", "scientific"]
RUNTIMES: tuple[RuntimeName, ...] = ("python", "javascript", "scientific")


def runtime_built(runtime: RuntimeName, cache_dir: Path) -> bool:
    """Whether `runtime` is built for the installed wasmbox in `cache_dir` (builds nothing)."""
    from ._backends.javascript import build as javascript
    from ._backends.python import build as python
    from ._backends.scientific import build as scientific

    return bool(
        {"python": python, "javascript": javascript, "scientific": scientific}[runtime].built(cache_dir)
    )


def build_runtime(runtime: RuntimeName, cache_dir: Path) -> None:
    """Build `runtime` into `cache_dir` and compile it (a minute or more the first time; the
    JavaScript and scientific runtimes download a pinned wheel). Raises RuntimeBuildError
    (`InputUnavailable` when the wheel cannot be fetched)."""
    with Sandbox(cache_dir=cache_dir) as box:
        if runtime == "python":
            box.prepare_python()
        elif runtime == "javascript":
            box.prepare_javascript()
        else:
            box.prepare_scientific()


class ToolLoader:
    """`wasmbox_tool(manifest)`: loads a manifest (a path, a dict or a Manifest) into the run's
    Sandbox and returns the Tool, replacing a loaded tool of the same name. A relative path is
    taken from `base` (the test file's folder). Raises what `Sandbox.load` raises."""

    def __init__(self, sandbox: Sandbox, base: Path) -> None:
        self.sandbox = sandbox
        self._base = base

    def __call__(self, manifest: ManifestSource) -> Tool:
        if isinstance(manifest, str | Path) and not Path(manifest).is_absolute():
            manifest = self._base / manifest
        return self.sandbox.load(manifest, replace=True)


class SnippetRunner:
    """`wasmbox_run.python(code)` and `wasmbox_run.javascript(code)`: a snippet in a fresh
    interpreter of the run's Sandbox (`Sandbox.run_python`, `Sandbox.run_javascript`)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def python(
        self, code: str, manifest: ManifestSource | None = None, *, runtime: PythonRuntimeName | None = None
    ) -> CallResult:
        return self.sandbox.run_python(code, manifest, runtime=runtime)

    def javascript(self, code: str, manifest: ManifestSource | None = None) -> CallResult:
        return self.sandbox.run_javascript(code, manifest)


# The phases' medians a BenchRun puts in the benchmark's `extra_info`, in this order.
_PHASES = ("instantiate_s", "run_s", "teardown_s", "host_s", "host_calls", "fuel_used")


@dataclass(frozen=True)
class BenchRun:
    """What `wasmbox_bench` measured. `median_s` is the benchmark plugin's median round when it
    has statistics (pytest-benchmark), else the median of the recorded calls' own time
    (`CallPhases.total_s`; pytest-codspeed, `--benchmark-disable`), as `measured_by` says.
    `calls` are the timed calls' phases; `result` is the last call's."""

    tool: str
    result: CallResult
    median_s: float
    measured_by: Literal["pytest-benchmark", "calls"]
    spacing_s: float
    calls: list[CallPhases]

    @property
    def phases(self) -> dict[str, float | int | None]:
        """The medians of the calls' phases (seconds; `host_calls` and `fuel_used` are counts),
        `made_ahead` (the share of calls a spare instance served; None outside Python), the
        number of calls and the spacing: what goes into `extra_info`."""
        summary: dict[str, float | int | None] = {
            name: statistics.median_low(getattr(c, name) for c in self.calls) if self.calls else None
            for name in _PHASES
        }  # (median_low: a count stays a count)
        spared = [c.made_ahead for c in self.calls if c.made_ahead is not None]
        summary["made_ahead"] = sum(spared) / len(spared) if spared else None
        summary["calls"] = len(self.calls)
        summary["spacing_s"] = self.spacing_s
        return summary

    def explain(self) -> str:
        """One line: the median and where a call's time went."""
        p = self.phases
        how = "back to back" if not self.spacing_s else f"{_time(self.spacing_s)} apart"
        line = f"{self.tool}: median fresh call {_time(self.median_s)} ({how}, {p['calls']} calls recorded)"
        if not self.calls:
            return line
        line += (
            f"; medians: instantiate {_time(p['instantiate_s'])}, run {_time(p['run_s'])} "
            f"(host functions {_time(p['host_s'])}, {p['host_calls']} calls), teardown "
            f"{_time(p['teardown_s'])}, fuel {p['fuel_used']:,}"
        )
        if p["made_ahead"] is not None:
            line += f"; a spare instance was ready for {p['made_ahead']:.0%} of calls"
        return line

    def assert_median_below(self, limit: float | str) -> None:
        """AssertionError saying where the time went when the median call took `limit` (seconds,
        or a duration such as "1ms") or more."""
        seconds = parse_duration(limit)
        if not isinstance(seconds, float) or seconds <= 0:
            raise ValueError(f"limit={limit!r} is not a duration")
        if self.median_s >= seconds:
            raise AssertionError(f"{self.explain()}: not under {_time(seconds)}")


class ToolBench:
    """`wasmbox_bench(tool, args)`: times fresh calls of `tool` with the test's `benchmark`
    fixture (pytest-benchmark's or pytest-codspeed's) and records each timed call's phases,
    whose medians go into the benchmark's `extra_info`.

    `spacing` (seconds or a duration such as "5ms") pauses between rounds, outside the timing,
    so a spare instance is ready (Python); 0 calls back to back. `rounds` fixes the number of
    rounds (default: back to back, the benchmark plugin's own calibration; spaced, 100). `target`
    may be a callable returning a CallResult instead of a Tool (then `args`, `argv`, `stdin` are
    not given). One untimed call comes first: it must succeed unless `allow_errors`, else
    AssertionError with its error. Usable once per test, like the fixture it wraps."""

    def __init__(self, benchmark: Any) -> None:
        self.benchmark = benchmark

    def __call__(
        self,
        target: Tool | Callable[[], CallResult],
        args: Mapping[str, Any] | None = None,
        *,
        argv: list[str] | tuple[str, ...] = (),
        stdin: bytes | str = b"",
        spacing: float | str = 0.0,
        rounds: int | None = None,
        allow_errors: bool = False,
    ) -> BenchRun:
        call: Callable[[], CallResult]
        if isinstance(target, Tool):
            call = partial(target.call, args, argv=argv, stdin=stdin)
        elif args is not None or argv or stdin:
            raise TypeError("args, argv and stdin are for a Tool; a callable takes none")
        else:
            call = target
        pause = parse_duration(spacing)
        if not isinstance(pause, float) or pause < 0:
            raise ValueError(f"spacing={spacing!r} is not a duration")
        first = call()
        if not first.ok and not allow_errors:
            assert first.error is not None
            raise AssertionError(
                f"{first.tool}: the call fails ({first.error.kind.value}: "
                f"{first.error.message}), so there is nothing to time"
            )
        benchmark = self.benchmark
        with record_phases() as recording:
            if pause:
                rounds = rounds or 100
                result = benchmark.pedantic(
                    call, setup=partial(time.sleep, pause), rounds=rounds, iterations=1
                )
            elif rounds is not None:
                result = benchmark.pedantic(call, rounds=rounds, iterations=1)
            else:
                result = benchmark(call)
        # pedantic runs time exactly `rounds` calls first (pytest-codspeed then makes one more,
        # untimed, for the value it returns)
        calls = recording.calls[:rounds] if pause or rounds is not None else recording.calls
        stats = getattr(benchmark, "stats", None)  # pytest-benchmark's, None when disabled
        median: float | None = stats["median"] if stats is not None else None
        measured_by: Literal["pytest-benchmark", "calls"] = (
            "pytest-benchmark" if median is not None else "calls"
        )
        if median is None and calls:
            median = statistics.median(c.total_s for c in calls)
        run = BenchRun(
            tool=first.tool,
            result=result,
            median_s=median if median is not None else float("nan"),
            measured_by=measured_by,
            spacing_s=pause,
            calls=calls,
        )
        extra = getattr(benchmark, "extra_info", None)
        if isinstance(extra, dict):
            extra.update(run.phases)
        return run


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
