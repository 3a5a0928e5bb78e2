"""A Sandbox's life: closing refuses new calls and waits for those in flight; a closed or
dropped Sandbox leaves no host function behind; a failed call frees its instance at once."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind
from wasmbox._backends.core import hostcall as _hostcall
from wasmbox._wasmtime import component_io as _component_io

from .conftest import CAPABILITIES, WAT, manifest

WAT_ECHO = WAT / "echo.wat"


def test_closed_sandbox_refuses_calls(cache_dir: Path) -> None:
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    tool = box.load(manifest("echo"))
    box.close()
    with pytest.raises(wasmbox.WasmboxError, match="closed"):
        tool.call({})


def test_close_waits_for_calls_in_flight(cache_dir: Path) -> None:
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    spin = box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "500ms"}))
    results: list[wasmbox.CallResult] = []
    entered, enter = threading.Event(), box._ticker.enter

    def counted_in() -> None:  # the call is in flight once the ticker has counted it in
        enter()
        entered.set()

    box._ticker.enter = counted_in  # type: ignore[method-assign]
    thread = threading.Thread(target=lambda: results.append(spin.call({})))
    thread.start()
    assert entered.wait(60)  # (a busy machine may start the thread late: close must come after)
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
    source.write_text(
        "import wasmbox_guest\n\ndef main(**args):\n    return wasmbox_guest.call_host('host.fn', **args)\n"
    )
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
            tool = box.load(
                {"name": "asks", "runtime": "python", "source": str(source), "host_functions": ["host.fn"]}
            )
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


def test_failed_calls_release_their_instance_at_once(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(CAPABILITIES / "fsprobe.toml")
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        result = tool.call(argv=["exit", "126"])  # Wasmtime refuses the status: a trap
        assert result.error is not None and result.error.kind is ErrorKind.TRAP
    assert len(os.listdir("/proc/self/fd")) <= before + 2  # no preopen fds held by garbage


def test_close_with_a_timeout_stops_the_calls_still_running(cache_dir: Path) -> None:
    """A call with a 120 s deadline is stopped by `close(timeout=...)` instead of holding the
    close for its deadline (the bound here is half that deadline: only a close that waited
    for it reaches it)."""
    box = wasmbox.Sandbox(cache_dir=cache_dir)
    started = threading.Event()
    box.register_host_function("test.started", started.set)
    grants = {"name": "spinner", "runtime": "python", "host_functions": ["test.started"],
              "limits": {"fuel": 10**15, "timeout": "120s"}}  # fmt: skip
    code = "import wasmbox_guest\nwasmbox_guest.call_host('test.started')\nwhile True:\n    pass"
    results: list[wasmbox.CallResult] = []
    thread = threading.Thread(target=lambda: results.append(box.run_python(code, grants)))
    begun = time.monotonic()
    thread.start()
    assert started.wait(60)
    box.close(timeout=0.1)
    thread.join(timeout=60)
    assert not thread.is_alive() and time.monotonic() - begun < 60
    assert results[0].error is not None and results[0].error.kind is ErrorKind.TIMEOUT
    with pytest.raises(wasmbox.WasmboxError, match="closed"):
        box.run_python("1")
    with wasmbox.Sandbox(cache_dir=None) as other, pytest.raises(ValueError, match="timeout"):
        other.close(timeout=-1)


def test_aload_loads_off_the_event_loop(cache_dir: Path) -> None:
    import asyncio

    async def run() -> tuple[wasmbox.Tool, Any]:
        with wasmbox.Sandbox(cache_dir=cache_dir) as box:
            tool = await box.aload(manifest("echo"))
            return tool, (await tool.acall({"a": 1})).value

    tool, value = asyncio.run(run())
    assert tool.name == "echo" and value == {"a": 1}


def test_stats_count_calls_errors_and_what_is_live(cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        assert box.stats().calls == 0 and box.stats().errors == {}
        echo = box.load(manifest("echo"))
        trap = box.load(manifest("trap"))
        echo.call({"a": 1})
        trap.call()
        trap.call()
        echo.call("not a mapping")  # type: ignore[arg-type]  # refused before running: counted too
        box.run_python("1 + 1")
        with box.session() as session:
            session.run("x = 1")  # a session's run is the session's, not counted here
            stats = box.stats()
    assert (stats.tools, stats.calls, stats.in_flight, stats.sessions) == (2, 5, 0, 1)
    assert stats.errors == {"trap": 2, "invalid_arguments": 1}
    assert stats.cache.compiles + stats.cache.hits >= 2


def test_traps_stay_traps_after_faulthandler_takes_the_handlers(tmp_path: Path) -> None:
    """`faulthandler.enable()` after the process's first Engine (as a pytest run in-process
    does) takes SIGSEGV, SIGILL and SIGFPE from Wasmtime: without a fix the next guest fault
    kills the process (-4, SIGILL). A new Sandbox puts Wasmtime's handlers back."""
    abi = '(memory (export "memory") 1) (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))'
    bodies = {  # a guest fault of each signal Wasmtime handles
        "sigfpe": "(i64.extend_i32_u (i32.div_u (i32.const 1) (i32.sub (local.get 1) (i32.const 1))))",  # {} is 1 byte
        "sigsegv": "(i64.load (i32.const 0x7fff0000))",
        "sigill": "unreachable",
    }
    for name, body in bodies.items():
        call = f'(func (export "wasmbox_call") (param i32 i32) (result i64) (drop (local.get 0)) {body})'
        (tmp_path / f"{name}.wat").write_text(f"(module {abi} {call})")
    program = f"""
import faulthandler, pathlib, wasmbox
first = wasmbox.Sandbox(cache_dir=None)
tools = [first.load({{"name": p.stem, "module": str(p)}}) for p in sorted(pathlib.Path({str(tmp_path)!r}).glob("*.wat"))]
kinds = lambda: [t.call({{}}).error.kind.value for t in tools]
print(kinds(), flush=True)
faulthandler.enable()  # takes the trap signals
wasmbox.Sandbox(cache_dir=None).close()  # gives them back
print(kinds(), flush=True)
first.close()
"""
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.splitlines() == [str(["trap"] * 3)] * 2


def test_instances_made_ahead_and_discarded_leave_no_stream_registered(cache_dir: Path) -> None:
    """A spare Python instance's stdout and stderr are registered for Wasmtime's write callback
    when it is made; one displaced or freed at close, never run, must not stay registered."""
    from wasmbox._wasmtime import output

    before = len(output._live._items)
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        for i in range(6):  # six grant sets: their spares displace each other (two are kept)
            assert box.run_python("1", {"name": f"g{i}", "runtime": "python", "env": {"I": str(i)}}).ok
        made = box.stats().spares
    gc.collect()
    assert len(output._live._items) == before, made


def test_a_ticker_never_ticks_an_engine_being_freed() -> None:
    """An Engine's `__del__` frees its C engine before its weak references are cleared: a
    ticker that reached its engines through them could tick one being freed and crash the
    process. Engines dropped by the thousand under tickers ticking every 10 µs, in a child
    process (a crash there is an exit code here)."""
    script = """
import wasmtime
from wasmbox._wasmtime.engine import EpochTicker

tickers = []
for _ in range(2000):
    config = wasmtime.Config()
    config.epoch_interruption = True
    engine = wasmtime.Engine(config)
    tickers.append(EpochTicker(engine, 0.00001))
    del engine  # the ticker's thread ticks on
    if len(tickers) > 8:
        tickers.pop(0).close()
print("survived")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "survived"), done.stderr[-2000:]


def test_stores_are_freed_again_once_a_new_engine_is_made_after_exit_hooks(
    box: wasmbox.Sandbox, cache_dir: Path
) -> None:
    """At exit the Python runtime's stores are forgotten, not freed (their resets are moot);
    a process whose exit hooks ran early and that then makes a Sandbox goes on, so its
    stores are freed again: 600 calls, past the pool's 512 slots, all served."""
    box.prepare_python()  # (built in this cache once: the child only loads it)
    script = f"""
import atexit
import wasmbox

box = wasmbox.Sandbox(cache_dir={str(cache_dir)!r})
assert box.run_python("6 * 7").value == 42  # (the runtime's exit hook is registered)
atexit._run_exitfuncs()  # e.g. a host framework running exit hooks before it is done
box = wasmbox.Sandbox(cache_dir={str(cache_dir)!r})
echo = box.load({{"name": "echo", "module": {str(WAT_ECHO)!r}}})
failed = [i for i in range(600) if not echo.call({{"n": i}}).ok]
print(len(failed), box.stats().stores)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["0", "0"], done.stderr[-2000:]
