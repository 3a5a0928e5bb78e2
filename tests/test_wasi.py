"""WASI grants, tried from a real C command module (fsprobe): only what the manifest names;
and WASI's clock: a sleep ends at the call's deadline."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import manifest

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


def test_read_only_preopen_refuses_a_commands_writes(
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


def test_writable_preopen_writes_inside_only(box: wasmbox.Sandbox, built_examples: Path, tree: Path) -> None:
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


def test_host_env_is_invisible_to_a_command(
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


# -- WASI's clock: a sleep (poll_oneoff) ends at the call's deadline ----------------------


def test_sleep_is_cut_at_the_deadline(box: wasmbox.Sandbox) -> None:
    started = time.perf_counter()
    result = box.load(manifest("sleep", limits={"timeout": "200ms"})).call({})
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert time.perf_counter() - started < 5  # it asked for 10 s


def test_nothing_runs_after_a_sleep_cut_at_the_deadline(box: wasmbox.Sandbox) -> None:
    tool = box.load(
        manifest("security/sleep_then_write", name="sleep_then_write", limits={"timeout": "200ms"})
    )
    result = tool.call()
    assert result.error is not None and result.error.kind is ErrorKind.TIMEOUT
    assert result.stdout == ""  # the guest stopped in the sleep, before its write


def test_short_sleep_still_works(box: wasmbox.Sandbox) -> None:
    assert box.load(manifest("nap")).call({}).unwrap() == 7


def test_poll_oneoff_refuses_huge_subscription_counts(box: wasmbox.Sandbox) -> None:
    result = box.load(manifest("poll_bomb", limits={"memory": "32MiB"})).call({})
    assert result.unwrap() == 28  # EINVAL, before the deadline could cut a poll of them all
