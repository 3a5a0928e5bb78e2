"""Scratch space: a fresh, empty, writable /tmp per call, capped while the call runs, gone after."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._capabilities import scratch as _scratch

from .conftest import BUILD, wat


def probe(**fields: Any) -> dict[str, Any]:
    """The fsprobe WASI command with a 1 MiB scratch space."""
    return {
        "name": "probe", "module": str(BUILD / "fsprobe.wasm"), "scratch": "1MiB",
        "limits": {"memory": "32MiB", "timeout": "2s", "fuel": 10**10}, **fields,
    }  # fmt: skip


def calls_left(box: wasmbox.Sandbox) -> list[str]:
    """The calls' folders left under the Sandbox's scratch root (beside it, the hidden root)."""
    return sorted(set(os.listdir(box._scratch_space.root)) - {box._scratch_space.empty.name})


@pytest.fixture
def tool(box: wasmbox.Sandbox, built_examples: Path) -> wasmbox.Tool:
    return box.load(probe())


def test_each_call_gets_a_fresh_empty_writable_tmp(box: wasmbox.Sandbox, tool: wasmbox.Tool) -> None:
    assert tool.call(argv=["write", "/tmp/note", "left by the first call"]).value == {"exit_code": 0}
    listing = tool.call(argv=["ls", "/tmp"])
    assert listing.value == {"exit_code": 0} and listing.stdout == ""  # the note is gone
    assert tool.call(argv=["read", "/tmp/note"]).stderr == "error: No such file or directory\n"
    assert calls_left(box) == []


def test_without_scratch_tmp_does_not_exist(box: wasmbox.Sandbox, built_examples: Path) -> None:
    fields = probe()
    del fields["scratch"]
    tool = box.load(fields)
    result = tool.call(argv=["write", "/tmp/x", "y"])
    assert result.value == {"exit_code": 1} and "error:" in result.stderr


def test_writing_past_the_cap_stops_the_call_while_it_runs(box: wasmbox.Sandbox, tool: wasmbox.Tool) -> None:
    held: list[int] = []
    remove = _scratch.remove

    def measure_then_remove(path: Path) -> None:
        held.append(_scratch.usage(path, 1 << 40))
        remove(path)

    _scratch.remove = measure_then_remove  # type: ignore[assignment]
    try:
        result = tool.call(argv=["fill", "/tmp/big", str(1 << 30), "4096"])  # 1 GiB, 4 KiB a write
    finally:
        _scratch.remove = remove  # type: ignore[assignment]
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.OUTPUT_LIMIT
    assert "scratch space /tmp exceeded its 1MiB cap" in result.error.message
    assert held and held[0] < 64 * 1024**2  # stopped long before the GiB it asked for
    assert calls_left(box) == []
    assert tool.call(argv=["fill", "/tmp/ok", "500000"]).value == {"exit_code": 0}  # still serving


def test_a_single_write_past_the_cap_is_stopped(box: wasmbox.Sandbox, tool: wasmbox.Tool) -> None:
    result = tool.call(argv=["fill", "/tmp/big", str(8 << 20), str(8 << 20)])  # one 8 MiB write
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.OUTPUT_LIMIT
    assert calls_left(box) == []


def test_many_small_files_count_against_the_cap(box: wasmbox.Sandbox) -> None:
    code = "import os\nfor i in range(100_000):\n    open(f'/tmp/{i}', 'w').close()\n"
    result = box.run_python(code, {"name": "files", "runtime": "python", "scratch": "1MiB",
                                   "limits": {"fuel": 10**11, "timeout": "10s"}})  # fmt: skip
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.OUTPUT_LIMIT


@pytest.mark.parametrize(
    "code, kind",
    [
        ("open('/tmp/a', 'w').write('x')\n1/0", wasmbox.ErrorKind.GUEST_ERROR),
        ("open('/tmp/a', 'w').write('x')\nwhile True: pass", wasmbox.ErrorKind.TIMEOUT),
        ("open('/tmp/a', 'w').write('x')\nwhile True: pass", wasmbox.ErrorKind.OUT_OF_FUEL),
        (
            (
                "import os\np = '/tmp'\nfor i in range(300):\n    p += '/d'\n    os.mkdir(p)\n"
                "os.symlink('../' * 310 + 'python', p + '/out')\nos.symlink('..', '/tmp/up')\n"
                "open(p + '/f', 'w').write('x')"
            ),
            None,
        ),
    ],
    ids=["guest_error", "timeout", "out_of_fuel", "deep-tree-and-symlinks"],
)
def test_nothing_is_left_on_the_host_whatever_the_outcome(
    box: wasmbox.Sandbox, code: str, kind: wasmbox.ErrorKind | None
) -> None:
    # fuel or the deadline decides, never the machine's speed: the other one is far away
    limits = (
        {"timeout": "300ms", "fuel": 10**12}
        if kind is wasmbox.ErrorKind.TIMEOUT
        else {"fuel": 10**8, "timeout": "60s"}
    )
    grants = {"name": f"outcome-{kind}", "runtime": "python", "scratch": "4MiB", "limits": limits}
    result = box.run_python(code, grants)
    assert (result.error.kind if result.error else None) is kind
    spares = set(calls_left(box))  # the next call's directory may be made ahead
    assert len(spares) <= 2
    box._runtimes.python().close()  # frees the spares, and their directories with them
    assert calls_left(box) == []


def test_deep_tree_is_removed(box: wasmbox.Sandbox, tool: wasmbox.Tool) -> None:
    path = box._scratch_space.create(1 << 20).path
    fd = os.open(path, os.O_RDONLY)
    for _ in range(3000):  # deeper than PATH_MAX, and than a recursive walk could go
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.symlink("/", "root", dir_fd=fd)
    os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    os.close(fd)
    assert _scratch.usage(path, 1 << 40) >= 3000 * _scratch.ENTRY_MIN
    _scratch.remove(path)
    assert not path.exists()


def test_concurrent_calls_never_see_each_others_scratch(box: wasmbox.Sandbox, built_examples: Path) -> None:
    box.load(probe(name="writer"))
    errors: list[str] = []

    def worker(n: int) -> None:
        tool = box.tool("writer")
        for i in range(20):
            if tool.call(argv=["write", f"/tmp/{n}-{i}", "x"]).value != {"exit_code": 0}:
                errors.append(f"{n}: write failed")
            seen = tool.call(argv=["ls", "/tmp"]).stdout.split()
            if seen:
                errors.append(f"{n}: saw {seen}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert calls_left(box) == []


def test_python_calls_in_parallel_have_separate_scratch(box: wasmbox.Sandbox) -> None:
    grants = {"name": "par", "runtime": "python", "scratch": "1MiB"}
    code = "import os\nbefore = os.listdir('/tmp')\nopen('/tmp/mine', 'w').write('x')\nbefore"

    async def many() -> list[wasmbox.CallResult]:
        return await asyncio.gather(*(box.arun_python(code, grants) for _ in range(12)))

    results = asyncio.run(many())
    assert [r.value for r in results] == [[]] * 12


def test_cancelled_call_leaves_nothing(box: wasmbox.Sandbox) -> None:
    grants = {"name": "cancelled", "runtime": "python", "scratch": "1MiB",
              "limits": {"timeout": "500ms", "fuel": 10**12}}  # fmt: skip
    started = threading.Event()

    @box.host_function("started")
    def mark() -> None:
        started.set()

    grants["host_functions"] = ["started"]
    code = "import wasmbox_guest\nopen('/tmp/a', 'w').write('x')\nwasmbox_guest.call_host('started')\nwhile True: pass"

    async def cancel_one() -> None:
        task = asyncio.ensure_future(box.arun_python(code, grants))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_one())
    box.close()  # waits for the call, which runs on until its deadline
    assert not box._scratch_space.root.exists()


def test_scratch_may_not_be_shadowed_by_a_preopen(tmp_path: Path) -> None:
    with pytest.raises(wasmbox.ManifestError, match="scratch space"):
        wasmbox.Manifest.load({"name": "t", "runtime": "python", "scratch": "1MiB",
                               "preopens": [{"host": str(tmp_path), "guest": "/tmp/data"}]})  # fmt: skip


def test_grants_may_not_reach_the_sandboxs_own_folders(tmp_path: Path, cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, scratch_dir=tmp_path / "scratch") as box:
        for host, writable, what in (
            (tmp_path / "scratch", False, "scratch"),
            (tmp_path, False, "scratch"),
            (cache_dir.parent, True, "compile cache"),
            (cache_dir / "inside", True, "compile cache"),  # e.g. the stdlib every call imports
            (box._scratch_space.root / "inside", False, "scratch"),
        ):
            host.mkdir(parents=True, exist_ok=True)
            grants = {"name": "g", "runtime": "python",
                      "preopens": [{"host": str(host), "guest": "/data", "writable": writable}]}  # fmt: skip
            with pytest.raises(wasmbox.CapabilityError, match=what):
                box.run_python("1", grants)
        # reading (not writing) a folder that holds the cache, or one in it, is allowed
        for host in (cache_dir.parent, cache_dir / "inside"):
            home = {"name": "h", "runtime": "python", "preopens": [{"host": str(host), "guest": "/h"}]}
            assert box.run_python("1", home).value == 1


def test_no_writable_grant_holds_a_symlink_on_the_way_to_the_cache(tmp_path: Path) -> None:
    """A guest that could write the folder holding a symlink on the cache's path could swap it
    for a folder of its own, which the next process would take for its cache."""
    home, mounts, disk = tmp_path / "home", tmp_path / "mounts", tmp_path / "disk" / "cache"
    for folder in (home, mounts, disk):
        folder.mkdir(parents=True)
    (home / ".cache").symlink_to("../mounts/cache")  # a chain: home/.cache -> mounts/cache -> disk
    (mounts / "cache").symlink_to(disk)
    with wasmbox.Sandbox(cache_dir=home / ".cache" / "wasmbox") as box:
        assert box._cache.directory == disk / "wasmbox"  # used by its real path
        spam = {"name": "spam", "module": wat("spam")}  # a WASI module, so grants are checked
        for holder in (home, mounts, tmp_path):  # (tmp_path holds the cache itself too)
            with pytest.raises(wasmbox.CapabilityError, match="compile cache"):
                box.load({**spam, "preopens": [{"host": str(holder), "guest": "/h", "writable": True}]})
        box.load({**spam, "preopens": [{"host": str(home), "guest": "/home"}]})  # reading is allowed
        other = tmp_path / "other"
        other.mkdir()
        box.load({**spam, "name": "w", "preopens": [{"host": str(other), "guest": "/o", "writable": True}]})


def test_scratch_root_is_private_and_removed_on_close(tmp_path: Path) -> None:
    box = wasmbox.Sandbox(cache_dir=None, scratch_dir=tmp_path)
    root = box._scratch_space.root
    assert root.parent == tmp_path and (root.stat().st_mode & 0o777) == 0o700
    box.close()
    assert not root.exists()
