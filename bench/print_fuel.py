"""Fuel of a `print('x')` in the CPython runtime, net of the bare loop, and what a 10 MB
`print` ends with under the default limits: `./dev python bench/print_fuel.py`."""

import wasmbox

with wasmbox.Sandbox(progress=None) as box:
    bare = box.run_python("for i in range(1000): pass\n1").fuel_used
    printed = box.run_python("for i in range(1000): print('x')\n1").fuel_used
    huge = box.run_python("print('x' * 10_000_000)")
    print(f"fuel per print('x'), net of the loop: {(printed - bare) / 1000:,.0f}")
    kind = huge.error.kind.value if huge.error else "ok"
    print(f"print('x' * 10_000_000): {kind}, {len(huge.stdout):,} bytes of stdout, {huge.fuel_used:,} fuel")
