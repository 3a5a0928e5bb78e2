"""Admission control for a whole Sandbox: calls past its bound on calls in flight or on the
process's resident memory are refused at once as `overloaded`, exactly under threads and
asyncio, before work is queued for the worker threads; counted in `stats()`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import wasmbox
from wasmbox import AdmissionLimits, ErrorKind

from .conftest import manifest, wat


def kind(result: wasmbox.CallResult) -> str:
    return result.error.kind.value if result.error else "ok"


class Hold:
    """A host function that holds each call inside it until released, counting how many are
    inside at once (and the most ever)."""

    def __init__(self) -> None:
        self.inside = threading.Semaphore(0)
        self.release = threading.Event()
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0

    def call(self, x: int) -> int:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)
        self.inside.release()
        try:
            assert self.release.wait(60)
        finally:
            with self._lock:
                self.now -= 1
        return x

    def entered(self, n: int) -> None:
        for _ in range(n):
            assert self.inside.acquire(timeout=60)


@pytest.fixture
def held_box(cache_dir: Path) -> Iterator[tuple[wasmbox.Sandbox, Hold]]:
    hold = Hold()
    with wasmbox.Sandbox(cache_dir=cache_dir, max_workers=2, admission=AdmissionLimits(in_flight=3)) as box:
        box.register_host_function("host.fn", hold.call)
        box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"],
                  "limits": {"timeout": "60s"}})  # fmt: skip
        box.load(manifest("echo"))
        yield box, hold
        hold.release.set()


def test_calls_past_the_bound_are_refused_at_once_and_counted(
    held_box: tuple[wasmbox.Sandbox, Hold],
) -> None:
    box, hold = held_box
    with ThreadPoolExecutor(3) as pool:
        running = [pool.submit(box.call, "forward", {"x": i}) for i in range(3)]
        hold.entered(3)
        refused = box.call("echo", {"text": "hi"})
        assert refused.error is not None and refused.error.kind is ErrorKind.OVERLOADED
        assert refused.fuel_used == 0 and refused.stdout == ""  # not started
        assert refused.error.message == (
            "not run: the Sandbox is overloaded: 3 calls are in flight, the most it admits "
            "(AdmissionLimits.in_flight); retry shortly, or elsewhere"
        )
        with pytest.raises(wasmbox.OverloadedError):
            refused.unwrap()
        stats = box.stats()
        assert stats.admission is not None
        assert (stats.admission.in_flight, stats.admission.refused["in_flight"]) == (3, 1)
        assert stats.errors == {"overloaded": 1}
        hold.release.set()
        assert [f.result().value for f in running] == [0, 1, 2]
    assert kind(box.call("echo", {})) == "ok"
    after = box.stats()
    assert after.admission is not None and after.admission.in_flight == 0
    assert after.admission.admitted == 4 and after.calls == 5


def test_exact_under_concurrent_threads(cache_dir: Path) -> None:
    """Threads hammering a bound of 2: no more than 2 calls are ever inside at once, and every
    call is either admitted and run, or refused; nothing is lost or counted twice."""
    hold = Hold()
    hold.release.set()  # (no holding: calls race each other through the gate)
    with wasmbox.Sandbox(cache_dir=cache_dir, admission=AdmissionLimits(in_flight=2)) as box:
        box.register_host_function("host.fn", hold.call)
        box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})
        with ThreadPoolExecutor(8) as pool:
            kinds = list(pool.map(lambda i: kind(box.call("forward", {"x": i})), range(300)))
        stats = box.stats()
    assert set(kinds) <= {"ok", "overloaded"} and hold.most <= 2
    assert stats.admission is not None and stats.admission.in_flight == 0
    assert stats.admission.admitted == kinds.count("ok")
    assert stats.admission.refused["in_flight"] == kinds.count("overloaded")
    assert stats.errors.get("overloaded", 0) == kinds.count("overloaded")


def test_exact_under_asyncio(cache_dir: Path) -> None:
    """300 acalls gathered at once against a bound of 3: never more than 3 inside, and the
    counts add up to what came back."""
    hold = Hold()
    hold.release.set()
    with wasmbox.Sandbox(cache_dir=cache_dir, max_workers=4, admission=AdmissionLimits(in_flight=3)) as box:
        box.register_host_function("host.fn", hold.call)
        box.load({"name": "forward", "module": wat("forward"), "host_functions": ["host.fn"]})

        async def run() -> list[str]:
            results = await asyncio.gather(*(box.acall("forward", {"x": i}) for i in range(300)))
            return [kind(r) for r in results]

        kinds = asyncio.run(run())
        stats = box.stats()
    assert set(kinds) <= {"ok", "overloaded"} and hold.most <= 3 and kinds.count("ok") >= 3
    assert stats.admission is not None and stats.admission.in_flight == 0
    assert (stats.admission.admitted, stats.admission.refused["in_flight"]) == (
        kinds.count("ok"), kinds.count("overloaded"),
    )  # fmt: skip


def test_the_mcp_server_is_admitted(held_box: tuple[wasmbox.Sandbox, Hold]) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    box, hold = held_box
    with ThreadPoolExecutor(3) as pool:
        running = [pool.submit(box.call, "forward", {"x": i}) for i in range(3)]
        hold.entered(3)

        async def run() -> None:
            async with Client(wasmbox_mcp.build_server(box)) as client:
                refused = await client.call_tool("echo", {})
                assert refused.is_error is True and "overloaded" in refused.content[0].text  # type: ignore[union-attr]

        asyncio.run(run())
        hold.release.set()
        assert [f.result().value for f in running] == [0, 1, 2]


def test_asyncio_calls_are_refused_before_they_queue(held_box: tuple[wasmbox.Sandbox, Hold]) -> None:
    """Two worker threads and a bound of 3: of ten acalls, two run, one waits in the queue and
    seven are refused while the others are still held (so without queueing behind them)."""
    box, hold = held_box

    async def run() -> list[str]:
        tasks = [asyncio.ensure_future(box.acall("forward", {"x": i})) for i in range(10)]
        await asyncio.to_thread(hold.entered, 2)
        done, pending = await asyncio.wait(tasks, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        while len(done) < 7:  # the refused ones end without the held ones ending
            more, pending = await asyncio.wait(pending, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            done |= more
        assert len(done) == 7 and all(kind(t.result()) == "overloaded" for t in done)
        stats = box.stats()
        assert stats.admission is not None and stats.admission.in_flight == 3
        assert stats.in_flight == 2  # two running; the third is queued for a worker
        hold.release.set()
        return [kind(r) for r in await asyncio.gather(*tasks)]

    kinds = asyncio.run(run())
    assert kinds.count("ok") == 3 and kinds.count("overloaded") == 7
    assert box.stats().admission.in_flight == 0  # type: ignore[union-attr]


def test_queued_work_cancelled_gives_its_place_back(held_box: tuple[wasmbox.Sandbox, Hold]) -> None:
    box, hold = held_box

    async def run() -> None:
        running = [asyncio.ensure_future(box.acall("forward", {"x": i})) for i in range(2)]
        await asyncio.to_thread(hold.entered, 2)
        queued = asyncio.ensure_future(box.acall("echo", {}))
        await asyncio.sleep(0)  # (let it take its place and queue)
        assert box.stats().admission.in_flight == 3  # type: ignore[union-attr]
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert box.stats().admission.in_flight == 2  # type: ignore[union-attr]
        hold.release.set()
        assert [r.value for r in await asyncio.gather(*running)] == [0, 1]

    asyncio.run(run())
    assert box.stats().admission.in_flight == 0  # type: ignore[union-attr]


def test_dispatch_sessions_and_snippets_are_admitted(held_box: tuple[wasmbox.Sandbox, Hold]) -> None:
    box, hold = held_box
    box.prepare_python()  # (a first build here would outlast the held calls)
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "echo", "arguments": "{}"}} for i in range(4)
    ]
    with ThreadPoolExecutor(3) as pool:
        running = [pool.submit(box.call, "forward", {"x": i}) for i in range(3)]
        hold.entered(3)
        budget = wasmbox.Budget(calls=100)
        replies = box.dispatch(calls, format="openai", budget=budget)
        assert [json.loads(r["content"])["error"]["kind"] for r in replies] == ["overloaded"] * 4
        assert kind(box.call("echo", {}, budget=budget)) == "overloaded"
        assert budget.used()["calls"] == 0  # refused before the budget: not charged
        replies = asyncio.run(box.adispatch(calls[:1], format="openai"))
        assert json.loads(replies[0]["content"])["error"]["kind"] == "overloaded"
        assert kind(box.run_python("1")) == "overloaded"
        assert kind(asyncio.run(box.arun_python("1"))) == "overloaded"
        with box.session() as session:
            assert kind(session.run("x = 1")) == "overloaded"
            assert kind(asyncio.run(session.arun("x = 1"))) == "overloaded"
        hold.release.set()
        assert [f.result().value for f in running] == [0, 1, 2]
    replies = box.dispatch(calls[:3], format="openai")  # (each of a dispatch's calls takes a place)
    assert [json.loads(r["content"]) for r in replies] == [{}] * 3
    stats = box.stats()
    assert stats.admission is not None and stats.admission.refused["in_flight"] == 10
    assert stats.errors == {"overloaded": 8}  # each refused call but the session runs (not counted)


def test_a_tool_code_calls_is_part_of_its_callers_place(cache_dir: Path) -> None:
    """With room for one call, a snippet calling a tool runs it: the inner call holds no
    place of its own (taking one would refuse every tool call code makes at the bound)."""
    with wasmbox.Sandbox(cache_dir=cache_dir, admission=AdmissionLimits(in_flight=1)) as box:
        box.load(manifest("echo"))
        result = box.run_python(
            "tools.echo(text='in')['text']", {"name": "s", "runtime": "python", "tools": ["echo"]}
        )
        assert result.value == "in", result.error
        assert box.stats().admission.admitted == 1  # type: ignore[union-attr]


def test_the_resident_memory_bound(cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir, admission=AdmissionLimits(resident="1000GiB")) as roomy:
        roomy.load(manifest("echo"))
        assert kind(roomy.call("echo", {})) == "ok"
        seen = roomy.stats().admission
        assert seen is not None and seen.resident is not None and seen.resident > 10 * 1024**2
    with wasmbox.Sandbox(cache_dir=cache_dir, admission=AdmissionLimits(resident=1)) as full:
        full.load(manifest("echo"))
        refused = full.call("echo", {})
        assert refused.error is not None and refused.error.kind is ErrorKind.OVERLOADED
        assert "the process's resident memory is" in refused.error.message
        assert "(AdmissionLimits.resident)" in refused.error.message
        assert full.stats().admission.refused == {"in_flight": 0, "resident": 1}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"in_flight": 0}, "in_flight must be an int >= 1"),
        ({"in_flight": True}, "in_flight must be an int >= 1"),
        ({"in_flight": 2.5}, "in_flight must be an int >= 1"),
        ({"resident": "lots"}, "resident must be a size in bytes"),
        ({"resident": -1}, "resident must be a size in bytes"),
    ],
)
def test_bad_limits_are_refused(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        AdmissionLimits(**fields)  # type: ignore[arg-type]


def test_admission_must_be_admission_limits(cache_dir: Path) -> None:
    with pytest.raises(TypeError, match="admission must be an AdmissionLimits, got dict"):
        wasmbox.Sandbox(cache_dir=cache_dir, admission={"in_flight": 2})  # type: ignore[arg-type]


def test_without_limits_stats_show_no_admission(box: wasmbox.Sandbox) -> None:
    box.load(manifest("echo"))
    assert kind(box.call("echo", {})) == "ok"
    assert box.stats().admission is None
