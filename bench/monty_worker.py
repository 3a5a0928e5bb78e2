"""bench/monty.py's child: runs snippets in pydantic-monty, in the venv that has it (not wasmbox's).

Run by bench/monty.py as `VENV/bin/python bench/monty_worker.py`; imports nothing of wasmbox.
Reads one JSON request a line on stdin, `{"code": ..., "fresh": true|false}`, and answers one
line on stdout, `{"ok": ..., "seconds": ..., "error": ...}`: with `fresh`, the code runs in a
fresh checkout of the pool (`with pool.checkout() as s: s.feed_run(code)`, the whole `with`
timed); without, as a feed of one checkout kept for the worker's life (opened again if its
worker dies). Both under wasmbox's default deadline and memory cap for Python (2 s, 64 MiB).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from pydantic_monty import Monty, MontyCrashedError, MontyError

LIMITS: Any = {"max_feed_duration_secs": 2.0, "max_memory": 64 * 2**20}


def main() -> int:
    with Monty() as pool:
        kept = pool.checkout(limits=LIMITS)
        session = kept.__enter__()
        for line in sys.stdin:
            request = json.loads(line)
            error = ""
            started = time.perf_counter()
            try:
                if request["fresh"]:
                    with pool.checkout(limits=LIMITS) as fresh:
                        fresh.feed_run(request["code"])
                else:
                    session.feed_run(request["code"])
            except MontyError as exc:
                error = f"{type(exc).__name__}: {str(exc).strip()}"
                if isinstance(exc, MontyCrashedError) and not request["fresh"]:
                    kept.__exit__(None, None, None)
                    kept = pool.checkout(limits=LIMITS)
                    session = kept.__enter__()
            seconds = time.perf_counter() - started
            print(json.dumps({"ok": not error, "seconds": seconds, "error": error}), flush=True)
        kept.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
