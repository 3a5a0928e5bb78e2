"""Hostile snippets in the scientific runtime: the guarantees of the suite (no environment, no
network, files only through grants, the caps, no state between calls, a rewritten driver moving
no host verdict) hold for it too. Slow (see tests/test_scientific.py). Not here, as they do not
apply: host functions (the runtime serves none: a manifest granting one is refused), and
sessions (it has none)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import SECRET, Guarded, leaks_secret, named

pytestmark = pytest.mark.slow
LIMITS = {"fuel": 5_000_000_000, "memory": "512MiB", "timeout": 20, "output": "1MiB"}


def run(
    box: wasmbox.Sandbox,
    guard: Guarded,
    code: str,
    writable: bool = False,
    **fields: Any,
) -> wasmbox.CallResult:
    grants = {
        "name": "hostile_sci", "runtime": "python", "python": "scientific", "limits": LIMITS,
        "preopens": guard.preopen(writable), **fields,
    }  # fmt: skip
    return box.run_python(code, grants)


def test_no_environment(
    scientific_box: wasmbox.Sandbox, guarded: Guarded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WASMBOX_HOST_SECRET", SECRET)
    bare = run(scientific_box, guarded, "import os\ndict(os.environ)")
    assert bare.ok, bare.error
    assert bare.value == {}
    given = run(scientific_box, guarded, "import os\ndict(os.environ)", env={"ONLY": "this"})
    assert given.value == {"ONLY": "this"}
    guarded.assert_untouched()


class Listener:
    """A loopback TCP listener that records every connection it accepts, on a thread of its own."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.accepted: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.accepted.append(self.server.accept())
            except OSError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    try:
        yield found
    finally:
        found.stop()


def test_scientific_python_has_no_network(
    scientific_box: wasmbox.Sandbox, guarded: Guarded, listener: Listener
) -> None:
    port = listener.port
    code = f"""
import socket, urllib.request
outcomes = []
for attempt in (
    lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
    lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", {port})),
    lambda: urllib.request.urlopen("http://127.0.0.1:{port}/", timeout=1),
    lambda: socket.getaddrinfo("localhost", {port}),
):
    try:
        attempt()
        outcomes.append("connected")
    except Exception as exc:
        outcomes.append(type(exc).__name__)
outcomes
"""
    result = run(scientific_box, guarded, code)
    assert result.ok, result.error
    assert "connected" not in result.value, result.value
    listener.stop()  # its thread, before the thread count is checked
    assert listener.accepted == []
    guarded.assert_untouched()


def test_files_only_through_grants(scientific_box: wasmbox.Sandbox, guarded: Guarded) -> None:
    code = """
import os
seen = {"inside": open("/data/inside.txt").read()}
try:
    seen["root"] = sorted(os.listdir("/"))
except OSError as exc:
    seen["root"] = [type(exc).__name__]
for path in ("/data/abs_link", "/data/rel_link", "/data/dir_link/secret.txt", "/data/../outside/secret.txt",
             "/etc/passwd", "/proc/self/environ", "/usr/local/lib/../../../etc/hostname"):
    try:
        seen[path] = open(path).read()
    except OSError as exc:
        seen[path] = type(exc).__name__
for path in ("/data/new.txt", "/data/inside.txt", "/usr/local/lib/python315.zip", "/usr/local/lib/planted.py"):
    try:
        open(path, "a").write("x")
        seen[path] = "written"
    except OSError as exc:
        seen[path] = type(exc).__name__
seen
"""
    result = run(scientific_box, guarded, code)
    assert result.ok, result.error
    seen = result.value
    assert seen.pop("inside") == "inside\n"
    assert set(seen.pop("root")) <= {"data", "usr", "FileNotFoundError", "PermissionError"}
    assert all(outcome != "written" and SECRET not in outcome for outcome in seen.values()), seen
    assert SECRET not in result.stdout + result.stderr
    guarded.assert_untouched()


def test_a_writable_grant_takes_no_symlink(scientific_box: wasmbox.Sandbox, guarded: Guarded) -> None:
    code = """
import os
open("/data/made.txt", "w").write("made")
try:
    os.symlink("/data/../outside/secret.txt", "/data/link")
    outcome = "linked"
except OSError as exc:
    outcome = type(exc).__name__
outcome
"""
    result = run(scientific_box, guarded, code, writable=True)
    assert result.ok, result.error
    assert result.value == "PermissionError"
    assert (guarded.granted / "made.txt").read_text() == "made"
    assert not os.path.lexists(guarded.granted / "link")
    (guarded.granted / "made.txt").unlink()
    guarded.assert_untouched(granted_too=False)


def test_scratch_is_the_calls_own(scientific_box: wasmbox.Sandbox, guarded: Guarded) -> None:
    first = run(
        scientific_box,
        guarded,
        "open('/tmp/left.txt', 'w').write('left')\nimport os\nos.listdir('/tmp')",
        scratch="1MiB",
    )
    assert first.value == ["left.txt"]
    second = run(scientific_box, guarded, "import os\nos.listdir('/tmp')", scratch="1MiB")
    assert second.value == []
    over = run(
        scientific_box,
        guarded,
        "open('/tmp/big', 'wb').write(b'x' * 4_000_000)",
        scratch="1MiB",
    )
    assert over.error is not None and over.error.kind is ErrorKind.OUTPUT_LIMIT
    guarded.assert_untouched()


# The exhaustion cases of test_exhaustion that apply (no host functions: the scientific runtime
# has none), with a memory cap its 100 MB snapshot fits in. (id, code, limits, kind, words)
SCIENTIFIC_EXHAUSTION: list[tuple[str, str, dict[str, Any], ErrorKind, str]] = [
    ("while-true-fuel", "while True:\n    pass", {"fuel": 100_000_000}, ErrorKind.OUT_OF_FUEL, "fuel"),
    ("while-true-deadline", "while True:\n    pass", {"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT,
     "deadline"),
    ("bytearray-1GiB", "x = bytearray(1 << 30)", {}, ErrorKind.MEMORY_LIMIT, "memory"),
    ("numpy-800MB", "import numpy\nnumpy.ones(10**8).sum()", {}, ErrorKind.MEMORY_LIMIT, "allocate"),
    ("print-flood", "while True:\n    print('x' * 1000)", {"output": "8KiB"}, ErrorKind.OUTPUT_LIMIT, "stdout"),
    ("huge-result", "'z' * 1_000_000", {"output": "8KiB"}, ErrorKind.OUTPUT_LIMIT, "output cap"),
    ("recursion-limit-raised", "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)",
     {}, ErrorKind.TRAP, "stack"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "limits", "kind", "words"), named(SCIENTIFIC_EXHAUSTION))
def test_scientific_cannot_exhaust_the_host(
    scientific_box: wasmbox.Sandbox, guarded: Guarded, code: str, limits: dict[str, Any], kind: ErrorKind,
    words: str,
) -> None:  # fmt: skip
    result = run(scientific_box, guarded, code, limits={**LIMITS, **limits})
    assert result.error is not None and result.error.kind is kind, result.error
    assert words.lower() in result.error.message.lower(), result.error.message[-500:]
    guarded.assert_untouched()


# What a call leaves in its interpreter and its libraries, for the next call to find.
LEAVE = f"""
import builtins, os, random, sys, numpy, pandas
builtins.LEFT = {SECRET!r}
sys.modules["planted"] = type(sys)("planted")
os.environ["LEFT"] = "behind"
numpy.seterr(all="raise")
pandas.set_option("display.max_rows", 3)
json_dumps = __import__("json").dumps
__import__("json").dumps = lambda *a, **k: '"hijacked"'
[random.random(), float(numpy.random.random())]
"""
LOOK = """
import builtins, json, os, random, sys, numpy, pandas
{"left": hasattr(builtins, "LEFT"), "planted": "planted" in sys.modules, "env": os.environ.get("LEFT"),
 "seterr": numpy.geterr()["divide"], "rows": pandas.get_option("display.max_rows"),
 "dumps": json.dumps([1]), "draws": [random.random(), float(numpy.random.random())]}
"""


def test_scientific_state_does_not_reach_the_next_call(
    scientific_box: wasmbox.Sandbox, guarded: Guarded
) -> None:
    """Globals, modules, the environment, numpy's and pandas' settings, a replaced stdlib
    function and the generators' state of one call are not there for the next."""
    left = run(scientific_box, guarded, LEAVE)
    assert left.error is not None or left.ok  # (its value went through the hijacked dumps, or not)
    seen = [run(scientific_box, guarded, LOOK) for _ in range(2)]
    assert all(s.ok for s in seen), [s.error for s in seen]
    first, second = (s.value for s in seen)
    draws = first.pop("draws"), second.pop("draws")
    assert first == second == {"left": False, "planted": False, "env": None, "seterr": "warn", "rows": 60,
                               "dumps": "[1]"}  # fmt: skip
    assert draws[0] != draws[1]  # each call seeds its generators afresh
    assert not leaks_secret(seen[0]) and not leaks_secret(seen[1])
    guarded.assert_untouched()


# The driver rewritten by the guest, then each of the host's caps passed: the host's verdict.
TAMPER = (
    "import _host, json, sys\n"
    "driver = sys.modules['_wasmbox_scientific']\n"
    "driver._reply = lambda *a, **k: None\n"
    "driver._error = lambda *a, **k: None\n"
    "json.dumps = lambda *a, **k: '{}'\n"
    "_host.call = lambda frame: b'{}'\n"
)
TAMPERED: list[tuple[str, str, dict[str, Any], ErrorKind]] = [
    ("fuel", "while True:\n    pass", {"fuel": 100_000_000}, ErrorKind.OUT_OF_FUEL),
    ("deadline", "while True:\n    pass", {"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT),
    ("output", "print('y' * 100_000)\n1", {"output": "8KiB"}, ErrorKind.OUTPUT_LIMIT),
]
# A claimed kind (SECURITY.md, known gaps: the Python driver's error kinds), never a host verdict.
CLAIMABLE = {
    ErrorKind.GUEST_ERROR,
    ErrorKind.INVALID_ARGUMENTS,
    ErrorKind.MEMORY_LIMIT,
    ErrorKind.BAD_RESPONSE,
}


@pytest.mark.parametrize(("code", "limits", "kind"), named(TAMPERED))
def test_scientific_driver_tampering_keeps_the_hosts_verdicts(
    scientific_box: wasmbox.Sandbox, guarded: Guarded, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    result = run(scientific_box, guarded, TAMPER + code, limits={**LIMITS, **limits})
    assert result.error is not None and result.error.kind is kind, result.error
    assert run(scientific_box, guarded, "6 * 7").value == 42  # the next call's driver is the snapshot's
    guarded.assert_untouched()


def test_scientific_driver_tampering_gets_no_memory_past_the_cap(
    scientific_box: wasmbox.Sandbox, guarded: Guarded
) -> None:
    """Memory filled with the driver rewritten: the cap holds; the kind is the guest's to
    claim (here no reply at all: `bad_response`), as with any rewritten driver."""
    result = run(scientific_box, guarded, TAMPER + "x = []\nwhile True:\n    x.append(bytearray(1 << 20))")
    assert result.error is not None and result.error.kind in CLAIMABLE, result.error
    assert result.peak_memory is not None and result.peak_memory <= 512 * 1024**2
    guarded.assert_untouched()


def test_scientific_forged_reply_claims_no_host_verdict(
    scientific_box: wasmbox.Sandbox, guarded: Guarded
) -> None:
    """A reply frame the guest sends itself, claiming the host's `timeout`, is not a timeout."""
    forged = "{'op': 'reply', 'error': 'forged', 'kind': 'timeout'}"
    result = run(
        scientific_box, guarded, f"import _host, json\n_host.call(json.dumps({forged}).encode())\n'real'"
    )
    assert result.error is None or result.error.kind in CLAIMABLE, result.error
    guarded.assert_untouched()
