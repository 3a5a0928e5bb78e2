"""The same calls timed on several checkouts of wasmbox, taking turns, in fresh processes.

Run: ./dev python bench/compare.py [--suite core|python|javascript|output] [--rounds N] [--calls N] TREE [TREE ...]
A TREE is a checkout whose `wasmbox/` package (and, for Python, `wasmbox/_backends/python/`) is timed
("." is this one), e.g. the code before a change: `git worktree add /tmp/before <rev>`. Guests
come from this checkout (build them with ./dev first). Each round runs every tree once, so a
noisy machine hits them alike; the table shows each tree's figures round by round.

--suite core (the default), medians:
- trivial core call (echo.wat), µs
- fsprobe `exit 0` (a WASI command touching no file) and fsprobe `read` (one file), µs
- a 50 ms deadline on a spinning guest while another thread makes trivial calls: median and
  max ms of 20 such calls (how promptly the epoch ticker thread gets the GIL)

--suite python, medians (in the default cache directory, where each tree's runtime is built
once; the first round of a new runtime includes nothing of its build):
- run_python("sum(range(100))") with calls 5 ms apart (a spare instance is ready; only the
  call is timed) and back to back, µs
- a small tool (bench/test_python_bench.py's greet), spaced and back to back, and
  capabilities/csv_stats.toml back to back, µs

--suite javascript, medians: `run_javascript("1 + 2")` back to back, and the trivial core
call (echo.wat), µs

--suite output (Python printing; fuel is deterministic, so one round tells it):
- fuel of one iteration of `for i in range(n): pass` in a snippet, and of the same loop
  with `print('x')`, `sys.stdout.write('x')` and `print('x', file=io.StringIO())` in it,
  net of the bare loop (from n = 3000 less n = 1000); fuel of `run_python("1")` and of a
  call of the small greet tool
- µs a `print('x')` adds to a call: the median of 9 calls of 1,000 prints less that of
  9 bare loops, divided by 1,000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import json, statistics, sys, tempfile, threading, time
tree, root, calls, suite = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]  # not the installed one
sys.path.insert(0, tree)
import wasmbox
assert wasmbox.__file__.startswith(tree), wasmbox.__file__

from wasmbox._bench import latency  # the measured tree's own

def median_us(call, n, gap_s=0.0):
    return latency(call, n, gap_s)[0] * 1e6

def python_figures():
    with wasmbox.Sandbox() as box:
        tmp = tempfile.mkdtemp()
        with open(tmp + "/greet.py", "w") as handle:  # wasmbox._bench.GREET_PY (older trees lack it)
            handle.write("def main(name: str, times: int = 1) -> dict:\\n"
                         "    return {'greeting': ('hello ' + name + '! ') * times}\\n")
        greet = box.load({"name": "greet", "runtime": "python", "source": tmp + "/greet.py"})
        stats = box.load(root + "/capabilities/csv_stats.toml")
        snippet = lambda: box.run_python("sum(range(100))")
        greeting = lambda: greet.call({"name": "ada", "times": 2})
        summary = lambda: stats.call({"path": "/data/sales.csv", "group_by": "region"})
        for call in (snippet, greeting, summary):
            assert call().ok
            for _ in range(200):
                call()
        return {
            "spaced_us": median_us(snippet, calls // 20, gap_s=0.005),
            "b2b_us": median_us(snippet, calls // 5),
            "greet_spaced_us": median_us(greeting, calls // 20, gap_s=0.005),
            "greet_us": median_us(greeting, calls // 5),
            "csv_us": median_us(summary, calls // 10),
        }

def output_figures():
    grants = {"name": "p", "runtime": "python", "limits": {"fuel": 10**10, "output": "1MiB"}}
    setup = "import io, sys\\nsink = io.StringIO()\\n"
    def run(body, n):
        result = box.run_python(f"{setup}for i in range({n}):\\n    {body}\\n", grants)
        assert result.ok, result.error
        return result
    def fuel(body):
        return (run(body, 3000).fuel_used - run(body, 1000).fuel_used) / 2000
    def seconds(body):
        return statistics.median(run(body, 1000).duration_s for _ in range(9))
    tmp = tempfile.mkdtemp()
    with open(tmp + "/greet.py", "w") as handle:
        handle.write("def main(name: str, times: int = 1) -> dict:\\n"
                     "    return {'greeting': ('hello ' + name + '! ') * times}\\n")
    greet = box.load({"name": "greet", "runtime": "python", "source": tmp + "/greet.py"})
    loop = fuel("pass")
    return {
        "loop_fuel": loop,
        "print_fuel": fuel("print('x')") - loop,
        "write_fuel": fuel("sys.stdout.write('x')") - loop,
        "stringio_fuel": fuel("print('x', file=sink)") - loop,
        "call_fuel": box.run_python("1").fuel_used,
        "greet_fuel": greet.call({"name": "ada", "times": 2}).fuel_used,
        "print_us": (seconds("print('x')") - seconds("pass")) / 1000 * 1e6,
    }

if suite == "python":
    print(json.dumps(python_figures()))
    sys.exit(0)
if suite == "javascript":
    with wasmbox.Sandbox() as box:
        echo = box.load({"name": "echo", "module": root + "/runtimes/examples/wat/echo.wat"})
        snippet = lambda: box.run_javascript("1 + 2")
        assert snippet().value == 3
        for _ in range(500):
            snippet(), echo.call({"n": 1})
        print(json.dumps({"js_us": median_us(snippet, calls // 5), "trivial_us": median_us(lambda: echo.call({"n": 1}), calls)}))
    sys.exit(0)
if suite == "output":
    with wasmbox.Sandbox() as box:
        print(json.dumps(output_figures()))
    sys.exit(0)

with wasmbox.Sandbox(cache_dir=tempfile.mkdtemp()) as box:
    echo = box.load({"name": "echo", "module": root + "/runtimes/examples/wat/echo.wat"})
    probe = box.load(root + "/capabilities/fsprobe.toml")
    spin = box.load({"name": "spin", "module": root + "/runtimes/examples/wat/spin.wat",
                     "limits": {"fuel": 10**12, "timeout": "50ms"}})
    for _ in range(500):
        echo.call({"n": 1}), probe.call(argv=["read", "/data/sample.txt"])
    figures = {
        "trivial_us": median_us(lambda: echo.call({"n": 1}), calls),
        "exit_us": median_us(lambda: probe.call(argv=["exit", "0"]), calls // 10),
        "read_us": median_us(lambda: probe.call(argv=["read", "/data/sample.txt"]), calls // 10),
    }
    stop = threading.Event()
    def hammer():
        while not stop.is_set():
            echo.call({"n": 1})
    thread = threading.Thread(target=hammer)
    thread.start()
    deadlines = [spin.call({}).duration_s * 1e3 for _ in range(20)]
    stop.set()
    thread.join()
    figures["deadline_ms"] = statistics.median(deadlines)
    figures["deadline_max_ms"] = max(deadlines)
print(json.dumps(figures))
"""
COLUMNS = {
    "core": (("trivial_us", "trivial µs"), ("exit_us", "exit µs"), ("read_us", "read µs"),
             ("deadline_ms", "50ms deadline"), ("deadline_max_ms", "max")),
    "python": (("spaced_us", "spaced µs"), ("b2b_us", "back-to-back µs"),
               ("greet_spaced_us", "greet spaced µs"), ("greet_us", "greet b2b µs"),
               ("csv_us", "csv_stats b2b µs")),
    "javascript": (("js_us", "run_javascript µs"), ("trivial_us", "trivial µs")),
    "output": (("loop_fuel", "loop fuel"), ("print_fuel", "print fuel"), ("write_fuel", "write fuel"),
               ("stringio_fuel", "StringIO fuel"), ("call_fuel", "call fuel"), ("greet_fuel", "greet fuel"),
               ("print_us", "print µs")),
}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suite", choices=sorted(COLUMNS), default="core")
    parser.add_argument(
        "--calls", type=int, default=10_000, help="trivial calls per figure (others: a fraction)"
    )
    options = parser.parse_args()
    trees = [str(tree.resolve()) for tree in options.trees]
    columns = COLUMNS[options.suite]
    print(f"{'round':>5} {'tree':30}" + "".join(f"{title:>16}" for _, title in columns))
    for round_ in range(1, options.rounds + 1):
        for tree in trees:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, tree, str(ROOT), str(options.calls), options.suite],
                check=False, capture_output=True, text=True,
            )  # fmt: skip
            if out.returncode != 0:
                sys.exit(f"{tree}: the child failed:\n{out.stderr[-3000:]}")
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{round_:5d} {tree[-30:]:30}" + "".join(f"{figures[key]:16.1f}" for key, _ in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
