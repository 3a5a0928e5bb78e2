"""Where a fresh-interpreter Python call's time goes, phase by phase, on one thread.

Run: ./dev python bench/python_phases.py [--calls N]
Each call's instance is made, run and freed here in turn, on this thread, nothing overlapping:
- prepare: a store, its WASI context, and instantiating the component (the housekeeper
  thread does this ahead of a call when it keeps up);
- run: `sum(range(100))` on that instance, and the page faults it takes;
- free: dropping the store after the run, and dropping an instance that never ran (Wasmtime
  resets the pooled memory to its image either way);
- dirty: (Linux) how much of the memory a run writes and touches, read from
  /proc/self/pagemap with `pool_keep_resident=0`, where every page starts out mapped from the
  image, so a written page is one that is no longer file-backed.
For where the time goes inside Wasmtime, run the same under `perf record -g` and look at
`CompiledFunctionsTable::func_loc` (function references made at instantiation) and
`__memmove_avx512_unaligned_erms` (the reset).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import struct
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import wasmbox
from wasmbox import _abi, _call
from wasmbox._backends.python.runner import (
    _INSTANTIATING,
    PythonRuntimeRunner,
    encode_request,
)
from wasmbox._wasmtime import component_io as _component_io
from wasmbox._wasmtime.engine import EngineSettings

_PAGE = 4096
REQUEST = encode_request({"mode": "code", "code": "sum(range(100))"}, 64 * 1024)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument(
        "--keep-resident", type=int, default=EngineSettings.pool_keep_resident,
        help="EngineSettings.pool_keep_resident for the timings (bytes)",
    )  # fmt: skip
    options = parser.parse_args()
    if sys.platform == "linux":  # first: a pool whose slots were all reset to the image
        with wasmbox.Sandbox(settings=EngineSettings(pool_keep_resident=0)) as box:
            written, touched, image = _dirty(box._runtimes.python())
    with wasmbox.Sandbox(settings=EngineSettings(pool_keep_resident=options.keep_resident)) as box:
        timings = _timings(box._runtimes.python(), options.calls)
    for name, values in timings.items():
        print(f"{name:34} {statistics.median(values):8.0f}")
    if sys.platform == "linux":
        print(f"{'memory image (MiB)':34} {image / 2**20:8.1f}")
        print(f"{'pages a run writes (KiB)':34} {written * _PAGE / 1024:8.0f}")
        print(
            f"{'pages mapped after a run (KiB)':34} {touched * _PAGE / 1024:8.0f}  (reads map 16 at a time)"
        )
    return 0


def _timings(runner: PythonRuntimeRunner, calls: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {
        "prepare (µs)": [], "run (µs)": [], "page faults in a run": [],
        "free after a run (µs)": [], "free an unused instance (µs)": [],
    }  # fmt: skip
    for i in range(calls + 20):
        spare, prepare_s = _timed(lambda: runner.instantiate(_INSTANTIATING))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        _, run_s = _timed(partial(_run, spare))
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        _, free_s = _timed(spare.discard)
        unused = runner.instantiate(_INSTANTIATING)
        _, unused_s = _timed(unused.discard)
        if i >= 20:  # warmed up
            for name, value in zip(
                timings, (prepare_s * 1e6, run_s * 1e6, faults, free_s * 1e6, unused_s * 1e6)
            ):
                timings[name].append(value)
    return timings


def _timed(action: Callable[[], object]) -> tuple[object, float]:
    started = time.perf_counter()
    result = action()
    return result, time.perf_counter() - started


def _run(spare: _call.Instance) -> None:
    assert spare.entry is not None, spare.error
    with _call.running(_call.CallState.start(_INSTANTIATING, time.perf_counter())):
        reply = _component_io.call_bytes(spare.store, spare.entry, REQUEST)
    assert _abi.unpack(reply) == {"ok": 4950}


def _dirty(runner: PythonRuntimeRunner) -> tuple[int, int, int]:
    """Pages of the component's memory image written and mapped by one run, and its size."""
    for _ in range(20):
        runner.instantiate(_INSTANTIATING).discard()
    spare = runner.instantiate(_INSTANTIATING)
    _run(spare)
    written = touched = image = 0
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()  # the image is mapped writable into a pool slot from the .cwasm
        if len(fields) < 6 or fields[1] != "rw-p" or not fields[5].endswith(".cwasm"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        w, t = _scan(low, high)
        if t > touched:  # the slot the run used (the others were reset: nothing mapped)
            written, touched, image = w, t, high - low
    spare.discard()
    return written, touched, image


def _scan(low: int, high: int) -> tuple[int, int]:
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(low // _PAGE * 8)
        entries = pagemap.read((high - low) // _PAGE * 8)
    written = touched = 0
    for (entry,) in struct.iter_unpack("<Q", entries):
        if entry >> 63 & 1:  # present
            touched += 1
            written += not (entry >> 61 & 1)  # no longer the file's page: copied on write
    return written, touched


if __name__ == "__main__":
    sys.exit(main())
