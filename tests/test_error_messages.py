"""What a newcomer's first mistakes are told: each error names the thing and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind
from wasmbox._capabilities import wasi_files as _wasi_files
from wasmbox._inputs import InputUnavailable

from .conftest import manifest

NOT_GRANTED = (
    "host function 'secret.get' is not granted to this tool: add it to the manifest's host_functions"
)


@pytest.fixture
def secret_box(box: wasmbox.Sandbox) -> wasmbox.Sandbox:
    @box.host_function("secret.get")
    def secret_get() -> str:
        return "hunter2"

    @box.host_function("host.fn")
    def host_fn(**args: Any) -> Any:
        return args

    return box


# -- an ungranted host function ------------------------------------------------------------


def test_a_core_module_importing_an_ungranted_function_is_told_to_grant_it(
    secret_box: wasmbox.Sandbox,
) -> None:
    with pytest.raises(wasmbox.CapabilityError) as refused:
        secret_box.load({"name": "fwd", "module": manifest("forward")["module"]})  # imports host.fn
    assert "host function 'host.fn' is not granted to this tool" in str(refused.value)
    assert "add it to the manifest's host_functions" in str(refused.value)


def test_python_calling_an_ungranted_function_is_told_its_name_and_the_fix(
    secret_box: wasmbox.Sandbox,
) -> None:
    code = (
        "import wasmbox_guest\ntry:\n    wasmbox_guest.call_host('secret.get')\nexcept wasmbox_guest.HostCallError as e:\n"
        "    r = str(e)\nr"
    )
    result = secret_box.run_python(
        code, {"name": "snippet", "runtime": "python", "host_functions": ["host.fn"]}
    )
    assert result.value == NOT_GRANTED
    uncaught = secret_box.run_python("import wasmbox_guest\nwasmbox_guest.call_host('secret.get')")
    assert uncaught.error is not None and uncaught.error.kind is ErrorKind.CAPABILITY_DENIED
    assert NOT_GRANTED in uncaught.error.message


def test_javascript_calling_an_ungranted_function_is_told_its_name_and_the_fix(
    secret_box: wasmbox.Sandbox,
) -> None:
    try:
        secret_box.prepare_javascript()
    except InputUnavailable as exc:
        pytest.skip(f"the JavaScript runtime's wheel cannot be fetched: {exc}")
    code = "try { wasmbox.callHost('secret.get', {}) } catch (e) { e.message }"
    result = secret_box.run_javascript(code, {"name": "snippet", "runtime": "javascript"})
    assert result.value == NOT_GRANTED


# -- tool names ----------------------------------------------------------------------------


def test_calling_a_misspelt_tool_names_the_close_ones(box: wasmbox.Sandbox) -> None:
    box.load({**manifest("echo"), "name": "greet"})
    box.load({**manifest("echo"), "name": "grep"})
    box.load({**manifest("echo"), "name": "sum"})
    with pytest.raises(wasmbox.UnknownToolError) as unknown:
        box.call("gret")
    assert isinstance(unknown.value, KeyError)  # what a caller catching KeyError still catches
    assert str(unknown.value) == "no tool named 'gret' is loaded; did you mean 'greet' or 'grep'?"
    assert unknown.value.close == ["greet", "grep"]
    with pytest.raises(wasmbox.UnknownToolError, match="the loaded tools are: greet, grep, sum"):
        box.tool("zzz")
    assert box.call("greet", {"x": 1}).ok  # the Sandbox keeps serving


def test_loading_a_name_twice_says_how_to_replace_it(box: wasmbox.Sandbox) -> None:
    box.load(manifest("echo"))
    with pytest.raises(
        wasmbox.ManifestError, match=r"already loaded; load\(\.\.\., replace=True\) replaces it"
    ):
        box.load(manifest("echo"))
    box.load(manifest("echo"), replace=True)


# -- Python snippets -----------------------------------------------------------------------


def test_a_python_syntax_error_is_reported_at_the_snippets_own_line_and_column(box: wasmbox.Sandbox) -> None:
    result = box.run_python("x = 1\ny = [2,\n     3 +]\n")
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    message = result.error.message
    assert message.startswith('  File "<code>", line 3\n    3 +]\n       ^\nSyntaxError:'), message
    assert "ast.py" not in message and "Traceback" not in message  # no frame of the driver's parser


def test_opening_a_path_no_preopen_covers_says_so_and_nothing_of_the_host(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "exists").mkdir()
    (tmp_path / "exists" / "x.csv").write_text("secret")
    grants = {"name": "snippet", "runtime": "python", "preopens": [{"host": str(data), "guest": "/data"}]}
    messages = {}
    exists, absent = str(tmp_path / "exists" / "x.csv"), str(tmp_path / "absent" / "x.csv")  # (as long)
    for path in ("/data/missing.csv", "/work/x.csv", exists, absent):
        result = box.run_python(f"open({path!r})", grants)
        assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
        messages[path] = result.error.message
    assert "preopen" not in messages["/data/missing.csv"]  # inside a grant: a missing file is just that
    assert "wasmbox: no preopen covers '/work/x.csv'" in messages["/work/x.csv"]
    assert "the manifest's preopens" in messages["/work/x.csv"]
    # a host path that exists and one that does not read the same, but for the name asked for
    shown = {path: message.replace(path, "<path>") for path, message in messages.items()}
    assert shown[exists] == shown[absent]
    assert "secret" not in "".join(messages.values())


def _probe(box: wasmbox.Sandbox, built_examples: Path, name: str = "probe", **fields: Any) -> wasmbox.Tool:
    return box.load({"name": name, "module": str(built_examples / "fsprobe.wasm"), **fields}, replace=True)


def _covers(path: str, granted: str) -> str:
    return f"wasmbox: no preopen covers {path!r} ({granted}): grant its folder in the manifest's preopens\n"


def test_a_command_opening_a_path_no_preopen_covers_says_so_on_stderr(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("secret")  # on the host, but not granted
    preopens = [{"host": str(tmp_path / "in"), "guest": "/in"},
                {"host": str(tmp_path / "out"), "guest": "/out", "writable": True}]  # fmt: skip
    tool = _probe(box, built_examples, preopens=preopens, scratch="1MiB")
    paths = ["/data/x.csv", "/in/missing.csv", "/data/x.csv", "data/y.csv", "/etc/passwd"]
    result = tool.call(argv=["open", *paths])
    assert result.ok and result.value == {"exit_code": 0}, result
    assert result.stdout == "".join(f"{p}: No such file or directory\n" for p in paths)  # as before
    granted = "granted: /in, /out, /tmp"
    # once per path, in the order first seen; none for a file missing inside a grant
    assert result.stderr == _covers("/data/x.csv", granted) + _covers("/data/y.csv", granted) + _covers(
        "/etc/passwd", granted
    )
    assert str(tmp_path) not in result.stderr and "secret" not in result.stderr
    failing = _probe(box, built_examples, "failing", command={"fail_on_exit_code": True})
    failed = failing.call(argv=["read", "/data/x.csv"])
    assert failed.error is not None and failed.error.kind is ErrorKind.GUEST_ERROR
    assert failed.error.message == (  # the exit's message quotes stderr, the note with it
        "exited with code 1: error: No such file or directory\n"
        + _covers("/data/x.csv", "nothing is granted").strip()
    )


def test_the_note_on_ungranted_paths_is_capped(box: wasmbox.Sandbox, built_examples: Path) -> None:
    paths = [f"/data/{n}.csv" for n in range(3 * _wasi_files.MAX_NOTED)]
    result = _probe(box, built_examples).call(argv=["open", *paths, *paths])
    lines = result.stderr.splitlines(keepends=True)
    noted = [_covers(p, "nothing is granted") for p in paths[: _wasi_files.MAX_NOTED]]
    assert lines == [*noted, "wasmbox: and more paths no preopen covers\n"]


def test_the_note_on_ungranted_paths_is_the_hosts_not_counted_against_the_output_cap(
    box: wasmbox.Sandbox, built_examples: Path
) -> None:
    """The guest's own stderr fills the cap exactly; the note still follows it, whole, and the
    call is not cut (no `output_limit`)."""
    own = "error: No such file or directory\n"
    tool = _probe(box, built_examples, limits={"output": len(own)})
    result = tool.call(argv=["read", "/data/x.csv"])
    assert result.ok and result.value == {"exit_code": 1} and not result.truncated, result
    assert result.stderr == own + _covers("/data/x.csv", "nothing is granted")


def test_a_command_with_a_grant_at_root_is_unchanged(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    (tmp_path / "here.txt").write_text("here")
    hostile = box.load({"name": "hostile", "module": str(built_examples / "hostile_cmd.wasm"),
                        "preopens": [{"host": str(tmp_path), "guest": "/"}]})  # fmt: skip
    assert hostile.call(argv=["prestat"]).stdout == "3: /\n"  # no hidden root beside it
    assert hostile.call(argv=["ls", "/"]).stdout == "here.txt\n"
    missing = hostile.call(argv=["read", "/data/x.csv"])
    assert missing.stdout == "error: No such file or directory\n" and missing.stderr == ""


def test_printing_past_the_output_cap_is_output_limit_with_what_fitted(box: wasmbox.Sandbox) -> None:
    result = box.run_python('print("x" * 10_000_000)')  # the default limits
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT, result.error
    assert result.stdout == "x" * wasmbox.Limits().output


# -- a module's memory minimum over limits.memory --------------------------------------------

ZIG_DEFAULT_STACK = 16 * 1024**2  # zig cc's stack for wasm32-wasi without -z stack-size


@pytest.fixture(scope="module")
def zig_default_command(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A C command compiled with zig cc's defaults (its 16 MiB stack in the memory minimum)."""
    folder = tmp_path_factory.mktemp("zig")
    source, wasm = folder / "hello.c", folder / "hello.wasm"
    source.write_text('#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n')
    argv = [
        sys.executable,
        "-m",
        "ziglang",
        "cc",
        "-target",
        "wasm32-wasi",
        "-O2",
        "-s",
        str(source),
        "-o",
        str(wasm),
    ]
    subprocess.run(argv, check=True, capture_output=True)
    return wasm


def test_a_module_needing_more_memory_than_the_limit_is_refused_at_load_with_both_numbers(
    box: wasmbox.Sandbox, zig_default_command: Path
) -> None:
    tool = {"name": "hello", "module": str(zig_default_command), "limits": {"memory": "8MiB"}}
    with pytest.raises(wasmbox.ManifestError) as refused:
        box.load(tool)
    message = str(refused.value)
    assert message.startswith(f"{zig_default_command}: module: declares a memory minimum of "), message
    assert "above limits.memory of 8MiB (8,388,608 bytes)" in message
    assert "raise limits.memory to at least" in message and "stack-size" in message
    found = int(message.split(" (")[1].split(" bytes")[0].replace(",", ""))
    assert found > ZIG_DEFAULT_STACK  # the stack and the data above it
    # under a limit that holds it, the same module loads and runs
    result = box.load({**tool, "limits": {"memory": "64MiB"}}).call()
    assert result.ok and result.stdout == "hello\n", result


def test_lint_warns_of_a_module_needing_more_memory_than_the_limit(
    zig_default_command: Path, tmp_path: Path
) -> None:
    from wasmbox._lint import lint

    small = wasmbox.Manifest.load(
        {"name": "hello", "module": str(zig_default_command), "limits": {"memory": "8MiB"}}
    )
    warnings = [w for w in lint(small) if "memory minimum" in w]
    assert len(warnings) == 1 and "limits.memory of 8MiB" in warnings[0] and "refuses it" in warnings[0]
    roomy = wasmbox.Manifest.load(
        {"name": "hello", "module": str(zig_default_command), "limits": {"memory": "64MiB"}}
    )
    assert not [w for w in lint(roomy) if "memory minimum" in w]
