"""What one WASI write from the Python runtime costs the host, by the kind of stdout it goes to.

Run: ./dev python bench/stdout_paths.py [--writes N]
A snippet does `os.write(1, b"x\\n")` N times in a fresh instance; the median of 5 calls less
that of 5 calls writing nothing, per write:
- custom: wasmbox's capped `Output` (`wasi_config_set_stdout_custom`), which Wasmtime serves
  through its async pipe adapter (a task on its own runtime, then our ctypes callback on that
  thread);
- libc: the same custom stream with libc's `write(2)` as its callback and /dev/null as its
  data, so no Python runs on the path (no cap either: it shows the async adapter's own cost);
- file: `WasiConfig.stdout_file`, which Wasmtime writes synchronously (no cap: not usable as it
  is, shown as the floor a synchronous path would have).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import wasmtime
from wasmtime import _ffi as ffi

import wasmbox
from wasmbox import _bench
from wasmbox._backends.python.runner import encode_request
from wasmbox._wasmtime import capi as _capi
from wasmbox._wasmtime import component_io as _component_io
from wasmbox._wasmtime import output as _output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=2000)
    options = parser.parse_args()
    libc_write = ctypes.cast(ctypes.CDLL(None).write, _output._WriteCallback)
    null = os.open(os.devnull, os.O_WRONLY)
    with wasmbox.Sandbox() as box, tempfile.TemporaryDirectory() as tmp:
        runtime = box._runtimes.python()._runtime
        engine, compiled, linker = _bench.plain_component(runtime.component)

        def call(writes: int, kind: str) -> float:
            store = wasmtime.Store(engine)
            wasi = wasmtime.WasiConfig()
            wasi.preopen_dir(str(runtime.stdlib), "/python", fs_mutable=False)
            output = _output.Output(1 << 26)
            if kind == "file":
                wasi.stdout_file = str(Path(tmp) / "stdout")
            elif kind == "libc":
                ffi.wasi_config_set_stdout_custom(wasi.ptr(), libc_write, null, _capi.NO_FINALIZER)
            else:
                output.attach(wasi, "stdout")
            store.set_wasi(wasi)
            run = linker.instantiate(store, compiled).get_func(store, "run")
            assert run is not None
            code = f"import os\nfor i in range({writes}):\n    os.write(1, b'x\\n')\n"
            request = encode_request({"mode": "code", "code": code}, 1 << 20)
            started = time.perf_counter()
            _component_io.call_bytes(store, run, request)
            elapsed = time.perf_counter() - started
            output.detach()
            return elapsed

        for kind in ("custom", "libc", "file"):
            base = statistics.median(call(0, kind) for _ in range(5))
            full = statistics.median(call(options.writes, kind) for _ in range(5))
            print(f"{kind:8} {(full - base) / options.writes * 1e6:8.1f} µs per write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
