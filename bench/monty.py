"""wasmbox beside pydantic-monty on the same snippets: fresh calls, session runs, one run.

Run: ./dev python bench/monty.py [--rounds N] [--quick N]
pydantic-monty (a Python subset interpreter in Rust, run in a pool of worker processes) is
installed once into a venv of its own, ~/.cache/wasmbox/bench-venvs/monty, from
bench/monty-requirements.txt (pinned, hash-checked; never a dependency of wasmbox), and runs
in a child process (bench/monty_worker.py), which times each snippet itself. The snippets are
`sum(range(100))` and bench/corpus.py's HumanEval programs. Four ways take turns program by
program (corpus.race): wasmbox's fresh `run_python` and a run of one session, monty's fresh
checkout (`with pool.checkout() as s: s.feed_run(code)`) and a feed of one kept checkout.
monty runs a subset of Python: a program it fails is counted and left out of the monty
comparisons, which use only the programs both ran and passed. Printed: each pair's medians and
ratio (corpus.print_race) and the programs monty could not run, with why.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import corpus

import wasmbox

HERE = Path(__file__).resolve().parent
VENV = Path.home() / ".cache" / "wasmbox" / "bench-venvs" / "monty"
TRIVIAL = corpus.Program("sum(range(100))", "sum(range(100))")
PAIRS = [
    ("wasmbox fresh", "monty fresh"),
    ("wasmbox session", "monty session"),
    ("wasmbox fresh", "wasmbox session"),
    ("monty fresh", "monty session"),
]


def monty_python() -> Path:
    """The monty venv's interpreter, the venv made and pydantic-monty installed the first time.
    Exits with a message when pip cannot install it."""
    python = VENV / "bin" / "python"
    if not (VENV / ".installed").exists():
        print(f"installing pydantic-monty into {VENV} (once) ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "-r"]
        if subprocess.run([*pip, str(HERE / "monty-requirements.txt")], check=False).returncode != 0:
            sys.exit("skipped: pip could not install pydantic-monty (is the package registry reachable?)")
        (VENV / ".installed").touch()
    return python


@contextmanager
def monty_runners() -> Iterator[dict[str, corpus.Runner]]:
    """monty's fresh checkout and kept checkout, served by one child (bench/monty_worker.py)."""
    child = subprocess.Popen(
        [str(monty_python()), str(HERE / "monty_worker.py")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    send, receive = child.stdin, child.stdout

    def way(fresh: bool) -> corpus.Runner:
        def runner(code: str) -> corpus.Outcome:
            send.write(json.dumps({"code": code, "fresh": fresh}) + "\n")
            answer = receive.readline()
            if not answer:
                sys.exit(f"the monty worker stopped (exit {child.wait()})")
            reply = json.loads(answer)
            return corpus.Outcome(reply["ok"], reply["seconds"], reply["error"])

        return runner

    try:
        yield {"monty fresh": way(True), "monty session": way(False)}
    finally:
        send.close()
        child.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", type=int, default=0, metavar="N", help="about N corpus programs")
    options = parser.parse_args()
    programs = corpus.programs(options.quick)
    with wasmbox.Sandbox() as box, box.session(limits=corpus.UNBOUNDED) as session, monty_runners() as monty:
        ways = corpus.wasmbox_runners(box, session) | monty
        trivial = corpus.race(ways, [TRIVIAL], options.rounds * 100)
        result = corpus.race(ways, programs, options.rounds)
    print(f"{TRIVIAL.name}, {options.rounds * 100} rounds:")
    corpus.print_race(trivial, PAIRS, slowest=0)
    print(f"\n{len(programs)} HumanEval programs, {options.rounds} rounds:")
    corpus.print_race(result, PAIRS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
