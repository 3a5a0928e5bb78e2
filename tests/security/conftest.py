"""Fixtures of the hostile-guest suite: a host tree with a secret outside the grant, and a
guard that checks the host is untouched after a hostile call.

Every case gets its own Sandbox (`guarded.box`). `guarded.assert_untouched()` then checks
that the files outside the grant are exactly as they were, that the Sandbox still serves a
normal core call and a normal Python call, that no thread was added, and that once the
Sandbox is closed the process holds exactly the descriptors and threads it held before the
Sandbox existed (so nothing the hostile call opened or started outlives it).

With `--under-load`, two more threads make valid calls on the case's Sandbox from before the
case starts until `assert_untouched` (or the case's end): core calls, one of them through a
host function, and a Python tool's and snippets', each result checked, so that races between
hostile and honest calls are tried in every case.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._inputs import InputUnavailable
from wasmbox._wasmtime import output as _output

from ..conftest import BUILD, WAT

SECRET = "wasmbox-hostile-suite-secret-7f3a"  # never appears in any guest's code or argv
SECURITY_WAT = WAT / "security"
HOSTILE_CMD = BUILD / "hostile_cmd.wasm"
HOSTILE_CORE = BUILD / "hostile_core.wasm"
# Limits for hostile cases: fuel stops them. The deadline is only a backstop, far beyond what
# any case needs on a loaded machine; the cases about the deadline set a short one of their own.
QUICK = {"fuel": 20_000_000, "timeout": "60s"}


def named(table: Sequence[tuple[Any, ...]]) -> list[Any]:
    """`pytest.param`s of a case table whose rows start with the case's id."""
    return [pytest.param(*row[1:], id=row[0]) for row in table]


def security_wat(name: str) -> str:
    return str(SECURITY_WAT / f"{name}.wat")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_targets() -> list[str]:
    """What each open descriptor of this process refers to (for failure messages)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(f"{fd}: {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass
    return targets


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` (links not followed): its kind and content digest or target."""
    tree: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                tree[key] = "link:" + os.readlink(path)
            elif path.is_dir():
                tree[key] = "dir"
            else:
                info = path.stat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                tree[key] = f"file:{digest}:{info.st_mode:o}:{info.st_mtime_ns}"
    return tree


def leaks_secret(result: wasmbox.CallResult) -> bool:
    return SECRET in json.dumps(result.model_dump(mode="json"), default=str)


Check = Callable[[int], tuple[wasmbox.CallResult, Any]]  # call n: the result, and its right value


class Load:
    """Valid calls on two threads (core; Python and JavaScript) until `stop`, every result
    checked (JavaScript where its runtime can be had: its pinned wheel needs the registry once)."""

    def __init__(self, box: wasmbox.Sandbox, folder: Path) -> None:
        @box.host_function("load.twice")
        def twice(n: int) -> int:
            return 2 * n

        forward = folder / "load_forward.wat"  # forward.wat, calling load.twice
        forward.write_text((WAT / "forward.wat").read_text().replace('"host.fn"', '"load.twice"'))
        source = folder / "load_tool.py"
        source.write_text("import wasmbox_guest\n\ndef main(n: int):\n"
                          "    return [n, wasmbox_guest.call_host('load.twice', n=n)]\n")  # fmt: skip
        # fuel decides these, never a loaded machine's speed (nor `end_once_cut`'s 30 s)
        limits = {"timeout": "300s"}
        echo = box.load({"name": "load_echo", "module": str(WAT / "echo.wat"), "limits": limits})
        fwd = box.load({"name": "load_forward", "module": str(forward), "host_functions": ["load.twice"],
                        "limits": limits})  # fmt: skip
        tool = box.load({"name": "load_py", "runtime": "python", "source": str(source),
                         "host_functions": ["load.twice"], "limits": limits})  # fmt: skip
        snippet = {"name": "load_snippet", "runtime": "python", "limits": limits}
        core: list[Check] = [
            lambda n: (echo.call({"n": n, "s": "x" * (n % 97)}), {"n": n, "s": "x" * (n % 97)}),
            lambda n: (fwd.call({"n": n}), 2 * n),
        ]
        python: list[Check] = [
            lambda n: (tool.call({"n": n}), [n, 2 * n]),
            lambda n: (box.run_python(f"print({n})\n{n} * 3", snippet), 3 * n),
        ]
        try:
            box.prepare_javascript()
        except InputUnavailable:
            pass
        else:
            js = {
                "name": "load_js",
                "runtime": "javascript",
                "host_functions": ["load.twice"],
                "limits": limits,
            }
            python.append(
                lambda n: (
                    box.run_javascript(f"console.log({n}); wasmbox.callHost('load.twice', {{n: {n}}})", js),
                    2 * n,
                )
            )
        self.calls = [0, 0]
        self.wrong: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i, checks), name=f"hostile-load-{what}", daemon=True)
            for i, (what, checks) in enumerate([("core", core), ("python", python)])
        ]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int, checks: list[Check]) -> None:
        n = 0
        while not self._stop.is_set():
            check = checks[n % len(checks)]
            try:
                result, expected = check(n)
                if not result.ok or result.value != expected:
                    self.wrong.append(f"call {n}: expected {expected!r}, got {result!r}")
            except Exception as exc:  # noqa: BLE001 - a valid call must never raise: report it
                self.wrong.append(f"call {n}: raised {exc!r}")
            n += 1
            self.calls[index] += 1
        checks.clear()  # hold nothing of the Sandbox once stopped

    def stop(self) -> None:
        """Once each thread has finished a call (so each overlapped the case), stop them;
        fail if any valid call went wrong."""
        if not self._threads:
            return
        stop = time.monotonic() + 60  # (only so that a broken run cannot hang)
        while not all(self.calls) and time.monotonic() < stop and not self.wrong:
            time.sleep(0.001)
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
        assert not self.wrong, (
            f"{len(self.wrong)} valid calls went wrong under the hostile case: {self.wrong[:3]}"
        )
        assert all(self.calls), f"the load made no call in time: {self.calls}"


@dataclass
class Guarded:
    """One hostile case's world: a Sandbox, a granted dir, and a secret beside it."""

    box: wasmbox.Sandbox
    root: Path  # the whole tree
    granted: Path  # root/granted: what cases preopen at /data
    outside: Path  # root/outside: never granted; holds secret.txt
    secret: Path
    fds_before: int
    fd_targets_before: list[str]
    threads_before: int
    threads_open: int  # with this Sandbox warmed up
    load: Load | None = None  # with --under-load

    def preopen(self, writable: bool = False) -> list[dict[str, Any]]:
        return [{"host": str(self.granted), "guest": "/data", "writable": writable}]

    def command(self, *argv: str, writable: bool = False, **fields: Any) -> wasmbox.CallResult:
        """Run hostile_cmd (a WASI command) with `argv`, /data granted."""
        manifest = {"name": "hostile_cmd", "module": str(HOSTILE_CMD), "limits": QUICK,
                    "preopens": self.preopen(writable), **fields}  # fmt: skip
        return self.box.load(manifest, replace=True).call(argv=list(argv))

    def core(self, *op: str, writable: bool = False, **fields: Any) -> wasmbox.CallResult:
        """Run hostile_core (an ABI v1 reactor) on `op`, /data granted."""
        manifest = {"name": "hostile_core", "module": str(HOSTILE_CORE), "limits": QUICK,
                    "preopens": self.preopen(writable), **fields}  # fmt: skip
        return self.box.load(manifest, replace=True).call({"op": list(op)})

    def python(self, code: str, writable: bool = False, **fields: Any) -> wasmbox.CallResult:
        """Run `code` with run_python, /data granted."""
        grants = {"name": "hostile_py", "runtime": "python", "limits": QUICK,
                  "preopens": self.preopen(writable), **fields}  # fmt: skip
        return self.box.run_python(code, grants)

    def end_once_cut(
        self, call: Callable[[], wasmbox.CallResult], timeout_s: float = 30.0
    ) -> wasmbox.CallResult:
        """Run `call`, a guest that floods its output and then goes on forever under a deadline
        of `timeout_s`, on a thread; once some output is cut at its cap, move the engine's
        clock past that deadline. So it is cut and then ends as `timeout`, however slow the
        machine (a short deadline could pass before the output reached the cap)."""
        outcome: list[wasmbox.CallResult] = []
        thread = threading.Thread(target=lambda: outcome.append(call()), name="hostile-flood")
        thread.start()
        stop = time.monotonic() + 60  # (only so that a broken run cannot hang)
        try:
            while thread.is_alive() and not any(o.truncated for o in list(_output._live._items.values())):
                assert time.monotonic() < stop, "the output was never cut"
                time.sleep(0.002)
        finally:
            for _ in range(self.box._ticker.ticks(timeout_s) + 1):
                self.box.engine.increment_epoch()
            thread.join()
        return outcome[0]

    def assert_untouched(self, *, granted_too: bool = True) -> None:
        """The host after a hostile call: outside files unchanged, the Sandbox serving, no
        thread added; closed, it leaves the descriptors and threads as they were before it."""
        if self.load is not None:
            self.load.stop()
        assert snapshot(self.outside) == self._outside, "a file outside the grant changed"
        assert self.secret.read_text() == SECRET
        assert sorted(os.listdir(self.root)) == ["granted", "outside"], (
            "something was created beside the grant"
        )
        if granted_too:
            assert snapshot(self.granted) == self._granted, "the read-only grant changed"
        echo = self.box.load({"name": "echo_after", "module": str(WAT / "echo.wat")}, replace=True)
        assert echo.call({"still": "serving"}).unwrap() == {"still": "serving"}
        del echo
        assert self.box.run_python("6 * 7").value == 42
        assert threading.active_count() <= self.threads_open, threading.enumerate()
        self.box.close()
        del self.box  # the last reference: its engine and compiled runtime go with it
        gc.collect()
        assert threading.active_count() <= self.threads_before, threading.enumerate()
        assert open_fds() <= self.fds_before, set(fd_targets()) - set(self.fd_targets_before)

    def _record(self) -> None:
        self._outside = snapshot(self.outside)
        self._granted = snapshot(self.granted)


@pytest.fixture(scope="session")
def hostile_guests(built_examples: Path, cache_dir: Path) -> Path:
    """The C guests built, and the Python runtime in the session cache (built once)."""
    with wasmbox.Sandbox(cache_dir=cache_dir) as sandbox:
        sandbox.prepare_python()
        sandbox.run_python("1")
    return built_examples


def host_tree(root: Path) -> tuple[Path, Path, Path]:
    """(granted, outside, secret) made under `root`, as `guarded` describes them."""
    granted, outside = root / "granted", root / "outside"
    (granted / "sub").mkdir(parents=True)
    outside.mkdir()
    (granted / "inside.txt").write_text("inside\n")
    secret = outside / "secret.txt"
    secret.write_text(SECRET)
    os.symlink(secret, granted / "abs_link")
    os.symlink("../outside/secret.txt", granted / "rel_link")
    os.symlink(outside, granted / "dir_link")
    return granted, outside, secret


@pytest.fixture
def sandbox_options() -> dict[str, Any]:
    """Keyword arguments of each case's Sandbox besides its cache (a module may override this)."""
    return {}


@pytest.fixture
def guarded(
    hostile_guests: Path,
    cache_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    sandbox_options: dict[str, Any],
) -> Iterator[Guarded]:
    """A fresh Sandbox beside a host tree:

    granted/inside.txt, granted/sub/, granted/abs_link -> outside/secret.txt,
    granted/rel_link -> ../outside/secret.txt, granted/dir_link -> outside/
    outside/secret.txt (SECRET)
    """
    root = tmp_path / "host"
    granted, outside, secret = host_tree(root)
    gc.collect()
    fds_before, targets_before, threads_before = open_fds(), fd_targets(), threading.active_count()
    box = wasmbox.Sandbox(cache_dir=cache_dir, **sandbox_options)
    box.load({"name": "warm", "module": str(WAT / "echo.wat")}).call({})
    box.run_python("1")  # starts the housekeeping thread and makes a spare
    guard = Guarded(box, root, granted, outside, secret, fds_before, targets_before, threads_before,
                    threading.active_count())  # fmt: skip
    guard._record()
    if request.config.getoption("--under-load"):
        guard.load = Load(box, tmp_path)  # (outside `root`: the case's tree stays as it was)
    del box
    try:
        yield guard
    finally:
        if guard.load is not None:
            guard.load.stop()
        if hasattr(guard, "box"):
            guard.box.close()
