"""Host secrets through env/argv, the network, state left for the next call (in memory or in a
writable grant), and a tampered or truncated compile-cache entry (compiled module or Python
bytecode)."""

from __future__ import annotations

import hashlib
import socket
import threading
import uuid
from pathlib import Path

import pytest

import wasmbox

from ..conftest import wat
from .conftest import SECRET, Guarded, leaks_secret, named


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WASMBOX_SUITE_TOKEN", SECRET)


@pytest.mark.parametrize("kind", ["command", "core", "python"])
@pytest.mark.parametrize("probe", ["env", "argv"])
def test_host_env_and_argv_are_invisible(guarded: Guarded, secret_env: None, kind: str, probe: str) -> None:
    if kind == "python":
        code = "import os, sys\ndict(os.environ)" if probe == "env" else "import sys\nsys.argv"
        result = guarded.python(code, env={"TZ": "UTC"})
        assert result.value == ({"TZ": "UTC"} if probe == "env" else ["hostile_py"])
    else:
        run = guarded.command if kind == "command" else guarded.core
        result = run("env" if probe == "env" else "wasiargs", env={"TZ": "UTC"})
        expected = {
            "env": "TZ=UTC\n",
            "argv": "hostile_cmd\nwasiargs\n" if kind == "command" else "hostile_core\n",
        }
        assert result.stdout == expected[probe]
    assert not leaks_secret(result)
    guarded.assert_untouched()


class Listener:
    """A local TCP server that records any connection made to it in 0.3 s."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.3)
        self.port = self.server.getsockname()[1]
        self.accepted: list[object] = []
        self._thread = threading.Thread(target=_accept, args=(self.server, self.accepted))
        self._thread.start()

    def stop(self) -> list[object]:
        """The connections it accepted."""
        self._thread.join()
        self.server.close()
        return self.accepted


def _accept(server: socket.socket, accepted: list[object]) -> None:
    try:
        accepted.append(server.accept())
    except OSError:
        pass


PY_NETWORK = [
    ("connect", "s = socket.socket()\ns.connect(('127.0.0.1', PORT))", "PermissionError"),
    ("create-connection", "socket.create_connection(('127.0.0.1', PORT), timeout=1)", "gaierror"),
    ("dns", "socket.getaddrinfo('example.com', 80)", "gaierror"),
    ("gethostbyname", "socket.gethostbyname('localhost')", "gaierror"),
    ("udp", "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('127.0.0.1', PORT))",
     "PermissionError"),
    ("bind-listen", "s = socket.socket()\ns.bind(('0.0.0.0', 0))\ns.listen()", "PermissionError"),
]  # fmt: skip


@pytest.mark.parametrize(("code", "exception"), named(PY_NETWORK))
def test_python_has_no_network(guarded: Guarded, code: str, exception: str) -> None:
    listener = Listener()
    code = code.replace("PORT", str(listener.port))
    result = guarded.python(f"import socket\ntry:\n    {code.replace(chr(10), chr(10) + '    ')}\n    r = 'reached'\n"
                            "except OSError as e:\n    r = type(e).__name__\nr")  # fmt: skip
    assert result.value == exception, result
    assert listener.stop() == []
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", ["command", "core"])
@pytest.mark.parametrize("op", [("accept", "3"), ("accept", "0"), ("recv", "3"), ("send", "1", "x"), ("shutdown", "3")],
                         ids=["accept-preopen", "accept-stdin", "recv", "send-stdout", "shutdown"])  # fmt: skip
def test_core_guests_have_no_sockets(guarded: Guarded, kind: str, op: tuple[str, ...]) -> None:
    run = guarded.command if kind == "command" else guarded.core
    result = run(*op)
    assert result.stdout == "error: Not a socket\n"
    guarded.assert_untouched()


@pytest.mark.parametrize("kind", ["core", "python"])
def test_memory_state_does_not_reach_the_next_call(guarded: Guarded, kind: str) -> None:
    if kind == "core":
        tool = guarded.box.load({"name": "state", "module": wat("state")})
        assert [tool.call({}).unwrap() for _ in range(20)] == [0] * 20
        del tool
    else:
        for _ in range(5):
            assert guarded.python("import builtins\nhasattr(builtins, 'LEFT')").value is False
            assert guarded.python(f"import builtins\nbuiltins.LEFT = {SECRET!r}").ok
    guarded.assert_untouched()


def test_writable_grant_is_the_only_state_the_next_call_sees(guarded: Guarded) -> None:
    """A writable grant persists by design; what a guest leaves there cannot widen the next
    call's reach (a symlink a Python guest planted stays unfollowable, a file stays inside)."""
    planted = guarded.python("import os\nos.symlink('../outside/secret.txt', '/data/trap')", writable=True)
    assert planted.ok, planted.error
    assert guarded.command("write", "/data/note.txt", "left", writable=True).value == {"exit_code": 0}
    after = guarded.command("read", "/data/trap", writable=True)
    assert after.stdout == "error: Operation not permitted\n"
    assert guarded.command("read", "/data/note.txt", writable=True).stdout == "left"
    guarded.assert_untouched(granted_too=False)


@pytest.mark.parametrize("damage", ["truncate", "flip-code", "swap-in-other-module", "empty"])
def test_tampered_cache_entry_is_rebuilt_never_executed(tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        box.load({"name": "echo", "module": wat("echo")})
        box.load({"name": "trap", "module": wat("trap")})
    echo_entry = next(p for p in cache.glob("module-*.cwasm") if _is_echo(p))
    trap_entry = next(p for p in cache.glob("module-*.cwasm") if p != echo_entry)
    data = echo_entry.read_bytes()
    tampered = {
        "truncate": data[: len(data) // 3],
        "flip-code": data[:-64] + bytes(b ^ 0xFF for b in data[-64:]),
        "swap-in-other-module": trap_entry.read_bytes(),  # valid compiled code, the wrong one
        "empty": b"",
    }[damage]
    echo_entry.write_bytes(tampered)
    with wasmbox.Sandbox(cache_dir=cache) as box:
        tool = box.load({"name": "echo", "module": wat("echo")})
        assert box.cache_stats.hits == 0 and box.cache_stats.compiles == 1
        assert tool.call({"still": "echo"}).unwrap() == {"still": "echo"}  # not the trap
    assert hashlib.sha256(echo_entry.read_bytes()).hexdigest() in echo_entry.with_suffix(".json").read_text()


def test_a_cache_folder_swapped_after_the_sandbox_is_made_is_never_used(tmp_path: Path) -> None:
    """Another folder renamed into the cache's place after the Sandbox checked it, holding
    another module's compiled code under this module's key with matching metadata: the
    Sandbox keeps to the folder it opened, so the next load runs the module it was given."""
    import json
    import os

    cache, moved, forged = tmp_path / "cache", tmp_path / "cache-moved", tmp_path / "forged"
    with wasmbox.Sandbox(cache_dir=forged) as other:  # the forger's entries: echo's key, trap's code
        other.load({"name": "echo", "module": wat("echo")})
        other.load({"name": "trap", "module": wat("trap")})
    echo_entry = next(p for p in forged.glob("module-*.cwasm") if _is_echo(p))
    trap_entry = next(p for p in forged.glob("module-*.cwasm") if p != echo_entry)
    code = trap_entry.read_bytes()
    record = json.loads(echo_entry.with_suffix(".json").read_text())
    record.update(size=len(code), digest=wasmbox._cache.artifact_digest(code))
    echo_entry.write_bytes(code)
    echo_entry.with_suffix(".json").write_text(json.dumps(record))
    with wasmbox.Sandbox(cache_dir=cache) as box:
        os.rename(cache, moved)  # the swap, after the Sandbox's check
        os.rename(forged, cache)
        tool = box.load({"name": "echo", "module": wat("echo")})
        assert tool.call({"still": "echo"}).unwrap() == {"still": "echo"}  # not the trap
        assert box.cache_stats.hits == 0 and box.cache_stats.compiles == 1
    assert any(_is_echo(p) for p in moved.glob("module-*.cwasm"))  # stored where it was opened
    assert echo_entry.name in os.listdir(cache) and cache.joinpath(echo_entry.name).read_bytes() == code


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o757], ids=oct)
def test_a_cache_whose_parent_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    """A folder on the cache's way that others can write (not sticky) would let them rename the
    runtimes and package sets built under it, which are used by path: such a cache is refused,
    naming the folder and the fix; a sticky one (as /tmp) is fine."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with pytest.raises(wasmbox.WasmboxError, match=r"the folder .*shared on its way is writable by others"):
        wasmbox.Sandbox(cache_dir=shared / "deeper" / "wasmbox")
    shared.chmod(mode | 0o1000)
    with wasmbox.Sandbox(cache_dir=shared / "deeper" / "wasmbox") as box:
        assert box.load({"name": "echo", "module": wat("echo")}).call({"a": 1}).unwrap() == {"a": 1}


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap-in-other-tool", "empty"])
def test_tampered_python_bytecode_entry_is_rebuilt_never_run(
    cache_dir: Path, tmp_path: Path, damage: str
) -> None:
    """A Python tool's cached bytecode is checked like compiled modules: a damaged entry, or
    another tool's valid one, is compiled again from the source, never run."""
    marker = uuid.uuid4().hex  # this test's own entries, in the session's cache
    honest, other = tmp_path / "honest.py", tmp_path / "other.py"
    honest.write_text(f"def main():\n    return 'honest {marker}'\n")
    other.write_text(f"def main():\n    return 'other {marker}'\n")

    def entries() -> set[Path]:
        return set(cache_dir.glob("bytecode-*.bin"))

    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        known = entries()
        box.load({"name": "honest", "runtime": "python", "source": str(honest)})
        (honest_entry,) = entries() - known
        box.load({"name": "other", "runtime": "python", "source": str(other)})
        (other_entry,) = entries() - known - {honest_entry}
    data = honest_entry.read_bytes()
    honest_entry.write_bytes({
        "truncate": data[: len(data) // 2],
        "flip": data[:-8] + bytes(b ^ 0xFF for b in data[-8:]),
        "swap-in-other-tool": other_entry.read_bytes(),  # valid bytecode, the wrong tool's
        "empty": b"",
    }[damage])  # fmt: skip
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        tool = box.load({"name": "honest", "runtime": "python", "source": str(honest)})
        assert (box.cache_stats.rejected, box.cache_stats.compiles) == (1, 1)
        assert tool.call({}).unwrap() == f"honest {marker}"
    assert honest_entry.read_bytes() == data  # rebuilt


def _is_echo(entry: Path) -> bool:
    import json

    wasm = bytes(wasmbox._inspect.read_wasm(Path(wat("echo"))))
    return (
        json.loads(entry.with_suffix(".json").read_text())["wasm_sha256"] == hashlib.sha256(wasm).hexdigest()
    )
