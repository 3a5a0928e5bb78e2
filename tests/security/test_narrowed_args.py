"""Grants narrowed to their args (`host_function_args`, `tool_args`): a guest that tries to pass
a granted host function, or a tool its code may call, arguments outside what its manifest
allows, from every kind of guest, with the tricks that fool loose checks (another type where a
string is constrained, extra keys, a function's default standing in for a refused value,
look-alike characters, anchors, very long values, bytes). The claim: the function or tool never
runs, and the call is `capability_denied` naming the function and the argument."""

from __future__ import annotations

import json
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from ..conftest import BUILD, CAPABILITIES, wat
from .conftest import QUICK, Guarded, named

KEY = {"type": "string", "pattern": "^public/[a-z0-9_]+$", "maxLength": 64}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 10}
NARROW = {"host.fn": {"key": KEY, "limit": LIMIT}}
# a snippet's: fuel for the megabyte-long key, read and sent by the interpreter (the deadline
# only a backstop, as QUICK's)
SNIPPET = {"fuel": 10**10, "timeout": "60s"}

# (id, the args the guest sends, what the refusal names)
TRICKS = [
    ("outside-the-pattern", {"key": "secret/x", "limit": 1}, "args.key: does not match"),
    ("number-for-string", {"key": 5, "limit": 1}, "args.key: expected string, got integer"),
    ("list-for-string", {"key": ["public/a"], "limit": 1}, "args.key: expected string, got array"),
    ("operator-map", {"key": {"$regex": "^public/"}, "limit": 1}, "args.key: expected string, got object"),
    ("null-for-string", {"key": None, "limit": 1}, "args.key: expected string, got null"),
    ("string-for-integer", {"key": "public/a", "limit": "5"}, "args.limit: expected integer, got string"),
    ("bool-for-integer", {"key": "public/a", "limit": True}, "args.limit: expected integer, got boolean"),
    ("fraction-for-integer", {"key": "public/a", "limit": 1.5}, "args.limit: expected integer, got number"),
    ("over-the-maximum", {"key": "public/a", "limit": 1000}, "args.limit: must be <= 10"),
    ("extra-key", {"key": "public/a", "limit": 1, "admin": True}, "args: unexpected property 'admin'"),
    (
        "dunder-key",
        {"key": "public/a", "limit": 1, "__class__": "x"},
        "args: unexpected property '__class__'",
    ),
    # the function's own default (limit=100) would stand in for a value the grant refuses
    ("default-stands-in", {"key": "public/a"}, "args: missing required property 'limit'"),
    ("cyrillic-look-alike", {"key": "\u0440ublic/a", "limit": 1}, "args.key: does not match"),
    ("fullwidth-look-alike", {"key": "\uff50ublic/a", "limit": 1}, "args.key: does not match"),
    ("combining-mark", {"key": "public/a\u0301", "limit": 1}, "args.key: does not match"),
    ("traversal", {"key": "public/../secret", "limit": 1}, "args.key: does not match"),
    ("newline-before-end", {"key": "public/a\n", "limit": 1}, "args.key: does not match"),
    ("nul-byte", {"key": "public/a\x00/../secret", "limit": 1}, "args.key: does not match"),
    ("very-long", {"key": "public/" + "a" * 1_000_000, "limit": 1}, "args.key: longer than 64"),
]
# bytes reach a host function from MessagePack guests only (JavaScript sends JSON)
BYTES = ("bytes-for-string", {"key": b"public/a", "limit": 1}, "args.key: holds a value that is not JSON")


def register(box: wasmbox.Sandbox, received: list[Any]) -> None:
    @box.host_function("host.fn")  # the name forward.wat imports
    def kv_get(key: str, limit: int = 100) -> dict[str, Any]:
        received.append((key, limit))
        return {"key": key, "limit": limit}


def assert_refused(result: wasmbox.CallResult, words: str, name: str = "host.fn") -> None:
    assert result.error is not None and result.error.kind is ErrorKind.CAPABILITY_DENIED, result.error
    assert f"{name!r} refused" in result.error.message and words in result.error.message
    assert [r.verdict for r in result.host_calls] == ["denied"]


@pytest.mark.parametrize(("args", "words"), named([*TRICKS, BYTES]))
def test_core_guest_outside_the_narrowed_args_never_reaches_the_function(
    box: wasmbox.Sandbox, args: dict[str, Any], words: str
) -> None:
    """forward.wat sends its call's args to host.fn as they are: any map the host can pack."""
    received: list[Any] = []
    register(box, received)
    tool = box.load({"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn"],
                     "host_function_args": NARROW, "limits": QUICK})  # fmt: skip
    assert_refused(tool.call(args), words)
    assert received == []
    assert tool.call({"key": "public/a", "limit": 10}).unwrap() == {"key": "public/a", "limit": 10}
    assert received == [("public/a", 10)]


def test_core_guest_outside_the_narrowed_args(guarded: Guarded) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    tool = guarded.box.load({"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn"],
                             "host_function_args": NARROW, "limits": QUICK})  # fmt: skip
    assert_refused(tool.call({"key": "secret/x", "limit": 1}), "args.key: does not match")
    assert received == []
    del tool
    guarded.assert_untouched()


def test_c_example_guest_outside_its_bundled_narrowing(guarded: Guarded) -> None:
    """kv_lookup.wasm (C, `wasmbox.h`) under capabilities/kv_lookup.toml, which narrows kv.get
    to keys of 1 to 256 characters; the tool's own args schema does not cap the length."""
    assert (BUILD / "kv_lookup.wasm").is_file()
    received: list[str] = []

    @guarded.box.host_function("kv.get")
    def kv_get(key: str) -> str:
        received.append(key)
        return "value"

    tool = guarded.box.load(CAPABILITIES / "kv_lookup.toml")
    result = tool.call({"key": "k" * 257})
    assert_refused(result, "args.key: longer than 256", "kv.get")
    assert received == []
    assert tool.call({"key": "k"}).unwrap() == {"key": "k", "value": "value"}
    del tool
    guarded.assert_untouched()


# Tries each trick in turn, catching each refusal, and returns what each was told.
PYTHON_TRIES = """
import json, wasmbox_guest
told = []
for args in json.loads(TRICKS):
    try:
        wasmbox_guest.call_host("host.fn", **args)
        told.append("served")
    except wasmbox_guest.HostCallError as exc:
        told.append(str(exc))
try:
    wasmbox_guest.call_host("host.fn", key=b"public/a", limit=1)
    told.append("served")
except wasmbox_guest.HostCallError as exc:
    told.append(str(exc))
told
"""
PYTHON_TOOL = """
import wasmbox_guest

def main(key: str) -> object:
    return wasmbox_guest.call_host("host.fn", key=key, limit=1)
"""


def _tricks_json(rows: list[tuple[str, dict[str, Any], str]]) -> str:
    return json.dumps([args for _, args, _ in rows])


def test_python_snippet_tries_every_trick(guarded: Guarded) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    code = f"TRICKS = {_tricks_json(TRICKS)!r}\n" + PYTHON_TRIES
    result = guarded.python(code, host_functions=["host.fn"], host_function_args=NARROW, limits=SNIPPET)
    assert result.ok, result.error
    assert received == []
    for told, (case, _, words) in zip(result.value, [*TRICKS, BYTES], strict=True):
        assert "'host.fn' refused" in told and words in told, (case, told)
    assert {r.verdict for r in result.host_calls} == {"denied"}
    guarded.assert_untouched()


def test_python_tool_outside_the_narrowed_args(guarded: Guarded) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    source = guarded.root.parent / "narrowed_tool.py"
    source.write_text(PYTHON_TOOL)
    tool = guarded.box.load({"name": "py", "runtime": "python", "source": str(source),
                             "host_functions": ["host.fn"], "host_function_args": NARROW})  # fmt: skip
    assert_refused(tool.call({"key": "\u0440ublic/a"}), "args.key: does not match")
    assert received == []
    assert tool.call({"key": "public/a"}).unwrap() == {"key": "public/a", "limit": 1}
    del tool
    guarded.assert_untouched()


JAVASCRIPT_TRIES = """
const told = [];
for (const args of JSON.parse(TRICKS)) {
  try { wasmbox.callHost("host.fn", args); told.push("served"); }
  catch (e) { told.push(String(e.message)); }
}
told
"""


@pytest.mark.usefixtures("javascript_runtime")
def test_javascript_snippet_tries_every_trick(guarded: Guarded) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    code = f"const TRICKS = {json.dumps(_tricks_json(TRICKS))};\n" + JAVASCRIPT_TRIES
    grants = {"name": "js", "runtime": "javascript", "host_functions": ["host.fn"],
              "host_function_args": NARROW, "limits": SNIPPET}  # fmt: skip
    result = guarded.box.run_javascript(code, grants)
    assert result.ok, result.error
    assert received == []
    for told, (case, _, words) in zip(result.value, TRICKS, strict=True):
        assert "'host.fn' refused" in told and words in told, (case, told)
    uncaught = guarded.box.run_javascript('wasmbox.callHost("host.fn", {key: "secret/x", limit: 1})', grants)
    assert_refused(uncaught, "args.key: does not match")
    assert received == []
    guarded.assert_untouched()


# Code calling the tool `store` (forward.wat: its args go to host.fn, which is not narrowed for
# `store` itself); the code's own grant narrows what it may pass `store`.
TOOL_NARROW = {"store": {"key": KEY, "limit": LIMIT}}
PYTHON_TOOL_TRIES = """
import json
from wasmbox_guest import HostCallError
told = []
for args in json.loads(TRICKS):
    try:
        tools.store(**args)
        told.append("served")
    except HostCallError as exc:
        told.append(str(exc))
told
"""
JAVASCRIPT_TOOL_TRIES = """
const told = [];
for (const args of JSON.parse(TRICKS)) {
  try { tools.store(args); told.push("served"); }
  catch (e) { told.push(String(e.message)); }
}
told
"""


def _load_store(box: wasmbox.Sandbox, received: list[Any]) -> None:
    register(box, received)
    box.load({"name": "store", "module": wat("forward"), "host_functions": ["host.fn"], "limits": QUICK})


def test_python_code_calling_a_tool_outside_its_narrowed_args(guarded: Guarded) -> None:
    received: list[Any] = []
    _load_store(guarded.box, received)
    code = f"TRICKS = {_tricks_json(TRICKS)!r}\n" + PYTHON_TOOL_TRIES
    result = guarded.python(code, tools=["store"], tool_args=TOOL_NARROW, limits=SNIPPET)
    assert result.ok, result.error
    assert received == []  # the tool never ran, so neither did its host function
    for told, (case, _, words) in zip(result.value, TRICKS, strict=True):
        assert "tool 'store' refused" in told and words in told, (case, told)
    uncaught = guarded.python("tools.store(key='public/a', limit=11)", tools=["store"], tool_args=TOOL_NARROW)
    assert uncaught.error is not None and uncaught.error.kind is ErrorKind.CAPABILITY_DENIED
    assert "args.limit: must be <= 10" in uncaught.error.message
    allowed = guarded.python("tools.store(key='public/a', limit=2)", tools=["store"], tool_args=TOOL_NARROW)
    assert allowed.value == {"key": "public/a", "limit": 2} and received == [("public/a", 2)]
    guarded.assert_untouched()


@pytest.mark.usefixtures("javascript_runtime")
def test_javascript_code_calling_a_tool_outside_its_narrowed_args(guarded: Guarded) -> None:
    received: list[Any] = []
    _load_store(guarded.box, received)
    code = f"const TRICKS = {json.dumps(_tricks_json(TRICKS))};\n" + JAVASCRIPT_TOOL_TRIES
    grants = {"name": "js", "runtime": "javascript", "tools": ["store"], "tool_args": TOOL_NARROW,
              "limits": SNIPPET}  # fmt: skip
    result = guarded.box.run_javascript(code, grants)
    assert result.ok, result.error
    assert received == []
    for told, (case, _, words) in zip(result.value, TRICKS, strict=True):
        assert "tool 'store' refused" in told and words in told, (case, told)
    guarded.assert_untouched()


def test_a_narrowed_grant_is_the_callers_not_the_tools(box: wasmbox.Sandbox) -> None:
    """`tool_args` narrows what one caller's code may pass; the host's own call of the tool,
    and another grant set's code, are held to the tool's own schema only."""
    received: list[Any] = []
    _load_store(box, received)
    narrow = {"name": "narrow", "runtime": "python", "tools": ["store"], "tool_args": TOOL_NARROW}
    wide = {"name": "wide", "runtime": "python", "tools": ["store"]}
    assert box.run_python("tools.store(key='secret/x', limit=1)", narrow).error is not None
    assert box.run_python("tools.store(key='secret/x', limit=1)", wide).value == {
        "key": "secret/x",
        "limit": 1,
    }
    assert box.tools["store"].call({"key": "other", "limit": 50}).ok
    assert received == [("secret/x", 1), ("other", 50)]
