"""The `wasmbox` command: run, inspect, schema."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from wasmbox.cli import main

from .conftest import wat


def _write(tmp_path: Path, module: str, **fields: object) -> Path:
    path = tmp_path / f"{module}.json"
    path.write_text(json.dumps({"name": module, "module": wat(module), **fields}))
    return path


def test_run_prints_result_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "echo")
    assert main(["run", str(path), "--args", '{"x": [1, "\\u001b[31mred"]}', "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out  # escapes are data, not terminal commands
    result = json.loads(out)
    assert result["ok"] is True and result["value"] == {"x": [1, "\x1b[31mred"]}


def test_run_failed_call_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "trap")
    assert main(["run", str(path), "--no-cache"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["kind"] == "trap"


def test_run_bad_manifest_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, "echo", surprise=True)
    assert main(["run", str(path)]) == 2
    assert "surprise" in capsys.readouterr().err
    assert main(["run", str(_write(tmp_path, "trap")), "--args", "{nope"]) == 2


def test_inspect_lists_imports_and_grants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", wat("forward"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "reactor"
    assert report["grants_needed"]["host_functions"] == ["host.fn"]
    assert {"name": "wasmbox_call", "type": "(i32, i32) -> i64"} in report["exports"]
    assert main(["inspect", wat("foreign_import")]) == 0
    assert "never granted" in capsys.readouterr().out


def test_console_script_and_module_entry_point() -> None:
    script = Path(sys.executable).with_name("wasmbox")  # installed by pyproject's [project.scripts]
    for command in ([sys.executable, "-m", "wasmbox", "schema"], [str(script), "schema"]):
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        assert json.loads(out)["title"] == "Manifest"


def test_python_and_build_commands(cache_dir: Path) -> None:
    env = {**__import__("os").environ, "WASMBOX_CACHE_DIR": str(cache_dir)}
    build = subprocess.run(
        [sys.executable, "-m", "wasmbox", "build"], capture_output=True, text=True, env=env
    )
    assert build.returncode == 0 and "ready" in build.stderr
    run = subprocess.run(
        [sys.executable, "-m", "wasmbox", "python", "print('hi')\n6 * 7"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    result = json.loads(run.stdout)
    assert run.returncode == 0 and result["value"] == 42 and result["stdout"] == "hi\n"
    failed = subprocess.run(
        [sys.executable, "-m", "wasmbox", "python", "1/0"], capture_output=True, text=True, env=env
    )
    assert failed.returncode == 1 and json.loads(failed.stdout)["error"]["kind"] == "guest_error"


def test_bench_command_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--seconds", "0.05", "--no-python"]) == 0
    out = capsys.readouterr().out
    assert "trivial core call" in out and "plain wasmtime-py" in out and "threads" in out


def _stdout_of_run(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    probe = str(Path(__file__).resolve().parent.parent / "capabilities" / "fsprobe.toml")
    assert main(["run", probe, "--no-cache", *words]) == 0
    result = json.loads(capsys.readouterr().out)
    lines: list[str] = result["stdout"].splitlines()
    assert lines[:2] == ["fsprobe", "argv"]
    return "\n".join(lines[2:])


def test_run_passes_argv_that_looks_like_options(
    built_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--argv -Tsvg`, `--argv -- -V` and a yosys-style `-p "script"` could not be passed."""
    words = ["--", "argv", "-Tsvg", "-V", "-p", "read_verilog x.v; synth", "--", "--x"]
    assert _stdout_of_run(capsys, *words) == "-Tsvg\n-V\n-p\nread_verilog x.v; synth\n--\n--x"
    assert _stdout_of_run(capsys, "--argv", "argv", "--argv=-Tsvg") == "-Tsvg"
    assert _stdout_of_run(capsys, "--argv", "argv", "one", "--", "-two") == "one\n-two"
    with pytest.raises(SystemExit, match="2"):  # only `run` takes argv
        main(["schema", "--", "x"])
    assert "only `run`" in capsys.readouterr().err


def test_run_builds_args_from_arg_options(built_examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chart = str(Path(__file__).resolve().parent.parent / "capabilities" / "bar_chart.toml")
    words = ["--args", '{"width": 64}', "--arg", "format=svg", "--arg", "values:=[1, -2]", "--arg", "title=-t"]
    assert main(["run", chart, "--no-cache", *words]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stdout"] == "wrote /tmp/chart.svg (svg, 64x400, 2 bars)\n"
    svg = base64.urlsafe_b64decode(result["files"]["/tmp/chart.svg"]).decode()
    assert ">-t</text>" in svg
    for bad in (["--arg", "novalue"], ["--arg", "n:=nope"], ["--args", "[]", "--arg", "a=b"]):
        assert main(["run", chart, *bad]) == 2
        assert "--arg" in capsys.readouterr().err
