"""What one clock reading or random draw costs a guest, in a fresh call and in a session run
(whose instance is linked as a taped call's, so its readings go through the host), with no
recording open: the least of seven runs of a loop of N readings, less that of an empty loop.

./dev python bench/clock_reads.py
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import wasmbox

N = 20_000
LOOPS = {  # what is read: (the loop, with its count to fill in; the runtime)
    "JavaScript Date.now()": ("{ let s = 0; for (let i = 0; i < %d; i++) s += Date.now(); } 1", "javascript"),
    "Python time.time()": ("import time\nfor i in range(%d): time.time()\n1", "python"),
    "Python time.monotonic()": ("import time\nfor i in range(%d): time.monotonic()\n1", "python"),
    "Python os.urandom(8)": ("import os\nfor i in range(%d): os.urandom(8)\n1", "python"),
}


def per_read(run: Callable[[str], wasmbox.CallResult], loop: str) -> float:
    """Microseconds a reading costs in `run`'s calls."""

    def least(count: int) -> float:
        results = [run(loop % count) for _ in range(7)]
        assert all(result.ok for result in results), results[0].error
        return min(result.duration_s for result in results)

    return (least(N) - least(0)) / N * 1e6


def main() -> None:
    with wasmbox.Sandbox(progress=None) as box:
        for what, (loop, runtime) in LOOPS.items():
            grants = {"name": "reads", "runtime": runtime}
            fresh = box.run_javascript if runtime == "javascript" else box.run_python
            with box.session(grants, runtime="javascript" if runtime == "javascript" else None) as session:
                in_session = per_read(session.run, loop)
            in_fresh = per_read(partial(fresh, manifest=grants), loop)
            print(f"{what:26} fresh {in_fresh:5.2f} µs  session {in_session:5.2f} µs")


if __name__ == "__main__":
    main()
