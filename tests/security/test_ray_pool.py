"""The hostile suite's cases that apply, through `RaySandboxPool` on a real local Ray cluster:
files out of the grant, writes to a read-only grant, the actor's environment, the network,
exhaustion, state left for the next call and host functions not granted, for core and Python
guests (and JavaScript where its runtime can be had). The calls run in the actors' processes,
so each case checks the host tree, that the pool still serves and that no call stays counted
in flight (`Tree.assert_untouched`), rather than this process's descriptors and threads.

Not here: the cases about this process's own resources (descriptors, threads, the engine's
clock) and about the compile cache, which concern a Sandbox, not the pool over it; and the
`--under-load` threads, which load an in-process Sandbox (the pool's concurrency is tried in
tests/test_ray.py). Slow (a cluster and its actors take seconds to start).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind
from wasmbox._inputs import InputUnavailable

from ..test_ray import ACTOR, HOSTS, cluster  # noqa: F401 - the module's cluster fixture
from .conftest import HOSTILE_CORE, QUICK, SECRET, host_tree, leaks_secret, named, snapshot

pytestmark = pytest.mark.slow

# after test_ray has set Ray's node address (read when Ray is imported)
from wasmbox.integrations.ray import RaySandboxPool

TOKEN_ENV = "WASMBOX_SUITE_TOKEN"
POOL_HOSTS = {**HOSTS, "test.environ": "tests.ray_hosts:environ"}


@dataclass
class Tree:
    """The host tree the pool's grants name (as `Guarded`'s): granted/ and outside/secret.txt."""

    root: Path
    granted: Path
    outside: Path
    secret: Path

    def preopen(self, writable: bool = False) -> list[dict[str, Any]]:
        return [{"host": str(self.granted), "guest": "/data", "writable": writable}]

    def record(self) -> None:
        self._outside, self._granted = snapshot(self.outside), snapshot(self.granted)

    def assert_untouched(self, pool: RaySandboxPool) -> None:
        """Outside files and the read-only grant unchanged; the pool serving, nothing in flight."""
        assert snapshot(self.outside) == self._outside, "a file outside the grant changed"
        assert self.secret.read_text() == SECRET
        assert sorted(os.listdir(self.root)) == ["granted", "outside"]
        assert snapshot(self.granted) == self._granted, "the read-only grant changed"
        assert pool.call("echo", {"still": "serving"}).value == {"still": "serving"}
        assert pool.run_python("6 * 7").value == 42
        assert pool.in_flight() == [0, 0]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    root = tmp_path_factory.mktemp("ray-hostile") / "host"
    granted, outside, secret = host_tree(root)
    found = Tree(root, granted, outside, secret)
    found.record()
    return found


@pytest.fixture(scope="module")
def hostile_pool(
    cluster: None,  # noqa: F811 - the fixture imported from test_ray
    hostile_guests: Path,
    cache_dir: Path,
    tree: Tree,
) -> Iterator[RaySandboxPool]:
    """Two actors whose processes hold a secret in their environment, with the hostile core
    guest (/data granted) and echo loaded."""
    from ..conftest import WAT

    manifests = [
        {"name": "hostile_core", "module": str(HOSTILE_CORE), "limits": QUICK, "preopens": tree.preopen(),
         "env": {"TZ": "UTC"}},
        {"name": "echo", "module": str(WAT / "echo.wat")},
    ]  # fmt: skip
    options = {**ACTOR, "runtime_env": {"env_vars": {TOKEN_ENV: SECRET}}}
    with RaySandboxPool(manifests, actors=2, actor_options=options, host_functions=POOL_HOSTS,
                        cache_dir=cache_dir, max_workers=2) as pool:  # fmt: skip
        assert pool.run_python("1").ok  # each actor's Python runtime loaded
        yield pool


@pytest.fixture
def pool(hostile_pool: RaySandboxPool, tree: Tree) -> Iterator[RaySandboxPool]:
    yield hostile_pool
    tree.assert_untouched(hostile_pool)


def python(pool: RaySandboxPool, tree: Tree, code: str, **fields: Any) -> wasmbox.CallResult:
    grants = {
        "name": "hostile_py",
        "runtime": "python",
        "limits": QUICK,
        "preopens": tree.preopen(),
        **fields,
    }
    return pool.run_python(code, grants)


READS_OUT = [
    "/data/../outside/secret.txt",
    "/data/sub/../../outside/secret.txt",
    "/data/abs_link",
    "/data/rel_link",
    "/data/dir_link/secret.txt",
    "HOST_PATH",  # the secret's real host path
    "/etc/passwd",
    "/proc/self/environ",
]


@pytest.mark.parametrize("kind", ["core", "python"])
def test_pool_reads_outside_the_grant_are_refused(pool: RaySandboxPool, tree: Tree, kind: str) -> None:
    paths = [str(tree.secret) if p == "HOST_PATH" else p for p in READS_OUT]
    for path in paths:
        if kind == "core":
            result = pool.call("hostile_core", {"op": ["read", path]})
            assert result.ok and result.value == 1 and result.stdout.startswith("error: "), (path, result)
        else:
            code = (f"try:\n    seen = open({path!r}).read()\nexcept OSError as e:\n"
                    "    seen = type(e).__name__\nseen")  # fmt: skip
            result = python(pool, tree, code)
            assert result.value in ("PermissionError", "FileNotFoundError"), (path, result)
        assert not leaks_secret(result), path
    assert pool.call("hostile_core", {"op": ["read", "/data/inside.txt"]}).stdout == "inside\n"


def test_pool_writes_to_a_read_only_grant_are_refused(pool: RaySandboxPool, tree: Tree) -> None:
    code = """
import os
seen = {}
for name, attempt in [
    ("write", lambda: open("/data/inside.txt", "w").write("x")),
    ("create", lambda: open("/data/new.txt", "w").write("x")),
    ("mkdir", lambda: os.mkdir("/data/made")),
    ("unlink", lambda: os.unlink("/data/inside.txt")),
    ("symlink", lambda: os.symlink("/data/../outside/secret.txt", "/data/link")),
    ("rename", lambda: os.rename("/data/inside.txt", "/data/sub/moved.txt")),
]:
    try:
        attempt()
        seen[name] = "done"
    except OSError as e:
        seen[name] = type(e).__name__
seen
"""
    result = python(pool, tree, code)
    assert result.ok, result.error
    assert "done" not in result.value.values(), result.value


@pytest.mark.parametrize("kind", ["core", "python"])
def test_pool_actors_environment_is_invisible(pool: RaySandboxPool, tree: Tree, kind: str) -> None:
    """The actors' processes hold a secret in their environment; a guest sees only its manifest's."""
    held = {"name": "environ", "runtime": "python", "host_functions": ["test.environ"]}
    probe = f"import wasmbox_guest\nwasmbox_guest.call_host('test.environ', name={TOKEN_ENV!r})"
    assert pool.run_python(probe, held).value == SECRET  # the actor's process has it
    if kind == "core":
        result = pool.call("hostile_core", {"op": ["env"]})
        assert result.stdout == "TZ=UTC\n"
    else:
        result = python(pool, tree, "import os, sys\n[dict(os.environ), sys.argv]", env={"TZ": "UTC"})
        assert result.value == [{"TZ": "UTC"}, ["hostile_py"]]
    assert not leaks_secret(result)


def test_pool_python_has_no_network(pool: RaySandboxPool, tree: Tree) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.3)
    port = server.getsockname()[1]
    code = f"""
import socket
seen = []
for attempt in (lambda: socket.socket().connect(("127.0.0.1", {port})),
                lambda: socket.create_connection(("127.0.0.1", {port}), timeout=1),
                lambda: socket.getaddrinfo("localhost", {port})):
    try:
        attempt()
        seen.append("reached")
    except OSError as e:
        seen.append(type(e).__name__)
seen
"""
    try:
        result = python(pool, tree, code)
        with pytest.raises(OSError):  # (a timeout: nothing connected)
            server.accept()
    finally:
        server.close()
    assert result.ok and "reached" not in result.value, result


# (id, runtime, code, limits, kind)
EXHAUSTION: list[tuple[str, str, str, dict[str, Any], ErrorKind]] = [
    ("python-fuel", "python", "while True:\n    pass", QUICK, ErrorKind.OUT_OF_FUEL),
    ("python-deadline", "python", "while True:\n    pass", {"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT),
    ("python-memory", "python", "x = bytearray(1 << 30)", QUICK, ErrorKind.MEMORY_LIMIT),
    ("python-print-flood", "python", "while True:\n    print('x' * 1000)", {"fuel": 10**9, "output": "8KiB"},
     ErrorKind.OUTPUT_LIMIT),
    ("python-huge-result", "python", "'z' * 1_000_000", {"fuel": 10**9, "output": "8KiB"}, ErrorKind.OUTPUT_LIMIT),
    ("javascript-fuel", "javascript", "for (;;) {}", QUICK, ErrorKind.OUT_OF_FUEL),
    ("javascript-memory", "javascript", "new ArrayBuffer(1e9).byteLength", QUICK, ErrorKind.MEMORY_LIMIT),
]  # fmt: skip


@pytest.mark.parametrize(("runtime", "code", "limits", "kind"), named(EXHAUSTION))
def test_pool_guests_cannot_exhaust_the_host(
    pool: RaySandboxPool, cache_dir: Path, runtime: str, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    grants = {"name": f"hostile_{runtime}", "runtime": runtime, "limits": limits}
    if runtime == "javascript":
        _javascript_or_skip(cache_dir)
        result = pool.run_javascript(code, grants)
    else:
        result = pool.run_python(code, grants)
    assert result.error is not None and result.error.kind is kind, result.error


def _javascript_or_skip(cache_dir: Path) -> None:
    """The JavaScript runtime built in the cache the actors use, or a skip saying why."""
    with wasmbox.Sandbox(cache_dir=cache_dir, progress=None) as box:
        try:
            box.prepare_javascript()
        except InputUnavailable as exc:
            pytest.skip(f"the JavaScript runtime's wheel cannot be fetched: {exc}")


def test_pool_state_does_not_reach_the_next_call(pool: RaySandboxPool, tree: Tree) -> None:
    """What one call leaves in its interpreter is gone for the next, on either actor."""
    for _ in range(6):  # spread over both actors
        assert python(pool, tree, "import builtins\nhasattr(builtins, 'LEFT')").value is False
        assert python(
            pool, tree, f"import builtins, sys\nbuiltins.LEFT = {SECRET!r}\nsys.modules['json'] = None"
        ).ok


def test_pool_host_functions_not_granted_are_refused(pool: RaySandboxPool, tree: Tree) -> None:
    code = (
        "import wasmbox_guest\nseen = []\nfor name in ('kv.get', 'test.nap', 'secret.get'):\n"
        "    try:\n        wasmbox_guest.call_host(name, key='greeting')\n        seen.append('served')\n"
        "    except wasmbox_guest.HostCallError as e:\n        seen.append(str(e))\nseen"
    )
    result = python(pool, tree, code)
    assert result.ok, result.error
    assert all("is not granted to this tool" in seen for seen in result.value), result.value
    assert [r.verdict for r in result.host_calls] == ["denied"] * 3
    refused = python(pool, tree, "import wasmbox_guest\nwasmbox_guest.call_host('kv.get', key='secret/x')",
                     host_functions=["kv.get"])  # fmt: skip
    assert refused.error is not None and refused.error.kind is ErrorKind.CAPABILITY_DENIED, refused.error
    assert "secret keys are not readable" in refused.error.message
