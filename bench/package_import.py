"""What importing a third-party package costs a Python call: fuel and time, with the bytecode
wasmbox compiles at install time and without it (the package compiled at every import).

    ./dev python bench/package_import.py [ROUNDS]

The wheels are made from pure-Python distributions installed in this venv (idna, packaging,
attrs, pygments), re-zipped with their own dist-info, so nothing is downloaded; they are
installed into a fresh cache the way a manifest's `packages` are. Printed: the first install
(pip + byte-compiling in the runtime), then per package the median time and the fuel of a
call that imports it, beside a call that imports nothing.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import statistics
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import wasmbox

PACKAGES = {  # distribution -> what the call runs
    "idna": "import idna; idna.encode('example.com')",
    "packaging": "import packaging.version; str(packaging.version.Version('1.2.3'))",
    "attrs": "import attrs; attrs.define(type('C', (), {'__annotations__': {'x': int}}))",
    "pygments": "import pygments.lexers.python, pygments.formatters.html; 1",
}


def wheel_of(name: str, folder: Path) -> str:
    """A py3-none-any wheel of the installed distribution `name`; returns its pin."""
    dist = importlib.metadata.distribution(name)
    root = Path(str(dist.locate_file("")))
    pin = f"{dist.metadata['Name']}=={dist.version}"
    target = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(target, "w") as archive:
        for file in dist.files or ():
            path = root / file
            if "__pycache__" in file.parts or ".." in file.parts or not path.is_file():
                continue
            data = path.read_bytes()
            if file.name == "WHEEL":
                data = b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
            archive.writestr(str(file), data)
    return pin


def measure(box: wasmbox.Sandbox, code: str, grants: dict[str, object], rounds: int) -> tuple[float, int]:
    times, fuel = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        result = box.run_python(code, grants)
        times.append(time.perf_counter() - started)
        if not result.ok:
            raise SystemExit(f"{code}: {result.error}")
        fuel = result.fuel_used
    return statistics.median(times), fuel


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    work = Path(tempfile.mkdtemp(prefix="wasmbox-bench-packages-"))
    wheels = work / "wheels"
    wheels.mkdir()
    pins = {name: wheel_of(name, wheels) for name in PACKAGES}
    cache = Path.home() / ".cache" / "wasmbox-bench"  # the runtime, built once; packages fresh
    try:
        with wasmbox.Sandbox(cache_dir=cache, package_wheels=wheels) as box:
            box.prepare_python()
            for stale in cache.glob("packages-*"):
                shutil.rmtree(stale)
            limits = {"fuel": 10**11, "timeout": 60, "memory": "256MiB"}
            base_time, base_fuel = measure(
                box, "sum(range(100))", {"name": "b", "runtime": "python", "limits": limits}, rounds
            )
            print(f"no import: {base_time * 1e3:.2f} ms, {base_fuel / 1e6:.1f}M fuel")
            print("| package | install (pip + compile) | import, bytecode | import, no bytecode |")
            print("| --- | ---: | ---: | ---: |")
            for name, code in PACKAGES.items():
                grants = {"name": name, "runtime": "python", "packages": [pins[name]], "limits": limits}
                started = time.perf_counter()
                box.run_python("1", grants)  # installs it
                install = time.perf_counter() - started
                with_time, with_fuel = measure(box, code, grants, rounds)
                site = next(
                    p / "site"
                    for p in cache.glob("packages-*")
                    if pins[name].lower() in (p / "wasmbox-packages.json").read_text().lower()
                )
                hidden = [folder for folder in site.rglob("__pycache__")]
                for folder in hidden:  # the same set without its bytecode, for a while
                    folder.rename(folder.with_name("__pycache__.off"))
                try:
                    box._runtimes.python()._spares.drain()  # none prepared before
                    without_time, without_fuel = measure(box, code, grants, max(3, rounds // 4))
                finally:
                    for folder in hidden:
                        folder.with_name("__pycache__.off").rename(folder)
                print(
                    f"| {pins[name]} | {install:.1f} s | {with_time * 1e3:.1f} ms, {with_fuel / 1e6:.0f}M fuel "
                    f"| {without_time * 1e3:.1f} ms, {without_fuel / 1e6:.0f}M fuel |"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
