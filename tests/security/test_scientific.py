"""Hostile snippets in the scientific runtime: the guarantees of the suite (no environment, no
network, files only through grants) hold for it too. Slow (see tests/test_scientific.py)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import SECRET, Guarded

pytestmark = pytest.mark.slow


def run(
    box: wasmbox.Sandbox,
    guard: Guarded,
    code: str,
    writable: bool = False,
    **fields: Any,
) -> wasmbox.CallResult:
    grants = {
        "name": "hostile_sci", "runtime": "python", "python": "scientific",
        "limits": {"fuel": 5_000_000_000, "memory": "512MiB", "timeout": 20, "output": "1MiB"},
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


def test_no_network(scientific_box: wasmbox.Sandbox, guarded: Guarded, listener: Listener) -> None:
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
