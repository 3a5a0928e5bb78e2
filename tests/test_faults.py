"""Faults around a call, not in the guest: a cancelled `acall`, KeyboardInterrupt, a cache
directory that cannot be written, a failed runtime build. Each is a clear, typed error (or
exception the caller raised itself), and the Sandbox keeps serving afterwards.

These reach into two internals to observe leaks that no public figure shows: the number of
calls in flight (`Sandbox._ticker._calls`) and the names of the Sandbox's threads.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import WasmboxError
from wasmbox._backends.python import build as python_build

from .conftest import manifest

LONG_SPIN = {"limits": {"fuel": 10**15, "timeout": "2s"}}
SHORT_PY = {"name": "short", "runtime": "python", "limits": {"fuel": 10**15, "timeout": "150ms"}}


def in_flight(box: wasmbox.Sandbox) -> int:
    return box._ticker._calls


def wait_until(condition: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    """Poll for `condition`; the limit only stops a broken run from hanging (not a timing test)."""
    stop = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < stop, f"still waiting for: {what}"
        time.sleep(0.01)


def sandbox_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("wasmbox"))


def assert_serving(box: wasmbox.Sandbox, python: bool = False) -> None:
    """The Sandbox answers new calls correctly, and nothing is left in flight."""
    echo = box.tools.get("echo") or box.load(manifest("echo"))
    assert echo.call({"still": "serving"}).unwrap() == {"still": "serving"}
    if python:
        assert box.run_python("6 * 7").unwrap() == 42
    wait_until(lambda: in_flight(box) == 0, "calls in flight to end")


# -- cancelling an acall ------------------------------------------------------------------


def test_cancelled_acall_returns_at_once_and_the_call_ends_at_its_deadline(box: wasmbox.Sandbox) -> None:
    box.load(manifest("spin", **LONG_SPIN))
    box.load(manifest("echo"))

    async def scenario() -> None:
        task = asyncio.ensure_future(box.acall("spin", {}))
        while in_flight(box) == 0:  # the guest is running on a worker thread
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The caller got CancelledError while the guest still runs: it was not held until the
        # call ended. The guest is bounded by its own deadline (2 s) and its thread is reused.
        assert in_flight(box) == 1
        assert (await box.acall("echo", {"n": 1})).unwrap() == {"n": 1}

    asyncio.run(scenario())
    assert_serving(box)


def test_many_cancelled_acalls_leak_no_threads_or_calls(box: wasmbox.Sandbox) -> None:
    box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "150ms"}))
    box.load(manifest("echo"))
    threads_before = threading.active_count()

    async def scenario() -> None:
        for round_ in range(3):
            tasks = [asyncio.ensure_future(box.acall("spin", {})) for _ in range(8)]
            tasks += [asyncio.ensure_future(box.arun_python("while True: pass", SHORT_PY)) for _ in range(2)]
            await asyncio.sleep(0.02 * round_)  # cancel queued, starting and running calls
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert all(isinstance(r, (asyncio.CancelledError, wasmbox.CallResult)) for r in results)
            echoed = await asyncio.gather(*(box.acall("echo", {"i": i}) for i in range(4)))
            assert [r.unwrap() for r in echoed] == [{"i": i} for i in range(4)]

    asyncio.run(scenario())
    assert_serving(box, python=True)
    # the executor's workers (one per core) and the runtime's housekeeper, nothing per call
    assert threading.active_count() <= threads_before + (os.cpu_count() or 2) + 1


# -- KeyboardInterrupt --------------------------------------------------------------------


def test_keyboard_interrupt_in_a_python_guests_host_call_reaches_the_caller(box: wasmbox.Sandbox) -> None:
    @box.host_function("host.interrupt")
    def interrupt() -> None:
        raise KeyboardInterrupt

    grants = {"name": "interrupting", "runtime": "python", "host_functions": ["host.interrupt"]}
    code = "import wasmbox_guest\nwasmbox_guest.call_host('host.interrupt')\nwhile True: pass"
    for _ in range(5):
        with pytest.raises(KeyboardInterrupt):
            box.run_python(code, grants)
    assert_serving(box, python=True)


def _sigint_after(delay_s: float) -> threading.Timer:
    """A timer (start it inside the `try`) that sends SIGINT to this process."""
    return threading.Timer(delay_s, os.kill, (os.getpid(), signal.SIGINT))


@pytest.fixture
def default_sigint() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt), whatever the test runner installed."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are delivered to the main thread")
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("default_sigint")
@pytest.mark.parametrize("runtime", ["core", "python"])
def test_sigint_while_a_guest_spins(box: wasmbox.Sandbox, runtime: str) -> None:
    """Python runs signal handlers between bytecodes, and the guest runs inside one C call, so
    KeyboardInterrupt is raised when the guest stops: at the latest, at its deadline."""
    spin = box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "300ms"}))
    grants = {"name": "spin_py", "runtime": "python", "limits": {"fuel": 10**15, "timeout": "300ms"}}
    box.prepare_python()
    for _ in range(3):
        timer = _sigint_after(0.05)
        try:
            with pytest.raises(KeyboardInterrupt):
                timer.start()
                if runtime == "core":
                    spin.call({})
                else:
                    box.run_python("while True: pass", grants)
                time.sleep(5)  # (the signal lands here if it was late; never reached otherwise)
        finally:
            timer.join()
    assert_serving(box, python=True)


@pytest.mark.usefixtures("default_sigint")
def test_sigint_while_a_core_guest_sleeps_reaches_the_caller(box: wasmbox.Sandbox) -> None:
    """The interrupt lands in our poll_oneoff (Python code inside a host callback): it must come
    out of `call`, not be parked in wasmtime-py's global last-exception slot."""
    import wasmtime._func

    nap = box.load(manifest("sleep", limits={"timeout": "1s"}))
    timer = _sigint_after(0.1)
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            nap.call({})
            time.sleep(5)  # (the signal lands here if it was late; never reached otherwise)
    finally:
        timer.join()
    assert getattr(wasmtime._func, "LAST_EXCEPTION", None) is None
    assert_serving(box, python=False)


@pytest.mark.usefixtures("default_sigint")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (see the loop)
def test_sigint_at_random_moments_leaves_nothing_behind(box: wasmbox.Sandbox) -> None:
    """Interrupts landing anywhere in the host's code around a call (not only in the guest).

    An interrupt raised right after `Store.close()` freed the store in C, before wasmtime-py
    forgot the pointer, would let the garbage collector free it again (`_call.close_store`)."""
    echo = box.load(manifest("echo"))
    trap = box.load(manifest("trap"))
    box.prepare_python()
    rng = random.Random(5)
    fds_before = len(os.listdir("/proc/self/fd"))
    interrupted = 0
    for i in range(90):
        timer = _sigint_after(rng.uniform(0, 0.004))
        try:
            timer.start()
            # calls until the signal lands in one of them; bounded, because Python drops a
            # KeyboardInterrupt that lands in a destructor (e.g. of an earlier test's garbage)
            for _ in range(5000):
                if i % 3 == 0:
                    echo.call({"i": i})
                elif i % 3 == 1:
                    trap.call({})
                else:
                    box.run_python("sum(range(10))")
        except KeyboardInterrupt:
            interrupted += 1
        finally:
            timer.join()
    assert interrupted >= 60
    assert_serving(box, python=True)
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 4  # (spares and queued closes move it)


# -- the compile cache --------------------------------------------------------------------


def test_cache_dir_that_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(WasmboxError, match="cache directory .*a-file/wasmbox cannot be created"):
        wasmbox.Sandbox(cache_dir=blocker / "wasmbox")


def _fail_cache_writes(monkeypatch: pytest.MonkeyPatch, error: int) -> None:
    """Cache writes fail at the OS boundary: ENOSPC for real (the temporary file's descriptor is
    /dev/full, so the kernel refuses the write), EACCES/EROFS as the kernel reports them when
    the file cannot be created (root ignores permission bits, so chmod cannot show it here).
    Only the cache's own temporary files (made relative to its descriptor) are affected."""
    real_open = os.open

    def failing_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if dir_fd is None or not flags & os.O_EXCL or not str(path).startswith(".tmp-"):
            return real_open(path, flags, mode, dir_fd=dir_fd)
        if error != errno.ENOSPC:
            raise OSError(error, os.strerror(error), path)
        os.close(real_open(path, flags, mode, dir_fd=dir_fd))  # made, so its removal is real too
        return real_open("/dev/full", os.O_WRONLY)

    monkeypatch.setattr(os, "open", failing_open)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EACCES, errno.EROFS], ids=errno.errorcode.get)
def test_unwritable_or_full_cache_dir_still_loads_and_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        _fail_cache_writes(monkeypatch, error)
        with pytest.warns(RuntimeWarning, match=f"cannot write to the compile cache .*{os.strerror(error)}"):
            echo = box.load(manifest("echo"))
        assert echo.call({"a": 1}).unwrap() == {"a": 1}
        assert box.cache_stats.write_failures == 1 and box.cache_stats.compiles == 1
        monkeypatch.undo()  # space again: the next module is cached as usual
        box.load(manifest("trap"))
        assert box.cache_stats.write_failures == 1
        assert_serving(box)
    assert not [p for p in os.listdir(cache) if p.startswith(".tmp-")]  # no partial files left
    assert len(list(cache.glob("*.cwasm"))) == 1  # trap's; echo's was never half-written


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_cache_dir_still_loads_and_serves(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o500)
    try:
        with wasmbox.Sandbox(cache_dir=cache) as box:
            with pytest.warns(RuntimeWarning, match="cannot write to the compile cache"):
                box.load(manifest("echo"))
            assert_serving(box)
    finally:
        cache.chmod(0o700)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EACCES])
def test_python_runtime_cannot_be_built_in_a_full_or_unwritable_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int
) -> None:
    def failing_mkdtemp(*args: Any, **kwargs: Any) -> str:
        raise OSError(error, os.strerror(error), kwargs.get("dir"))

    with wasmbox.Sandbox(cache_dir=tmp_path / "cache") as box:
        monkeypatch.setattr(python_build.tempfile, "mkdtemp", failing_mkdtemp)
        for _ in range(2):  # not remembered as broken: each use tries again, and says why
            with pytest.raises(
                python_build.RuntimeBuildError,
                match=f"cannot build the Python runtime in .*{os.strerror(error)}",
            ):
                box.run_python("1")
        assert_serving(box)


# -- a failed runtime build ---------------------------------------------------------------


FAILING_COMPONENTIZE_PY = """#!/bin/sh
echo 'Traceback (most recent call last):' >&2
echo '  File "/0/wasmbox_driver.py", line 251' >&2
echo 'SyntaxError: invalid syntax' >&2
exit 1
"""
SILENT_COMPONENTIZE_PY = "#!/bin/sh\nexit 0\n"  # "succeeds" and writes nothing


@pytest.mark.parametrize(
    ("script", "words"),
    [(FAILING_COMPONENTIZE_PY, "componentize-py failed:.*SyntaxError: invalid syntax"),
     (SILENT_COMPONENTIZE_PY, "componentize-py failed"),
     (None, "cannot build the Python runtime.*Permission denied")],
    ids=["exits-1", "writes-nothing", "not-executable"],
)  # fmt: skip
def test_componentize_py_failure_is_a_runtime_build_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str | None, words: str
) -> None:
    """The real failure this mimics (a syntax error in the guest driver) takes ~10 s to reach,
    so the build command is replaced by a script that fails the same way."""
    command = tmp_path / "componentize-py"
    command.write_text(script or "not a program")
    command.chmod(0o755 if script else 0o644)
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        core = box.load(manifest("echo"))
        monkeypatch.setattr(python_build, "_componentize_py", lambda: str(command))
        source = tmp_path / "tool.py"
        source.write_text("def main():\n    return 1\n")
        with pytest.raises(python_build.RuntimeBuildError, match=f"(?s){words}"):
            box.load({"name": "py_tool", "runtime": "python", "source": str(source)})
        with pytest.raises(WasmboxError, match=f"(?s){words}"):  # again: not cached as broken
            box.run_python("1")
        assert core.call({"after": "failure"}).unwrap() == {"after": "failure"}
        assert "py_tool" not in box.tools
        assert_serving(box)
    assert not list(cache.glob(".build-*"))  # the staging directory is cleaned up
    assert not list(cache.glob("python-runtime-*"))  # and nothing half-built is published


def test_base_exception_in_host_function_stays_on_its_thread(box: wasmbox.Sandbox) -> None:
    @box.host_function("host.fn")
    def interrupt(**_: object) -> int:
        raise KeyboardInterrupt

    forward = box.load(manifest("forward", host_functions=["host.fn"]))
    trap = box.load(manifest("trap"))
    kinds: list[str] = []
    stop = threading.Event()

    def other_thread() -> None:
        while not stop.is_set():
            result = trap.call({})  # must never raise someone else's KeyboardInterrupt
            kinds.append(result.error.kind.value if result.error else "ok")

    thread = threading.Thread(target=other_thread)
    thread.start()
    try:
        for _ in range(50):
            with pytest.raises(KeyboardInterrupt):
                forward.call({})
    finally:
        stop.set()
        thread.join()
    assert kinds and set(kinds) == {"trap"}
