#!/usr/bin/env bash
# Builds the native engine-layer spike (native/, a PyO3 extension on the wasmtime crate) and
# puts it in this tree as wasmbox/_native.abi3.so (git-ignored), where bench/native_spike.py
# imports it. Needs cargo (stable, 1.95 or later) and maturin.
# The first build compiles Wasmtime: many minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf native/target/wheels
(cd native && maturin build --release --interpreter "${PYTHON:-python3}" --out target/wheels)
python3 - <<'PY'
import glob, zipfile
wheel, = glob.glob("native/target/wheels/*.whl")
with zipfile.ZipFile(wheel) as archive:
    name, = [n for n in archive.namelist() if n.endswith("_native.abi3.so")]
    with open("wasmbox/_native.abi3.so", "wb") as out:
        out.write(archive.read(name))
print("built wasmbox/_native.abi3.so from", wheel)
PY
