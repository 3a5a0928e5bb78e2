"""WASI grants, tried from a real C command module (fsprobe): only what the manifest names."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import wasmbox

SECRET = "top-secret-do-not-leak"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """granted/ (preopened) beside outside/ (not granted), with links from one to the other."""
    granted = tmp_path / "granted"
    outside = tmp_path / "outside"
    granted.mkdir()
    outside.mkdir()
    (granted / "inside.txt").write_text("inside\n")
    (outside / "secret.txt").write_text(SECRET)
    (granted / "sub").mkdir()
    os.symlink(outside / "secret.txt", granted / "abs_link")  # absolute target, out
    os.symlink("../outside/secret.txt", granted / "rel_link")  # relative target, out
    os.symlink(outside, granted / "dir_link")  # a directory, out
    os.symlink("inside.txt", granted / "ok_link")  # stays inside
    return tmp_path


def probe(
    box: wasmbox.Sandbox, built: Path, tree: Path, *argv: str, writable: bool = False, **fields: Any
) -> wasmbox.CallResult:
    manifest = {
        "name": "fsprobe",
        "module": str(built / "fsprobe.wasm"),
        "preopens": [{"host": str(tree / "granted"), "guest": "/data", "writable": writable}],
        **fields,
    }
    tool = box.load(manifest, replace=True)
    return tool.call(argv=list(argv))


def exit_code(result: wasmbox.CallResult) -> int:
    assert result.ok, result.error
    return int(result.value["exit_code"])


def test_reads_inside_the_grant(box: wasmbox.Sandbox, built_examples: Path, tree: Path) -> None:
    result = probe(box, built_examples, tree, "read", "/data/inside.txt")
    assert exit_code(result) == 0 and result.stdout == "inside\n"
    assert exit_code(probe(box, built_examples, tree, "read", "/data/ok_link")) == 0


@pytest.mark.parametrize(
    "path",
    [
        "/data/../outside/secret.txt",
        "/data/sub/../../outside/secret.txt",
        str(Path("/") / "etc" / "passwd"),
        "/outside/secret.txt",
        "/data/abs_link",
        "/data/rel_link",
        "/data/dir_link/secret.txt",
        "inside.txt",  # no ambient cwd either
    ],
)
def test_paths_outside_the_grant_are_refused(
    box: wasmbox.Sandbox, built_examples: Path, tree: Path, path: str
) -> None:
    result = probe(box, built_examples, tree, "read", path)
    assert exit_code(result) == 1
    assert result.stderr.startswith("error: ")
    assert SECRET not in result.stdout + result.stderr


def test_read_only_preopen_refuses_writes(
    box: wasmbox.Sandbox, built_examples: Path, tree: Path
) -> None:
    for path in ["/data/new.txt", "/data/inside.txt", "/data/sub/new.txt"]:
        result = probe(box, built_examples, tree, "write", path, "pwned")
        assert exit_code(result) == 1, path
    assert sorted(os.listdir(tree / "granted")) == sorted(
        ["inside.txt", "sub", "abs_link", "rel_link", "dir_link", "ok_link"]
    )
    assert (tree / "granted" / "inside.txt").read_text() == "inside\n"
    assert os.listdir(tree / "granted" / "sub") == []


def test_writable_preopen_writes_inside_only(
    box: wasmbox.Sandbox, built_examples: Path, tree: Path
) -> None:
    result = probe(box, built_examples, tree, "write", "/data/new.txt", "hello", writable=True)
    assert exit_code(result) == 0
    assert (tree / "granted" / "new.txt").read_text() == "hello"
    for path in ["/data/../escape.txt", "/data/abs_link", "/data/dir_link/new.txt"]:
        result = probe(box, built_examples, tree, "write", path, "pwned", writable=True)
        assert exit_code(result) == 1, path
    assert not (tree / "escape.txt").exists()
    assert (tree / "outside" / "secret.txt").read_text() == SECRET
    assert os.listdir(tree / "outside") == ["secret.txt"]


def test_no_preopen_means_no_filesystem(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load({"name": "bare", "module": str(built_examples / "fsprobe.wasm")})
    for argv in (["ls", "/"], ["ls", "."], ["read", "/etc/hostname"]):
        result = tool.call(argv=argv)
        assert result.ok and result.value == {"exit_code": 1}, argv


def test_host_env_is_invisible(
    box: wasmbox.Sandbox, built_examples: Path, tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WASMBOX_TEST_SECRET", SECRET)
    result = probe(box, built_examples, tree, "env", env={"TZ": "UTC", "LANG": "C"})
    assert exit_code(result) == 0
    assert sorted(result.stdout.splitlines()) == ["LANG=C", "TZ=UTC"]
    bare = probe(box, built_examples, tree, "env")
    assert bare.stdout == ""


def test_argv_is_name_then_manifest_args_then_call_argv(
    box: wasmbox.Sandbox, built_examples: Path, tree: Path
) -> None:
    manifest = {"name": "probe", "module": str(built_examples / "fsprobe.wasm"), "args": ["argv"]}
    result = box.load(manifest).call(argv=["one", "two words"])
    assert result.stdout.splitlines() == ["probe", "argv", "one", "two words"]


def test_stdin_and_exit_code(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load({"name": "probe", "module": str(built_examples / "fsprobe.wasm")})
    result = tool.call(argv=["cat"], stdin="line one\nline two\n")
    assert result.value == {"exit_code": 0} and result.stdout == "line one\nline two\n"
    assert tool.call(argv=["cat"]).stdout == ""  # no ambient stdin
    assert tool.call(argv=["exit", "3"]).value == {"exit_code": 3}
    assert tool.call(argv=["bogus"]).value == {"exit_code": 2}


def test_command_output_over_the_cap(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(
        {"name": "probe", "module": str(built_examples / "fsprobe.wasm"), "limits": {"output": "1KiB"}}
    )
    result = tool.call(argv=["cat"], stdin=b"x" * 10_000)
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.OUTPUT_LIMIT
    assert result.truncated and len(result.stdout) == 1024
