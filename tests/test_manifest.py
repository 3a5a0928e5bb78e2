"""Manifests: formats, paths, units, strictness, errors that name the file and field."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import wasmbox
from wasmbox import Manifest, ManifestError
from wasmbox._manifest import json_schema
from wasmbox._units import format_size, parse_duration, parse_size
from wasmbox.cli import main as cli

from .conftest import CAPABILITIES, wat

ECHO_TOML = """
name = "echo"
description = "Echo the args"
module = "echo.wat"
host_functions = ["kv.get"]
env = { TZ = "UTC" }
args = ["--quiet"]
[limits]
fuel = 1_000
memory = "2MiB"
timeout = "250ms"
output = "1KiB"
host_calls = 3
[[preopens]]
host = "data"
guest = "/data"
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "echo.wat").write_text(Path(wat("echo")).read_text())
    (tmp_path / "data").mkdir()
    return tmp_path


def test_toml_with_every_field(folder: Path) -> None:
    (folder / "echo.toml").write_text(ECHO_TOML)
    m = Manifest.load(folder / "echo.toml")
    assert m.module == folder / "echo.wat"  # relative to the manifest's folder
    assert m.preopens[0].host == (folder / "data").resolve()
    assert m.preopens[0].writable is False
    assert m.limits.memory == 2 * 1024 * 1024
    assert m.limits.timeout == pytest.approx(0.25)
    assert m.limits.output == 1024
    assert m.env == {"TZ": "UTC"} and m.args == ("--quiet",)


def test_json_and_dict_give_the_same_manifest(folder: Path) -> None:
    data = {"name": "echo", "module": "echo.wat", "limits": {"memory": "1MiB"}}
    (folder / "echo.json").write_text(json.dumps(data))
    from_json = Manifest.load(folder / "echo.json")
    from_dict = Manifest.load({**data, "module": str(folder / "echo.wat")})
    assert from_json == from_dict
    assert from_json.digest() == from_dict.digest()


def test_defaults_are_safe(folder: Path) -> None:
    m = Manifest.load({"name": "echo", "module": str(folder / "echo.wat")})
    assert m.preopens == () and m.env == {} and m.host_functions == () and m.args == ()
    assert 0 < m.limits.fuel < 10**9
    assert m.limits.memory <= 256 * 1024**2
    assert 0 < m.limits.timeout <= 10
    assert m.limits.output <= 1024**2
    assert m.limits.host_calls <= 1000


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"bogus": 1}, "bogus", "Extra inputs"),
        ({"limits": {"memory": "12 parsecs"}}, "limits.memory", "unknown size unit"),
        ({"limits": {"memory": "8GiB"}}, "limits.memory", "less than or equal"),
        ({"limits": {"timeout": -1}}, "limits.timeout", "greater than 0"),
        ({"limits": {"fuel": "10"}}, "limits.fuel", "valid integer"),
        ({"limits": {"cpu": 1}}, "limits.cpu", "Extra inputs"),
        ({"preopens": [{"host": "data", "guest": "../etc"}]}, "preopens.0.guest", "absolute"),
        ({"preopens": [{"host": "data", "guest": "data"}]}, "preopens.0.guest", "absolute"),
        ({"preopens": [{"host": "nope", "guest": "/d"}]}, "preopens.0", "host: not a directory"),
        ({"preopens": [{"host": "data", "guest": "/d", "writable": "yes"}]},
         "preopens.0.writable", "boolean"),
        ({"module": "missing.wasm"}, "module", "no such file"),
        ({"name": "has space"}, "name", "pattern"),
        ({"host_functions": ["kv.get", "kv.get"]}, "host_functions", "more than once"),
        ({"host_functions": ["rm -rf"]}, "host_functions.0", "pattern"),
        ({"env": {"A=B": "x"}}, "env", "invalid environment"),
        ({"input_schema": {"type": "object", "optional": True}}, "input_schema", "not JSON Schema"),
        ({"runtime": "python"}, "(manifest)", "not both"),
    ],
)  # fmt: skip
def test_malformed_manifest_names_file_and_field(
    folder: Path, patch: dict[str, object], field: str, words: str
) -> None:
    data: dict[str, object] = {"name": "echo", "module": "echo.wat", **patch}
    path = folder / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ManifestError) as raised:
        Manifest.load(path)
    message = str(raised.value)
    assert str(path) in message
    assert f": {field}: " in message
    assert words in message


def test_unreadable_and_unparsable_files(folder: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        Manifest.load(folder / "absent.toml")
    (folder / "broken.toml").write_text("name = ")
    with pytest.raises(ManifestError, match="broken.toml: not valid"):
        Manifest.load(folder / "broken.toml")
    (folder / "list.json").write_text("[1, 2]")
    with pytest.raises(ManifestError, match="table/object"):
        Manifest.load(folder / "list.json")


def test_sandbox_load_raises_manifest_error_for_bad_module(folder: Path, box: wasmbox.Sandbox) -> None:
    (folder / "junk.wasm").write_bytes(b"\0asm\x01\0\0\0garbage")
    with pytest.raises(ManifestError, match="junk.wasm: module"):
        box.load({"name": "junk", "module": str(folder / "junk.wasm")})
    with pytest.raises(ManifestError, match="exports neither"):
        box.load({"name": "no_abi", "module": wat("no_abi")})


def _until_done(fifo: Path, job: Callable[[], object]) -> BaseException | None:
    """Run `job` on a thread, and what it raised. While it runs, any reader the FIFO has is
    let go with an end of file, so a reader that blocks on it ends too (and the test with it)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            job()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while thread.is_alive():
        with contextlib.suppress(OSError):  # ENXIO: no reader has it open
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(0.01)
    return raised[0]


@pytest.mark.parametrize("what", ["manifest", "module", "source", "inspect", "directory"])
def test_files_that_are_not_regular_are_refused_without_blocking(
    folder: Path, box: wasmbox.Sandbox, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    """A FIFO where a manifest, module or source should be is refused, not read: reading one
    blocks until something writes to it. Modules and sources are swapped for the FIFO after the
    manifest was checked, as a racing process could."""
    fifo = folder / "fifo"
    if what == "directory":
        fifo.mkdir()
        with pytest.raises(ManifestError, match=r"cannot read manifest: not a regular file \(a directory\)"):
            Manifest.load(fifo)
        return
    os.mkfifo(fifo)
    if what == "manifest":
        raised = _until_done(fifo, lambda: Manifest.load(fifo))
    elif what == "inspect":
        raised = _until_done(fifo, lambda: cli(["inspect", str(fifo)]))
        assert raised is None and "not a regular file (a FIFO)" in capsys.readouterr().err
        return
    else:
        code = folder / ("tool.py" if what == "source" else "tool.wat")
        code.write_text("def main():\n    return 1\n" if what == "source" else Path(wat("echo")).read_text())
        fields = {"runtime": "python", "source": str(code)} if what == "source" else {"module": str(code)}
        loaded = Manifest.load({"name": "swapped", **fields})
        code.unlink()
        fifo.rename(code)
        raised = _until_done(code, lambda: box.load(loaded))
    assert isinstance(raised, ManifestError), raised
    assert "not a regular file (a FIFO)" in str(raised)
    assert box.load({"name": "still", "module": wat("echo")}).call({"a": 1}).unwrap() == {"a": 1}


def test_schema_file_is_current() -> None:
    on_disk = json.loads((CAPABILITIES / "manifest.schema.json").read_text())
    assert on_disk == json_schema(), "run: python -m wasmbox schema > capabilities/manifest.schema.json"


def test_bundled_manifests_follow_the_schema_keys() -> None:
    properties = set(json_schema()["properties"])
    for path in CAPABILITIES.glob("*.toml"):
        import tomllib

        assert set(tomllib.loads(path.read_text())) <= properties, path


@given(st.integers(min_value=1, max_value=2**40))
def test_sizes_round_trip(size: int) -> None:
    assert parse_size(format_size(size)) == size


@pytest.mark.parametrize(
    ("text", "seconds"), [("500ms", 0.5), ("2s", 2.0), ("2", 2.0), ("1m", 60.0), ("250us", 0.00025), (3, 3.0)]
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ms", "1 fortnight", "-1s", "nan", "1e9s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_a_fuel_limit_past_u64_is_a_manifest_error(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.ManifestError, match="limits.fuel"):
        box.load({"name": "echo", "module": wat("echo"), "limits": {"fuel": 2**64 + 5_000_000}})
