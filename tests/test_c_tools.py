"""The bundled C tools (built with zig cc), loaded from their capability manifests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import CAPABILITIES

SAMPLE = CAPABILITIES / "data" / "sample.txt"


def counts(text: str) -> dict[str, int]:
    """What word_count.c computes: a final line without a newline still counts."""
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    return {"words": len(text.split()), "lines": lines, "bytes": len(text.encode())}


@pytest.fixture
def kv_box(box: wasmbox.Sandbox, built_examples: Path) -> wasmbox.Sandbox:
    store = {"greeting": "hello", "empty": ""}

    @box.host_function("kv.get")
    def kv_get(key: str) -> str | None:
        if key.startswith("secret/"):
            raise wasmbox.CapabilityDeniedError("secret keys are not readable")
        if key == "explode":
            raise RuntimeError("backend down")
        return store.get(key)

    return box


def test_word_count_of_a_preopened_file(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(CAPABILITIES / "word_count.toml")
    assert tool.call({"path": "/data/sample.txt"}).unwrap() == counts(SAMPLE.read_text())


@pytest.mark.parametrize(
    "text", ["", "one", "  two  words  ", "tabs\tand\nnew\nlines\n", "ünïcödé wörds", "a " * 5000]
)
def test_word_count_of_text_matches_python(box: wasmbox.Sandbox, built_examples: Path, text: str) -> None:
    tool = box.load(CAPABILITIES / "word_count.toml")
    assert tool.call({"text": text}).unwrap() == counts(text)


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ({"path": "/data/missing.txt"}, ErrorKind.GUEST_ERROR),
        ({"path": "/etc/passwd"}, ErrorKind.GUEST_ERROR),
        ({"path": 5}, ErrorKind.INVALID_ARGUMENTS),
        ({}, ErrorKind.INVALID_ARGUMENTS),
        ({"path": "/data/sample.txt", "text": "x"}, ErrorKind.INVALID_ARGUMENTS),
    ],
)
def test_word_count_refusals(
    box: wasmbox.Sandbox, built_examples: Path, args: dict[str, Any], kind: ErrorKind
) -> None:
    result = box.load(CAPABILITIES / "word_count.toml").call(args)
    assert result.error is not None and result.error.kind is kind


@pytest.mark.parametrize(
    "args", [{"path": 5}, {"text": None}, {"text": ["a"]}, {}, {"path": "a", "text": "b"}, {"x": 1}]
)
def test_c_guest_rejects_malformed_args_without_trapping(
    box: wasmbox.Sandbox, built_examples: Path, args: dict[str, Any]
) -> None:
    # no input_schema here: the guest's own msgpack reader must cope
    tool = box.load({"name": "wc", "module": str(built_examples / "word_count.wasm")})
    result = tool.call(args)
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR


def test_kv_lookup_round_trip(kv_box: wasmbox.Sandbox) -> None:
    tool = kv_box.load(CAPABILITIES / "kv_lookup.toml")
    assert tool.call({"key": "greeting"}).unwrap() == {"key": "greeting", "value": "hello"}
    assert tool.call({"key": "missing"}).unwrap() == {"key": "missing", "value": None}
    assert tool.call({"key": "empty"}).unwrap() == {"key": "empty", "value": ""}
    result = tool.call({"key": "greeting"})
    (record,) = result.host_calls
    assert record.name == "kv.get" and record.verdict == "ok" and record.bytes_in > 0


def test_kv_lookup_denied_and_failing_host(kv_box: wasmbox.Sandbox) -> None:
    tool = kv_box.load(CAPABILITIES / "kv_lookup.toml")
    denied = tool.call({"key": "secret/token"})
    assert denied.error is not None and denied.error.kind is ErrorKind.CAPABILITY_DENIED
    failed = tool.call({"key": "explode"})
    assert failed.error is not None and failed.error.kind is ErrorKind.HOST_ERROR
    assert "backend down" not in failed.error.message
    assert tool.call({"key": "greeting"}).ok  # and it keeps serving


def test_kv_lookup_needs_the_grant(box: wasmbox.Sandbox, built_examples: Path) -> None:
    box.register_host_function("kv.get", lambda key: None)
    with pytest.raises(wasmbox.CapabilityError, match="kv.get"):
        box.load({"name": "kv", "module": str(built_examples / "kv_lookup.wasm")})


def test_tool_spec_is_what_a_model_sees(box: wasmbox.Sandbox, built_examples: Path) -> None:
    import tomllib

    tool = box.load(CAPABILITIES / "word_count.toml")
    spec = tool.spec()
    manifest = tomllib.loads((CAPABILITIES / "word_count.toml").read_text())
    assert spec == {"name": "word_count", "description": manifest["description"],
                    "parameters": manifest["input_schema"]}  # fmt: skip
    bare = box.load({"name": "bare", "module": str(built_examples / "word_count.wasm")})
    assert bare.spec()["parameters"] == {"type": "object"}
