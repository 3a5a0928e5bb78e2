"""A batch of tool calls through one Sandbox: successes and each kind of refusal, with timings.

Run it with `./dev demo` (which sets up the venv and builds the C example tools first).
"""

from __future__ import annotations

import http.server
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import wasmbox

ROOT = Path(__file__).resolve().parent
CAPS = ROOT / "capabilities"
WAT = ROOT / "runtimes" / "examples" / "wat"
KV = {"greeting": "hello from the host", "answer": "42"}
PY_KV = {"name": "py_kv", "runtime": "python", "host_functions": ["kv.get"]}
JS_KV = {"name": "js_kv", "runtime": "javascript", "host_functions": ["kv.get"]}
JS_SNIPPETS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("JS: last expression + console.log", "console.log('squares'); [1, 2, 3].map(x => x * x)", None),
    ("JS: top-level await and a timer", "await new Promise(r => setTimeout(r, 5)); 'waited'", None),
    ("JS: host function", "wasmbox.callHost('kv.get', {key: 'greeting'})", JS_KV),
    ("JS: ungranted host function", "wasmbox.callHost('kv.get', {key: 'greeting'})", None),
    ("JS: read a host file", "std.loadFile('/etc/passwd')", None),
    ("JS: exception with its stack", "function f() { null.x }\nf()", None),
    ("JS: for (;;) {}", "for (;;) {}", None),
]


def wat(module: str, **fields: Any) -> dict[str, Any]:
    return {"name": module, "module": str(WAT / f"{module}.wat"), **fields}


def load_tools(box: wasmbox.Sandbox) -> tuple[dict[str, wasmbox.Tool], str]:
    """The demo's tools, and a line saying how many were compiled now and how many came from
    the compile cache (a Python tool is compiled when its runtime or its bytecode is)."""
    manifests: dict[str, Path | dict[str, Any]] = {
        "word_count": CAPS / "word_count.toml",
        "kv_lookup": CAPS / "kv_lookup.toml",
        "fsprobe": CAPS / "fsprobe.toml",
        "echo": wat("echo", input_schema={"type": "object", "required": ["text"]}),
        "spin": wat("spin", limits={"fuel": 5_000_000}),
        "spin_slow": wat("spin", name="spin_slow", limits={"fuel": 10**15, "timeout": "100ms"}),
        "grow": wat("grow", limits={"memory": "4MiB"}),
        "trap": wat("trap"),
        "guest_error": wat("guest_error"),
        "garbage": wat("garbage"),
        "spam": wat("spam", limits={"output": "4KiB"}),
        "forward": wat("forward", host_functions=["host.fn"], limits={"timeout": "200ms"}),
        "csv_stats": CAPS / "csv_stats.toml",  # Python: builds the runtime on first use
    }
    tools: dict[str, wasmbox.Tool] = {}
    how = {"compiled": 0, "from cache": 0}
    start = time.perf_counter()
    for name, manifest in manifests.items():
        compiles, hits = box.cache_stats.compiles, box.cache_stats.hits
        tools[name] = box.load(manifest)
        assert box.cache_stats.compiles + box.cache_stats.hits > compiles + hits  # one or the other
        how["compiled" if box.cache_stats.compiles > compiles else "from cache"] += 1
    load_ms = (time.perf_counter() - start) * 1e3
    counts = ", ".join(f"{what} {n}" for what, n in how.items())
    return tools, f"loaded {len(tools)} tools in {load_ms:.1f} ms ({counts})"


def outcome(result: wasmbox.CallResult) -> str:
    """A row's outcome: the error kind; for a command that ran and exited nonzero (e.g. its
    open was refused), its exit code; else ok."""
    if not result.ok:
        return result.error.kind.value  # type: ignore[union-attr]
    if isinstance(result.value, dict) and result.value.get("exit_code", 0) != 0:
        return f"exit {result.value['exit_code']}"
    return "ok"


def main() -> int:
    box = wasmbox.Sandbox()

    @box.host_function("kv.get")
    def kv_get(key: str) -> str | None:
        if key.startswith("secret"):
            raise wasmbox.CapabilityDeniedError(f"key {key!r} is not readable by tools")
        return KV.get(key)

    @box.host_function("host.fn")
    def host_fn(fail: bool = False, sleep: float = 0.0) -> str:
        if sleep:
            time.sleep(sleep)
        if fail:
            raise ConnectionError("db at 10.0.0.5 refused (password hunter2)")
        return "pong"

    tools, summary = load_tools(box)
    print(summary + "\n")

    batch: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
        ("word count of a preopened file", "word_count", {"path": "/data/sample.txt"}, {}),
        ("word count of inline text", "word_count", {"text": "to be or not to be"}, {}),
        ("host function round trip", "kv_lookup", {"key": "greeting"}, {}),
        ("WASI command reads a granted dir", "fsprobe", {}, {"argv": ["ls", "/data"]}),
        ("echo through the ABI", "echo", {"text": "hi", "n": [1, 2.5, None]}, {}),
        ("file outside the grant", "word_count", {"path": "/etc/passwd"}, {}),
        ("'..' out of the preopen", "fsprobe", {}, {"argv": ["read", "/data/../../etc/passwd"]}),
        ("write to a read-only preopen", "fsprobe", {}, {"argv": ["write", "/data/x", "pwned"]}),
        ("host env is invisible", "fsprobe", {}, {"argv": ["env"]}),
        ("out_of_fuel: infinite loop", "spin", {}, {}),
        ("timeout: infinite loop", "spin_slow", {}, {}),
        ("timeout: slow host function", "forward", {"sleep": 0.4}, {}),
        ("memory_limit: grows until refused", "grow", {}, {}),
        ("trap: divide by zero", "trap", {}, {}),
        ("guest_error", "guest_error", {}, {}),
        ("capability_denied by a host function", "kv_lookup", {"key": "secret/token"}, {}),
        ("invalid_arguments: schema", "echo", {"txt": "typo"}, {}),
        ("output_limit: stdout flood", "spam", {}, {}),
        ("bad_response: garbage result", "garbage", {}, {}),
        ("host_error: host function raised", "forward", {"fail": True}, {}),
        ("Python tool over a preopened CSV", "csv_stats", {"path": "/data/sales.csv"}, {}),
        ("Python tool, file outside the grant", "csv_stats", {"path": "/etc/passwd"}, {}),
    ]
    snippets: list[tuple[str, str, dict[str, Any] | None]] = [
        (
            "snippet: last expression + print",
            ("import statistics\nprint('mean of 1..10')\nstatistics.mean(range(1, 11))"),
            None,
        ),
        (
            "snippet: host function",
            ("import wasmbox_guest\nwasmbox_guest.call_host('kv.get', key='greeting')"),
            PY_KV,
        ),
        (
            "snippet: ungranted host function",
            ("import wasmbox_guest\nwasmbox_guest.call_host('kv.get', key='greeting')"),
            None,
        ),
        ("snippet: socket connect", "import socket\nsocket.socket().connect(('127.0.0.1', 22))", None),
        ("snippet: while True", "while True:\n    pass", None),
        ("snippet: 1 GiB allocation", "x = bytearray(1 << 30)", None),
    ]
    print(f"{'call':38} {'outcome':20} {'fuel':>10} {'µs':>8}  detail")
    print("-" * 110)
    for label, name, args, extra in batch:
        result = tools[name].call(args, **extra)
        shown = outcome(result)
        detail = _detail(result)
        print(f"{label:38} {shown:20} {result.fuel_used:>10,} {result.duration_s * 1e6:>8.0f}  {detail}")
    for label, code, grants in snippets:
        result = box.run_python(code, grants)
        shown = outcome(result)
        print(
            f"{label:38} {shown:20} {result.fuel_used:>10,} {result.duration_s * 1e6:>8.0f}  {_detail(result)}"
        )
    try:
        box.prepare_javascript()  # QuickJS-NG from PyPI, built once per cache
    except wasmbox.RuntimeBuildError as exc:
        print(f"(JavaScript skipped: {exc})")
        javascript = False
    else:
        javascript = True
        for label, code, grants in JS_SNIPPETS:
            result = box.run_javascript(code, grants)
            shown = outcome(result)
            print(
                f"{label:38} {shown:20} {result.fuel_used:>10,} {result.duration_s * 1e6:>8.0f}  "
                f"{_detail(result)}"
            )

    print("\nwarm latency (median / p99):")
    for name, args, count in [
        ("echo", {"text": "hi"}, 2000),
        ("word_count", {"text": "a b c"}, 2000),
        ("kv_lookup", {"key": "answer"}, 2000),
        ("csv_stats", {"path": "/data/sales.csv"}, 200),
    ]:
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            tools[name].call(args)
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        print(
            f"  {name:12} {statistics.median(times):7.1f} µs / {times[int(len(times) * 0.99)]:7.1f} µs"
            f"  ({count:,} calls)"
        )
    interpreters = [("run_python", box.run_python, "sum(range(100))", 200, "fresh interpreters")]
    if javascript:
        interpreters.append(("run_javascript", box.run_javascript, "1 + 2", 2000, "fresh contexts"))
    for label, run, code, count, what in interpreters:
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            run(code)
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        print(
            f"  {label:12} {statistics.median(times):7.1f} µs / {times[int(len(times) * 0.99)]:7.1f} µs"
            f"  ({count:,} {what}, {code})"
        )
    box.close()
    builtin_capabilities()
    return 0


class _Weather(http.server.BaseHTTPRequestHandler):
    """A local stand-in for a weather API."""

    def do_GET(self) -> None:
        body = json.dumps({"city": "Lisbon", "temp_c": 19.5, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def builtin_capabilities() -> None:
    """http.fetch (allowed and refused), scratch space, and the audit trail of each call."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Weather)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    records: list[wasmbox.AuditRecord] = []
    print("\nbuilt-in capabilities (a Sandbox with an audit sink):")
    with wasmbox.Sandbox(audit=records.append) as box:
        # the bundled manifest, with its allow rule pointed at this demo's server
        manifest = wasmbox.Manifest.load(CAPS / "fetch_json.toml")
        assert manifest.network is not None and isinstance(manifest.network.allow[0], wasmbox.EgressRule)
        rule = manifest.network.allow[0].model_copy(update={"host": f"127.0.0.1:{port}"})
        network = manifest.network.model_copy(update={"allow": (rule,)})
        fetch = box.load(manifest.model_copy(update={"network": network}))
        for label, url in (
            ("fetch an allowed URL", f"http://127.0.0.1:{port}/today"),
            ("fetch the metadata endpoint", "http://169.254.169.254/latest/meta-data/"),
        ):
            result = fetch.call({"url": url})
            shown = outcome(result)
            print(f"  {label:36} {shown:18} {_detail(result)}")
        incident = records[-1]
        print(
            "  its audit record:",
            json.dumps(
                {
                    k: v
                    for k, v in incident.as_dict().items()
                    if k in ("tool", "error_kind", "host_calls", "args_digest")
                },
            )[:300],
        )
        scratch = {"name": "scratch_demo", "runtime": "python", "scratch": "1MiB"}
        code = (
            "import os\nbefore = os.listdir('/tmp')\nopen('/tmp/notes.txt', 'w').write('draft ' * 100)\n"
            "{'empty_at_start': before == [], 'wrote': os.path.getsize('/tmp/notes.txt')}"
        )
        for label, snippet in (
            ("scratch: write a temp file", code),
            ("scratch: next call starts empty", code),
            ("scratch: write past the 1MiB cap", "open('/tmp/big', 'wb').write(b'x' * (4 << 20))"),
        ):
            result = box.run_python(snippet, scratch)
            shown = outcome(result)
            print(f"  {label:36} {shown:18} {_detail(result)}")
    server.shutdown()
    print(
        f"  {len(records)} audit records; nothing left in the scratch folder: "
        f"{not box._scratch_space.root.exists()}"
    )


def _detail(result: wasmbox.CallResult) -> str:
    if result.ok:
        text = json.dumps(result.value, default=repr)
        if result.stdout:
            text += "  stdout=" + json.dumps(result.stdout[:60])
        if result.stderr:
            text += "  stderr=" + json.dumps(result.stderr[:60])
    else:
        lines = result.error.message.strip().splitlines()  # type: ignore[union-attr]
        # the exception's own line: first above a JavaScript stack, last in a Python traceback
        text = lines[0] if len(lines) > 1 and lines[1].startswith("    at ") else lines[-1]
        hidden = [r.detail for r in result.host_calls if r.detail]
        if hidden:
            text += f"  [host-side only: {hidden[0][:50]}]"
    return text[:110]


if __name__ == "__main__":
    sys.exit(main())
