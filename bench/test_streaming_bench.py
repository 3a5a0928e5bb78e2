"""What streaming output costs (pytest-benchmark). Run: ./dev bench bench/test_streaming_bench.py

In one run: a snippet printing 1,000 lines without a listener (the path every call takes) and
with one (`on_output`, a listener that appends to a list), and a snippet printing nothing with
a listener. The per-line cost is (streamed - plain) / 1,000.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox

LINES = "for i in range(1000):\n    print(i)"
GRANTS = {"name": "stream", "runtime": "python", "limits": {"output": "1MiB"}}


@pytest.fixture(scope="module")
def box() -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=Path.home() / ".cache" / "wasmbox-bench") as sandbox:
        sandbox.run_python("1", GRANTS)
        yield sandbox


def test_streaming_1000_lines_plain(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    assert benchmark(box.run_python, LINES, GRANTS).stdout.count("\n") == 1000


def test_streaming_1000_lines_streamed(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    heard: list[str] = []

    def listener(stream: str, text: str) -> None:
        heard.append(text)

    assert benchmark(box.run_python, LINES, GRANTS, on_output=listener).stdout.count("\n") == 1000
    assert len(heard) % 1000 == 0


def test_streaming_silent_with_listener(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    assert benchmark(box.run_python, "1", GRANTS, on_output=lambda stream, text: None).value == 1


def test_streaming_silent_plain(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    assert benchmark(box.run_python, "1", GRANTS).value == 1
