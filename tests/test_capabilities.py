"""Grants are checked at load: a module's imports must be WASI or granted host functions."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import wasmbox

from .conftest import CAPABILITIES, manifest


def test_ungranted_host_function_is_refused_at_load(box: wasmbox.Sandbox) -> None:
    box.register_host_function("secret.get", lambda: "s3cr3t")
    with pytest.raises(wasmbox.CapabilityError, match="'secret.get'.*not granted"):
        box.load(manifest("asks_secret"))
    # granted, it loads
    tool = box.load(manifest("asks_secret", host_functions=["secret.get"]))
    assert tool.info.host_functions == ("secret.get",)


def test_foreign_import_module_is_refused(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.CapabilityError, match="'env' 'system'"):
        box.load(manifest("foreign_import"))


def test_granting_an_unregistered_host_function_is_refused(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.CapabilityError, match="not registered"):
        box.load(manifest("echo", host_functions=["kv.get"]))


def test_granted_but_unused_functions_are_allowed(box: wasmbox.Sandbox) -> None:
    box.register_host_function("kv.get", lambda key: None)
    tool = box.load(manifest("echo", host_functions=["kv.get"]))
    assert tool.info.host_functions == ()
    assert tool.call({"x": 1}).unwrap() == {"x": 1}


def test_host_function_names_are_checked(box: wasmbox.Sandbox) -> None:
    with pytest.raises(ValueError):
        box.register_host_function("not a name", lambda: None)
    box.register_host_function("a.b", lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        box.register_host_function("a.b", lambda: None)


@pytest.mark.parametrize(
    ("module", "words"),
    [
        ("multi_result", "exports neither"),
        ("bad_initialize", "_initialize"),
        ("command_host_no_alloc", "does not export memory and wasmbox_alloc"),
        ("no_abi", "exports neither"),
    ],
)
def test_abi_exports_are_type_checked_at_load(box: wasmbox.Sandbox, module: str, words: str) -> None:
    box.register_host_function("host.fn", lambda: 1)
    with pytest.raises(wasmbox.ManifestError, match=words):
        box.load(manifest(module, host_functions=["host.fn"]))


def test_command_module_may_call_granted_host_functions(box: wasmbox.Sandbox) -> None:
    calls = []
    box.register_host_function("host.fn", lambda: calls.append(1))
    result = box.load(manifest("command_host", host_functions=["host.fn"])).call()
    assert result.value == {"exit_code": 0}
    assert calls == [1] and [r.verdict for r in result.host_calls] == ["ok"]


def test_tables_and_initial_memory_count_against_the_limits(box: wasmbox.Sandbox) -> None:
    # the pooling allocator refuses a 10M-entry table at load; a declared memory minimum over
    # limits.memory is refused at load too, before the compile's artifact is kept
    with pytest.raises(wasmbox.ManifestError, match="exceeds the limit"):
        box.load(manifest("big_table", limits={"memory": "64MiB"}))
    with pytest.raises(
        wasmbox.ManifestError, match=r"memory minimum of 512MiB .* above limits.memory of 64MiB"
    ):
        box.load(manifest("big_memory", limits={"memory": "64MiB"}))


def test_big_table_without_pooling_fails_at_call(cache_dir: Path) -> None:
    settings = wasmbox.EngineSettings(pooling=False)
    with wasmbox.Sandbox(cache_dir=cache_dir, settings=settings) as box:
        result = box.load(manifest("big_table")).call({})
        assert result.error is not None and result.error.kind is wasmbox.ErrorKind.MEMORY_LIMIT


def test_host_function_may_call_another_tool(box: wasmbox.Sandbox) -> None:
    echo = box.load(manifest("echo"))

    @box.host_function("host.fn")
    def nested(**args: object) -> object:
        return echo.call(args).unwrap()

    tool = box.load(manifest("forward_loop", host_functions=["host.fn"], limits={"host_calls": 1000}))
    result = tool.call({"n": 7})
    assert result.unwrap() == {"n": 7}
    assert len(result.host_calls) == 1000


def test_no_noise_at_interpreter_exit(built_examples: Path) -> None:
    """Wasmtime's threads must not call back into a finalizing interpreter.

    With wasmtime-py's `stdout_custom`, a WASI call that touched a preopen made a Wasmtime
    worker thread run a Python finalizer at exit: "panic in a function that cannot unwind".
    """
    manifest = CAPABILITIES / "fsprobe.toml"
    script = (
        "import wasmbox\n"
        "box = wasmbox.Sandbox(cache_dir=None)\n"
        f"tool = box.load({str(manifest)!r})\n"
        "print(tool.call(argv=['ls', '/data']).stdout, end='')\n"
    )
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert out.returncode == 0 and "sample.txt\n" in out.stdout
        assert out.stderr == ""


def _big(tmp_path: Path, module: str, size: int = 9 * 1024**2) -> str:
    """The WAT module `module` as a binary of `size` bytes and more (a custom section pads it)."""
    import wasmtime

    from wasmbox._inspect import read_wasm

    from .conftest import wat

    payload = b"\0" * size
    name = b"\x07padding"
    body = name + payload
    length, leb = len(body), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        leb.append(byte | (0x80 if length else 0))
        if not length:
            break
    path = tmp_path / f"big_{module}.wasm"
    path.write_bytes(read_wasm(Path(wat(module))) + b"\0" + bytes(leb) + body)
    assert wasmtime.Module.validate(wasmtime.Engine(), path.read_bytes()) is None
    return str(path)


@pytest.mark.parametrize(
    ("module", "error", "match"),
    [
        ("asks_secret", wasmbox.CapabilityError, "not granted"),
        ("foreign_import", wasmbox.CapabilityError, "'env' 'system'"),
        ("no_abi", wasmbox.ManifestError, "exports neither"),
    ],
)
def test_a_big_module_that_will_be_refused_is_refused_before_compiling(
    tmp_path: Path, module: str, error: type[Exception], match: str
) -> None:
    messages: list[str] = []
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache, progress=messages.append) as box:
        with pytest.raises(error, match=match):
            box.load({"name": module, "module": _big(tmp_path, module)})
        assert box.cache_stats.compiles == 0 and messages == []  # no compile began
        assert not list(cache.glob("module-*"))  # and nothing was stored


def test_a_big_modules_compile_is_announced(tmp_path: Path) -> None:
    messages: list[str] = []
    with wasmbox.Sandbox(cache_dir=tmp_path / "cache", progress=messages.append) as box:
        box.load({"name": "echo", "module": _big(tmp_path, "echo")})
        assert box.call("echo", {"a": 1}).unwrap() == {"a": 1}
        messages[:] = [m for m in messages if not m.startswith("still ")]  # a tick, on a slow machine
        assert len(messages) == 2
        assert re.fullmatch(
            r"compiling big_echo\.wasm \(9 MiB, once per cache; about \d+ s\) \.\.\.", messages[0]
        )
        assert re.fullmatch(r"compiled big_echo\.wasm in [0-9.]+ s", messages[1])
    with wasmbox.Sandbox(cache_dir=tmp_path / "cache", progress=messages.append) as box:
        box.load({"name": "echo", "module": _big(tmp_path, "echo")})
        assert len(messages) == 2  # a cache hit compiles nothing, and says nothing


def test_a_module_whose_reading_disagrees_with_wasmtime_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # defence in depth for the pre-compile reader: were it to describe a module otherwise than
    # Wasmtime does (here: it is made to claim no_abi has the ABI's exports), load refuses it
    import wasmbox._sandbox
    from wasmbox._inspect import read_module_info, read_wasm

    from .conftest import wat

    echo = read_module_info(read_wasm(Path(wat("echo"))), "echo")
    monkeypatch.setattr(wasmbox._sandbox, "read_module_info", lambda wasm, origin: echo)
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        with pytest.raises(wasmbox.ManifestError, match="differ from Wasmtime's"):
            box.load(manifest("no_abi"))
        assert not list(cache.glob("module-*"))


def test_an_import_wasi_does_not_have_is_refused_at_load(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.CapabilityError, match="no_such_fn"):
        box.load(manifest("unknown_wasi"))
