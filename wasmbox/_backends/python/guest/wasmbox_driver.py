"""The guest driver of wasmbox's CPython runtime (runs inside the sandbox).

componentize-py imports this module at build time and snapshots the interpreter, so every
import below is already done when a call starts. Each call is a fresh instance of that
snapshot: nothing here survives from one call to the next.

Request: the call's output cap in bytes (8 bytes, little-endian), then a map in `marshal`'s
format (decoded in C: msgpack's pure-Python codec cost a fresh interpreter ~30 times the fuel;
the host makes it, from the values MessagePack gives it, so a guest sees what MessagePack
carries: lists, not tuples; str keys):
    {"mode": "compile", "source": str, "filename": str}   -> {"ok": bytes}, the tool compiled
      (+ "entry": str -> {"ok": {"code": bytes, "signature": map | None, "defined": map | None}},
       see `_signature` and `_defined`)
    {"mode": "tool", "code": bytes, "source": str, "filename": str, "entry": str, "args": map}
    {"mode": "code", "code": str}
      (+ "session": true -> run in the instance's one persistent `__main__` namespace, which
       earlier session runs of this instance filled; tracebacks name the run, "<run 3>")
    any of them + "path": str   a folder appended to sys.path for this call (its packages)
Response (MessagePack map):
    {"ok": value}
    {"error": message, "kind": "guest_error" | "invalid_arguments" | "memory_limit"
                               | "bad_response", "traceback": str}
    {"too_big": int}   the ok response would have been this many bytes: over the output cap,
                       or over what one transfer to the host can carry (REPLY_MAX); not sent

A tool is compiled once, when the host loads it, by a "compile" request to an instance that
runs nothing else; its calls then send those bytes (the marshalled code object) with the source
(for tracebacks), so a call skips compiling, which costs more than many a tool's run.

No exception may escape `run`: in the component it would become a Rust panic and a trap.
"""

from __future__ import annotations

# The standard library a tool or snippet can use without touching the filesystem: imported
# here, at build time, so it is part of the snapshot. Anything else is imported lazily from
# the read-only stdlib preopen the host adds to every call.
import abc  # noqa: F401
import array  # noqa: F401
import ast
import base64  # noqa: F401
import binascii  # noqa: F401
import bisect  # noqa: F401
import builtins
import calendar  # noqa: F401
import cmath  # noqa: F401
import collections  # noqa: F401
import collections.abc  # noqa: F401
import contextlib  # noqa: F401
import copy  # noqa: F401
import csv  # noqa: F401
import dataclasses
import datetime
import decimal
import difflib  # noqa: F401
import enum
import fractions
import functools
import gc
import hashlib  # noqa: F401
import heapq  # noqa: F401
import html  # noqa: F401
import inspect
import io
import itertools  # noqa: F401
import json  # noqa: F401
import linecache
import marshal
import math  # noqa: F401
import numbers  # noqa: F401
import operator  # noqa: F401
import os
import pathlib
import pprint  # noqa: F401
import random
import re  # noqa: F401
import secrets  # noqa: F401
import socket  # noqa: F401  (imports, but every connection is refused: no network grant)
import sqlite3  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import struct
import subprocess  # noqa: F401  (imports, but cannot start a process under WASI)
import sys
import textwrap  # noqa: F401
import threading  # noqa: F401  (imports, but cannot start a thread under WASI)
import time  # noqa: F401
import tomllib  # noqa: F401
import traceback
import types
import typing  # noqa: F401
import unicodedata  # noqa: F401
import urllib.parse  # noqa: F401
import uuid
import zlib  # noqa: F401

import annotationlib  # stdlib since 3.14 (the linter, on the host's 3.11, sorts it here)
import msgpack  # the pure-Python fallback, bundled by the build
import wasmbox_guest  # noqa: F401  (so tools import it from the snapshot)
import wit_world

TRACEBACK_CAP = 8192
TRACEBACK_FRAMES = 30  # the innermost ones; a RecursionError has a thousand

# The most bytes one response can carry: Wasmtime copies a component's result into the host
# under a 128 MiB budget per call ("hostcall fuel"), and through the C API every byte of a
# list<u8> costs one 48-byte value of it. Past this the call would trap; the host has the same
# figure (_component_io.REPLY_MAX).
REPLY_MAX = (128 << 20) // 48
_output_cap = REPLY_MAX  # this call's output cap, from its request


def _stream(fd: int) -> io.TextIOWrapper:
    """A line-buffered text stream over `fd`: each line reaches the host as soon as it ends,
    so a call stopped by its fuel or deadline (after which its instance never runs again)
    keeps what it printed, but for at most the last 16 KiB of a line it had not ended (the
    text and byte buffers hold 8 KiB each; 3.14's default for the latter is 128 KiB).
    (componentize-py gives sys.stdout a TextIOWrapper straight over the raw fd, which drops
    the rest of a write when WASI takes only part of it, 8 KiB at a time; the buffered writer
    retries short writes.) The driver flushes at the end of every call."""
    raw = io.BufferedWriter(io.FileIO(fd, "w", closefd=False), buffer_size=8192)
    return _SlicedWriter(raw, encoding="utf-8", errors="backslashreplace", line_buffering=True)


class _SlicedWriter(io.TextIOWrapper):
    """Writes a long text a slice at a time, so the host's output cap stops it (the write
    past the cap fails) after the first slices, before encoding and copying the rest costs
    the call its fuel."""

    def write(self, text: str, _write=io.TextIOWrapper.write, _slice=64 * 1024) -> int:  # noqa: ANN001
        # (the defaults are locals: a print pays only for this check, not for looking them up)
        if len(text) <= _slice:
            return _write(self, text)
        written = 0
        for start in range(0, len(text), _slice):
            written += _write(self, text[start : start + _slice])
        return written


sys.stdout = _stream(1)
sys.stderr = _stream(2)


class _Refusal(Exception):
    """A failure the driver reports with a specific kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WitWorld(wit_world.WitWorld):
    def run(self, request: bytes) -> bytes:
        try:
            return _reply(*_serve(request))
        except _Refusal as refusal:
            if _raised_here(refusal):
                return _error(refusal.kind, str(refusal), "")
            return _error("guest_error", _describe(refusal), _traceback(refusal))
        except MemoryError:
            return _error("memory_limit", "MemoryError: out of memory", "")
        except BaseException as exc:  # noqa: BLE001 - everything becomes a response
            _explain_missing_module(exc)
            _explain_ungranted_path(exc)
            return _error("guest_error", _describe(exc), _traceback(exc))
        finally:
            _flush()


def _explain_missing_module(exc: BaseException) -> None:
    """A failed import of a module that is not in the stdlib says how to get it."""
    name = getattr(exc, "name", None)
    if isinstance(exc, ModuleNotFoundError) and isinstance(name, str) and name:
        if name.partition(".")[0] not in sys.stdlib_module_names:
            exc.add_note(
                f"wasmbox: {name!r} is not in the sandbox's Python; a pure-Python package can be added by "
                "declaring it, pinned, in the tool's or grant set's manifest: packages = [\"name==version\"] "
                '(docs/python.md: "Third-party packages")'
            )


def _explain_ungranted_path(exc: BaseException) -> None:
    """A file not found at a path no preopen covers says so: WASI fails such a path exactly as
    a missing file. Decided from what the guest itself can reach (no ancestor of the path is
    reachable), so it says nothing of the host."""
    if not isinstance(exc, FileNotFoundError):
        return
    for name in (exc.filename, exc.filename2):
        if isinstance(name, (str, bytes)) and not _reachable(os.path.abspath(os.fsdecode(name))):
            exc.add_note(
                f"wasmbox: no preopen covers {os.fsdecode(name)!r}: the sandbox sees only the directories "
                "its manifest grants; grant this one in the manifest's preopens (guest = the folder "
                "the tool opens it under)"
            )
            return


def _reachable(path: str) -> bool:
    """Whether some ancestor of `path` can be looked at (then a preopen covers it)."""
    parent = os.path.dirname(path)
    while True:
        try:
            os.stat(parent)
            return True
        except OSError:
            pass
        if parent == os.path.dirname(parent):
            return False
        parent = os.path.dirname(parent)


def _raised_here(exc: BaseException) -> bool:
    """Whether the driver raised `exc` (guest code can import this module and raise its
    exceptions, but must not choose the error kind)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename == __file__


def _serve(request: bytes) -> tuple[object, bool]:
    """The value the request produced, and whether it must be sendable as is (a tool's)."""
    global _output_cap
    _output_cap = min(int.from_bytes(request[:8], "little"), REPLY_MAX)
    try:
        message = marshal.loads(memoryview(request)[8:])
    except Exception as exc:
        raise _Refusal("bad_response", f"driver: bad request: {exc}") from None
    if not isinstance(message, dict):
        raise _Refusal("bad_response", "driver: bad request: not a map")
    path = message.get("path")
    if isinstance(path, str) and path not in sys.path:
        sys.path.append(path)  # after the stdlib: a package cannot shadow it
    mode = message.get("mode")
    if mode == "tool":
        return _run_tool(message)
    if mode == "code":
        if message.get("session") is True:
            return _run_code(message["code"], *_session_run())
        return _run_code(message["code"], _fresh_module("__main__"), "<code>")
    if mode == "compile":
        code = _compile_tool(message["source"], message["filename"])
        if "entry" not in message:
            return code, True
        source, entry = message["source"], message["entry"]
        return {
            "code": code,
            "signature": _signature(source, entry),
            "defined": _defined(source, entry),
        }, True
    raise _Refusal("bad_response", f"driver: unknown mode {mode!r}")


def _compile_tool(source: str, filename: str) -> bytes:
    """A tool's source compiled, as its calls take it. (`dont_inherit`: not this module's
    `from __future__ import annotations`; here and below.)"""
    return marshal.dumps(compile(source, filename, "exec", dont_inherit=True))


def _signature(source: str, entry: str) -> dict | None:
    """`entry`'s parameters as written, read from the syntax tree, so none of the tool's code
    runs: {"params": [{"name", "kind", "annotation": source text | None, "default"?: JSON-able
    literal, "has_default": bool}], "doc": docstring | None, "returns": the return annotation as
    source text | None}. None unless `entry` is a plain top-level `def` (not decorated, not
    rebound later), whose signature is then the real one."""
    found = None
    for node in ast.parse(source).body:
        names = _bound_names(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            found = node
        elif entry in names:
            found = None
    if found is None or found.decorator_list:
        return None
    spec = found.args
    positional = [*spec.posonlyargs, *spec.args]
    defaults = [None] * (len(positional) - len(spec.defaults)) + list(spec.defaults)
    params = [
        _param(arg, "positional_only" if arg in spec.posonlyargs else "positional_or_keyword", default)
        for arg, default in zip(positional, defaults)
    ]
    if spec.vararg is not None:
        params.append(_param(spec.vararg, "var_positional", None))
    params += [_param(arg, "keyword_only", d) for arg, d in zip(spec.kwonlyargs, spec.kw_defaults)]
    if spec.kwarg is not None:
        params.append(_param(spec.kwarg, "var_keyword", None))
    returns = ast.unparse(found.returns) if found.returns is not None else None
    return {"params": params, "doc": ast.get_docstring(found), "returns": returns}


def _defined(source: str, entry: str) -> dict | None:
    """None when `entry` may be bound at the top level of `source` (a statement binds it, or
    names may be bound out of sight: `import *`, `globals()`, `exec`); else the top-level
    functions there are, {"functions": [names]}."""
    tree = ast.parse(source)
    names = set()
    for node in tree.body:
        names |= _bound_names(node)
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return None
    if entry in names or any(
        isinstance(n, ast.Name) and n.id in ("globals", "exec", "vars", "locals", "__builtins__")
        for n in ast.walk(tree)
    ):
        return None
    functions = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {"functions": functions}


def _bound_names(node: ast.stmt) -> set:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return {  # (a def or class inside a top-level if/try/with counts too)
        n.id if isinstance(n, ast.Name) else n.name
        for n in ast.walk(node)
        if isinstance(n, ast.Name)
        and isinstance(n.ctx, ast.Store)
        or isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def _param(arg: ast.arg, kind: str, default: ast.expr | None) -> dict:
    param = {
        "name": arg.arg,
        "kind": kind,
        "has_default": default is not None,
        "annotation": ast.unparse(arg.annotation) if arg.annotation is not None else None,
    }
    if default is not None:
        try:
            value = ast.literal_eval(default)
        except Exception:  # noqa: BLE001 - not a literal: a default the schema does not show
            return param
        if _jsonable(value, 0):
            param["default"] = value
    return param


def _jsonable(value: object, depth: int) -> bool:
    if value is None or isinstance(value, (bool, str, float)):
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, (list, tuple)) and depth < 8:
        return all(_jsonable(item, depth + 1) for item in value)
    if isinstance(value, dict) and depth < 8:
        return all(isinstance(k, str) and _jsonable(v, depth + 1) for k, v in value.items())
    return False


def _run_tool(message: dict) -> tuple[object, bool]:
    _remember_source(message["filename"], message["source"])
    namespace = _fresh_module("__wasmbox_tool__")
    exec(marshal.loads(message["code"]), namespace)
    entry = namespace.get(message["entry"])
    if not callable(entry):
        raise _Refusal("guest_error", f"tool source defines no function {message['entry']!r}")
    args = message["args"]
    try:  # whatever the entry is, calling it decides what it accepts
        return entry(**args), True
    except TypeError as exc:
        trace = exc.__traceback__
        if trace is None or trace.tb_next is not None:
            raise  # raised with some of the tool's Python code running: the tool's own
        refusal = exc  # raised by the call itself, e.g. binding the arguments
    if _fits(entry, args):  # (decided out here: nothing of this gets chained to it)
        raise refusal
    raise _Refusal("invalid_arguments", str(refusal) or f"{message['entry']}(): the arguments do not fit")


def _fits(entry: object, args: dict) -> bool:
    """Whether `args` fit `entry`'s signature (True when it has none to tell by)."""
    if type(entry) is types.FunctionType and not hasattr(entry, "__signature__"):
        return False  # a plain function's own call raises only when binding fails
    try:  # annotations as written: a name imported only for type checkers must not fail here
        signature = inspect.signature(entry, annotation_format=_FORWARDREF)
    except Exception:  # noqa: BLE001 - no signature to tell by
        return True
    try:
        signature.bind(**args)
    except TypeError:
        return False
    return True


_FORWARDREF = annotationlib.Format.FORWARDREF


def _run_code(source: str, namespace: dict[str, object], filename: str) -> tuple[object, bool]:
    """Run a snippet; its value is its last statement's when that is an expression."""
    _remember_source(filename, source)
    split = _compile_split(source, filename)
    if split is None:  # no clean split: the syntax tree decides, and reports any SyntaxError
        return _run_code_tree(source, namespace, filename)
    head, tail, is_expression = split
    if head is not None:
        exec(head, namespace)
    if is_expression:
        return eval(tail, namespace), False
    exec(tail, namespace)
    return None, False


def _compile_split(source: str, filename: str) -> tuple[types.CodeType | None, types.CodeType, bool] | None:
    """The snippet compiled straight from its text, parsed once in C (a syntax tree made in
    Python and compiled again parses it twice over: bench/README.md, "Python: fresh calls"):
    everything before its last top-level line (the last line
    that starts at column 0 with neither a space nor a comment), and that line on, as an
    expression when it is one. When both parts compile, the split is at a statement boundary:
    a part that ended inside a bracket, a string or a continued line would not. None when they
    do not, or when the split could change what the code means (a `;` after the split, a
    `__future__` import)."""
    if "\n" not in source.strip() and ";" not in source:  # one line: no split to look for
        try:
            return None, compile(source, filename, "eval", dont_inherit=True), True
        except SyntaxError:  # a statement (it fails at its first tokens, before costing much)
            pass
        try:
            return None, compile(source, filename, "exec", dont_inherit=True), False
        except (SyntaxError, ValueError):
            return None
    lines = source.splitlines(keepends=True)
    at = len(lines) - 1
    while at >= 0 and (not lines[at][:1] or lines[at][:1].isspace() or lines[at][:1] == "#"):
        at -= 1
    if at < 0 or "__future__" in source:
        return None
    head_source, tail_source = "".join(lines[:at]), "".join(lines[at:])
    if ";" in tail_source:
        return None
    tail_source = "\n" * at + tail_source  # (its lines keep their numbers in tracebacks)
    try:
        head = compile(head_source, filename, "exec", dont_inherit=True) if head_source.strip() else None
        if _STATEMENT.match(lines[at]) is None:
            try:
                return head, compile(tail_source, filename, "eval", dont_inherit=True), True
            except SyntaxError:  # a statement that starts like an expression (`x = 1`)
                pass
        if ":" in tail_source:  # it may annotate a name: then the module's annotations are one
            return None, compile(source, filename, "exec", dont_inherit=True), False  # code's
        return head, compile(tail_source, filename, "exec", dont_inherit=True), False
    except (SyntaxError, ValueError):  # (ValueError: a NUL in the source)
        return None


# A line that starts a statement, not an expression (compiled as one without trying).
_STATEMENT = re.compile(
    r"(?:@|(?:async|assert|break|class|continue|def|del|for|from|global|if|import|nonlocal|pass"
    r"|raise|return|try|while|with)\b)"
)


def _run_code_tree(source: str, namespace: dict[str, object], filename: str) -> tuple[object, bool]:
    try:
        tree = ast.parse(source, filename, "exec")
    except SyntaxError as exc:  # the snippet's own: its line and column, no frame of ast's
        raise exc.with_traceback(None) from None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
    if last is None:
        return None, False
    return eval(compile(last, filename, "eval", dont_inherit=True), namespace), False


_session: list = []  # [the session's namespace, runs so far], once this instance serves a session


def _session_run() -> tuple[dict[str, object], str]:
    """The session's namespace (made at its first run, and `__main__` from then on) and this
    run's filename: each run's source stays in linecache under its own name, so a traceback
    through a function an earlier run defined shows that run's lines."""
    if not _session:
        _session[:] = [_fresh_module("__main__"), 0]
    _session[1] += 1
    return _session[0], f"<run {_session[1]}>"


def _fresh_module(name: str) -> dict[str, object]:
    """The namespace of a new module `name`, registered in sys.modules as guest code expects
    (dataclasses, pickle and typing look a class's module up there)."""
    module = types.ModuleType(name)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module.__dict__


def _remember_source(filename: str, source: str) -> None:
    """Let tracebacks show the guest's source lines (there is no file to read them from)."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def _reply(value: object, strict: bool) -> bytes:
    """The ok response, encoded once (see `_encode`), or its size when it is too big to send.
    A value that cannot be sent is an error for a tool (`strict`) that names what is wrong; a
    snippet's becomes its repr."""
    try:
        reply = _pack_plain(value, _OK, 0) or _pack({"ok": value})
    except (TypeError, ValueError, OverflowError) as exc:
        if strict:
            raise _Refusal("guest_error", _unsendable(exc)) from None
        reply = _pack({"ok": repr(value)})
    if len(reply) > _output_cap:  # the host would refuse it: say how big, send nothing
        return _pack({"too_big": len(reply)})
    return reply


_OK = b"\x81\xa2ok"  # the start of {"ok": value}: a map of one entry, its key


def _pack_plain(value: object, head: bytes, depth: int) -> bytes | None:
    """`head` + `value` as msgpack packs it, byte for byte, when `value` is of the plain types
    most results are (None, bool, int within 64 bits, float, str, and lists, tuples and dicts
    of them, exactly those types, 32 levels at most); None for anything else, which msgpack's
    pure-Python Packer then does (its set-up costs a fresh interpreter ~70k fuel a reply)."""
    kind = type(value)
    if value is None:
        return head + b"\xc0"
    if kind is bool:
        return head + (b"\xc3" if value else b"\xc2")
    if kind is int:
        if -0x20 <= value < 0x80:
            return head + (value & 0xFF).to_bytes(1, "big")
        for marker, size in _INT_SIZES[value < 0]:
            try:
                return head + marker + value.to_bytes(size, "big", signed=value < 0)
            except OverflowError:
                continue
        return None
    if kind is float:
        return head + b"\xcb" + _DOUBLE(value)
    if kind is str:
        try:
            data = value.encode("utf-8")
        except UnicodeEncodeError:
            return None
        n = len(data)
        if n <= 0x1F:
            return head + (0xA0 | n).to_bytes(1, "big") + data
        if n <= 0xFF:
            return head + b"\xd9" + n.to_bytes(1, "big") + data
        if n <= 0xFFFF:
            return head + b"\xda" + n.to_bytes(2, "big") + data
        return head + b"\xdb" + n.to_bytes(4, "big") + data if n < 2**32 else None
    if depth >= 32 or kind not in (list, tuple, dict):
        return None
    n = len(value)  # type: ignore[arg-type]  (under 2**32 in a 32-bit memory)
    if kind is dict:
        out = head + (bytes([0x80 | n]) if n <= 0x0F else b"\xde" + n.to_bytes(2, "big") if n <= 0xFFFF
                      else b"\xdf" + n.to_bytes(4, "big"))  # fmt: skip
        items = [x for pair in value.items() for x in pair]  # type: ignore[attr-defined]
    else:
        out = head + (bytes([0x90 | n]) if n <= 0x0F else b"\xdc" + n.to_bytes(2, "big") if n <= 0xFFFF
                      else b"\xdd" + n.to_bytes(4, "big"))  # fmt: skip
        items = value  # type: ignore[assignment]
    parts = [out]
    for item in items:
        part = _pack_plain(item, b"", depth + 1)
        if part is None:
            return None
        parts.append(part)
    return b"".join(parts)


# msgpack's int markers past the fixints, smallest first: unsigned (uint 8..64), signed (int 8..64)
_INT_SIZES = (
    ((b"\xcc", 1), (b"\xcd", 2), (b"\xce", 4), (b"\xcf", 8)),
    ((b"\xd0", 1), (b"\xd1", 2), (b"\xd2", 4), (b"\xd3", 8)),
)
_DOUBLE = struct.Struct(">d").pack


def _unsendable(exc: BaseException) -> str:
    if isinstance(exc, _Unsendable):
        return (
            f"the tool's result contains a value of type {exc.type_name}, which cannot be sent: return "
            "dict, list, str, int, float, bool, None, bytes, or a value wasmbox converts "
            "(dates and times, sets, Decimal, Fraction, UUID, paths, enums, dataclasses)"
        )
    if isinstance(exc, OverflowError):
        return "the tool's result contains an integer outside the 64-bit range, which cannot be sent"
    return f"the tool's result cannot be sent: {exc}"


class _Unsendable(TypeError):
    def __init__(self, value: object) -> None:
        super().__init__(f"cannot serialize {type(value).__name__}")
        self.type_name = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True, default=_encode)


def _encode(value: object) -> object:
    """What a value MessagePack has no type for is sent as (docs/commands-and-reactors.md's table,
    "Python values"): ISO 8601 text for dates and times, seconds for a timedelta, a sorted list
    for a set (in iteration order when its items do not sort), the exact text of a Decimal,
    Fraction ("1/3"), UUID or path, an enum member's value, a dataclass instance's fields as a map."""
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            items.sort()
        except TypeError:  # e.g. ints and strs mixed
            pass
        return items
    if isinstance(value, (datetime.date, datetime.time)):  # (a datetime is a date)
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (decimal.Decimal, fractions.Fraction, uuid.UUID, pathlib.PurePath)):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, int):  # msgpack's pure-Python packer asks about ints it cannot carry
        raise OverflowError("integer out of range")
    raise _Unsendable(value)


def _error(kind: str, message: str, trace: str) -> bytes:
    return _pack({"error": message[:TRACEBACK_CAP], "kind": kind, "traceback": trace})


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


def _traceback(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # the driver's own frames are noise to the tool's author
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    omitted = max(0, len(frames) - TRACEBACK_FRAMES)  # formatting each frame costs fuel
    start = frames[omitted] if frames else None
    text = "".join(traceback.format_exception(type(exc), exc, start))
    if omitted:
        text = f"[{omitted} outer frames omitted]\n" + text
    if len(text) > TRACEBACK_CAP:
        text = text[: TRACEBACK_CAP // 2] + "\n[...]\n" + text[-TRACEBACK_CAP // 2 :]
    return text


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a full output cap must not turn into a trap
            pass


# Whether this instance's `random` state has been drawn from WASI's randomness. The snapshot's
# state is the one drawn at build time, the same in every instance, so the module's functions draw a
# fresh one when first used (`_draw_random_state_when_first_used`): a call that uses no random
# number does not pay for the Mersenne Twister's set-up (bench/README.md, "Python: fresh calls").
_random_drawn = False


def _draw_random_state_when_first_used() -> None:
    """Make every function of `random` that reads or advances `random._inst`'s state draw a
    fresh state first, once per instance; `seed(x)` and `setstate` count as that draw, and
    `seed()` (draw a fresh state) leaves it to the first use, which is what the caller asked for.
    componentize-py's runtime calls `random.seed()` at an instance's first call, so that call
    costs nothing either. The first draw rebinds the module's names to the instance's own
    methods, so later uses cost nothing extra. Run at build time, after every import: a
    snapshot module holding one of those methods under another name gets the wrapper too, and
    the build fails if anything else still holds the instance (it would read the build's
    state in every instance)."""
    state = random._inst  # noqa: SLF001 - the module's own instance, behind its functions
    methods = {
        name: value
        for name, value in vars(random).items()
        if getattr(value, "__self__", None) is state and not name.startswith("_")
    }
    sets_state = ("seed", "setstate")

    def rebind() -> None:
        global _random_drawn
        _random_drawn = True
        for name, method in methods.items():
            setattr(random, name, method)

    def lazy(name: str, method: collections.abc.Callable) -> collections.abc.Callable:
        if name in sets_state:

            def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                if name == "seed" and not args and not kwargs and not _random_drawn:
                    return None  # "draw a fresh state": done when first used, as for any call
                result = method(*args, **kwargs)
                if not _random_drawn:
                    rebind()
                return result
        else:

            def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                if not _random_drawn:
                    state.seed()
                    rebind()
                return method(*args, **kwargs)

        functools.update_wrapper(call, method)
        return call

    wrappers = {name: lazy(name, method) for name, method in methods.items()}
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        for key, value in list(namespace.items()) if isinstance(namespace, dict) else ():
            if getattr(value, "__self__", None) is state:
                namespace[key] = wrappers[value.__name__]
    known = [vars(random), *methods.values()]
    for holder in gc.get_referrers(state):
        if not isinstance(holder, types.CellType) and not any(holder is k for k in known):
            raise RuntimeError(f"random._inst is held where no wrapper reaches: {holder!r:.200}")


def _warm_up() -> None:
    """Run once at build time, so what these paths import lazily is in the snapshot too."""
    try:
        raise ValueError("warm-up")
    except ValueError as exc:
        _traceback(exc)
        _describe(exc)
    main = sys.modules["__main__"]
    _fits(functools.partial(_warm_up), {"x": 1})  # inspect.signature, too
    for warm in ("import json\njson.loads(json.dumps({'a': [1, 2.5, None]}))", "sum(range(3))"):
        _run_code(warm, _fresh_module("__main__"), "<code>")
    source = "def main(x):\n    return x\n"
    code = _compile_tool(source, "warm_up.py")
    _signature(source, "main")
    _run_tool({"code": code, "source": source, "filename": "warm_up.py", "entry": "main", "args": {"x": 1}})
    marshal.loads(memoryview(marshal.dumps({"mode": "code"}))[0:])  # as `_serve` decodes a request
    _reply({"a": [1, -200, 2.5, None, True, "x" * 40, (70000,)]}, True)
    msgpack.unpackb(_pack({"ok": {1, 2}, "b": b"x", "d": datetime.date(2024, 1, 1)}), raw=False)
    linecache.cache.clear()
    sys.modules["__main__"] = main  # no call meets the warm-up's modules
    sys.modules.pop("__wasmbox_tool__", None)


_warm_up()
_draw_random_state_when_first_used()
if _random_drawn:  # the snapshot must not hold a drawn state: every instance would share it
    raise RuntimeError("the driver's set-up drew random's state before the snapshot")
# Everything the snapshot holds goes to the collector's permanent generation: a call's
# collections then never walk (nor touch the pages of) the ~18,000 objects of the imports.
gc.freeze()
