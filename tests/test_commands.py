"""WASI command tools called with args (`[command]`), exit codes, and binary output: raw
stdout/stderr bytes, output files from /tmp, media types."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import CallResult, ErrorKind, ManifestError
from wasmbox._capabilities.scratch import read_file
from wasmbox._lint import lint

from .conftest import CAPABILITIES

ALL_BYTES = bytes(range(256)) * 4


def _probe(built: Path, command: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """A manifest for fsprobe (argv: read/write/ls/env/argv/cat/exit) with a small schema."""
    properties = {
        "format": {"type": "string", "default": "svg"},
        "files": {"type": "array", "items": {"type": "string"}},
        "opt": {"type": "string"},
        "n": {"type": "number"},
        "flag": {"type": "boolean"},
        "obj": {"type": "object"},
        "text": {"type": "string"},
        "code": {"type": "integer"},
    }
    manifest: dict[str, Any] = {
        "name": "probe",
        "module": str(built / "fsprobe.wasm"),
        "input_schema": {"type": "object", "properties": properties, "additionalProperties": False},
        **fields,
    }
    if command is not None:
        manifest["command"] = command
    return manifest


def _argv(result: CallResult) -> list[str]:
    """What fsprobe's `argv` subcommand printed after argv[0] and "argv": one argument a line."""
    assert result.ok, result.error
    lines = result.stdout.splitlines()
    assert lines[:2] == ["probe", "argv"]
    return lines[2:]


def _png(data: bytes) -> tuple[int, int, list[bytes], bytes]:
    """(width, height, rows of palette indices, palette) of an 8-bit palette PNG, every CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks: dict[bytes, bytes] = {}
    pos = 8
    while pos < len(data):
        (size,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        (crc,) = struct.unpack(">I", data[pos + 8 + size : pos + 12 + size])
        assert crc == zlib.crc32(kind + body), kind
        chunks[kind] = body
        pos += 12 + size
    assert list(chunks) == [b"IHDR", b"PLTE", b"IDAT", b"IEND"]
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 3)
    raw = zlib.decompress(chunks[b"IDAT"])
    assert len(raw) == (width + 1) * height
    rows = [raw[y * (width + 1) : (y + 1) * (width + 1)] for y in range(height)]
    assert all(row[0] == 0 for row in rows)  # filter: none
    return width, height, [row[1:] for row in rows], chunks[b"PLTE"]


# -- the mapping: args -> argv and stdin ----------------------------------------------------


def test_args_become_argv_items_one_each(box: wasmbox.Sandbox, built_examples: Path) -> None:
    command = {
        "argv": ["argv", "-T{format}", "--opt={opt}", "{{lit}}", "-f{*files}", "--", "{*files}", "n={n}"]
    }
    tool = box.load(_probe(built_examples, command))
    hostile = "a b; --evil $(x) '\"{opt} \t"  # (fsprobe prints one item a line: no newline here)
    result = tool.call({"format": "png", "opt": hostile, "files": ["-x", "y z"], "n": 1.5})
    assert _argv(result) == [
        "-Tpng", f"--opt={hostile}", "{lit}", "-f-x", "-fy z", "--", "-x", "y z", "n=1.5"
    ]  # fmt: skip
    # Missing args drop their items; a schema default fills in; an empty list gives no items.
    assert _argv(tool.call({"files": []})) == ["-Tsvg", "{lit}", "--"]


def test_values_render_as_strings_or_compact_json(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(_probe(built_examples, {"argv": ["argv", "{n}", "{flag}", "{obj}", "{code}"]}))
    result = tool.call({"n": 3, "flag": True, "obj": {"a": [1, "é"]}, "code": -2})
    assert _argv(result) == ["3", "true", '{"a":[1,"é"]}', "-2"]


def test_stdin_template(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(_probe(built_examples, {"argv": ["cat"], "stdin": "graph {{ {text} }}\n"}))
    assert tool.call({"text": "a -> b"}).stdout == "graph { a -> b }\n"
    assert tool.call({}).stdout == ""  # its arg is missing: no stdin at all


def test_mapped_tools_take_args_only(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load(_probe(built_examples, {"argv": ["argv", "{opt}"]}))
    for kwargs in ({"argv": ["x"]}, {"stdin": b"x"}):
        result = tool.call({}, **kwargs)
        assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
        assert "from args" in result.error.message
    result = tool.call({"opt": 3})  # checked against input_schema first
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    result = tool.call({"opt": "a\0b"})
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert "NUL" in result.error.message


def test_unmapped_command_refuses_args(box: wasmbox.Sandbox, built_examples: Path) -> None:
    """Args were silently dropped for a command tool without a mapping."""
    tool = box.load({"name": "probe", "module": str(built_examples / "fsprobe.wasm")})
    result = tool.call({"path": "/data/x"})
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert _argv(tool.call(argv=["argv", "-V"])) == ["-V"]  # argv/stdin keywords keep working


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ({"argv": ["{nope}"]}, "{nope} is not a property"),
        ({"stdin": "{nope}"}, "{nope} is not a property"),
        ({"argv": ["{"]}, "unmatched '{'"),
        ({"argv": ["a}b"]}, "unmatched '}'"),
        ({"argv": ["{opt"]}, "unmatched '{'"),
        ({"argv": ["{*opt}"]}, 'type "array"'),
        ({"argv": ["{*files}{*files}"]}, "at most one"),
        ({"stdin": "{*files}"}, "not in stdin"),
        ({"outputs": ["/tmp/x"]}, "need `scratch`"),
        ({"outputs": ["/etc/passwd"]}, "under /tmp"),
        ({"outputs": ["/tmp/../etc/passwd"]}, "under /tmp"),
        ({"outputs": ["/tmp"]}, "under /tmp"),
        ({"stdout_media_type": "png"}, "pattern"),
        ({"exit_codes": "x"}, "Extra inputs"),
    ],
)
def test_bad_command_tables_are_refused_at_load(
    built_examples: Path, command: dict[str, Any], words: str
) -> None:
    with pytest.raises(ManifestError, match="command") as info:
        wasmbox.Manifest.load(_probe(built_examples, command))
    assert words in str(info.value)


def test_templates_need_an_input_schema_with_properties(built_examples: Path) -> None:
    manifest = {"name": "p", "module": str(built_examples / "fsprobe.wasm"), "command": {"argv": ["x"]}}
    with pytest.raises(ManifestError, match="input_schema"):
        wasmbox.Manifest.load(manifest)


def test_command_table_only_for_command_modules(box: wasmbox.Sandbox, built_examples: Path) -> None:
    reactor = {"name": "wc", "module": str(built_examples / "word_count.wasm"), "command": {}}
    with pytest.raises(ManifestError, match="WASI command modules"):
        box.load(reactor)
    with pytest.raises(ManifestError, match="not Python tools"):
        wasmbox.Manifest.load({"name": "py", "runtime": "python", "command": {}})


# -- exit codes -----------------------------------------------------------------------------


def test_nonzero_exit_is_a_value_unless_the_manifest_says_fail(
    box: wasmbox.Sandbox, built_examples: Path, tmp_path: Path
) -> None:
    plain = box.load({"name": "plain", "module": str(built_examples / "fsprobe.wasm")})
    assert plain.call(argv=["exit", "3"]).value == {"exit_code": 3}
    failing = box.load(
        {
            "name": "failing",
            "module": str(built_examples / "fsprobe.wasm"),
            "command": {"fail_on_exit_code": True},
        }
    )
    result = failing.call(argv=["exit", "3"])
    assert not result.ok and result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert result.error.message == "exited with code 3"
    (tmp_path / "in").mkdir()
    failing = box.load(
        {
            "name": "failing",
            "module": str(built_examples / "fsprobe.wasm"),
            "command": {"fail_on_exit_code": True},
            "preopens": [{"host": str(tmp_path / "in"), "guest": "/in"}],
        },
        replace=True,
    )
    result = failing.call(argv=["read", "/in/nowhere"])
    assert result.error is not None and result.error.message == (
        "exited with code 1: error: No such file or directory"
    )  # stderr's tail says why
    assert result.stderr == "error: No such file or directory\n"
    assert failing.call(argv=["argv"]).value == {"exit_code": 0}


# -- binary output --------------------------------------------------------------------------


def test_binary_stdout_arrives_intact(box: wasmbox.Sandbox, built_examples: Path) -> None:
    tool = box.load({"name": "cat", "module": str(built_examples / "fsprobe.wasm"), "args": ["cat"]})
    result = tool.call(stdin=ALL_BYTES)
    assert result.stdout_bytes == ALL_BYTES  # the text view alone lost it:
    assert result.stdout == ALL_BYTES.decode("utf-8", "replace") and "\ufffd" in result.stdout
    # JSON carries the bytes as base64, and reads them back.
    dumped = result.model_dump(mode="json")
    assert isinstance(dumped["stdout_bytes"], str)
    assert CallResult.model_validate_json(result.model_dump_json()) == result
    text = tool.call(stdin="naïve ✓\n".encode())
    assert text.stdout == "naïve ✓\n" and text.stdout_bytes is None and text.media_types == {}
    assert "stdout_bytes" in text.model_dump(mode="json")  # (as null)


def test_stdout_media_type_is_sniffed_or_declared(box: wasmbox.Sandbox, built_examples: Path) -> None:
    module = str(built_examples / "fsprobe.wasm")
    tool = box.load({"name": "cat", "module": module, "args": ["cat"]})
    png = b"\x89PNG\r\n\x1a\n" + bytes(20)
    assert tool.call(stdin=png).media_types == {"stdout": "image/png"}
    assert tool.call(stdin=b"GIF89a...").media_types == {"stdout": "image/gif"}
    assert tool.call(stdin=b'<?xml version="1.0"?>\n<svg/>').media_types == {"stdout": "image/svg+xml"}
    declared = box.load(
        {"name": "cat2", "module": module, "args": ["cat"], "command": {"stdout_media_type": "text/csv"}}
    )
    assert declared.call(stdin=b"a,b\n").media_types == {"stdout": "text/csv"}


def test_output_files_are_returned(box: wasmbox.Sandbox, built_examples: Path) -> None:
    command = {"argv": ["write", "/tmp/{opt}", "{text}"], "outputs": ["/tmp/a.txt", {"path": "/tmp/b.bin"}]}
    tool = box.load(_probe(built_examples, command, scratch="1MiB"))
    result = tool.call({"opt": "a.txt", "text": "hello"})
    assert result.ok and result.files == {"/tmp/a.txt": b"hello"}  # b.bin was not written
    assert result.media_types == {}
    assert CallResult.model_validate_json(result.model_dump_json()).files == {"/tmp/a.txt": b"hello"}


def test_output_files_count_against_the_output_cap(box: wasmbox.Sandbox, built_examples: Path) -> None:
    command = {"argv": ["fill", "/tmp/big", "{code}"], "outputs": ["/tmp/big"]}
    tool = box.load(_probe(built_examples, command, scratch="1MiB", limits={"output": "4KiB"}))
    assert tool.call({"code": 4096}).files == {"/tmp/big": b"x" * 4096}
    result = tool.call({"code": 4097})
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT
    assert "output files exceed the 4KiB output cap" in result.error.message and result.files == {}


def test_failed_calls_return_no_files(box: wasmbox.Sandbox, built_examples: Path) -> None:
    command = {"argv": ["write", "/tmp/a", "{text}"], "outputs": ["/tmp/a"], "fail_on_exit_code": True}
    tool = box.load(_probe(built_examples, command, scratch="1MiB", limits={"output": "16"}))
    result = tool.call({"text": "x" * 17})  # written, then over the cap
    assert result.error is not None and result.error.kind is ErrorKind.OUTPUT_LIMIT and result.files == {}


# -- the bundled bar_chart tool -------------------------------------------------------------


@pytest.fixture
def bar_chart(box: wasmbox.Sandbox, built_examples: Path) -> wasmbox.Tool:
    return box.load(CAPABILITIES / "bar_chart.toml")


def test_bar_chart_png_from_a_models_args(bar_chart: wasmbox.Tool) -> None:
    spec = bar_chart.spec()
    assert spec["parameters"]["required"] == ["values"]  # the model sees the args, not argv
    args = json.loads('{"values": [3, -1.5, 2], "width": 100, "height": 80}')  # as a model sends them
    result = bar_chart.call(args)
    assert result.ok, result.error
    assert result.stdout == "wrote /tmp/chart.png (png, 100x80, 3 bars)\n"
    assert result.media_types == {"/tmp/chart.png": "image/png"}
    width, height, rows, palette = _png(result.files["/tmp/chart.png"])
    assert (width, height) == (100, 80)
    blue, red = palette.index(bytes([0x4E, 0x79, 0xA7])) // 3, palette.index(bytes([0xE1, 0x57, 0x59])) // 3
    column = [row[25] for row in rows]  # through the first bar (3): blue above the zero line
    assert column.count(blue) > 30 and red not in column
    column = [row[50] for row in rows]  # the second (-1.5): red below it
    assert column.count(red) > 10 and blue not in column
    top_of_first = column_top = next(y for y, row in enumerate(rows) if row[25] == blue)
    top_of_third = next(y for y, row in enumerate(rows) if row[83] == blue)
    assert top_of_first < top_of_third  # 3 is taller than 2
    assert column_top >= 12  # the margin


def test_bar_chart_svg_escapes_text(bar_chart: wasmbox.Tool) -> None:
    result = bar_chart.call({"values": [1, 2], "labels": ["<a>", "b & c"], "title": '"T"', "format": "svg"})
    assert result.ok, result.error
    svg = result.files["/tmp/chart.svg"].decode()
    assert result.media_types == {"/tmp/chart.svg": "image/svg+xml"}
    assert svg.startswith("<svg ") and svg.endswith("</svg>\n")
    assert "&lt;a&gt;" in svg and "b &amp; c" in svg and "&quot;T&quot;" in svg and "<a>" not in svg
    assert svg.count("<rect ") == 3  # the background and two bars


def test_bar_chart_reports_bad_args_as_guest_errors(bar_chart: wasmbox.Tool) -> None:
    result = bar_chart.call({"values": [1], "labels": ["a", "b"]})
    assert result.error is not None and result.error.kind is ErrorKind.GUEST_ERROR
    assert result.error.message == "exited with code 2: bar_chart: more labels than values"
    result = bar_chart.call({"values": []})  # minItems, checked before the guest runs
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS


def test_bar_chart_large_png_fits_its_limits(bar_chart: wasmbox.Tool) -> None:
    result = bar_chart.call({"values": list(range(-128, 128)), "width": 1024, "height": 1024})
    assert result.ok, result.error
    assert _png(result.files["/tmp/chart.png"])[:2] == (1024, 1024)


def test_output_files_are_read_without_following_links(tmp_path: Path) -> None:
    """`command.outputs` are read from the call's scratch directory only: a symlink (to a file or
    on the way), a FIFO (which would block) or a directory is left out, never followed."""
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    root = tmp_path / "scratch"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "ok.txt").write_text("fine")
    (root / "link.txt").symlink_to(secret)
    (root / "dirlink").symlink_to(tmp_path)
    os.mkfifo(root / "fifo")
    assert read_file(root, "sub/ok.txt", 100) == b"fine"
    assert read_file(root, "sub/ok.txt", 2) == b"fin"  # at most cap + 1 bytes are read
    for name in ("link.txt", "dirlink/secret.txt", "fifo", "sub", "missing", "sub/ok.txt/x"):
        assert read_file(root, name, 100) is None, name


def test_lint_warns_about_items_a_dash_could_turn_into_options(built_examples: Path) -> None:
    def warnings(*argv: str) -> list[str]:
        return [
            w
            for w in lint(wasmbox.Manifest.load(_probe(built_examples, {"argv": list(argv)})))
            if "argv" in w
        ]

    assert warnings("{opt}") and warnings("{*files}") and warnings("{n}")
    assert warnings("--opt={opt}", "-T{format}", "{flag}", "--", "{opt}", "{*files}") == []
    assert lint(wasmbox.Manifest.load(CAPABILITIES / "bar_chart.toml")) == []


BINARY_STDERR_WAT = r"""
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "\10\00\00\00\06\00\00\00")  ;; one iovec: 6 bytes at 16
  (data (i32.const 16) "\ff\fe\00bin")
  (func (export "_start") (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))))
"""


def test_binary_stderr_arrives_intact(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    module = tmp_path / "binary_stderr.wat"
    module.write_text(BINARY_STDERR_WAT)
    result = box.load({"name": "binary_stderr", "module": str(module)}).call()
    assert result.ok and result.stderr_bytes == b"\xff\xfe\x00bin" and result.stdout_bytes is None
    assert result.stderr == "\ufffd\ufffd\x00bin"
