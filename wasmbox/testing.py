"""Testing and benchmarking tools with pytest: what the wasmbox plugin's fixtures hand out.

The plugin (installed with wasmbox; `-p no:wasmbox` turns it off) does nothing until a test
asks for one of its fixtures: `wasmbox_sandbox`, `wasmbox_tool` (a `ToolLoader`), `wasmbox_run`
(a `SnippetRunner`), `wasmbox_bench` (a `ToolBench`, whose calls return a `BenchRun`). docs/testing.md
shows them; `record_phases` works anywhere, with or
without pytest.
"""

from ._phases import CallPhases, Recording
from ._phases import record as record_phases
from ._testing import (
    RUNTIMES,
    BenchRun,
    RuntimeName,
    SnippetRunner,
    ToolBench,
    ToolLoader,
    build_runtime,
    runtime_built,
)

__all__ = [
    "RUNTIMES",
    "BenchRun",
    "CallPhases",
    "Recording",
    "RuntimeName",
    "SnippetRunner",
    "ToolBench",
    "ToolLoader",
    "build_runtime",
    "record_phases",
    "runtime_built",
]
