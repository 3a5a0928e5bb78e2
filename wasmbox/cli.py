"""The `wasmbox` command: run a tool from its manifest, inspect a module, print the schema."""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import wasmtime

from . import _abi
from ._backends.core.reactor import command_c_api
from ._errors import WasmboxError
from ._inspect import inspect_file
from ._manifest import json_schema
from ._units import parse_size


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wasmbox", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser(
        "run",
        help="call a tool once and print the result as JSON",
        usage="wasmbox run MANIFEST [options] [-- ARGV...]",
        epilog="Everything after the first -- is the command tool's extra argv, as is "
        "(e.g. -- -Tsvg -p 'read x; synth').",
    )
    run.add_argument("manifest", type=Path)
    run.add_argument("--args", default="{}", help="the call's args as a JSON object")
    run.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="KEY=TEXT|KEY:=JSON",
        help="one arg, a string (KEY=TEXT) or any JSON value (KEY:=JSON); over --args",
    )
    run.add_argument(
        "--argv",
        nargs="*",
        action="extend",
        default=[],
        help="extra argv (WASI command tools); --argv=-x for one that starts with a dash",
    )
    run.add_argument("--stdin", type=Path, help="a file whose bytes are the guest's stdin")
    run.add_argument("--no-cache", action="store_true", help="do not use the compile cache")

    inspect = commands.add_parser("inspect", help="list a module's imports, exports and grants")
    inspect.add_argument(
        "module", type=Path, help="a .wasm or .wat module, or a manifest (.toml, .json): its module"
    )
    inspect.add_argument("--json", action="store_true", help="print JSON")

    commands.add_parser("schema", help="print the JSON Schema of the manifest format")

    python = commands.add_parser("python", help="run a Python snippet in a fresh interpreter")
    python.add_argument("code", help="the code; the value of its last expression is returned")
    python.add_argument("--manifest", type=Path, help='grants: runtime = "python", no source')

    javascript = commands.add_parser("javascript", help="run a JavaScript snippet in a fresh context")
    javascript.add_argument("code", help="the code; the value of its last expression is returned")
    javascript.add_argument("--manifest", type=Path, help='grants: runtime = "javascript", no source')

    build = commands.add_parser(
        "build",
        help="build and compile runtimes into the cache now (else: on first use)",
        description="Build and compile the runtimes a deployment needs into the cache "
        "($WASMBOX_CACHE_DIR or ~/.cache/wasmbox), e.g. in a container image or a CI cache step. "
        "Without options: the CPython runtime.",
    )
    for runtime, what in _RUNTIMES.items():
        build.add_argument(f"--{runtime}", action="store_true", help=what)
    build.add_argument("--all", action="store_true", help="all of them")

    bench = commands.add_parser("bench", help="a short benchmark of this machine, as a table")
    bench.add_argument("--seconds", type=float, default=1.0, help="per throughput figure")
    bench.add_argument("--no-python", action="store_true", help="core modules only")

    lint = commands.add_parser(
        "lint", help="warn about broad, unused or unnarrowed grants in manifests (what to narrow)"
    )
    lint.add_argument("manifests", type=Path, nargs="+")
    lint.add_argument("--strict", action="store_true", help="exit 1 when there is any warning (for CI)")
    lint.add_argument(
        "--no-examples",
        action="store_true",
        help="do not run a manifest's examples to compare its raised limits with what they use",
    )

    cache = commands.add_parser("cache", help="show the compile cache's entries, sizes and cap")
    cache.add_argument(
        "--dir", type=Path, help="the cache directory (default: $WASMBOX_CACHE_DIR or ~/.cache/wasmbox)"
    )
    cache_commands = cache.add_subparsers(dest="cache_command")
    prune = cache_commands.add_parser("prune", help="evict least recently used entries")
    prune.add_argument("--to", metavar="SIZE", help='down to this total ("500MiB"; default: the cap)')
    prune.add_argument("--all", action="store_true", help="remove every entry")

    audit = commands.add_parser("audit", help="work with audit logs")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    check = audit_commands.add_parser("verify", help="check an audit log's hash chain")
    check.add_argument("file", type=Path)
    check.add_argument("--head", help="the hash the log must end at (catches lines cut from the end)")

    mcp = commands.add_parser("mcp", help="serve tools over the Model Context Protocol")
    mcp_commands = mcp.add_subparsers(dest="mcp_command", required=True)
    serve = mcp_commands.add_parser(
        "serve", help="serve the manifests' tools (needs the extra: pip install 'wasmbox[mcp]')"
    )
    serve.add_argument("manifests", type=Path, nargs="*", help="the tools' manifests")
    serve.add_argument("--python", action="store_true", help="also serve run_python (code interpreter)")
    serve.add_argument(
        "--sessions",
        action="store_true",
        help="run_python (and run_javascript) calls that pass the session a result named share one interpreter",
    )
    serve.add_argument(
        "--python-grants",
        type=Path,
        metavar="MANIFEST",
        help='run_python\'s grants and limits: runtime = "python", no source (implies --python)',
    )
    serve.add_argument("--javascript", action="store_true", help="also serve run_javascript")
    serve.add_argument(
        "--javascript-grants",
        type=Path,
        metavar="MANIFEST",
        help='run_javascript\'s grants and limits: runtime = "javascript", no source (implies --javascript)',
    )
    serve.add_argument(
        "--transport",
        choices=("stdio", "http"),
        default="stdio",
        help="stdio (default: the client starts this command) or streamable HTTP at /mcp",
    )
    serve.add_argument(
        "--host",
        default="127.0.0.1",
        help="HTTP: the address to bind (default 127.0.0.1); an address other than loopback "
        "needs --allow-remote and a token",
    )
    serve.add_argument("--port", type=int, default=8000, help="HTTP: the port (0: a free one)")
    serve.add_argument(
        "--allow-remote",
        action="store_true",
        help="HTTP: allow --host to be a non-loopback address (reachable from the network)",
    )
    token = serve.add_mutually_exclusive_group()
    token.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="PATH",
        help="HTTP: every request must carry the token in this file (its first line) as "
        "`Authorization: Bearer <token>`",
    )
    token.add_argument(
        "--auth-token-env",
        metavar="VAR",
        help="HTTP: as --auth-token-file, the token in this environment variable",
    )
    serve.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="HTTP: a Host header to accept besides loopback's (DNS-rebinding check; repeatable)",
    )
    serve.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="URL",
        help="HTTP: an Origin header to accept besides loopback's, e.g. https://app.example.com (repeatable)",
    )
    serve.add_argument("--max-workers", type=int, help="calls run at once (default: CPU count)")
    serve.add_argument("--no-cache", action="store_true", help="do not use the compile cache")

    words = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] = []
    if "--" in words:  # split here, not by argparse: what follows may look like options
        at = words.index("--")
        words, tail = words[:at], words[at + 1 :]
    options = parser.parse_args(words)
    if tail and options.command != "run":
        parser.error("only `run` takes argv after --")
    options.command_argv = tail
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning  # e.g. a Python tool's SyntaxWarnings, at load
        return _dispatch(options)


def _dispatch(options: argparse.Namespace) -> int:
    try:
        if options.command == "run":
            return _run(options)
        if options.command == "inspect":
            return _inspect(options)
        if options.command in ("python", "javascript"):
            return _snippet(options)
        if options.command == "build":
            return _build(options)
        if options.command == "lint":
            return _lint(options)
        if options.command == "audit":
            return _audit_verify(options)
        if options.command == "cache":
            return _cache(options)
        if options.command == "mcp":
            return _mcp_serve(options)
        if options.command == "bench":
            from . import _bench

            _bench.print_table(_bench.run(options.seconds, python=not options.no_python))
            return 0
        _print_json(json_schema())
        return 0
    except WasmboxError as exc:
        print(f"wasmbox: {type(exc).__name__}: {_escape(str(exc), lines=True)}", file=sys.stderr)
        return 2


def _run(options: argparse.Namespace) -> int:
    from ._sandbox import Sandbox

    try:
        args = _call_args(options.args, options.arg)
    except ValueError as exc:
        print(f"wasmbox: {_escape(str(exc))}", file=sys.stderr)
        return 2
    stdin = options.stdin.read_bytes() if options.stdin else b""
    kwargs: dict[str, Any] = {"cache_dir": None} if options.no_cache else {}
    with Sandbox(**kwargs) as box:
        tool = box.load(options.manifest)
        result = tool.call(args, argv=[*options.argv, *options.command_argv], stdin=stdin)
    _print_json(result.model_dump(mode="json"))
    return 0 if result.ok else 1


def _call_args(text: str, items: list[str]) -> Any:
    """`--args` JSON with each `--arg` set over it. Raises ValueError saying which is wrong."""
    try:
        args = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"--args is not JSON: {exc}") from None
    if items and not isinstance(args, dict):
        raise ValueError("--arg needs --args to be a JSON object")
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key or key == ":":
            raise ValueError(f"--arg {item!r}: write KEY=TEXT or KEY:=JSON")
        if key.endswith(":"):
            try:
                args[key[:-1]] = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"--arg {item!r}: not JSON after ':=': {exc}") from None
        else:
            args[key] = value
    return args


def _snippet(options: argparse.Namespace) -> int:
    from ._sandbox import Sandbox

    with Sandbox() as box:
        if options.command == "javascript":
            result = box.run_javascript(options.code, options.manifest)
        else:
            result = box.run_python(options.code, options.manifest)
    _print_json(result.model_dump(mode="json"))
    return 0 if result.ok else 1


# the runtimes `wasmbox build` makes: its option, what it is
_RUNTIMES = {
    "python": "the CPython runtime (run_python, Python tools; the default)",
    "javascript": "the JavaScript runtime (QuickJS-NG: run_javascript, JavaScript tools)",
    "scientific": "the scientific Python runtime (numpy, pandas; minutes, a 98 MB download)",
}


def _build(options: argparse.Namespace) -> int:
    from ._cache import default_cache_dir
    from ._sandbox import Sandbox

    chosen = [name for name in _RUNTIMES if options.all or getattr(options, name)] or ["python"]
    with Sandbox() as box:
        prepare = {
            "python": box.prepare_python,
            "javascript": box.prepare_javascript,
            "scientific": box.prepare_scientific,
        }
        for name in chosen:
            started = time.perf_counter()
            folder = prepare[name]()
            print(
                f"wasmbox: the {name} runtime is ready ({time.perf_counter() - started:.1f} s): "
                f"{_escape(str(folder))}",
                file=sys.stderr,
            )
    print(
        f"wasmbox: compiled artifacts in {_escape(str(default_cache_dir()))} (wasmbox cache lists them)",
        file=sys.stderr,
    )
    return 0


def _lint(options: argparse.Namespace) -> int:
    from ._lint import lint
    from ._manifest import Manifest

    worst = 0
    for path in options.manifests:
        shown = _escape(str(path))
        try:
            found = lint(Manifest.load(path), run_examples=not options.no_examples)
        except (WasmboxError, wasmtime.WasmtimeError, OSError) as exc:
            print(f"{shown}: error: {_escape(str(exc), lines=True)}")
            worst = 2
            continue
        for warning in found:
            print(f"{shown}: warning: {_escape(warning)}")
        if found and options.strict:
            worst = max(worst, 1)
        elif not found:
            print(f"{shown}: ok")
    return worst


def _cache(options: argparse.Namespace) -> int:
    from ._cache import default_cache_dir, default_max_bytes, entries, folders, prune, tree_size

    directory = options.dir or default_cache_dir()
    try:
        cap = default_max_bytes()
        limit: object = cap
        if options.cache_command == "prune":
            limit = 0 if options.all else parse_size(options.to) if options.to else cap
            if not isinstance(limit, int) or limit < 0:
                raise ValueError(f"--to {options.to!r} is not a size")
    except ValueError as exc:
        print(f"wasmbox: {exc}", file=sys.stderr)
        return 2
    if not directory.is_dir():
        print(f"{_escape(str(directory))}: no cache yet")
        return 0
    if options.cache_command == "prune":
        assert isinstance(limit, int)
        removed = prune(directory, limit)
        print(f"removed {len(removed)} entries ({_size(sum(e.size for e in removed))})")
    found = entries(directory)
    built = folders(directory)
    if options.cache_command != "prune":
        for entry in reversed(found):  # most recently used first
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.last_used))
            print(f"{_size(entry.size):>10}  {used}  {entry.key}")
        if built:
            print(
                "runtimes, package sets and downloaded build inputs (not under the cap; delete to rebuild):"
            )
        for entry in built:
            print(f"{_size(entry.size):>10}  {_escape(entry.key)}")
    total = sum(e.size for e in found)
    print(
        f"{_escape(str(directory))}: {len(found)} entries, {_size(total)} of {_size(cap)} (WASMBOX_CACHE_MAX); "
        f"{len(built)} runtimes, package sets and inputs, {_size(sum(e.size for e in built))}; "
        f"{_size(tree_size(directory))} in all"
    )
    return 0


def _size(count: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= factor:
            return f"{count / factor:.1f} {unit}"
    return f"{count} B"


def _audit_verify(options: argparse.Namespace) -> int:
    from ._audit import verify_audit_log

    shown = _escape(str(options.file))
    try:
        outcome = verify_audit_log(options.file, options.head)
    except OSError as exc:
        print(f"wasmbox: cannot read {shown}: {_escape(str(exc.strerror or exc))}", file=sys.stderr)
        return 2
    if not outcome.ok:
        print(f"{shown}: BROKEN after {outcome.records} good records: {outcome.problem}")
        return 1
    print(f"{shown}: ok, {outcome.records} records, head {outcome.head}")
    return 0


def _mcp_serve(options: argparse.Namespace) -> int:  # noqa: C901 - each option checked where it is read
    import asyncio

    try:
        from .integrations import mcp
    except ImportError as exc:
        print(f"wasmbox: {exc}", file=sys.stderr)
        return 2
    from ._manifest import Manifest
    from ._sandbox import Sandbox

    interpreters = (options.python, options.python_grants, options.javascript, options.javascript_grants)
    if not options.manifests and not any(interpreters):
        print("wasmbox: nothing to serve: give manifests, --python or --javascript", file=sys.stderr)
        return 2
    if options.sessions and not any(interpreters):
        print(
            "wasmbox: --sessions is for run_python and run_javascript: add --python or --javascript",
            file=sys.stderr,
        )
        return 2
    http_only = (
        options.auth_token_file,
        options.auth_token_env,
        options.allowed_host,
        options.allowed_origin,
    )
    if options.transport != "http" and any(http_only):
        print("wasmbox: tokens and allowed hosts and origins are for --transport http", file=sys.stderr)
        return 2
    token = None
    try:
        if options.auth_token_file is not None or options.auth_token_env is not None:
            token = mcp.read_token(file=options.auth_token_file, env=options.auth_token_env)
        mcp.transport_security(options.host, options.allowed_host, options.allowed_origin)
    except ValueError as exc:
        print(f"wasmbox: {_escape(str(exc))}", file=sys.stderr)
        return 2
    if options.transport == "http" and not mcp.is_loopback(options.host):
        if not options.allow_remote:
            print(
                f"wasmbox: --host {options.host} is not loopback: "
                "add --allow-remote (and a token) to serve the network",
                file=sys.stderr,
            )
            return 2
        if token is None:
            print(
                f"wasmbox: --host {options.host} is not loopback: anyone who can reach it could call "
                "the tools; give a token with --auth-token-file or --auth-token-env",
                file=sys.stderr,
            )
            return 2
    kwargs: dict[str, Any] = {"cache_dir": None} if options.no_cache else {}
    with Sandbox(max_workers=options.max_workers, **kwargs) as box:
        for path in options.manifests:
            box.load(path)
        python: bool | Manifest = options.python
        if options.python_grants is not None:
            python = Manifest.load(options.python_grants)
            # a grant set run_python refuses (a tool manifest, an unregistered host function)
            # fails here, not at every call
            box.run_python("None", python)
        elif python:
            box.prepare_python()  # built (or loaded) now, not during the first call
        javascript: bool | Manifest = options.javascript
        if options.javascript_grants is not None:
            javascript = Manifest.load(options.javascript_grants)
            box.run_javascript("null", javascript)  # refused here, as run_python's grants are
        elif javascript:
            box.prepare_javascript()

        def listening(url: str) -> None:
            print(f"wasmbox: serving MCP on {url}", file=sys.stderr, flush=True)

        if options.transport == "stdio":
            serve = mcp.serve_stdio(box, python=python, sessions=options.sessions, javascript=javascript)
        else:
            serve = mcp.serve_http(
                box,
                python=python,
                host=options.host,
                port=options.port,
                allow_remote=options.allow_remote,
                on_listening=listening,
                sessions=options.sessions,
                javascript=javascript,
                auth_token=token,
                allowed_hosts=options.allowed_host,
                allowed_origins=options.allowed_origin,
            )
        try:
            asyncio.run(serve)
        except KeyboardInterrupt:  # Ctrl-C is how a stdio server is stopped by hand
            pass
    return 0


def _inspect(options: argparse.Namespace) -> int:
    module, manifest = options.module, None
    if module.suffix in _MANIFEST_SUFFIXES:  # a manifest: its module
        from ._manifest import Manifest

        manifest, loaded = module, Manifest.load(module)
        if loaded.module is None:
            print(
                f"wasmbox: {_escape(str(manifest))} is a {loaded.runtime} tool's manifest: it has no "
                "module to inspect (wasmbox lint checks its grants)",
                file=sys.stderr,
            )
            return 2
        module = loaded.module
    try:
        info = inspect_file(module)
    except (OSError, wasmtime.WasmtimeError) as exc:
        shown = _escape(str(module))
        print(f"wasmbox: cannot read {shown}: {_escape(str(exc), lines=True)}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "module": str(module),
        "manifest": str(manifest) if manifest is not None else None,
        "kind": info.kind.value if info.kind else None,
        "imports": [{"module": i.module, "name": i.name, "type": i.type} for i in info.imports],
        "exports": [{"name": name, "type": ty} for name, ty in info.exports],
        "grants_needed": {
            "wasi": info.uses_wasi,
            "host_functions": sorted(set(info.host_functions)),
            "refused_imports": [
                f"{i.module}.{i.name}"
                for i in info.imports
                if i.module not in (_abi.WASI_MODULE, _abi.ABI_MODULE)
            ],
        },
        # a command that also exports a C API: its _start may be a stub (docs/commands-and-reactors.md)
        "command_exports_c_api": list(command_c_api(info)),
    }
    if options.json:
        _print_json(report)
        return 0
    # every name below is the module's to choose: escaped, so none can move the cursor or
    # start a line of its own
    print(f"{_escape(report['module'])}: {report['kind'] or 'not a wasmbox tool'}")
    if manifest is not None:
        print(f"manifest: {_escape(str(manifest))}")
    print("imports:")
    for i in info.imports:
        print(f"  {_escape(i.module)} {_escape(i.name)} {i.type}")
    print("exports:")
    for name, ty in info.exports:
        print(f"  {_escape(name)} {ty}")
    grants = report["grants_needed"]
    print("grants needed:")
    print(f"  wasi: {'yes' if grants['wasi'] else 'no'}")
    print(f"  host_functions: {_names(grants['host_functions'])}")
    if grants["refused_imports"]:
        print(f"  never granted (load will refuse): {_names(grants['refused_imports'])}")
    if report["command_exports_c_api"]:
        print(
            f"note: a WASI command that also exports {_names(report['command_exports_c_api'])}: "
            "if its _start does not do the work, call these through a [reactor] table"
        )
    return 0


_MANIFEST_SUFFIXES = (".toml", ".json")  # what Manifest.load reads; a module is .wasm or .wat


def _names(names: list[str]) -> str:
    return "[" + ", ".join(f"'{_escape(name)}'" for name in names) + "]"


def _escape(text: str, *, lines: bool = False) -> str:
    """`text` as the terminal may show it: each character that is not printable (control
    characters, C1 included, and format characters such as bidi overrides) written as its
    escape, e.g. `\\x1b`. With `lines`, newlines are kept and each line after the first is
    indented, so the text cannot pass a line of its own off as one of ours."""
    if text.isprintable():
        return text
    if lines:
        return "\n  ".join(_escape(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    print(f"wasmbox: {category.__name__}: {_escape(str(message), lines=True)}", file=file or sys.stderr)


def _print_json(data: Any) -> None:
    # ensure_ascii escapes every control character (C1 too), so guest output cannot drive
    # the terminal.
    print(json.dumps(data, indent=2, ensure_ascii=True))


if __name__ == "__main__":
    sys.exit(main())
