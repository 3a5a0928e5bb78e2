"""`wasmbox lint`: warnings about manifests that grant more than a tool plausibly needs.

A valid manifest can still be too generous: a writable preopen of a big tree, a grant of a
system or home folder or the compile cache (read-only too), a grant given through a symlink,
an allow list of whole address ranges, limits far above what one tool call needs or than the
tool's own examples use, grants the module never uses, packages pinned by version without a
hash, and the combinations that turn a prompt injection into damage: host functions and code
tools granted for any arguments, a writable grant beside egress. Each warning says what to
narrow. Lint says so; loading is unaffected (but see `Sandbox`'s refusals).

Each check is a function of the manifest in `CHECKS`, giving its warnings as sentences.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Callable
from pathlib import Path

from ._backends.core.reactor import command_c_api
from ._cache import default_cache_dir
from ._capabilities.allowlist import FETCH, AddressRule, forbidden_reason
from ._capabilities.egress import CompiledRule, compile_rules
from ._command import Template
from ._errors import WasmboxError
from ._files import read_regular_file
from ._inspect import inspect_file, memory_problem
from ._manifest import CALL_TOOL, PYTHON_FUEL, Limits, Manifest
from ._pins import is_hashed, pin_project
from ._results import CallResult
from ._schema import as_json
from ._units import format_size

LARGE_TREE_FILES = 1000
LARGE_TREE_BYTES = 100 * 1024**2
# Limits above these are unusual for one tool call.
HIGH = {"fuel": 10**10, "memory": 1024**3, "timeout": 60.0, "output": 16 * 1024**2, "host_calls": 10_000}
HIGH_SCRATCH = 1024**3
HIGH_RESPONSE = 64 * 1024**2
# A limit the manifest raises above its default is warned about when it is more than this many
# times what the manifest's own `examples` used at most (each run once by lint), counting at
# least the floor as used (a timer's and a page's grain).
EXAMPLE_FACTOR = {"fuel": 100, "memory": 16, "timeout": 100, "output": 100, "host_calls": 10}
_USED_FLOOR = {"fuel": 1, "memory": 64 * 1024, "timeout": 0.01, "output": 1024, "host_calls": 1}


def lint(manifest: Manifest, *, run_examples: bool = True, cache_dir: Path | None = None) -> list[str]:
    """The warnings for `manifest`, each a sentence saying what to narrow; empty when nothing
    stands out. With `run_examples`, a manifest that raises a limit above its default and has
    `examples` has each run once in a fresh Sandbox (on `cache_dir`, else the default cache;
    with wasmbox's own host functions only: a tool granted others is not run) to compare the
    limit with what they used."""
    warnings = [warning for check in CHECKS for warning in check(manifest)]
    return warnings + (_example_warnings(manifest, cache_dir) if run_examples else [])


def _memory_warnings(manifest: Manifest) -> list[str]:
    """A module whose declared memory minimum is above limits.memory: `Sandbox.load` refuses it."""
    if manifest.module is None:
        return []
    problem = memory_problem(inspect_file(manifest.module), manifest.limits.memory)
    return [f"{manifest.module.name} {problem} (Sandbox.load refuses it)"] if problem else []


def _package_warnings(manifest: Manifest) -> list[str]:
    """Pins without a hash: the index or wheel folder decides which file each version is."""
    bare = [pin_project(pin) for pin in manifest.packages if not is_hashed(pin)]
    if not bare:
        return []
    warning = (
        f"packages {', '.join(bare)} are pinned by version only: whoever serves the index or wheel "
        "folder chooses the code; pin each (dependencies too) with --hash=sha256:<digest>, e.g. from "
        "`pip hash` or `pip-compile --generate-hashes`"
    )
    return [warning]


def _entry_warnings(manifest: Manifest) -> list[str]:
    """A module run as a WASI command that exports a C API of its own: its `_start` may be a
    stub that exits 0 with no output (Graphviz's), so that every call "succeeds" with nothing."""
    if manifest.module is None or manifest.reactor is not None:
        return []
    api = command_c_api(inspect_file(manifest.module))
    if not api:
        return []
    shown = ", ".join(api[:5]) + (f" and {len(api) - 5} more" if len(api) > 5 else "")
    warning = (
        f"the module is called as a WASI command (_start) but exports functions of its own ({shown}): "
        "if its _start does not do the work, call them through a [reactor] table"
    )
    return [warning]


def _command_warnings(manifest: Manifest) -> list[str]:
    """argv items that begin with an arg's value, which may start with '-' (and be read as an
    option), with no '--' before them and nothing in the schema that rules the dash out."""
    command, schema = manifest.command, manifest.input_schema or {}
    if command is None or command.argv is None:
        return []
    properties = schema.get("properties", {})
    warnings = []
    after_dashes = "--" in manifest.args
    for item in command.argv:
        if item == "--":
            after_dashes = True
        template = Template.parse(item, argv_item=True)
        first = template.parts[0] if template.parts else None
        if after_dashes or isinstance(first, str) or first is None:
            continue
        declared = properties.get(first.name, {})
        if first.expand and isinstance(declared, dict):
            declared = declared.get("items", {})
        if not _dash_ruled_out(declared):
            warnings.append(
                f"command.argv item {item!r}: a value starting with '-' would be read as an option; "
                "put a '--' item before it, give it a prefix, or constrain it (pattern, enum)"
            )
    return warnings


def _dash_ruled_out(schema: object) -> bool:
    if not isinstance(schema, dict):
        return False
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return not any(isinstance(v, str) and v.startswith("-") for v in values)
    if "pattern" in schema:
        return True  # the author said what is allowed
    kind = schema.get("type")
    if kind == "boolean":
        return True
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        return isinstance(low, (int, float)) and low >= 0
    return False


def _preopen_warnings(manifest: Manifest) -> list[str]:
    warnings = []
    for preopen in manifest.preopens:
        sensitive = _sensitive_folder(preopen.host)
        if sensitive is not None:
            warnings.append(f"preopen {preopen.guest}: grants {preopen.host}, {sensitive}")
        resolved = preopen._resolved
        if resolved is not None and resolved.lookup.links:
            links = ", ".join(resolved.lookup.links)
            warnings.append(
                f"preopen {preopen.guest}: given through a symlink ({links}); whoever can write the "
                f"folder holding it chooses what is granted: give the real path {preopen.host}"
            )
        if not preopen.writable:
            continue
        if len(preopen.host.parts) <= 2 or preopen.host == Path.home():
            warnings.append(f"preopen {preopen.guest}: writable grant of a top-level folder {preopen.host}")
            continue
        files, size = _tree_size(preopen.host)
        if files > LARGE_TREE_FILES or size > LARGE_TREE_BYTES:
            warnings.append(
                f"preopen {preopen.guest}: writable grant of a large tree {preopen.host} "
                f"(more than {min(files, LARGE_TREE_FILES)} files or {format_size(size)}); "
                "grant a small folder, or use `scratch` for temporary files"
            )
    return warnings


# Folders whose contents a guest should not read, even read-only, and why.
_SYSTEM = {
    Path(
        "/proc"
    ): "the kernel's and every process's state (e.g. the host's environment in /proc/self/environ)",
    Path("/sys"): "the kernel's and the hardware's state",
    Path("/dev"): "the host's devices",
    Path("/etc"): "the host's configuration (and often its secrets)",
}


def _sensitive_folder(host: Path) -> str | None:
    """Why a grant of `host` shows a guest more than a tool plausibly needs, or None: a system
    folder or one in it, the root, a home folder or a folder holding one, the compile cache or
    a folder holding it or in it."""
    for folder, what in _SYSTEM.items():
        if host == folder or folder in host.parents:
            return what
    if host == Path(host.anchor):
        return "the whole host"
    for home in _home_folders():
        if host == home or host in home.parents:
            return f"which is or holds the home folder {home} (keys, tokens, shell history)"
    cache = Path(os.path.realpath(default_cache_dir()))
    if host == cache or host in cache.parents or cache in host.parents:
        return f"which reaches the compile cache {cache} (every cached tool's code and bytecode)"
    return None


def _home_folders() -> set[Path]:
    """The caller's home folder, root's, and the folders in /home."""
    homes = {Path(os.path.realpath(Path.home())), Path("/root")}
    try:
        homes.update(Path(os.path.realpath(entry.path)) for entry in os.scandir("/home") if entry.is_dir())
    except OSError:
        pass
    return homes


def _tree_size(top: Path) -> tuple[int, int]:
    files = size = 0
    for root, dirs, names in os.walk(top):
        files += len(names) + len(dirs)
        for name in names:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
        if files > LARGE_TREE_FILES or size > LARGE_TREE_BYTES:
            break
    return files, size


def _network_warnings(manifest: Manifest) -> list[str]:
    if manifest.network is None:
        return []
    warnings = []
    for compiled in compile_rules(manifest.network.allow):
        entry, rule = compiled.entry, compiled.dest
        if not isinstance(rule, AddressRule):
            continue
        broad = 24 if rule.network.version == 4 else 48
        if rule.network.prefixlen < broad:
            warnings.append(
                f"network.allow {entry!r}: a whole range of {rule.network.num_addresses:,} addresses"
            )
        reason = forbidden_reason(ipaddress.ip_address(rule.network.network_address))
        one_port_of_one_host = rule.port is not None and rule.network.num_addresses == 1
        if reason is not None and not one_port_of_one_host:
            warnings.append(f"network.allow {entry!r}: allows internal addresses ({reason})")
    if manifest.network.max_response > HIGH_RESPONSE:
        warnings.append(f"network.max_response is {format_size(manifest.network.max_response)}")
    return warnings


def _egress_rule_warnings(manifest: Manifest) -> list[str]:
    """Egress rules that let a request use any method or any path of where they reach."""
    if manifest.network is None:
        return []
    warnings = []
    for rule in compile_rules(manifest.network.allow):
        missing = _left_open(rule)
        if missing:
            warnings.append(
                f"{rule.label}: any {' and any '.join(missing)}: a prompt-injected call may send any such "
                f"request there; give the rule the {' and '.join(m + 's' for m in missing)} the tool uses, "
                f'e.g. {{ host = "{rule.entry}", methods = ["GET"], paths = ["/v1/forecast"] }}'
            )
    return warnings


def _left_open(rule: CompiledRule) -> list[str]:
    """What a rule leaves to the guest: "method" (no `methods`), "path" (no `paths`, or `/**`)."""
    wide = ["method"] if rule.methods is None else []
    return wide + (["path"] if rule.path_pattern is None or "/**" in (rule.paths or ()) else [])


def _secret_warnings(manifest: Manifest) -> list[str]:
    """Secrets on rules wider than one host and port, or than some methods and paths."""
    if manifest.network is None:
        return []
    warnings = []
    for rule in compile_rules(manifest.network.allow):
        if rule.secret is None:
            continue
        wide = []
        if isinstance(rule.dest, AddressRule) and rule.dest.network.num_addresses > 1:
            wide.append(f"{rule.dest.network.num_addresses:,} addresses")
        if isinstance(rule.dest, AddressRule) and rule.dest.port is None:
            wide.append("any port")
        wide += [f"any {what}" for what in _left_open(rule)]
        if wide:
            warnings.append(
                f"{rule.label}: its secret ({rule.secret.describe()}) goes with requests to {', '.join(wide)}: "
                "narrow the rule to the host, port, methods and paths the credential is for"
            )
    return warnings


def _limit_warnings(manifest: Manifest) -> list[str]:
    limits = manifest.limits
    warnings = []
    for name, high in HIGH.items():
        value = getattr(limits, name)
        if value > high:
            shown = format_size(value) if name in ("memory", "output") else f"{value:,}"
            warnings.append(f"limits.{name} is {shown}, more than one tool call usually needs")
    if manifest.scratch is not None and manifest.scratch > HIGH_SCRATCH:
        warnings.append(f"scratch is {format_size(manifest.scratch)}")
    return warnings


def _unused_grant_warnings(manifest: Manifest) -> list[str]:
    if manifest.module is not None:
        info = inspect_file(manifest.module)
        used = set(info.host_functions)
        warnings = [
            f"host function {name} is granted but the module never imports it"
            for name in manifest.host_functions
            if name not in used
        ]
        if not info.uses_wasi:
            for what, given in (
                ("preopens", manifest.preopens),
                ("scratch", manifest.scratch),
                ("env", manifest.env),
                ("args", manifest.args),
            ):
                if given:
                    warnings.append(
                        f"{what} is granted but the module does not import WASI, so cannot use it"
                    )
        return warnings
    if manifest.source is not None:  # a Python tool: names its host functions in its source
        source = read_regular_file(manifest.source).decode("utf-8", errors="replace")
        return [
            f"host function {name} is granted but the source never names it"
            for name in manifest.host_functions
            if name not in source
        ]
    return []


def _unnarrowed_host_function_warnings(manifest: Manifest) -> list[str]:
    """Host functions granted for any arguments (`http.fetch` is narrowed by `[network]`, the
    tools' host function by `tool_args`)."""
    return [
        f"host function {name} is granted for any arguments: narrow what this tool may pass it "
        f'in [host_function_args."{name}"] (a JSON Schema per argument: a pattern, enum, const '
        "or maximum)"
        for name in manifest.host_functions
        if name not in (FETCH, CALL_TOOL) and name not in manifest.host_function_args
    ]


def _unnarrowed_tool_warnings(manifest: Manifest) -> list[str]:
    """Tools the code may call with any args its schema accepts."""
    return [
        f"tool {name} is granted to the code for any args its own schema accepts: narrow what "
        f"the code may pass it in [tool_args.{name}] (a JSON Schema per argument)"
        for name in manifest.tools
        if name not in manifest.tool_args
    ]


def _writable_with_egress_warnings(manifest: Manifest) -> list[str]:
    """A writable preopen beside `http.fetch`: an injected instruction can both change the
    host's files and send what it read out."""
    if FETCH not in manifest.host_functions:
        return []
    return [
        f"preopen {preopen.guest} is writable and the tool can send data out ({FETCH}): a prompt "
        f"injection can change {preopen.host} and send what it reads; make the preopen read-only "
        "(scratch for temporary files), or split the tool so one part writes and another fetches"
        for preopen in manifest.preopens
        if preopen.writable
    ]


def _raised_limits(manifest: Manifest) -> dict[str, float]:
    """The limits the manifest sets above the default it would otherwise have, by name."""
    defaults = Limits()
    raised: dict[str, float] = {}
    for name in sorted(manifest.limits.model_fields_set):
        default = getattr(defaults, name)
        if name == "fuel" and manifest.runtime == "python" and manifest.python != "scientific":
            default = PYTHON_FUEL
        value = getattr(manifest.limits, name)
        if value > default:
            raised[name] = value
    return raised


def _example_warnings(manifest: Manifest, cache_dir: Path | None) -> list[str]:
    """Raised limits more than `EXAMPLE_FACTOR` times what the manifest's examples use, and
    examples that fail; nothing when there are no examples, no raised limit, or the tool cannot
    be loaded here."""
    raised = _raised_limits(manifest)
    if not manifest.examples or not raised:
        return []
    results = _run_examples(manifest, cache_dir)
    if results is None:
        return []
    failed = [
        f"examples[{i}] fails ({r.error.kind.value}: {r.error.message[:120]}): a tool's own examples "
        "should succeed under its limits, so they can show what the limits need to be"
        for i, r in enumerate(results)
        if r.error is not None
    ]
    if failed:
        return failed
    used = {
        "fuel": max(r.fuel_used for r in results),
        "timeout": max(r.duration_s for r in results),
        "output": max(_output_size(r) for r in results),
        "host_calls": max(len(r.host_calls) for r in results),
    }
    peaks = [r.peak_memory for r in results if r.peak_memory is not None]
    if len(peaks) == len(results):
        used["memory"] = max(peaks)
    warnings = []
    for name, value in raised.items():
        if name not in used:
            continue
        most = max(used[name], _USED_FLOOR[name])
        if value > EXAMPLE_FACTOR[name] * most:
            warnings.append(
                f"limits.{name} is {_shown(name, value)} but the manifest's examples use at most "
                f"{_shown(name, used[name])}: lower it toward {_shown(name, 10 * most)} (10x that), "
                "or add an example that needs more"
            )
    return warnings


def _run_examples(manifest: Manifest, cache_dir: Path | None) -> list[CallResult] | None:
    """Each example called once, in a fresh Sandbox; None when the tool cannot be loaded there
    (e.g. it is granted host functions only its application registers)."""
    from ._sandbox import Sandbox  # (lint's other checks need no engine)

    with Sandbox() if cache_dir is None else Sandbox(cache_dir=cache_dir) as box:
        try:
            tool = box.load(manifest)
        except WasmboxError:
            return None
        return [tool.call(example) for example in manifest.examples]


def _output_size(result: CallResult) -> int:
    value = len(json.dumps(as_json(result.value))) if result.value is not None else 0
    files = sum(len(data) for data in result.files.values())
    return max(len(result.stdout_bytes or result.stdout.encode()), len(result.stderr.encode()), value, files)


def _shown(name: str, value: float) -> str:
    if name in ("memory", "output"):
        return format_size(int(value))
    if name == "timeout":
        return f"{value:.3g}s"
    return f"{int(value):,}"


CHECKS: tuple[Callable[[Manifest], list[str]], ...] = (
    _preopen_warnings,
    _network_warnings,
    _limit_warnings,
    _unused_grant_warnings,
    _package_warnings,
    _command_warnings,
    _entry_warnings,
    _memory_warnings,
    _unnarrowed_host_function_warnings,
    _unnarrowed_tool_warnings,
    _writable_with_egress_warnings,
    _egress_rule_warnings,
    _secret_warnings,
)
