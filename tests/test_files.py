"""Files into and out of Python and JavaScript calls: a manifest's `inputs` (written under
/tmp/in before the guest starts; names and sizes checked) and `outputs` (paths and globs under
/tmp, in `CallResult.files`); a value of image bytes sent as an image; a session's files.
The images are checked where they arrive: Anthropic and OpenAI Responses through the real SDK
clients over a mock HTTP transport, MCP through the real client."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import ErrorKind

from .conftest import WAT

CI = {"name": "ci", "runtime": "python", "scratch": "4MiB", "inputs": {"size": "64KiB", "count": 8},
      "outputs": ["/tmp/out/*", "/tmp/deep/**/*.txt"]}  # fmt: skip
JS = {**CI, "name": "cj", "runtime": "javascript"}
# A real 1x1 PNG, made in the guest from the stdlib (zlib, struct): what a chart library writes.
MAKE_PNG = """
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 2, 0, 0, 0)) \\
    + chunk(b'IDAT', zlib.compress(b'\\x00\\xff\\x00\\x00')) + chunk(b'IEND', b'')
"""


def test_python_reads_its_inputs_and_cannot_change_them(box: wasmbox.Sandbox) -> None:
    code = (
        "import csv, os\nrows = list(csv.reader(open('/tmp/in/data.csv')))\n"
        "try:\n    open('/tmp/in/data.csv', 'w')\n    changed = 'changed'\nexcept OSError as e:\n"
        "    changed = type(e).__name__\n[rows, open('/tmp/in/raw/b.bin', 'rb').read().hex(), changed]"
    )
    files = {"data.csv": "a,b\nx,1\n", "/tmp/in/raw/b.bin": b"\x00\xff"}
    result = box.run_python(code, CI, files=files)
    assert result.value == [[["a", "b"], ["x", "1"]], "00ff", "PermissionError"], result.error
    assert (
        box.run_python("import os\nos.path.exists('/tmp/in/data.csv')", CI).value is False
    )  # the call's own


def test_writable_inputs_are_the_guests_and_count_against_the_scratch_cap(box: wasmbox.Sandbox) -> None:
    grants = {**CI, "scratch": "64KiB", "inputs": {"size": "64KiB", "writable": True}}
    changed = box.run_python("open('/tmp/in/a.txt', 'a').write('!')\nopen('/tmp/in/a.txt').read()", grants,
                             files={"a.txt": "hi"})  # fmt: skip
    assert changed.value == "hi!", changed.error
    over = box.run_python("1", grants, files={"big": b"x" * 63_000})  # with the folder's own entries
    assert over.error is not None and over.error.kind is ErrorKind.OUTPUT_LIMIT, over
    with pytest.raises(wasmbox.ManifestError, match="scratch` must be at least inputs.size"):
        box.run_python("1", {**grants, "inputs": {"size": "1MiB", "writable": True}})


def test_outputs_come_back_by_path_and_glob_with_their_media_types(box: wasmbox.Sandbox) -> None:
    code = MAKE_PNG + (
        "import os\nfor d in ('/tmp/out', '/tmp/deep/a/b', '/tmp/other'):\n    os.makedirs(d)\n"
        "open('/tmp/out/chart.png', 'wb').write(png)\nopen('/tmp/out/sum.csv', 'w').write('s\\n3\\n')\n"
        "open('/tmp/deep/a/b/n.txt', 'w').write('deep')\nopen('/tmp/deep/skip.bin', 'w').write('no')\n"
        "open('/tmp/other/x.txt', 'w').write('no')\n1"
    )
    result = box.run_python(code, CI)
    assert result.ok, result.error
    assert sorted(result.files) == ["/tmp/deep/a/b/n.txt", "/tmp/out/chart.png", "/tmp/out/sum.csv"]
    assert (
        result.files["/tmp/out/chart.png"].startswith(b"\x89PNG")
        and result.files["/tmp/deep/a/b/n.txt"] == b"deep"
    )
    assert result.media_types == {"/tmp/out/chart.png": "image/png"}
    failed = box.run_python("import os\nos.makedirs('/tmp/out')\nopen('/tmp/out/a', 'w').write('x')\n1/0", CI)
    assert failed.error is not None and failed.files == {}  # a failed call returns none
    capped = {**CI, "limits": {"output": "8KiB"}}
    big = box.run_python(
        "import os\nos.makedirs('/tmp/out')\nopen('/tmp/out/a', 'w').write('x' * 9000)", capped
    )
    assert big.error is not None and big.error.kind is ErrorKind.OUTPUT_LIMIT
    assert "output files exceed the 8KiB output cap" in big.error.message


def test_the_outputs_walk_follows_no_link(tmp_path: Path) -> None:
    """Links a guest could not make (both runtimes refuse symlinks) but a host folder may hold."""
    from wasmbox._capabilities import scratch

    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_text("secret")
    root = tmp_path / "call"
    (root / "out").mkdir(parents=True)
    (root / "out" / "a.txt").write_text("a")
    (root / "out" / "file-link.txt").symlink_to(outside / "secret.txt")
    (root / "out" / "dir-link").symlink_to(outside)
    found = scratch.matching(root, ("/tmp/**/*",))
    assert found == ["/tmp/out/a.txt"]
    box_scratch = scratch.CallScratch(root, 1 << 20)
    assert box_scratch.read("/tmp/out/file-link.txt", 100) is None
    assert box_scratch.listing() == {"/tmp/out/a.txt": 1}


def test_javascript_snippets_and_tools_take_files_too(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    box.prepare_javascript()
    code = (
        "os.mkdir('/tmp/out'); const f = std.open('/tmp/out/up.txt', 'w');"
        "f.puts(std.loadFile('/tmp/in/a.txt').toUpperCase()); f.close(); std.open('/tmp/in/a.txt', 'w') === null"
    )
    result = box.run_javascript(code, JS, files={"a.txt": "hello"})
    assert result.value is True and result.files == {"/tmp/out/up.txt": b"HELLO"}, result.error
    source = tmp_path / "count.js"
    source.write_text("function main({name}) { return std.loadFile('/tmp/in/' + name).split('\\n').length; }")
    tool = box.load({**JS, "name": "count", "source": str(source), "outputs": []})
    assert tool.call({"name": "t.txt"}, files={"t.txt": "a\nb\nc"}).value == 3


def test_a_python_tool_takes_files(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "size.py"
    source.write_text(
        "import os\n\ndef main(name: str) -> int:\n    return os.path.getsize('/tmp/in/' + name)\n"
    )
    tool = box.load({**CI, "name": "size", "source": str(source), "outputs": []})
    assert tool.call({"name": "x"}, files={"x": b"12345"}).value == 5
    result = asyncio.run(tool.acall({"name": "x"}, files={"x": b"1"}))
    assert result.value == 1


HOSTILE_NAMES = [
    ("dotdot", "../escape", "'..', '.' and empty parts are refused"),
    ("dotdot-inside", "a/../../escape", "'..', '.' and empty parts are refused"),
    ("dot", "./a", "'..', '.' and empty parts are refused"),
    ("empty-part", "a//b", "'..', '.' and empty parts are refused"),
    ("trailing-slash", "a/", "'..', '.' and empty parts are refused"),
    ("absolute-outside", "/etc/passwd", "an absolute path must be under /tmp/in"),
    ("absolute-scratch", "/tmp/x", "an absolute path must be under /tmp/in"),
    ("absolute-prefix", "/tmp/inx/a", "an absolute path must be under /tmp/in"),
    ("the-folder-itself", "/tmp/in/", "an empty name"),
    ("nul", "a\0b", "a NUL byte"),
    ("empty", "", "an empty name"),
    ("long-part", "x" * 256, "a part longer than 255 bytes"),
    ("long-path", "/".join(["y" * 200] * 6), "a path longer than 1024 bytes"),
    ("deep", "/".join("d" * 17 + "f"), "more than 16 folders deep"),
    ("surrogate", "a\ud800", "a lone surrogate"),
]


@pytest.mark.parametrize(("name", "expected"), [pytest.param(*row[1:], id=row[0]) for row in HOSTILE_NAMES])
def test_hostile_input_names_are_refused_naming_the_file(
    box: wasmbox.Sandbox, name: str, expected: str
) -> None:
    result = box.run_python("1", CI, files={name: b"x"})
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert expected in result.error.message and "input file" in result.error.message


@pytest.mark.parametrize(
    ("files", "grants", "expected"),
    [
        ({"a": b"x" * (64 * 1024 + 1)}, CI, "more than the 64KiB a call may bring (inputs.size)"),
        ({"a": b"x" * 40_000, "b": b"y" * 40_000}, CI, "(inputs.size)"),
        ({f"f{i}": b"" for i in range(9)}, CI, "9 files, more than the 8 a call may bring (inputs.count)"),
        ({"a": b"", "a/b": b""}, CI, "input file 'a' is also the folder of 'a/b'"),
        ({"a": b"", "/tmp/in/a": b""}, CI, "is given twice"),
        ({"a": 3}, CI, "its content must be bytes or str, got int"),
        ({1: b""}, CI, "an input file's name must be a str"),
        ([("a", b"")], CI, "files must be a mapping"),
        ({"a": b""}, None, "its manifest has no `inputs`"),
    ],
    ids=["one-too-big", "together-too-big", "too-many", "file-and-folder", "twice", "content", "name-type",
         "not-a-mapping", "no-inputs"],
)  # fmt: skip
def test_input_sizes_counts_and_types_are_checked(
    box: wasmbox.Sandbox, files: Any, grants: dict[str, Any] | None, expected: str
) -> None:
    result = box.run_python("1", grants, files=files)
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert expected in result.error.message, result.error.message


def test_files_are_refused_for_other_tools_and_manifests_are_checked(box: wasmbox.Sandbox) -> None:
    echo = box.load({"name": "echo", "module": str(WAT / "echo.wat")})
    refused = echo.call({"n": 1}, files={"a": b""})
    assert refused.error is not None and "files are for Python and JavaScript calls" in refused.error.message
    with pytest.raises(wasmbox.ManifestError, match="they need `scratch`"):
        wasmbox.Manifest.load({"name": "x", "runtime": "python", "inputs": {"size": "1KiB"}})
    with pytest.raises(wasmbox.ManifestError, match="must be a path or glob under /tmp"):
        wasmbox.Manifest.load({"name": "x", "runtime": "python", "scratch": "1MiB", "outputs": ["/etc/*"]})
    with pytest.raises(wasmbox.ManifestError, match="`outputs` are for Python and JavaScript calls"):
        wasmbox.Manifest.load(
            {"name": "x", "module": str(WAT / "echo.wat"), "scratch": "1MiB", "outputs": ["/tmp/a"]}
        )


def test_a_session_keeps_its_files_and_lists_and_reads_them(box: wasmbox.Sandbox) -> None:
    for session in (box.session(CI), box.session(JS, runtime="javascript")):
        first = session.run("1", files={"a.txt": "one"})
        assert first.ok, first.error
        if session.runtime == "python":
            made = session.run(
                "import os\nos.makedirs('/tmp/out')\nopen('/tmp/out/r.txt', 'w').write(open('/tmp/in/a.txt').read() * 2)"
            )
        else:
            made = session.run(
                "os.mkdir('/tmp/out'); const g = std.open('/tmp/out/r.txt', 'w'); g.puts(std.loadFile('/tmp/in/a.txt').repeat(2)); g.close()"
            )
        assert made.ok and made.files == {"/tmp/out/r.txt": b"oneone"}, made.error
        assert session.files() == {"/tmp/out/r.txt": 6}
        assert session.read("/tmp/out/r.txt") == b"oneone"
        for missing in ("/tmp/none", "/tmp/../etc/passwd", "/etc/passwd", "/tmp/out"):
            with pytest.raises(FileNotFoundError):
                session.read(missing)
        again = session.run("1", files={"a.txt": "two"})  # replaced for the next runs
        assert again.ok
        bad = session.run("1", files={"../x": b""})
        assert bad.error is not None and bad.error.kind is ErrorKind.INVALID_ARGUMENTS and not session.closed
        session.close()
        with pytest.raises(wasmbox.SessionEndedError):
            session.files()


# -- images to the models ---------------------------------------------------------------------

httpx = pytest.importorskip("httpx")
PNG_CODE = MAKE_PNG + "import os\nos.makedirs('/tmp/out')\nopen('/tmp/out/chart.png', 'wb').write(png)\npng"


class FakeModel:
    """An HTTP handler that records each request body and replies with the next scripted one."""

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: Any) -> Any:
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, json=self.replies.pop(0))


def _made_png(box: wasmbox.Sandbox) -> bytes:
    png = box.run_python(MAKE_PNG + "png").value
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG")
    return png


def test_anthropic_gets_the_value_and_the_output_file_as_image_blocks(box: wasmbox.Sandbox) -> None:
    anthropic = pytest.importorskip("anthropic")
    call = {"type": "tool_use", "id": "t1", "name": "run_python", "input": {"code": PNG_CODE}}
    message = {"id": "m1", "type": "message", "role": "assistant", "model": "claude-test", "content": [call],
               "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
    model = FakeModel(
        [message, {**message, "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}]
    )
    client = anthropic.Anthropic(api_key="sk-ant-test", base_url="http://model.test",
                                 http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    messages: list[Any] = [{"role": "user", "content": "chart"}]
    response = client.messages.create(model="claude-test", max_tokens=10, messages=messages)
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in response.content]}
    )
    messages.append({"role": "user", "content": box.dispatch(response, format="anthropic", python=CI)})
    client.messages.create(model="claude-test", max_tokens=10, messages=messages)
    (sent,) = model.bodies[1]["messages"][2]["content"]
    text, *images = sent["content"]
    names = [note["name"] for note in json.loads(text["text"])["attachments"]]
    assert names == ["value", "/tmp/out/chart.png"] and "value" not in json.loads(text["text"])
    png = _made_png(box)
    for image in images:
        assert image["type"] == "image" and image["source"]["media_type"] == "image/png"
        assert base64.b64decode(image["source"]["data"], validate=True) == png


def test_openai_responses_gets_an_input_image(box: wasmbox.Sandbox) -> None:
    openai = pytest.importorskip("openai")
    output = [{"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "run_python",
               "arguments": json.dumps({"code": PNG_CODE}), "status": "completed"}]  # fmt: skip
    body = {"id": "resp_1", "object": "response", "created_at": 0, "model": "gpt-test", "status": "completed",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}  # fmt: skip
    model = FakeModel([body, body])
    client = openai.OpenAI(api_key="sk-test", base_url="http://model.test/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(model)))  # fmt: skip
    inputs: list[Any] = [{"role": "user", "content": "chart"}]
    response = client.responses.create(model="gpt-test", input=inputs)
    inputs += [item.model_dump(exclude_none=True) for item in response.output]
    inputs += box.dispatch(response, format="openai-responses", python=CI)
    client.responses.create(model="gpt-test", input=inputs)
    (sent,) = [i["output"] for i in model.bodies[1]["input"] if i.get("type") == "function_call_output"]
    text, *images = sent
    assert text["type"] == "input_text" and len(images) == 2
    for image in images:
        assert image["type"] == "input_image" and image["image_url"].startswith("data:image/png;base64,")
        assert base64.b64decode(image["image_url"].split(",", 1)[1], validate=True) == _made_png(box)


def test_mcp_gets_image_content(box: wasmbox.Sandbox) -> None:
    pytest.importorskip("mcp")
    import mcp_types as types
    from mcp import Client

    from wasmbox.integrations import mcp as wasmbox_mcp

    async def run() -> Any:
        async with Client(wasmbox_mcp.build_server(box, python=CI)) as client:
            return await client.call_tool("run_python", {"code": PNG_CODE})

    result = asyncio.run(asyncio.wait_for(run(), 60))
    text, *images = result.content
    assert isinstance(text, types.TextContent) and len(images) == 2
    for image in images:
        assert isinstance(image, types.ImageContent) and image.mime_type == "image/png"
        assert base64.b64decode(image.data, validate=True) == _made_png(box)
