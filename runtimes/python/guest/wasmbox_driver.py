"""The guest driver of wasmbox's CPython runtime (runs inside the sandbox).

componentize-py imports this module at build time and snapshots the interpreter, so every
import below is already done when a call starts. Each call is a fresh instance of that
snapshot: nothing here survives from one call to the next.

Request (MessagePack map):
    {"mode": "compile", "source": str, "filename": str}   -> {"ok": bytes}, the tool compiled
    {"mode": "tool", "compiled": bytes, "filename": str, "entry": str, "args": map}
    {"mode": "code", "code": str}
Response (MessagePack map):
    {"ok": value}
    {"error": message, "kind": "guest_error" | "invalid_arguments" | "memory_limit"
                               | "bad_response", "traceback": str}

A tool is compiled once, when the host loads it, by a "compile" request to an instance that
runs nothing else; its calls then send those bytes (zlib-compressed marshal of the code object
and the source), so a call skips compiling, which costs ~1 ms in a fresh interpreter.

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
import dataclasses  # noqa: F401
import datetime  # noqa: F401
import decimal  # noqa: F401
import difflib  # noqa: F401
import enum  # noqa: F401
import fractions  # noqa: F401
import functools  # noqa: F401
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
import os  # noqa: F401
import pathlib  # noqa: F401
import pprint  # noqa: F401
import random
import re  # noqa: F401
import secrets  # noqa: F401
import socket  # noqa: F401  (imports, but every connection is refused: no network grant)
import sqlite3  # noqa: F401
import statistics  # noqa: F401
import string  # noqa: F401
import struct  # noqa: F401
import subprocess  # noqa: F401  (imports, but cannot start a process under WASI)
import sys
import textwrap  # noqa: F401
import threading  # noqa: F401  (imports, but cannot start a thread under WASI)
import time  # noqa: F401
import tomllib  # noqa: F401
import traceback
import typing  # noqa: F401
import unicodedata  # noqa: F401
import urllib.parse  # noqa: F401
import uuid  # noqa: F401
import zlib

import msgpack  # the pure-Python fallback, bundled by the build
import wasmbox_guest  # noqa: F401  (so tools import it from the snapshot)
import wit_world

TRACEBACK_CAP = 8192
TRACEBACK_FRAMES = 30  # the innermost ones; a RecursionError has a thousand

# componentize-py gives sys.stdout a TextIOWrapper straight over the raw fd, which drops the
# rest of a write when WASI accepts only part of it (it takes 8 KiB at a time). A buffered
# writer retries short writes; the driver flushes at the end of every call.
sys.stdout = io.TextIOWrapper(
    io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding="utf-8", errors="backslashreplace"
)
sys.stderr = io.TextIOWrapper(
    io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8", errors="backslashreplace"
)


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
            return _error("guest_error", _describe(exc), _traceback(exc))
        finally:
            _flush()


def _raised_here(exc: BaseException) -> bool:
    """Whether the driver raised `exc` (guest code can import this module and raise its
    exceptions, but must not choose the error kind)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename == __file__


def _serve(request: bytes) -> tuple[object, bool]:
    """The value the request produced, and whether it must be sendable as is (a tool's)."""
    random.seed()  # the snapshot's seed was fixed at build time; each call gets a fresh one
    try:
        message = msgpack.unpackb(request, raw=False)
    except Exception as exc:
        raise _Refusal("bad_response", f"driver: bad request: {exc}") from None
    mode = message.get("mode")
    if mode == "tool":
        return _run_tool(message)
    if mode == "code":
        return _run_code(message["code"])
    if mode == "compile":
        return _compile_tool(message["source"], message["filename"]), True
    raise _Refusal("bad_response", f"driver: unknown mode {mode!r}")


def _compile_tool(source: str, filename: str) -> bytes:
    """A tool's source compiled, with the source for tracebacks, as its calls take it."""
    return zlib.compress(marshal.dumps((compile(source, filename, "exec"), source)))


def _run_tool(message: dict) -> tuple[object, bool]:
    namespace = {"__name__": "__wasmbox_tool__", "__builtins__": builtins}
    code, source = marshal.loads(zlib.decompress(message["compiled"]))
    _remember_source(message["filename"], source)
    exec(code, namespace)
    entry = namespace.get(message["entry"])
    if not callable(entry):
        raise _Refusal("guest_error", f"tool source defines no function {message['entry']!r}")
    args = message["args"]
    try:
        return entry(**args), True
    except TypeError as exc:
        misfit = _misfit(entry, args, exc)
        if misfit is None:
            raise
    raise _Refusal("invalid_arguments", misfit)


def _misfit(entry: object, args: dict, exc: TypeError) -> str | None:
    """Why `args` do not fit `entry`, if that is what `exc` (raised by calling it) means. The
    call is tried first because `inspect.signature` costs ~0.1 ms in a fresh interpreter."""
    trace = exc.__traceback__
    if trace is not None and trace.tb_next is None:  # the call itself: no frame of the tool ran
        return str(exc)
    try:  # raised inside: a decorator's wrapper may have refused what the tool would
        inspect.signature(entry).bind(**args)
    except TypeError as misfit:
        return f"{getattr(entry, '__name__', 'entry')}(): {misfit}"
    except ValueError:  # no signature to check against
        pass
    return None


def _run_code(source: str) -> tuple[object, bool]:
    _remember_source("<code>", source)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:  # a lone expression compiles straight from source, without Python-level AST objects
        expression = compile(source, "<code>", "eval")
    except SyntaxError:
        pass
    else:
        return eval(expression, namespace), False
    tree = ast.parse(source, "<code>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, "<code>", "exec"), namespace)
    if last is None:
        return None, False
    return eval(compile(last, "<code>", "eval"), namespace), False


def _remember_source(filename: str, source: str) -> None:
    """Let tracebacks show the guest's source lines (there is no file to read them from)."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def _reply(value: object, strict: bool) -> bytes:
    """The ok response, encoded once. A value MessagePack cannot carry is an error for a
    tool (`strict`); a snippet's becomes its repr."""
    try:
        return _pack({"ok": value})
    except (TypeError, ValueError, OverflowError):
        if strict:
            raise _Refusal(
                "guest_error", f"the tool returned a {type(value).__name__}, which cannot be sent"
            ) from None
        return _pack({"ok": repr(value)})


def _pack(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True, default=_encode)


def _encode(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"cannot serialize {type(value).__name__}")


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


def _warm_up() -> None:
    """Run once at build time, so what these paths import lazily is in the snapshot too."""
    try:
        raise ValueError("warm-up")
    except ValueError as exc:
        _traceback(exc)
        _describe(exc)
    inspect.signature(_warm_up).bind()
    _run_code("import json\njson.loads(json.dumps({'a': [1, 2.5, None]}))")
    _run_code("sum(range(3))")
    compiled = _compile_tool("def main(x):\n    return x\n", "warm_up.py")
    _run_tool({"compiled": compiled, "filename": "warm_up.py", "entry": "main", "args": {"x": 1}})
    msgpack.unpackb(_pack({"ok": {1, 2}, "b": b"x"}), raw=False)
    linecache.cache.clear()


_warm_up()
