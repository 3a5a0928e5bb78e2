"""`wasmbox lint`: warnings about manifests that grant more than a tool plausibly needs.

A valid manifest can still be too generous: a writable preopen of a big tree, a grant of a
system or home folder or the compile cache (read-only too), a grant given through a symlink,
an allow list of whole address ranges, limits far above what one tool call needs, grants the
module never uses, packages pinned by version without a hash. Lint says so; loading is unaffected (but see `Sandbox`'s refusals).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from ._backends.core.reactor import command_c_api
from ._backends.python.packages import is_hashed, pin_project
from ._cache import default_cache_dir
from ._capabilities.allowlist import AddressRule, forbidden_reason, parse_rules
from ._command import Template
from ._files import read_regular_file
from ._inspect import inspect_file, memory_problem
from ._manifest import Manifest
from ._units import format_size

LARGE_TREE_FILES = 1000
LARGE_TREE_BYTES = 100 * 1024**2
# Limits above these are unusual for one tool call.
HIGH = {"fuel": 10**10, "memory": 1024**3, "timeout": 60.0, "output": 16 * 1024**2, "host_calls": 10_000}
HIGH_SCRATCH = 1024**3
HIGH_RESPONSE = 64 * 1024**2


def lint(manifest: Manifest) -> list[str]:
    """The warnings for `manifest`, each a sentence; empty when nothing stands out."""
    warnings = [*_preopen_warnings(manifest), *_network_warnings(manifest), *_limit_warnings(manifest)]
    warnings += _unused_grant_warnings(manifest) + _package_warnings(manifest)
    return warnings + _command_warnings(manifest) + _entry_warnings(manifest) + _memory_warnings(manifest)


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
    for entry, rule in zip(manifest.network.allow, parse_rules(manifest.network.allow)):
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
            for what, given in (("preopens", manifest.preopens), ("scratch", manifest.scratch),
                                ("env", manifest.env), ("args", manifest.args)):  # fmt: skip
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
