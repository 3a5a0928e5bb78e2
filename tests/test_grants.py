"""Grants: a preopen is the directory its manifest resolved, opened as exactly that directory at
each call (a swap for a symlink or another directory is refused, never followed), and held in a
process-wide registry, so no writable grant contains another grant, holds a symlink another grant
was given through, or a folder on the path to a tool's own files; the host root, /proc and /sys
cannot be granted."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import wasmtime

import wasmbox
from wasmbox import ErrorKind
from wasmbox._wasmtime.output import Output

from .conftest import manifest


def test_writable_preopen_may_not_contain_another_grant(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    nested = [
        {"host": str(tmp_path), "guest": "/outer", "writable": True},
        {"host": str(tmp_path / "inner"), "guest": "/inner"},
    ]
    with pytest.raises(wasmbox.ManifestError, match="contains another granted directory"):
        box.load(manifest("echo", preopens=nested))
    # ...nor another tool's grant, whichever is loaded first
    box.load(manifest("echo", preopens=nested[1:]))
    with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
        box.load(manifest("state", preopens=nested[:1]))
    # a read-only parent is fine: nothing can be swapped through it
    box.load(manifest("trap", preopens=[{**nested[0], "writable": False}]))


def test_host_root_cannot_be_granted_by_a_manifest(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.ManifestError, match="root directory"):
        box.load(manifest("echo", preopens=[{"host": "/", "guest": "/"}]))


def test_preopen_swapped_for_a_symlink_after_load_is_refused(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "a.txt").write_text("fine")
    tool = box.load(
        {"name": "probe", "module": str(built_examples / "fsprobe.wasm"),
         "preopens": [{"host": str(granted), "guest": "/data"}]}
    )  # fmt: skip
    assert tool.call(argv=["read", "/data/a.txt"]).stdout == "fine"
    granted.rename(tmp_path / "moved")
    os.symlink("/etc", granted)
    result = tool.call(argv=["read", "/data/hostname"])
    assert result.error is not None and result.error.kind is ErrorKind.CAPABILITY_DENIED
    assert result.stdout == ""


def _nested_grants(tmp_path: Path) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """A writable folder D and a read-only grant of D/inner, as preopen lists."""
    outer, inner = tmp_path / "D", tmp_path / "D" / "inner"
    inner.mkdir(parents=True)
    return ([{"host": str(outer), "guest": "/d", "writable": True}],
            [{"host": str(inner), "guest": "/inner"}])  # fmt: skip


def test_concurrent_loads_of_nested_grants_cannot_both_succeed(
    box: wasmbox.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check and the hold of a load's grants are one step: while a load of a writable D
    compiles (held here until the other load is over), a load of D/inner is refused, and
    loading stays concurrent (nothing waits for the compile)."""
    writable, inner = _nested_grants(tmp_path)
    compiling, resume = threading.Event(), threading.Event()
    compile_module = box._cache.module

    def slow_compile(*args: object) -> object:
        compiling.set()
        assert resume.wait(30)
        return compile_module(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(box._cache, "module", slow_compile)
    outcomes: list[object] = []

    def load_outer() -> None:
        try:
            outcomes.append(box.load(manifest("echo", name="outer", preopens=writable)))
        except wasmbox.WasmboxError as exc:
            outcomes.append(exc)

    thread = threading.Thread(target=load_outer)
    thread.start()
    try:
        assert compiling.wait(30)
        monkeypatch.setattr(box._cache, "module", compile_module)
        with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
            box.load(manifest("echo", name="inner", preopens=inner))
    finally:
        resume.set()
        thread.join(30)
    assert isinstance(outcomes[0], wasmbox.Tool)
    assert set(box.tools) == {"outer"}


def test_a_failed_load_gives_its_grants_back(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    writable, inner = _nested_grants(tmp_path)
    with pytest.raises(wasmbox.ManifestError):  # the grants are held, then the module is bad
        box.load({"name": "garbage", "module": __file__, "preopens": writable})
    box.load(manifest("echo", preopens=inner))
    # replace=True swaps a tool's grants for the new ones, checked against all the others
    box.load(manifest("echo", preopens=writable), replace=True)
    with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
        box.load(manifest("trap", preopens=inner))


def test_grants_of_two_sandboxes_may_not_nest(cache_dir: Path, tmp_path: Path) -> None:
    """Grants are held process-wide: another live Sandbox's writable D keeps D/inner out,
    until that Sandbox is closed or collected."""
    writable, inner = _nested_grants(tmp_path)
    with wasmbox.Sandbox(cache_dir=cache_dir) as first, wasmbox.Sandbox(cache_dir=cache_dir) as second:
        first.load(manifest("echo", preopens=writable))
        with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
            second.load(manifest("echo", preopens=inner))
        with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
            second.run_python("1", {"name": "g", "runtime": "python", "preopens": inner})
        first.close()
        second.load(manifest("echo", preopens=inner))
    dropped = wasmbox.Sandbox(cache_dir=cache_dir)
    dropped.run_python("1", {"name": "g", "runtime": "python", "preopens": writable})
    with wasmbox.Sandbox(cache_dir=cache_dir) as third:
        with pytest.raises(wasmbox.CapabilityError, match="contains another granted directory"):
            third.load(manifest("echo", preopens=inner))
        del dropped
        gc.collect()
        third.load(manifest("echo", preopens=inner))


# Run in another process (so at full speed, not taking turns with the calls for the GIL):
# swap the directory argv[1] with a symlink to argv[2] and back, atomically (RENAME_EXCHANGE,
# or two renames where the file system has no exchange), until the file argv[3] exists.
_SWAPPER = """
import ctypes, os, sys, time
inner, outside, stop = sys.argv[1:4]
def dwell():  # a few tens of µs in each state: about as long as a check takes
    started = time.perf_counter()
    while time.perf_counter() - started < 30e-6:
        pass
link = inner + ".link"
os.symlink(outside, link)
libc = ctypes.CDLL(None, use_errno=True)
def exchange():
    return libc.renameat2(-100, inner.encode(), -100, link.encode(), 2) == 0  # AT_FDCWD, RENAME_EXCHANGE
atomic = exchange() and exchange()
print("swapping", flush=True)
swaps = 0
while not os.path.exists(stop):
    if atomic:
        exchange()
        dwell()
        exchange()
    else:
        os.rename(inner, inner + ".parked")
        os.rename(link, inner)
        dwell()
        os.rename(inner, link)
        os.rename(inner + ".parked", inner)
    dwell()
    swaps += 1
print(swaps, flush=True)
"""


@contextlib.contextmanager
def _swapping(inner: Path, outside: Path) -> Iterator[None]:
    """While in the block, another process swaps `inner` for a symlink to `outside` and back."""
    stop = inner.with_name("stop")
    swapper = subprocess.Popen([sys.executable, "-c", _SWAPPER, str(inner), str(outside), str(stop)],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert swapper.stdout is not None and swapper.stdout.readline() == "swapping\n"
        yield
    finally:
        stop.touch()
        swapper.wait(30)
    assert swapper.returncode == 0 and inner.is_dir() and not inner.is_symlink()


@pytest.mark.parametrize("kind", ["command", "python"])
def test_inner_grant_swapped_for_a_symlink_during_calls_is_never_followed(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path, kind: str
) -> None:
    """The race of a grant swapped for a symlink, tried for real: while another process swaps
    a granted directory for a symlink to a secret folder and back, calls of the tool granted it
    run over and over. Each one reads its grant's file or is refused; none ever reads the
    secret. (Bounded by a count and a time, whichever comes first; how many calls fit in the
    time does not matter.)"""
    inner, outside = tmp_path / "D" / "inner", tmp_path / "outside"
    inner.mkdir(parents=True)
    outside.mkdir()
    (inner / "f.txt").write_text("public")
    (outside / "f.txt").write_text("SECRET")
    grant = [{"host": str(inner), "guest": "/data"}]
    if kind == "command":
        tool = box.load({"name": "probe", "module": str(built_examples / "fsprobe.wasm"), "preopens": grant})
        calls, read = 20_000, lambda: tool.call(argv=["read", "/data/f.txt"])
    else:
        grants = wasmbox.Manifest.load({"name": "g", "runtime": "python", "preopens": grant})
        calls, read = 3_000, lambda: box.run_python("open('/data/f.txt').read()", grants)
    assert read().ok
    seen: dict[str, int] = {}
    with _swapping(inner, outside):
        deadline = time.monotonic() + 3
        for _ in range(calls):
            result = read()
            text = result.stdout if kind == "command" else str(result.value)
            outcome = (
                "public"
                if result.ok and text == "public"
                else result.error.kind.value
                if result.error
                else text
            )
            seen[outcome] = seen.get(outcome, 0) + 1
            if time.monotonic() > deadline:
                break
    assert set(seen) <= {"public", "capability_denied"}, seen


@pytest.mark.parametrize("kind", ["command", "python"])
def test_preopen_replaced_by_another_directory_after_load_is_refused(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path, kind: str
) -> None:
    """A grant is the directory its manifest resolved, not whatever has its path later: a
    real directory renamed into its place is refused too (a spare instance made before the
    swap included)."""
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "a.txt").write_text("fine")
    grant = [{"host": str(granted), "guest": "/data"}]
    if kind == "command":
        tool = box.load({"name": "probe", "module": str(built_examples / "fsprobe.wasm"), "preopens": grant})
        read = lambda: tool.call(argv=["read", "/data/a.txt"])
    else:
        grants = wasmbox.Manifest.load({"name": "g", "runtime": "python", "preopens": grant})
        read = lambda: box.run_python("open('/data/a.txt').read()", grants)
    assert read().ok
    granted.rename(tmp_path / "moved")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "a.txt").write_text("other")
    (tmp_path / "other").rename(granted)
    for _ in range(2):
        result = read()
        assert result.error is not None and result.error.kind is ErrorKind.CAPABILITY_DENIED, result
        assert "other" not in result.stdout


def test_a_symlink_planted_in_a_writable_grant_cannot_redirect_a_later_grant(
    box: wasmbox.Sandbox, cache_dir: Path, tmp_path: Path
) -> None:
    """A guest plants w/shared -> ../secret; a later grant given as w/shared is
    refused (a real w/shared would have been too), in this Sandbox or another; and a grant
    given through a symlink keeps a writable grant of the folder holding it out."""
    w, secret = tmp_path / "w", tmp_path / "secret"
    w.mkdir()
    secret.mkdir()
    writer = {
        "name": "writer",
        "runtime": "python",
        "preopens": [{"host": str(w), "guest": "/w", "writable": True}],
    }
    assert box.run_python("import os\nos.symlink('../secret', '/w/shared')", writer).ok
    assert os.readlink(w / "shared") == "../secret"
    later = [{"host": str(w / "shared"), "guest": "/s"}]
    with pytest.raises(wasmbox.CapabilityError, match="given through a symlink"):
        box.load(manifest("echo", preopens=later))
    with pytest.raises(wasmbox.CapabilityError, match="given through a symlink"):
        box.run_python("1", {"name": "reader", "runtime": "python", "preopens": later})
    with (
        wasmbox.Sandbox(cache_dir=cache_dir) as other,
        pytest.raises(wasmbox.CapabilityError, match="symlink"),
    ):
        other.load(manifest("echo", preopens=later))
    box.close()
    with wasmbox.Sandbox(cache_dir=cache_dir) as fresh:  # the other order: the link's grant first
        fresh.load(manifest("echo", preopens=later))
        with pytest.raises(wasmbox.CapabilityError, match="given through a symlink"):
            fresh.run_python("1", writer)
    with pytest.raises(wasmbox.ManifestError, match="given through a symlink"):  # in one manifest
        wasmbox.Manifest.load(manifest("echo", preopens=[*writer["preopens"], *later]))


@pytest.mark.parametrize("host", ["/proc", "/proc/self", "/proc/self/fd", "/sys", "/sys/kernel"])
def test_proc_and_sys_cannot_be_granted_unless_allowed(cache_dir: Path, host: str) -> None:
    """A guest granted /proc, even read-only, could read the host's environment from
    /proc/self/environ: such grants are refused unless the Sandbox opts in."""
    grants = {"name": "g", "runtime": "python", "preopens": [{"host": host, "guest": "/p"}]}
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        with pytest.raises(wasmbox.CapabilityError, match="allow_system_grants"):
            box.load(manifest("echo", preopens=grants["preopens"]))
        with pytest.raises(wasmbox.CapabilityError, match="allow_system_grants"):
            box.run_python("1", grants)
    with wasmbox.Sandbox(cache_dir=cache_dir, allow_system_grants=True) as box:
        box.load(manifest("echo", preopens=grants["preopens"]))
        assert box.run_python("1", grants).ok


def test_a_folder_on_procs_file_system_is_refused_by_any_path(
    box: wasmbox.Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc and /sys are told by their file system as well as by path (a bind mount of /proc
    elsewhere is procfs all the same): here tmp_path's file system stands in for procfs."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setattr(wasmbox._sandbox, "_SYSTEM_FOLDERS", (tmp_path / "proc",))
    with pytest.raises(wasmbox.CapabilityError, match="allow_system_grants"):
        box.load(manifest("echo", preopens=[{"host": str(tmp_path / "elsewhere"), "guest": "/p"}]))


def test_no_writable_grant_holds_the_path_to_a_tools_own_files(
    box: wasmbox.Sandbox, cache_dir: Path, tmp_path: Path
) -> None:
    """A tool's module and source are read by path when it is loaded: a guest able to write
    a folder on that path (its own tool's, or any live Sandbox's) could swap them, or plant a
    symlink that `load` would follow."""
    tools, data = tmp_path / "tools", tmp_path / "tools" / "data"
    data.mkdir(parents=True)
    (tools / "echo.wat").write_text(Path(manifest("echo")["module"]).read_text())
    (tmp_path / "link").symlink_to("tools")  # the module given through a symlink in tmp_path
    echo = {"name": "echo", "module": str(tmp_path / "link" / "echo.wat")}
    for holder in (tools, tmp_path):
        with pytest.raises(wasmbox.CapabilityError, match="tool's file"):
            box.load({**echo, "preopens": [{"host": str(holder), "guest": "/w", "writable": True}]})
    box.load(echo)  # loaded, its files' path keeps later writable grants out
    with pytest.raises(wasmbox.CapabilityError, match="tool's file"):
        box.run_python("1", {"name": "g", "runtime": "python",
                             "preopens": [{"host": str(tmp_path), "guest": "/w", "writable": True}]})  # fmt: skip
    with (
        wasmbox.Sandbox(cache_dir=cache_dir) as other,
        pytest.raises(wasmbox.CapabilityError, match="tool's file"),
    ):
        other.load(manifest("spam", preopens=[{"host": str(tools), "guest": "/w", "writable": True}]))
    box.load(
        {**echo, "preopens": [{"host": str(data), "guest": "/w", "writable": True}]}, replace=True
    )  # beside: fine


def test_wasmtime_opens_a_preopen_when_the_config_is_built(built_examples: Path, tmp_path: Path) -> None:
    """What the per-call open relies on: Wasmtime opens a preopen's directory in
    `wasi_config_preopen_dir` (the config is built, the descriptor handed over is closed), so
    a directory swapped in before the instance runs is never what the guest sees."""
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "a.txt").write_text("checked")
    grants = wasmbox.Manifest.load({"name": "probe", "module": str(built_examples / "fsprobe.wasm"),
                                    "preopens": [{"host": str(granted), "guest": "/data"}]})  # fmt: skip
    stdout, stderr = Output(4096), Output(4096)
    wasi = wasmbox._call.build_wasi(
        grants, wasmbox._call.CallInput({}, argv=("read", "/data/a.txt")), stdout, stderr
    )
    granted.rename(tmp_path / "moved")
    granted.mkdir()
    (granted / "a.txt").write_text("swapped in")
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    store.set_wasi(wasi)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    instance = linker.instantiate(
        store, wasmtime.Module.from_file(engine, str(built_examples / "fsprobe.wasm"))
    )
    start = instance.exports(store)["_start"]
    assert isinstance(start, wasmtime.Func)
    with contextlib.suppress(wasmtime.ExitTrap):
        start(store)
    stdout.detach()
    stderr.detach()
    assert stdout.text() == "checked", stderr.text()


def test_a_sandbox_released_while_the_grant_lock_is_held_never_waits() -> None:
    """A Sandbox's finalizer (`release_owner`) runs when the garbage collector does, which can
    be inside `reserve` on the same thread, with the registry's lock held: it must not wait for
    that lock (a deadlock), and the owner's grants are dropped by the next reservation."""
    from wasmbox._capabilities import grants

    owner, other = grants.new_owner(), grants.new_owner()
    token = grants.reserve(owner, ())
    done = threading.Event()

    def finalizer_inside_reserve() -> None:
        with grants._lock:  # as `reserve` holds it when the collector runs there
            grants.release_owner(owner)
        done.set()

    thread = threading.Thread(target=finalizer_inside_reserve, daemon=True)
    thread.start()
    assert done.wait(30), "release_owner waited for a lock its own thread holds"
    assert token in grants._held  # (not yet: the lock was held)
    grants.release(grants.reserve(other, ()))  # the next holder of the lock drops it first
    assert token not in grants._held
