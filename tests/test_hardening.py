"""Regressions for holes a review found: each test tries the attack that used to work."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind, _component_io, _hostcall

from .conftest import CAPABILITIES, manifest


def test_sleep_is_cut_at_the_deadline(box: wasmbox.Sandbox) -> None:
    started = time.perf_counter()
    result = box.load(manifest("sleep", limits={"timeout": "200ms"})).call({})
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert time.perf_counter() - started < 5  # it asked for 10 s


def test_nothing_runs_after_a_sleep_cut_at_the_deadline(box: wasmbox.Sandbox) -> None:
    tool = box.load(manifest("security/sleep_then_write", name="sleep_then_write", limits={"timeout": "200ms"}))
    result = tool.call()
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.stdout == ""  # the guest stopped in the sleep, before its write


def test_short_sleep_still_works(box: wasmbox.Sandbox) -> None:
    assert box.load(manifest("nap")).call({}).unwrap() == 7


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


def test_host_root_cannot_be_granted(box: wasmbox.Sandbox) -> None:
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


def test_fuel_is_bounded(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.ManifestError, match="limits.fuel"):
        box.load(manifest("echo", limits={"fuel": 2**64 + 5_000_000}))


def test_deeply_nested_result_is_a_bad_response(box: wasmbox.Sandbox) -> None:
    result = box.load(manifest("deep_result")).call({})
    assert result.error is not None and result.error.kind is ErrorKind.BAD_RESPONSE
    assert "nested" in result.error.message


def test_no_host_call_is_served_after_the_deadline(box: wasmbox.Sandbox) -> None:
    calls = []

    @box.host_function("host.fn")
    def slow(**_: object) -> int:
        calls.append(1)
        time.sleep(0.3)
        return 1

    tool = box.load(manifest("host_thrice", host_functions=["host.fn"], limits={"timeout": "100ms"}))
    result = tool.call({})
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert len(calls) == 1  # straight-line code asked twice more; neither ran


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


def test_failed_calls_release_their_instance_at_once(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(CAPABILITIES / "fsprobe.toml")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        result = tool.call(argv=["exit", "126"])  # Wasmtime refuses the status: a trap
        assert result.error is not None and result.error.kind is ErrorKind.TRAP
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # no preopen fds held by garbage


def test_misclassifications(box: wasmbox.Sandbox) -> None:
    fixed = box.load(manifest("fixed_memory_trap")).call({})
    assert fixed.error is not None and fixed.error.kind is ErrorKind.TRAP  # not memory_limit
    words = box.load(manifest("oom_words")).call({})
    assert words.error is not None and words.error.kind is ErrorKind.GUEST_ERROR
    with pytest.raises(wasmbox.CapabilityError, match="no_such_fn"):
        box.load(manifest("unknown_wasi"))


def test_closed_sandbox_refuses_calls(cache_dir: Path) -> None:
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    tool = box.load(manifest("echo"))
    box.close()
    with pytest.raises(wasmbox.WasmboxError, match="closed"):
        tool.call({})


def test_poll_oneoff_refuses_huge_subscription_counts(box: wasmbox.Sandbox) -> None:
    result = box.load(manifest("poll_bomb", limits={"memory": "32MiB"})).call({})
    assert result.unwrap() == 28  # EINVAL, before the deadline could cut a poll of them all


def test_close_waits_for_calls_in_flight(cache_dir: Path) -> None:
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    spin = box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "500ms"}))
    results: list[wasmbox.CallResult] = []
    thread = threading.Thread(target=lambda: results.append(spin.call({})))
    thread.start()
    time.sleep(0.1)
    box.close()  # must not strand the running call without a deadline
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert results[0].error is not None and results[0].error.kind is ErrorKind.TIMEOUT



class _Tenant:
    """What a host function closes over: a tenant's state, and (as a host function that calls
    back into its Sandbox does) the Sandbox itself, a cycle that only the GC frees."""

    def __init__(self, box: wasmbox.Sandbox) -> None:
        self.box = box

    def serve(self, **args: Any) -> Any:
        return {"served": args}


@pytest.mark.parametrize("kind", ["core", "python"])
def test_closed_or_dropped_sandboxes_leave_no_host_function_behind(
    cache_dir: Path, tmp_path: Path, kind: str
) -> None:
    """A Sandbox per tenant: each registers a host function over the tenant's state and loads
    a tool that calls it. Once each Sandbox is closed (or only dropped), nothing of it stays
    reachable from the module-level registries of callbacks."""
    source = tmp_path / "asks.py"
    source.write_text("import wasmbox_guest\n\ndef main(**args):\n    return wasmbox_guest.call_host('host.fn', **args)\n")
    registries = {"host functions": _hostcall._functions, "call-host handlers": _component_io._handlers}
    gc.collect()
    before = {name: len(registry._items) for name, registry in registries.items()}
    tenants, boxes = [], []
    for n in range(20):
        box = wasmbox.Sandbox(cache_dir=cache_dir)
        tenant = _Tenant(box)
        box.register_host_function("host.fn", tenant.serve)
        if kind == "core":
            tool = box.load(manifest("forward", host_functions=["host.fn"]))
        else:
            tool = box.load({"name": "asks", "runtime": "python", "source": str(source), "host_functions": ["host.fn"]})
        assert tool.call({"n": n}).unwrap() == {"served": {"n": n}}
        if n % 2 == 0:
            box.close()  # the other half are only dropped
        tenants.append(weakref.ref(tenant))
        boxes.append(weakref.ref(box))
        del box, tenant, tool
    gc.collect()
    assert [n for n, ref in enumerate(tenants) if ref() is not None] == []
    assert [n for n, ref in enumerate(boxes) if ref() is not None] == []
    assert {name: len(registry._items) for name, registry in registries.items()} == before
