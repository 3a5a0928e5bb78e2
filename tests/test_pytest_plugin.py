"""The pytest plugin (`_wasmbox_pytestplugin`, `wasmbox.testing`), driven through pytester: real
pytest runs of test files that use its fixtures, markers and benchmark helper."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import wasmbox
from wasmbox import _phases
from wasmbox.testing import record_phases

from .conftest import ROOT, WAT, manifest

pytest_plugins = ["pytester"]

BUILD = ROOT / "runtimes" / "examples" / "build"

# A conftest for pytester's runs whose tools call host function "host.fn" (the documented way:
# override wasmbox_sandbox).
HOST_CONFTEST = """
import pytest
import wasmbox

@pytest.fixture(scope="session")
def wasmbox_sandbox(wasmbox_cache_dir):
    with wasmbox.Sandbox(cache_dir=wasmbox_cache_dir) as sandbox:
        @sandbox.host_function("host.fn")
        def host_fn(x: int) -> int:
            return x + 1

        yield sandbox
"""


def _cache_option(cache_dir: Path) -> str:
    """Pytester's runs share the session's cache, so the Python runtime is built once."""
    return f"--wasmbox-cache-dir={cache_dir}"


# -- inert unless used --------------------------------------------------------------------


def test_the_plugin_module_imports_nothing_of_wasmbox_or_wasmtime() -> None:
    code = (
        "import sys, _wasmbox_pytestplugin\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('wasmbox', 'wasmtime', 'pydantic')]\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_plain_test_file_runs_the_same_with_and_without_the_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_plain="""
        import sys
        import pytest

        def test_nothing_of_wasmbox_is_imported():
            assert not [m for m in sys.modules if m.split(".")[0] in ("wasmbox", "wasmtime")]

        @pytest.mark.parametrize("n", [1, 2])
        def test_param(n):
            assert n

        def test_skipped():
            pytest.skip("plain skip")
        """
    )
    runs = {}
    for flags in ((), ("-p", "no:wasmbox")):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *flags)
        runs[flags] = (result.ret, result.parseoutcomes(), _test_lines(result.stdout.lines))
    with_plugin, without = runs.values()
    assert with_plugin == without
    assert with_plugin[1] == {"passed": 3, "skipped": 1}
    # and the plugin was there in the first run: its option is accepted
    help_text = pytester.runpytest_subprocess("--help").stdout.str()
    assert "--wasmbox-build" in help_text


def _test_lines(lines: list[str]) -> list[str]:
    """The lines naming tests and outcomes, without timings."""
    return [re.sub(r" in [\d.]+s", "", line) for line in lines if "::" in line or "passed" in line]


# -- fixtures -----------------------------------------------------------------------------


def test_fixtures_share_one_sandbox_and_cache_for_the_run(pytester: pytest.Pytester, cache_dir: Path) -> None:
    (pytester.path / "echo.json").write_text(json.dumps({"name": "echo", "module": str(WAT / "echo.wat")}))
    pytester.makepyfile(
        test_tools=f"""
        import wasmbox

        SEEN = []

        def test_a_path_relative_to_this_file(wasmbox_tool, wasmbox_sandbox):
            SEEN.append(id(wasmbox_sandbox))
            assert wasmbox_tool("echo.json").call({{"n": 1}}).unwrap() == {{"n": 1}}

        def test_a_dict_and_a_manifest(wasmbox_tool, wasmbox_sandbox):
            SEEN.append(id(wasmbox_sandbox))
            echo = {{"name": "echo", "module": {str(WAT / "echo.wat")!r}}}
            assert wasmbox_tool(echo).call({{"n": 2}}).unwrap() == {{"n": 2}}
            assert wasmbox_tool(wasmbox.Manifest.load(echo)).call({{"n": 3}}).ok
            # one Sandbox for the run, so the module was compiled once
            assert SEEN[0] == SEEN[1] and wasmbox_sandbox.cache_stats.compiles == 1

        def test_the_cache_is_in_pytests_cache(wasmbox_cache_dir, pytestconfig):
            assert wasmbox_cache_dir == pytestconfig.cache.mkdir("wasmbox")
            assert any(wasmbox_cache_dir.iterdir())  # the compiled module

        def test_snippets(wasmbox_run):
            result = wasmbox_run.python("sum(range(10))")
            assert result.value == 45, result
        """
    )
    result = pytester.runpytest("-p", "no:randomly", "-k", "not snippets")
    result.assert_outcomes(passed=3)
    result = pytester.runpytest("-p", "no:randomly", "-k", "snippets", _cache_option(cache_dir))
    result.assert_outcomes(passed=1)


def test_the_sandbox_is_closed_at_the_end_of_the_run(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        f"""
        import wasmbox

        KEPT = []

        def pytest_sessionfinish(session):
            try:
                KEPT[0].load({{"name": "echo", "module": {str(WAT / "echo.wat")!r}}})
            except wasmbox.WasmboxError as exc:
                open("closed.txt", "w").write(str(exc))
        """
    )
    pytester.makepyfile(
        test_closed="""
        from conftest import KEPT

        def test_keep(wasmbox_sandbox):
            KEPT.append(wasmbox_sandbox)
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)
    assert (pytester.path / "closed.txt").read_text() == "the Sandbox is closed"


# -- the benchmark helper -----------------------------------------------------------------


BENCH_FILE = f"""
def test_host_round_trip(wasmbox_tool, wasmbox_bench, benchmark):
    tool = wasmbox_tool({{"name": "forward", "module": {str(WAT / "forward.wat")!r},
                         "host_functions": ["host.fn"]}})
    run = wasmbox_bench(tool, {{"x": 1}}, spacing="1ms", rounds=7)
    assert run.result.unwrap() == 2
    assert len(run.calls) == 7 and run.spacing_s == 0.001
    for call in run.calls:
        assert call.tool == "forward" and call.host_calls == 1 and call.made_ahead is None
        assert call.fuel_used == run.result.fuel_used > 0
        assert 0 < call.host_s < call.run_s and call.instantiate_s > 0 and call.teardown_s > 0
    assert benchmark.extra_info["host_calls"] == 1
    assert benchmark.extra_info["fuel_used"] == run.result.fuel_used
    assert MEASURED_BY == run.measured_by
    if run.measured_by == "pytest-benchmark":  # a round is the whole call, phases within it
        assert min(c.total_s for c in run.calls) <= benchmark.stats["max"]
    run.assert_median_below(3600)
    try:
        run.assert_median_below(1e-9)
    except AssertionError as exc:
        assert "forward: median fresh call" in str(exc) and "host functions" in str(exc)
    else:
        raise AssertionError("a median under a nanosecond")

def test_failing_calls_are_refused(wasmbox_tool, wasmbox_bench):
    tool = wasmbox_tool({{"name": "echo", "module": {str(WAT / "echo.wat")!r}, "limits": {{"fuel": 1}}}})
    try:
        wasmbox_bench(tool, {{"n": 1}})
    except AssertionError as exc:
        assert "echo: the call fails (out_of_fuel" in str(exc)
    else:
        raise AssertionError("timed a failing call")
"""


def test_bench_helper_under_pytest_benchmark(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(HOST_CONFTEST)
    pytester.makepyfile(test_bench='MEASURED_BY = "pytest-benchmark"\n' + BENCH_FILE)
    out = pytester.path / "bench.json"
    result = pytester.runpytest("-p", "no:randomly", f"--benchmark-json={out}")
    result.assert_outcomes(passed=2)
    (saved,) = json.loads(out.read_text())["benchmarks"]
    info = saved["extra_info"]
    assert saved["stats"]["rounds"] == 7
    assert set(info) == {"instantiate_s", "run_s", "teardown_s", "host_s", "host_calls", "fuel_used",
                         "made_ahead", "calls", "spacing_s"}  # fmt: skip
    assert info["host_calls"] == 1 and info["calls"] == 7 and info["made_ahead"] is None


def test_bench_helper_under_pytest_codspeed(pytester: pytest.Pytester) -> None:
    pytest.importorskip("pytest_codspeed", reason="pytest-codspeed is not installed (the test extra has it)")
    pytester.makeconftest(HOST_CONFTEST)
    pytester.makepyfile(test_bench='MEASURED_BY = "calls"\n' + BENCH_FILE)
    result = pytester.runpytest("-p", "no:randomly", "--codspeed")
    result.assert_outcomes(passed=2)
    assert "codspeed" in result.stdout.str().lower()


def test_bench_helper_times_python_calls_spaced(pytester: pytest.Pytester, cache_dir: Path) -> None:
    pytester.makepyfile(
        test_python="""
        def test_snippet(wasmbox_sandbox, wasmbox_bench):
            run = wasmbox_bench(wasmbox_sandbox.interpreter(), {"code": "sum(range(100))"},
                                spacing="5ms", rounds=5)
            assert run.result.value == 4950 and len(run.calls) == 5
            assert 0 <= run.phases["made_ahead"] <= 1  # Python calls say whether a spare served them
            assert "a spare instance was ready for" in run.explain()
        """
    )
    result = pytester.runpytest("-p", "no:randomly", _cache_option(cache_dir))
    result.assert_outcomes(passed=1)


def test_bench_helper_skips_without_a_benchmark_plugin(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_nobench="""
        def test_speed(wasmbox_bench):
            raise AssertionError("not skipped")
        """
    )
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:codspeed", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*wasmbox_bench needs a benchmark fixture: install pytest-benchmark*"])


# -- markers ------------------------------------------------------------------------------


def test_runtime_marker_skips_saying_why_when_not_built(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.wasmbox_runtime("javascript")
        def test_js(wasmbox_sandbox):
            raise AssertionError("not skipped")

        @pytest.mark.wasmbox_runtime("scientific")
        class TestScientific:
            def test_numpy(self):
                raise AssertionError("not skipped")
        """
    )
    empty = pytester.mkdir("empty-cache")
    result = pytester.runpytest("-rs", f"--wasmbox-cache-dir={empty}")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(
        [
            f"*needs the javascript runtime, which is not built in {empty}: run pytest with --wasmbox-build*",
            "*needs the scientific runtime*--wasmbox-cache-dir*",
        ],
        consecutive=False,
    )
    assert not any(empty.iterdir())  # nothing was built


def test_runtime_marker_runs_the_test_when_built(pytester: pytest.Pytester, cache_dir: Path) -> None:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        box.prepare_python()
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.wasmbox_runtime("python")
        def test_py(wasmbox_run):
            assert wasmbox_run.python("6 * 7").value == 42
        """
    )
    pytester.runpytest(_cache_option(cache_dir)).assert_outcomes(passed=1)
    # --wasmbox-build with the runtime already there builds nothing and runs the test
    pytester.runpytest(_cache_option(cache_dir), "--wasmbox-build").assert_outcomes(passed=1)


def test_runtime_marker_names_a_runtime(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_typo="""
        import pytest

        @pytest.mark.wasmbox_runtime("pyton")
        def test_py():
            pass
        """
    )
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*wasmbox_runtime('pyton'): the runtimes are python, javascript, scientific*"]
    )


def test_network_marker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_net="""
        import pytest

        @pytest.mark.wasmbox_network
        def test_fetch():
            pass
        """
    )
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*needs the network (marked wasmbox_network): run pytest with --wasmbox-network*"]
    )
    pytester.runpytest("--wasmbox-network").assert_outcomes(passed=1)


# -- the documented example ---------------------------------------------------------------


def test_the_readme_example_runs(pytester: pytest.Pytester) -> None:
    """docs/testing.md's test and benchmark of a tool, as written there, beside the tool's manifest."""
    section = (ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert block is not None
    shipped = (ROOT / "capabilities" / "word_count.toml").read_text()
    pytester.path.joinpath("word_count.toml").write_text(
        shipped.replace(
            '"../runtimes/examples/build/word_count.wasm"', json.dumps(str(BUILD / "word_count.wasm"))
        )
    )
    pytester.mkdir("data")
    pytester.makepyfile(test_word_count=block.group(1))
    result = pytester.runpytest("-p", "no:randomly", "--benchmark-min-rounds=20", "--benchmark-max-time=0.1")
    result.assert_outcomes(passed=2)


# -- recording a call's phases ------------------------------------------------------------


def test_record_phases_of_a_call_and_not_of_the_calls_it_makes(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))

    @box.host_function("host.fn")
    def host_fn(x: int) -> int:
        return echo.call({"x": x}).unwrap()["x"] + 1  # a tool called from a host function

    forward = box.load(manifest("forward", host_functions=["host.fn"]))
    with record_phases() as recording:
        result = forward.call({"x": 1})
    assert result.unwrap() == 2
    (call,) = recording.calls  # the nested echo call is inside the host function's time
    assert call.tool == "forward" and call.host_calls == 1 and call.fuel_used == result.fuel_used
    assert 0 < call.host_s < call.run_s
    assert call.total_s <= result.duration_s
    assert _phases.active == 0  # nothing is recorded, nor costs, once the block is left
    forward.call({"x": 1})
    assert len(recording) == 1


def test_record_phases_sees_only_its_own_thread(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))
    with record_phases() as recording:
        worker = threading.Thread(target=echo.call, args=({"n": 1},))
        worker.start()
        worker.join()
        echo.call({"n": 2})
        assert echo.call("not a mapping").error is not None  # type: ignore[arg-type]  # refused: no runner
    assert [c.tool for c in recording.calls] == ["echo"]


def test_the_plugin_knows_the_runtimes_wasmbox_testing_does() -> None:
    """The plugin cannot import wasmbox at load, so it keeps its own list: the same one."""
    import _wasmbox_pytestplugin as plugin
    from wasmbox.testing import RUNTIMES

    assert plugin._RUNTIMES == RUNTIMES and tuple(plugin._BUILD_TIME) == RUNTIMES
