"""Fuel of snippets as fresh calls and as session runs (exact, whatever the machine's load).

./dev python bench/session_fuel.py            # fresh calls, then a session's runs
PYTHONPATH=<another tree> .venv/bin/python bench/session_fuel.py --fresh   # another tree's
    fresh calls, to compare the per-call path (a tree without sessions has no session runs)
"""

from __future__ import annotations

import sys

import wasmbox

SNIPPETS = (
    "sum(range(100))",
    "import json\njson.dumps({'a': [1, 2]})",
    "x = 1",
    "import xml.dom.minidom as minidom\nminidom.parseString('<a><b/></a>').documentElement.tagName",
)


def main() -> None:
    with wasmbox.Sandbox(progress=None) as box:
        print(f"wasmbox from {wasmbox.__file__}")
        for code in SNIPPETS:
            fresh = sorted({box.run_python(code).fuel_used for _ in range(5)})
            line = f"{code.splitlines()[-1][:40]!r:44} fresh {fresh}"
            if "--fresh" not in sys.argv:
                with box.session() as session:
                    line += f"  session runs {[session.run(code).fuel_used for _ in range(3)]}"
            print(line)


if __name__ == "__main__":
    main()
