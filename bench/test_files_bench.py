"""What files in and out cost a call (pytest-benchmark). Run: ./dev bench bench/test_files_bench.py

In one run: the same snippet under a grant set with `scratch` and no files (the baseline), with
one 64 KiB input file read, with ten small input files, and writing one 64 KiB output file that
`outputs` returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox

GRANTS = {"name": "files", "runtime": "python", "scratch": "4MiB", "inputs": {"size": "1MiB"},
          "outputs": ["/tmp/out/*"], "limits": {"output": "1MiB"}}  # fmt: skip
BIG = {"data.bin": bytes(64 * 1024)}
SMALL = {f"f{i}.txt": f"file {i}\n" for i in range(10)}


@pytest.fixture(scope="module")
def box() -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=Path.home() / ".cache" / "wasmbox-bench") as sandbox:
        sandbox.run_python("1", GRANTS)
        yield sandbox


def test_files_none(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The baseline: scratch, no files."""
    assert benchmark(box.run_python, "len(b'x' * 65536)", GRANTS).value == 65536


def test_files_one_64k_input(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    code = "len(open('/tmp/in/data.bin', 'rb').read())"
    assert benchmark(box.run_python, code, GRANTS, files=BIG).value == 65536


def test_files_ten_small_inputs(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    code = "import os\nlen(os.listdir('/tmp/in'))"
    assert benchmark(box.run_python, code, GRANTS, files=SMALL).value == 10


def test_files_one_64k_output(benchmark, box: wasmbox.Sandbox) -> None:  # type: ignore[no-untyped-def]
    code = "import os\nos.makedirs('/tmp/out')\nopen('/tmp/out/a.bin', 'wb').write(b'x' * 65536)"
    assert len(benchmark(box.run_python, code, GRANTS).files["/tmp/out/a.bin"]) == 65536
