"""Fuel per second of the CPython runtime on this machine, for model-style code (loops,
arithmetic, list/dict/str work, recursion), so that the Python defaults' fuel fits their
deadline: `./dev python bench/python_fuel_rate.py`. Each program runs fresh five times under
a high fuel cap; the rate is its fuel over its median call time (`duration_s`,
what the deadline measures)."""

import statistics

import wasmbox

PROGRAMS = {
    "arithmetic loop": "t = 0\nfor i in range(300_000):\n    t += i * i % 7\nt",
    "list and dict work": (
        "d = {}\nfor i in range(60_000):\n    d[str(i)] = [i, i * 2]\nsorted(d, key=lambda k: d[k][1])[:3]"
    ),
    "string building": "s = []\nfor i in range(50_000):\n    s.append(f'{i:05d}'.upper())\nlen(''.join(s))",
    "recursion": "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nfib(22)",
    "comprehensions": "sum(x * y for x in range(400) for y in range(400) if (x ^ y) & 1)",
}
LIMITS = {"fuel": 20_000_000_000, "timeout": "60s"}

with wasmbox.Sandbox(progress=None) as box:
    manifest = {"name": "python", "runtime": "python", "limits": LIMITS}
    box.run_python("1", manifest)  # the runtime built and compiled, spares made
    rates = []
    for name, code in PROGRAMS.items():
        runs = []
        for _ in range(5):
            result = box.run_python(code, manifest)
            assert result.ok, (name, result.error)
            runs.append((result.duration_s, result.fuel_used))
        run_s = statistics.median(r for r, _ in runs)
        fuel = runs[0][1]
        rates.append(fuel / run_s)
        print(f"{name:20} {fuel / 1e6:8.1f}M fuel  {run_s * 1000:7.1f} ms  {fuel / run_s / 1e6:7.0f}M fuel/s")
    print(
        f"median rate: {statistics.median(rates) / 1e6:.0f}M fuel/s, slowest {min(rates) / 1e6:.0f}M fuel/s"
    )
