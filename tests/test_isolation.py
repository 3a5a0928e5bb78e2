"""One call, one instance: nothing one call does is visible to the next, across threads too."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import wasmbox

from .conftest import WAT, manifest, wat

SECURITY_WAT = WAT / "security"


def test_memory_and_globals_are_fresh_every_call(box: wasmbox.Sandbox) -> None:
    tool = box.load(manifest("state"))
    # state.wat returns how many calls its instance has seen (memory and a global)
    assert [tool.call({}).unwrap() for _ in range(5)] == [0] * 5


def test_concurrent_calls_from_8_threads_are_independent(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))
    state = box.load(manifest("state"))
    barrier = threading.Barrier(8)

    def worker(i: int) -> list[tuple[object, object]]:
        barrier.wait()
        out = []
        for j in range(50):
            args = {"thread": i, "call": j, "blob": bytes([i]) * (j * 37)}
            out.append((echo.call(args).unwrap(), args))
            assert state.call({}).unwrap() == 0
        return out

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(worker, range(8)))
    for per_thread in results:
        for got, sent in per_thread:
            assert got == sent


def test_concurrent_failures_do_not_leak_into_other_calls(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))
    spin = box.load(manifest("spin", limits={"fuel": 200_000}))
    trap = box.load(manifest("trap"))

    def worker(i: int) -> None:
        for j in range(30):
            tool = (echo, spin, trap)[(i + j) % 3]
            result = tool.call({"i": i, "j": j})
            if tool is echo:
                assert result.unwrap() == {"i": i, "j": j}
            else:
                assert result.error is not None
                expected = "out_of_fuel" if tool is spin else "trap"
                assert result.error.kind.value == expected

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))


def test_acall_runs_off_the_event_loop(box: wasmbox.Sandbox) -> None:
    box.load(manifest("echo"))
    box.load(manifest("spin", limits={"fuel": 10**15, "timeout": "300ms"}))

    async def main() -> tuple[list[wasmbox.CallResult], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        results = await asyncio.gather(box.acall("spin"), *(box.acall("echo", {"n": n}) for n in range(20)))
        task.cancel()
        return list(results), ticks

    results, ticks = asyncio.run(main())
    assert results[0].error is not None and results[0].error.kind.value == "timeout"
    assert [r.unwrap() for r in results[1:]] == [{"n": n} for n in range(20)]
    assert ticks >= 5  # the loop kept running while the spinning guest waited for its deadline


def test_call_by_name_and_unknown_name(box: wasmbox.Sandbox) -> None:
    box.load(manifest("echo"))
    assert box.call("echo", {"a": 1}).unwrap() == {"a": 1}
    assert set(box.tools) == {"echo"}
    try:
        box.call("nope", {})
    except KeyError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("expected KeyError")


def test_loading_a_name_twice_needs_replace(box: wasmbox.Sandbox) -> None:
    box.load(manifest("echo"))
    try:
        box.load(manifest("echo"))
    except wasmbox.ManifestError:
        pass
    else:
        raise AssertionError("expected ManifestError")
    box.load(manifest("state", name="echo"), replace=True)
    assert box.call("echo", {}).unwrap() == 0


def test_pool_exhaustion_is_a_host_error_and_recovers(cache_dir: Path) -> None:
    settings = wasmbox.EngineSettings(pool_slots=1)
    with wasmbox.Sandbox(cache_dir=cache_dir, settings=settings) as box:
        echo = box.load(manifest("echo"))
        inner: list[wasmbox.CallResult] = []

        @box.host_function("host.fn")
        def nested(**args: object) -> int:
            inner.append(echo.call(args))  # a second live instance: no slot left
            return 1

        outer = box.load(manifest("forward", host_functions=["host.fn"]))
        assert outer.call({"a": 1}).unwrap() == 1
        (result,) = inner
        assert result.error is not None and result.error.kind.value == "host_error"
        assert "capacity" in result.error.message
        assert echo.call({"b": 2}).unwrap() == {"b": 2}  # the slot is free again


def test_pooled_slots_do_not_leak_memory_between_calls(box: wasmbox.Sandbox) -> None:
    # state.wat bumps a counter in memory and a global; pooled slots are reused, not reset lazily
    tool = box.load(manifest("state"))
    assert {tool.call({}).unwrap() for _ in range(200)} == {0}


@pytest.mark.parametrize("where", ["export", "start"])
def test_guest_code_runs_without_the_gil(box: wasmbox.Sandbox, where: str) -> None:
    """ctypes lets go of the GIL while wasm runs: while one thread's guest spins, in its export
    or while it is instantiated, other threads' calls go on, and the spinning call then ends
    at its deadline."""
    module = wat("spin") if where == "export" else str(SECURITY_WAT / "start_loop.wat")
    # it spins until the test moves the engine's clock past its deadline (far, so that no
    # machine is too slow for the calls below to finish first), and fuel would last ~1000 s
    limits = {"fuel": 10**12, "timeout": "60s"}
    spinner = box.load({"name": f"spinner_{where}", "module": module, "limits": limits})
    echo = box.load(manifest("echo"), replace=True)
    outcome: list[wasmbox.CallResult] = []
    spinning = threading.Thread(target=lambda: outcome.append(spinner.call({})))
    spinning.start()
    time.sleep(0.2)  # so that the spinner is in guest code before the other calls start
    try:
        for n in range(50):
            assert echo.call({"n": n}).unwrap() == {"n": n}
        assert spinning.is_alive(), "other calls waited for the spinning guest"
    finally:
        for _ in range(box._ticker.ticks(60) + 1):
            box.engine.increment_epoch()
        spinning.join()
    assert outcome[0].error is not None and outcome[0].error.kind is wasmbox.ErrorKind.TIMEOUT
