"""Reactor modules (`[reactor]`) against the hostile-guest suite: QuickJS with its `std`/`os`
modules on (files, environment, processes), Graphviz told to read files, and a hand-written
module whose allocator and entry lie about pointers and lengths. Each case ends with the host
untouched and still serving (`Guarded.assert_untouched`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wasmbox import CallResult, ErrorKind
from wasmbox._inspect import inspect_file

from ..reactor_inputs import (
    GRAPHVIZ,
    QUICKJS,
    graphviz_manifest,
    pinned,
    quickjs_manifest,
)
from .conftest import QUICK, SECRET, Guarded, leaks_secret, named

# One file operation per call, by QuickJS's std/os modules: what it did, or the errno it got.
PROBE = r"""
const [op, a, b] = scriptArgs;
function attempt() {
  const e = {};
  switch (op) {
    case "read": { const f = std.open(a, "r", e); if (!f) return "errno " + e.errno;
                   const text = f.readAsString(); f.close(); return "read " + text; }
    case "write": { const f = std.open(a, "w", e); if (!f) return "errno " + e.errno;
                    f.puts(b); f.close(); return "written"; }
    case "mkdir": return "rc " + os.mkdir(a);
    case "remove": return "rc " + os.remove(a);
    case "rename": return "rc " + os.rename(a, b);
    case "readdir": return JSON.stringify(os.readdir(a));
    case "env": return JSON.stringify(std.getenviron());
    case "exec": return typeof os.exec;
  }
}
console.log(attempt());
"""


def js(guarded: Guarded, *args: str, writable: bool = False, **fields: Any) -> CallResult:
    manifest = quickjs_manifest(pinned(QUICKJS), limits=QUICK, preopens=guarded.preopen(writable), **fields)
    manifest["name"] = "hostile_js"
    manifest["command"] = {"argv": ["--std", "-e", "{code}", "--", "{*args}"], "fail_on_exit_code": True}
    return guarded.box.load(manifest, replace=True).call({"code": PROBE, "args": list(args)})


def outcome(result: CallResult) -> str:
    assert result.ok, result.error
    assert not leaks_secret(result)
    return result.stdout.strip()


READS_OUT = [
    "/data/../outside/secret.txt",
    "/data/sub/../../outside/secret.txt",
    "/data/abs_link",
    "/data/rel_link",
    "/data/dir_link/secret.txt",
    "HOST_PATH",
    "/etc/passwd",
    "/proc/self/environ",
]


@pytest.mark.parametrize("path", READS_OUT)
def test_quickjs_reactor_reads_outside_the_grant_are_refused(guarded: Guarded, path: str) -> None:
    assert outcome(js(guarded, "read", "/data/inside.txt")) == "read inside"
    said = outcome(js(guarded, "read", str(guarded.secret) if path == "HOST_PATH" else path))
    assert said.startswith("errno "), said
    guarded.assert_untouched()


@pytest.mark.parametrize(
    "op",
    [("write", "/data/new.txt", "pwned"), ("write", "/data/inside.txt", "pwned"), ("mkdir", "/data/newdir"),
     ("remove", "/data/inside.txt"), ("remove", "/data/abs_link"), ("rename", "/data/inside.txt", "/data/moved")],
    ids=lambda op: "-".join(op[:2]),
)  # fmt: skip
def test_quickjs_reactor_writes_to_a_read_only_grant_are_refused(
    guarded: Guarded, op: tuple[str, ...]
) -> None:
    said = outcome(js(guarded, *op))
    assert said.startswith(("errno ", "rc -")), said
    guarded.assert_untouched()


@pytest.mark.parametrize(
    "op",
    [("write", "/data/../outside/planted.txt", "x"), ("write", "/data/dir_link/planted.txt", "x"),
     ("write", "/data/abs_link", "pwned"), ("rename", "/data/inside.txt", "/data/../outside/moved")],
    ids=lambda op: "-".join(op[:2]),
)  # fmt: skip
def test_quickjs_reactor_writable_grant_cannot_reach_outside(guarded: Guarded, op: tuple[str, ...]) -> None:
    said = outcome(js(guarded, *op, writable=True))
    assert said.startswith(("errno ", "rc -")), said
    guarded.assert_untouched(granted_too=False)


def test_quickjs_reactor_sees_only_the_manifest_env(
    guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WASMBOX_SUITE_TOKEN", SECRET)
    assert outcome(js(guarded, "env", env={"TZ": "UTC"})) == '{"TZ":"UTC"}'
    guarded.assert_untouched()


def test_quickjs_reactor_has_no_processes_or_sockets(guarded: Guarded) -> None:
    """QuickJS's os.exec is not built for WASI, and neither module can import a socket call:
    their imports are WASI preview1 file, clock and stdio calls only."""
    assert outcome(js(guarded, "exec")) == "undefined"
    for module in (pinned(QUICKJS), pinned(GRAPHVIZ)):
        imports = inspect_file(module).imports
        assert {i.module for i in imports} == {"wasi_snapshot_preview1"}
        assert not [i.name for i in imports if i.name.startswith("sock_")]
    guarded.assert_untouched()


def test_graphviz_image_attributes_cannot_read_outside(guarded: Guarded) -> None:
    """Graphviz reads `image=` files itself: through the grant only, so the secret beside it
    (directly, by '..' or by a host-made symlink) is never read into the drawing."""
    paths = ["/data/../outside/secret.txt", "/data/abs_link", "/data/rel_link", str(guarded.secret)]
    nodes = " ".join(f'n{i} [image="{path}", label="n{i}"];' for i, path in enumerate(paths))
    tool = guarded.box.load(graphviz_manifest(pinned(GRAPHVIZ), limits=QUICK, preopens=guarded.preopen()))
    result = tool.call({"dot": f"digraph {{ {nodes} }}"})
    assert not leaks_secret(result)
    assert result.ok or result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR, result.error
    del tool  # (holds the compiled module, which assert_untouched checks is let go with the Sandbox)
    guarded.assert_untouched()


JS_EXHAUSTION = [
    ("spin-fuel", "for (;;) {}", QUICK, ErrorKind.OUT_OF_FUEL),
    ("spin-deadline", "for (;;) {}", {"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT),
    ("deep-recursion", "function f() { return f() + 1 } f()", QUICK, ErrorKind.TRAP),
    ("memory-bomb", "const k = []; for (;;) k.push(new Array(1e5).fill(1.5))",
     {"fuel": 10**11, "timeout": "60s", "memory": "16MiB"}, ErrorKind.MEMORY_LIMIT),
    # QuickJS ignores its failed writes past the cap: it goes on until its fuel runs out, cut
    ("stdout-flood", "for (;;) console.log('x'.repeat(1000))", {**QUICK, "output": "4KiB"}, ErrorKind.OUT_OF_FUEL),
    ("stderr-flood", "for (;;) std.err.puts('x'.repeat(1000))", {**QUICK, "output": "4KiB"}, ErrorKind.OUT_OF_FUEL),
]  # fmt: skip


@pytest.mark.parametrize(("code", "limits", "kind"), named(JS_EXHAUSTION))
def test_quickjs_reactor_cannot_exhaust_the_host(
    guarded: Guarded, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    manifest = quickjs_manifest(pinned(QUICKJS), limits=limits)
    manifest["command"] = {"argv": ["--std", "-e", "{code}"], "fail_on_exit_code": True}
    result = guarded.box.load(manifest).call({"code": code})
    assert result.error is not None and result.error.kind is kind, result.error
    if "flood" in code or "repeat" in code:
        assert result.truncated and len(result.stdout) + len(result.stderr) <= 4096
    guarded.assert_untouched()


def test_quickjs_reactor_state_does_not_cross_calls(guarded: Guarded) -> None:
    """Nothing a call leaves behind, in the interpreter or in its scratch /tmp, is there for
    the next one."""
    manifest = quickjs_manifest(pinned(QUICKJS), limits=QUICK, scratch="1MiB")
    manifest["command"] = {"argv": ["--std", "-e", "{code}"], "fail_on_exit_code": True}
    tool = guarded.box.load(manifest)
    code = (
        "const f = std.open('/tmp/left', 'r'); console.log(f ? 'found ' + f.readAsString() : 'none',"
        " typeof globalThis.left); globalThis.left = 1; const g = std.open('/tmp/left', 'w');"
        " g.puts('behind'); g.close()"
    )
    assert [tool.call({"code": code}).stdout for _ in range(2)] == ["none undefined\n"] * 2
    del tool
    guarded.assert_untouched()


# A module that lies: its allocator and entries return pointers and lengths it chose.
LIAR = r"""
(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1 1)
  (global $mode (mut i32) (i32.const 0))
  (func (export "alloc_past_end") (param i32) (result i32) (i32.const 65533))
  (func (export "alloc_wraps") (param i32) (result i32) (i32.const -16))
  (func (export "alloc_null") (param i32) (result i32) (i32.const 0))
  (func (export "alloc_spins") (param i32) (result i32) (loop $l (br $l)) (i32.const 0))
  (func (export "alloc_ok") (param i32) (result i32) (i32.const 1024))
  (func (export "take_string") (param i32) (result i32) (local.get 0))
  ;; a C string with no NUL up to the memory's end
  (func (export "unterminated") (param i32) (result i32)
    (memory.fill (i32.const 0) (i32.const 65) (i32.const 65536)) (i32.const 60000))
  ;; *out_len = 0xffffffff
  (func (export "huge_len") (param i32) (param $out_len i32) (result i32)
    (i32.store (local.get $out_len) (i32.const -1)) (i32.const 16))
  ;; the out_len pointer it was given is not where it writes: it returns a pointer 4 bytes
  ;; from the end of memory as the result, with length 100
  (func (export "len_past_end") (param i32) (param $out_len i32) (result i32)
    (i32.store (local.get $out_len) (i32.const 100)) (i32.const 65532))
  (func (export "exits") (param i32) (result i32) (call $exit (i32.const 3)) (i32.const 0))
)
"""

LIES = [
    ("alloc-past-end", "alloc_past_end", "take_string", "cstring", ErrorKind.BAD_RESPONSE, "outside the memory"),
    ("alloc-wraps-around", "alloc_wraps", "take_string", "cstring", ErrorKind.BAD_RESPONSE, "outside the memory"),
    ("alloc-null", "alloc_null", "take_string", "cstring", ErrorKind.MEMORY_LIMIT, "returned NULL"),
    ("alloc-spins", "alloc_spins", "take_string", "cstring", ErrorKind.OUT_OF_FUEL, "fuel"),
    ("unterminated-string", "alloc_ok", "unterminated", "cstring", ErrorKind.BAD_RESPONSE, "runs past the end"),
    ("huge-out-len", "alloc_ok", "huge_len", "out_len", ErrorKind.OUTPUT_LIMIT, "output cap"),
    ("result-past-end", "alloc_ok", "len_past_end", "out_len", ErrorKind.BAD_RESPONSE, "outside the module's memory"),
    ("exits-mid-call", "alloc_ok", "exits", "cstring", ErrorKind.GUEST_ERROR, "exited with code 3"),
]  # fmt: skip


@pytest.mark.parametrize(("allocator", "entry", "result", "kind", "words"), named(LIES))
def test_a_lying_module_cannot_make_the_host_read_or_write_out_of_bounds(
    guarded: Guarded, tmp_path: Path, allocator: str, entry: str, result: str, kind: ErrorKind, words: str
) -> None:
    module = tmp_path / "liar.wat"
    module.write_text(LIAR)
    params: list[Any] = [{"cstring": "{s}"}] + (["out_len"] if result == "out_len" else [])
    manifest = {
        "name": "liar", "module": str(module), "limits": QUICK,
        "reactor": {"entry": entry, "allocator": {"export": allocator}, "params": params, "result": result},
        "input_schema": {"type": "object", "properties": {"s": {"type": "string"}}},
    }  # fmt: skip
    called = guarded.box.load(manifest).call({"s": "hello"})
    assert called.error is not None and called.error.kind is kind, called.error
    assert words in called.error.message
    guarded.assert_untouched()
