"""Progress lines of slow steps (`wasmbox._progress.Step`): what the step does and roughly how
long, then a line at every tick while it runs, and when it is done."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from wasmbox._progress import Step


class _Lines:
    """A Progress sink that lets a test wait for its n-th line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, line: str) -> None:
        with self._changed:
            self.lines.append(line)
            self._changed.notify_all()

    def wait_for(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.lines) >= count, timeout=60), self.lines


def test_a_step_says_what_it_does_then_ticks_while_it_runs_then_says_it_is_done() -> None:
    lines = _Lines()
    with Step(lines, "building the thing", "about 10 s, once", done="built the thing", every=0.01) as step:
        lines.wait_for(3)  # the first line and two ticks, while the step is still running
    assert lines.lines[0] == "building the thing (about 10 s, once) ..."
    assert all(
        re.fullmatch(r"still building the thing: \d+ s so far \.\.\.", line) for line in lines.lines[1:-1]
    )
    assert re.fullmatch(r"built the thing in [0-9.]+ s", lines.lines[-1])
    assert step.seconds > 0
    count = len(lines.lines)
    threading.Event().wait(0.05)
    assert len(lines.lines) == count  # the ticker stopped with the step


def test_a_failed_step_stops_ticking_and_does_not_say_done() -> None:
    lines = _Lines()
    with pytest.raises(RuntimeError), Step(lines, "compiling", "a while", done="compiled", every=0.01):
        lines.wait_for(2)
        raise RuntimeError("the compile failed")
    count = len(lines.lines)
    threading.Event().wait(0.05)
    assert len(lines.lines) == count and not any(line.startswith("compiled") for line in lines.lines)


def test_a_step_without_a_sink_is_silent_and_a_failing_sink_does_not_break_it() -> None:
    with Step(None, "quiet work", "no time", every=0.01) as step:
        pass
    assert step.seconds >= 0
    calls: list[str] = []

    def broken(line: str) -> None:
        calls.append(line)
        if line.startswith("still"):
            raise OSError("stderr is closed")

    with Step(broken, "work", "a while", every=0.01):
        while len(calls) < 2:
            threading.Event().wait(0.01)
    assert calls[0] == "work (a while) ..." and calls[1].startswith("still work")


def test_a_runtime_build_ticks_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wasmbox
    from wasmbox import _progress
    from wasmbox._inputs import InputUnavailable

    monkeypatch.setattr(_progress, "TICK_S", 0.01)  # a tick in every step, however quick
    lines = _Lines()
    with wasmbox.Sandbox(cache_dir=tmp_path / "cache", progress=lines) as box:
        try:
            box.prepare_javascript()  # built anew in this cache: its inputs are the shared ones
        except InputUnavailable as exc:
            pytest.skip(f"the JavaScript runtime's wheel cannot be fetched: {exc}")
    building = "building the JavaScript runtime"
    first = next(line for line in lines.lines if not line.startswith(("downloading", "still downloading")))
    assert first.startswith(f"{building} (") and first.endswith(") ...")
    assert any(re.fullmatch(rf"still {building}: \d+ s so far \.\.\.", line) for line in lines.lines)
    assert re.fullmatch(r"built the JavaScript runtime \([0-9.]+ MB\) in [0-9.]+ s", lines.lines[-1])
