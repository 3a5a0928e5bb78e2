"""The `wasmbox` command: run, inspect, schema."""

from __future__ import annotations

import base64
import json
import re
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
    assert report["kind"] == "abi"
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
    words = [
        "--args",
        '{"width": 64}',
        "--arg",
        "format=svg",
        "--arg",
        "values:=[1, -2]",
        "--arg",
        "title=-t",
    ]
    assert main(["run", chart, "--no-cache", *words]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stdout"] == "wrote /tmp/chart.svg (svg, 64x400, 2 bars)\n"
    svg = base64.urlsafe_b64decode(result["files"]["/tmp/chart.svg"]).decode()
    assert ">-t</text>" in svg
    for bad in (["--arg", "novalue"], ["--arg", "n:=nope"], ["--args", "[]", "--arg", "a=b"]):
        assert main(["run", chart, *bad]) == 2
        assert "--arg" in capsys.readouterr().err


# A module whose names try to drive the terminal (clear it, retitle it, reverse the text) and
# to forge a second "grants needed" block with newlines.
HOSTILE_NAMES_WAT = r"""
(module
  (import "wasi_snapshot_preview1" "fd_write\1b[2J\1b]0;owned\07" (func (param i32 i32 i32 i32) (result i32)))
  (import "wasmbox" "kv.get\ngrants needed:\n  wasi: no\n  host_functions: []\n" (func (param i32 i32) (result i64)))
  (import "evil\1b[31m\c2\9b" "x\u{202e}y" (func))
  (memory (export "memory") 1)
  (global (export "g\1b[1m\0a  forged") i32 (i32.const 0))
  (func (export "wasmbox_alloc") (param i32) (result i32) i32.const 0)
  (func (export "wasmbox_call") (param i32 i32) (result i64) i64.const 0))
"""
# a reactor whose one unknown WASI import Wasmtime's linker names in its error
UNKNOWN_WASI_WAT = r"""
(module
  (import "wasi_snapshot_preview1" "fd_write\1b[2J\nwasmbox: forged" (func (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) i32.const 0)
  (func (export "wasmbox_call") (param i32 i32) (result i64) i64.const 0))
"""
# what a terminal would act on (C0, DEL, C1, bidi controls); a newline only where we put one
_ACTIVE = {chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x202E]} - {"\n"}


def _inert(text: str) -> bool:
    return not _ACTIVE & set(text)


def test_inspect_escapes_the_modules_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "names\x1b[8m.wat"
    module.write_text(HOSTILE_NAMES_WAT)
    assert main(["inspect", str(module)]) == 0
    out = capsys.readouterr().out
    assert _inert(out), out
    assert [line for line in out.splitlines() if not line.startswith("  ")] == [
        f"{tmp_path}/names\\x1b[8m.wat: abi", "imports:", "exports:", "grants needed:",
    ]  # fmt: skip
    assert "  wasi_snapshot_preview1 fd_write\\x1b[2J\\x1b]0;owned\\x07 (i32, i32, i32, i32) -> i32" in out
    assert "  evil\\x1b[31m\\x9b x\\u202ey () -> ()" in out
    assert "  g\\x1b[1m\\n  forged global" in out
    assert "  host_functions: ['kv.get\\ngrants needed:\\n  wasi: no\\n  host_functions: []\\n']" in out
    assert main(["inspect", str(module), "--json"]) == 0  # JSON was escaped already
    assert _inert(capsys.readouterr().out)


def test_lint_and_errors_escape_what_a_module_controls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.wat"
    broken.write_text("(module (func $f\x1b[2J\x1b]0;owned\x07 (unknown)))")
    manifests = [_write(tmp_path, "hostile"), tmp_path / "broken.json"]
    manifests[0].write_text(json.dumps({"name": "hostile", "module": str(tmp_path / "names.wat")}))
    (tmp_path / "names.wat").write_text(HOSTILE_NAMES_WAT)
    manifests[1].write_text(json.dumps({"name": "broken", "module": str(broken)}))
    assert main(["lint", *map(str, manifests)]) == 2
    out = capsys.readouterr().out
    assert _inert(out) and "\\x1b[2J" in out, out
    assert [line.split(": ")[1] for line in out.splitlines() if line.startswith(str(tmp_path))] == [
        "ok",
        "error",
    ]
    # run: loading fails on the unknown WASI import, and the error names it
    (tmp_path / "unknown.wat").write_text(UNKNOWN_WASI_WAT)
    (tmp_path / "unknown.json").write_text(
        json.dumps({"name": "unknown", "module": str(tmp_path / "unknown.wat")})
    )
    assert main(["run", str(tmp_path / "unknown.json"), "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert _inert(err) and "fd_write\\x1b[2J" in err, err
    assert [line for line in err.splitlines() if line.startswith("wasmbox:")] == [err.splitlines()[0]]
    assert main(["inspect", str(broken)]) == 2
    err = capsys.readouterr().err
    assert _inert(err) and "\\x1b]0;owned\\x07" in err, err


def test_run_escapes_a_python_tools_syntax_error_and_warnings(
    tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WASMBOX_CACHE_DIR", str(cache_dir))
    warns, broken = tmp_path / "warns.py", tmp_path / "broken.py"
    # an invalid escape sequence of ESC itself: CPython's SyntaxWarning quotes it
    warns.write_text(f"# {tmp_path}\ndef main():\n    return '\\\x1b[2J'\n")
    broken.write_text(f"# {tmp_path}\ndef main():\n    return '\x1b]0;owned\x07' +\n")
    for source in (warns, broken):
        (tmp_path / f"{source.stem}.json").write_text(
            json.dumps({"name": source.stem, "runtime": "python", "source": str(source)})
        )
    assert main(["run", str(tmp_path / "warns.json")]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["value"] == "\\\x1b[2J"
    assert "SyntaxWarning" in captured.err and "\\x1b" in captured.err, captured.err
    assert _inert(captured.err), captured.err
    assert main(["run", str(tmp_path / "broken.json")]) == 2
    err = capsys.readouterr().err
    assert "SyntaxError" in err and "\\x1b]0;owned\\x07" in err, err
    assert _inert(err), err


def test_inspect_and_lint_read_the_module_without_compiling_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import wasmbox._inspect

    def no_compile(*_: object) -> None:
        raise AssertionError("compiled")

    monkeypatch.setattr(wasmbox._inspect.wasmtime, "Module", no_compile)
    assert main(["inspect", wat("asks_secret"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["kind"] == "abi" and report["grants_needed"]["host_functions"] == ["secret.get"]
    assert main(["lint", str(_write(tmp_path, "echo"))]) == 0
    capsys.readouterr()
    garbage = tmp_path / "garbage.wasm"
    garbage.write_bytes(b"\0asm\x01\x00\x00\x00\x02\xff\xff\xff\xff\x0f")
    assert main(["inspect", str(garbage)]) == 2
    assert "not a valid module" in capsys.readouterr().err


def test_cache_command_shows_and_prunes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import wasmbox

    monkeypatch.delenv("WASMBOX_CACHE_MAX", raising=False)
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        box.load({"name": "echo", "module": wat("echo")})
        box.load({"name": "state", "module": wat("state")})
    assert main(["cache", "--dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert out.count("module-") == 2 and ": 2 entries, " in out and "of 2.0 GiB" in out
    assert main(["cache", "--dir", str(cache), "prune", "--to", "1B"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert not list(cache.glob("module-*"))
    assert main(["cache", "--dir", str(cache), "prune", "--to", "lots"]) == 2
    assert main(["cache", "--dir", str(tmp_path / "none")]) == 0
    assert "no cache yet" in capsys.readouterr().out


def test_inspect_reads_a_manifests_module(capsys: pytest.CaptureFixture[str], built_examples: Path) -> None:
    manifest = Path(__file__).resolve().parent.parent / "capabilities" / "word_count.toml"
    assert main(["inspect", str(manifest), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert Path(report["module"]).resolve() == built_examples / "word_count.wasm"
    assert report["manifest"] == str(manifest) and report["kind"] == "abi"
    assert main(["inspect", str(manifest)]) == 0
    assert f"manifest: {manifest}" in capsys.readouterr().out.splitlines()[1]


def test_inspect_of_an_interpreters_manifest_says_it_has_no_module(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tool.py").write_text("def main():\n    return 1\n")
    manifest = tmp_path / "tool.toml"
    manifest.write_text('name = "t"\nruntime = "python"\nsource = "tool.py"\n')
    assert main(["inspect", str(manifest)]) == 2
    assert "is a python tool's manifest: it has no module to inspect" in capsys.readouterr().err
    (tmp_path / "bad.toml").write_text("name = 3\n")
    assert main(["inspect", str(tmp_path / "bad.toml")]) == 2  # the manifest's own error
    assert "ManifestError" in capsys.readouterr().err


def test_cache_command_counts_runtimes_and_inputs_too(
    cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import wasmbox
    from wasmbox._cache import entries

    monkeypatch.delenv("WASMBOX_CACHE_MAX", raising=False)
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        runtime = box.prepare_python()
    assert main(["cache", "--dir", str(cache_dir)]) == 0
    out = capsys.readouterr().out
    on_disk = sum(os.lstat(Path(r, n)).st_size for r, _, names in os.walk(cache_dir) for n in names)
    runtime_size = sum(p.stat().st_size for p in runtime.rglob("*") if p.is_file())
    line = next(line for line in out.splitlines() if line.endswith(f"  {runtime.name}"))
    assert line.split()[:2] == _shown(runtime_size).split()
    total = out.splitlines()[-1]
    assert f": {len(entries(cache_dir))} entries, " in total
    assert total.endswith(f"; {_shown(on_disk)} in all")


def _shown(count: int) -> str:
    from wasmbox.cli import _size

    return _size(count)


def test_build_command_prebuilds_the_runtimes_it_is_given(cache_dir: Path, javascript_runtime: None) -> None:
    env = {**__import__("os").environ, "WASMBOX_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, "-m", "wasmbox", "build", "--python", "--javascript"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    ready = re.findall(
        r"^wasmbox: the (\w+) runtime is ready \(([0-9.]+) s\): (.+)$", done.stderr, re.MULTILINE
    )
    assert [name for name, _, _ in ready] == ["python", "javascript"]
    for name, _, folder in ready:
        assert Path(folder).parent == cache_dir and (Path(folder) / "runtime.wasm").is_file()
    assert f"compiled artifacts in {cache_dir}" in done.stderr
    usage = subprocess.run(
        [sys.executable, "-m", "wasmbox", "build", "--rust"], capture_output=True, text=True
    )
    assert usage.returncode == 2 and "--rust" in usage.stderr


@pytest.mark.slow
def test_build_all_includes_the_scientific_runtime(scientific_cache: Path) -> None:
    env = {**__import__("os").environ, "WASMBOX_CACHE_DIR": str(scientific_cache)}
    done = subprocess.run(
        [sys.executable, "-m", "wasmbox", "build", "--all"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert re.findall(r"^wasmbox: the (\w+) runtime is ready", done.stderr, re.MULTILINE) == [
        "python", "javascript", "scientific",
    ]  # fmt: skip
