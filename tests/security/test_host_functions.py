"""Abusing host functions: type confusion and injection in the arguments, ungranted and
unregistered names, the host-call cap, a host function that raises, blocks past the deadline
or re-enters the Sandbox, and replies the guest cannot take."""

from __future__ import annotations

from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from ..conftest import outlast_the_deadline, wat
from .conftest import QUICK, SECRET, Guarded, leaks_secret, named, security_wat


def register(box: wasmbox.Sandbox, received: list[Any]) -> None:
    @box.host_function("host.fn")  # the name forward.wat imports
    def kv_get(key: str, limit: int = 10) -> dict[str, Any]:
        received.append((key, limit))
        return {"key": key, "limit": limit}

    @box.host_function("secret.get")
    def secret_get() -> str:
        return SECRET


# (id, args the guest sends, the guest-visible outcome)
ARGUMENTS = [
    ("int-for-str", {"key": 5}, "invalid arguments for host.fn"),
    ("list-for-str", {"key": ["a"]}, "invalid arguments for host.fn"),
    ("nosql-operator", {"key": {"$ne": None}}, "invalid arguments for host.fn"),
    ("none-for-str", {"key": None}, "invalid arguments for host.fn"),
    ("float-for-int", {"key": "a", "limit": 1.5}, "invalid arguments for host.fn"),
    ("bytes-not-utf8", {"key": b"\xff\xfe"}, "invalid arguments for host.fn"),
    ("missing", {}, "invalid arguments for host.fn"),
    ("extra-kwarg", {"key": "a", "admin": True}, "invalid arguments for host.fn"),
    ("dunder-kwarg", {"key": "a", "__class__": "x"}, "invalid arguments for host.fn"),
    ("positional-smuggling", {"key": "a", "args": ["x"]}, "invalid arguments for host.fn"),
]


@pytest.mark.parametrize(("args", "words"), named(ARGUMENTS))
def test_bad_host_function_arguments_never_reach_it(
    guarded: Guarded, args: dict[str, Any], words: str
) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    tool = guarded.box.load({"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn"]})
    result = tool.call(args)
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert words in result.error.message
    assert [r.verdict for r in result.host_calls] == ["invalid_arguments"]
    assert received == []
    del tool
    guarded.assert_untouched()


def test_coerced_arguments_arrive_with_the_declared_types(guarded: Guarded) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    tool = guarded.box.load({"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn"]})
    assert tool.call({"key": "a/../../etc", "limit": "7"}).unwrap() == {"key": "a/../../etc", "limit": 7}
    ((key, limit),) = received
    assert type(key) is str and type(limit) is int  # the function sees its own types only
    del tool
    guarded.assert_untouched()


@pytest.mark.parametrize(
    "request_bytes",
    [b"\xc1", b"\x91\x01", b"\x81\x01\x02", b"\xc0", b"\x81\xa3key\xd6\xff\x00\x00\x00\x00"],
    ids=["not-msgpack", "a-list", "int-keys", "nil", "timestamp"],
)
def test_malformed_host_requests_are_bad_requests(guarded: Guarded, request_bytes: bytes) -> None:
    """The raw request bytes, straight from guest memory (result_bytes-style: python guest)."""
    received: list[Any] = []
    register(guarded.box, received)
    code = f"import wit_world\nwit_world.call_host('host.fn', {request_bytes!r})"
    result = guarded.python(code, host_functions=["host.fn"])
    assert result.ok, result.error
    assert [r.verdict for r in result.host_calls] == ["bad_request"]
    assert received == []
    guarded.assert_untouched()


@pytest.mark.parametrize(
    "name",
    [
        "secret.get",
        "nope",
        "host.fn\x00secret.get",
        "../secret.get",
        "host.fn ",
        "HOST.FN",
        "x" * 100_000,
        "",
    ],
    ids=["ungranted", "unregistered", "nul-injection", "path", "trailing-space", "case", "huge", "empty"],
)
def test_python_cannot_call_ungranted_or_unregistered_functions(guarded: Guarded, name: str) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    code = (f"import wasmbox_guest\ntry:\n    wasmbox_guest.call_host({name!r}, key='a')\n    r = 'served'\n"
            "except wasmbox_guest.HostCallError as e:\n    r = str(e)\nr")  # fmt: skip
    result = guarded.python(code, host_functions=["host.fn"], limits={**QUICK, "fuel": 10**9})
    shown = result.host_calls[0].name  # the name, cut short: the message is bounded too
    assert (
        result.value
        == f"host function {shown!r} is not granted to this tool: add it to the manifest's host_functions"
    )
    assert [r.verdict for r in result.host_calls] == ["denied"]
    assert len(result.host_calls[0].name) <= 131  # the guest's megabytes are not echoed
    assert received == [] and not leaks_secret(result)
    guarded.assert_untouched()


def test_core_module_cannot_import_ungranted_or_unregistered_functions(guarded: Guarded) -> None:
    register(guarded.box, [])
    with pytest.raises(wasmbox.CapabilityError, match="not granted"):
        guarded.box.load({"name": "fwd", "module": wat("forward")})  # imports host.fn, grants none
    with pytest.raises(wasmbox.CapabilityError, match="has not registered"):
        guarded.box.load({"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn", "nope.fn"]})
    with pytest.raises(wasmbox.CapabilityError, match="sock_open"):
        guarded.box.load({"name": "sock", "module": security_wat("sock_open")})
    guarded.assert_untouched()


def test_host_call_cap_stops_a_flood(guarded: Guarded) -> None:
    calls: list[int] = []

    @guarded.box.host_function("host.fn")
    def host_fn(**_: Any) -> int:
        calls.append(1)
        return 1

    tool = guarded.box.load({"name": "loop", "module": wat("forward_loop"), "host_functions": ["host.fn"],
                             "limits": {**QUICK, "host_calls": 20}})  # fmt: skip
    result = tool.call({})
    assert result.error is not None and result.error.kind is ErrorKind.HOST_ERROR
    assert [r.verdict for r in result.host_calls] == ["ok"] * 20 + ["limit"] and len(calls) == 20
    del tool
    guarded.assert_untouched()


def test_raising_host_function_keeps_its_secret(guarded: Guarded) -> None:
    @guarded.box.host_function("host.fn")
    def host_fn(**_: Any) -> int:
        raise RuntimeError(f"db password {SECRET}")

    result = guarded.box.load({"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn"]}).call(
        {}
    )
    assert result.error is not None and result.error.kind is ErrorKind.HOST_ERROR
    assert SECRET not in result.error.message + result.stdout + result.stderr
    assert SECRET in (result.host_calls[0].detail or "")  # the host keeps the detail
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", ["core", "python"])
def test_host_function_blocking_past_the_deadline(guarded: Guarded, kind: str) -> None:
    calls: list[int] = []

    @guarded.box.host_function("host.fn")
    def slow(**_: Any) -> int:
        calls.append(1)
        outlast_the_deadline()
        return 1

    limits = {**QUICK, "timeout": "1s"}  # reached by the first call on a busy machine, then outlasted
    if kind == "core":
        tool = guarded.box.load({"name": "thrice", "module": wat("host_thrice"), "host_functions": ["host.fn"],
                                 "limits": limits})  # fmt: skip
        result = tool.call({})
        del tool
    else:
        code = "import wasmbox_guest\nfor _ in range(3):\n    wasmbox_guest.call_host('host.fn')"
        result = guarded.python(code, host_functions=["host.fn"], limits=limits)
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert len(calls) == 1  # none served after the deadline
    guarded.assert_untouched()


# (id, guest, extra limits, kind, words): guests that abuse the way a host reply is delivered
REPLY_ABUSE = [
    # its wasmbox_alloc calls the host again while the host writes a reply
    ("reentrant-alloc", "reentrant_alloc", {"host_calls": 30}, ErrorKind.HOST_ERROR, "host-call limit"),
    ("alloc-returns-a-bad-pointer", "bad_alloc_for_reply", {}, ErrorKind.BAD_RESPONSE, "invalid pointer"),
    ("request-out-of-bounds", "host_request_oob", {}, ErrorKind.BAD_RESPONSE, "request out of bounds"),
]  # fmt: skip


@pytest.mark.parametrize(("guest", "limits", "kind", "words"), named(REPLY_ABUSE))
def test_reply_the_guest_cannot_take(
    guarded: Guarded, guest: str, limits: dict[str, Any], kind: ErrorKind, words: str
) -> None:
    @guarded.box.host_function("host.fn")
    def host_fn(**_: Any) -> int:
        return 1

    tool = guarded.box.load({"name": guest, "module": security_wat(guest), "host_functions": ["host.fn"],
                             "limits": {**QUICK, **limits}})  # fmt: skip
    result = tool.call({})
    assert result.error is not None and result.error.kind is kind, result.error
    assert words in result.error.message
    del tool
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", ["core", "python"])
def test_host_function_reentering_the_sandbox_is_bounded(guarded: Guarded, kind: str) -> None:
    """A host function that calls a tool whose guest calls it again, as deep as the guest
    likes: the nesting stops at wasmbox's limit instead of crashing the process (it aborted
    in a RecursionError inside a ctypes callback at ~60 levels)."""
    depth: list[int] = []

    @guarded.box.host_function("host.fn")
    def delegate(**args: Any) -> Any:
        depth.append(1)
        if kind == "core":
            inner = guarded.box.call("fwd", args)
        else:
            inner = guarded.box.run_python(CODE, GRANTS)
        return inner.error.kind.value if inner.error else inner.value

    CODE = "import wasmbox_guest\nwasmbox_guest.call_host('host.fn')"
    GRANTS = {"name": "py", "runtime": "python", "host_functions": ["host.fn"], "limits": QUICK}
    if kind == "core":
        guarded.box.load(
            {"name": "fwd", "module": wat("forward"), "host_functions": ["host.fn"], "limits": QUICK}
        )
        result = guarded.box.call("fwd", {})
    else:
        result = guarded.box.run_python(CODE, GRANTS)
    assert result.ok and result.value == "host_error", result
    assert len(depth) == wasmbox._call.MAX_NESTED_CALLS
    del delegate
    guarded.assert_untouched()


def test_host_reply_over_the_cap(guarded: Guarded) -> None:
    @guarded.box.host_function("host.fn")
    def host_fn(**_: Any) -> str:
        return "x" * 100_000

    code = "import wasmbox_guest\nwasmbox_guest.call_host('host.fn')"
    result = guarded.python(code, host_functions=["host.fn"], limits={**QUICK, "output": "16KiB"})
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT
    guarded.assert_untouched()
