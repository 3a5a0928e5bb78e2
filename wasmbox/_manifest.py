"""The capability manifest: one tool and everything it may touch (ARCHITECTURE.md, "Limits →
Wasmtime": what each limit and grant becomes)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from . import _command, _pins, _schema
from ._capabilities import grants as _grants
from ._capabilities.allowlist import FETCH
from ._capabilities.egress import HEADER_NAME, compile_rules, header_value_ok
from ._capabilities.grants import overlapping_preopens
from ._errors import LimitsError, ManifestError
from ._files import read_regular_file
from ._units import DURATION_PATTERN, SIZE_PATTERN, format_size, parse_duration, parse_size
from ._wasmtime.engine import MAX_MEMORY

SCRATCH_GUEST_PATH = "/tmp"  # noqa: S108 - a path inside the guest: each call's scratch space
INPUTS_GUEST_PATH = "/tmp/in"  # noqa: S108 - a call's input files (`inputs`), in its scratch space
STDLIB_GUEST_PATH = "/python"  # the Python runtime's stdlib (where its build saw it, too)
PACKAGES_GUEST_PATH = "/packages"  # a Python manifest's third-party packages, read-only
SCIENTIFIC_LIB_GUEST_PATH = "/usr/local/lib"  # the scientific runtime's stdlib zip, read-only
_NAME = r"^[A-Za-z_][A-Za-z0-9_-]*$"
HOST_FUNCTION_NAME = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
# the host function through which Python and JavaScript code calls the tools its `tools` names
# (granted by `tools`, never on its own)
CALL_TOOL = "wasmbox.call_tool"

Size = Annotated[
    int,
    BeforeValidator(parse_size),
    Field(gt=0),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": SIZE_PATTERN}]}
    ),
]
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    Field(gt=0, le=3600),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
                {"type": "string", "pattern": DURATION_PATTERN},
            ]
        }
    ),
]


# What a grant of a host function or tool narrows its args to: argument name -> JSON Schema.
ArgConstraints = dict[str, dict[str, dict[str, Any] | bool]]

# Keywords that apply to values of one JSON type only: a schema using one without saying the
# type lets every other type through (a number passes `pattern`, a string passes `maximum`).
_TYPED_KEYWORDS = {
    "string": ("pattern", "minLength", "maxLength", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "array": ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"),
    "object": (
        "properties",
        "patternProperties",
        "additionalProperties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyNames",
    ),
}


def constraint_schema(args: Mapping[str, Mapping[str, Any] | bool]) -> dict[str, Any]:
    """The JSON Schema of the args a grant narrowed to `args`: a map of exactly those names,
    every one given (so a default of the function's own cannot stand in for a refused value),
    each value fitting its schema."""
    return {
        "type": "object",
        "properties": dict(args),
        "required": sorted(args),
        "additionalProperties": False,
    }


def _check_constraints(table: ArgConstraints) -> ArgConstraints:
    """ValueError naming the function (or tool) and argument of a schema that cannot be checked
    as written, or that uses a one-type keyword without a `type`."""
    for name, args in table.items():
        for arg, schema in args.items():
            where = f"{name}.{arg}"
            try:
                _schema.check_schema(schema)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
            untyped = _untyped_keyword(schema)
            if untyped is not None:
                keyword, kind = untyped
                raise ValueError(
                    f"{where}: `{keyword}` applies to {kind}s only, so a value of another type "
                    f'would pass it: add type = "{kind}" (or const, enum)'
                )
    return table


def _untyped_keyword(schema: Mapping[str, Any] | bool) -> tuple[str, str] | None:
    """The first one-type keyword of `schema`, or of a property's or item's schema in it, that
    has no `type`, `const` or `enum` beside it, with that type."""
    if not isinstance(schema, Mapping):
        return None
    if not any(key in schema for key in ("type", "const", "enum")):
        for kind, keywords in _TYPED_KEYWORDS.items():
            for keyword in keywords:
                if keyword in schema:
                    return keyword, kind
    subs: list[Any] = list((schema.get("properties") or {}).values())
    subs += [schema[key] for key in ("items", "additionalProperties") if key in schema]
    subs += list(schema.get("prefixItems") or [])
    for sub in subs:
        found = _untyped_keyword(sub)
        if found is not None:
            return found
    return None


class _Narrowed:
    """The validators of a manifest's `host_function_args` and `tool_args` (by "host" or "tool"
    and name), built once, with the tables they were built from. A cache: never part of a
    manifest's equality."""

    def __init__(self, host: ArgConstraints | None, tool: ArgConstraints | None) -> None:
        self.host, self.tool = host, tool
        tables = {"host": host or {}, "tool": tool or {}}
        self.checks = {
            (kind, name): _schema.compile(constraint_schema(args))
            for kind, table in tables.items()
            for name, args in table.items()
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Narrowed)

    __hash__ = object.__hash__


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# The default fuel of a standard-runtime Python tool or run_python grant set (one that does not
# set limits.fuel): about what the CPython runtime burns in its 2 s default deadline on a
# typical machine (7-10G fuel/s: bench/python_fuel_rate.py), so ordinary model-written code is
# stopped by the deadline or finishes, rather than running out of fuel in a few milliseconds.
PYTHON_FUEL = 10_000_000_000


class Limits(_Strict):
    """Per-call limits. Every one is finite; the defaults are the safe ones."""

    fuel: int = Field(
        50_000_000,
        gt=0,
        le=2**63 - 1,
        description="Wasm fuel units (about one per instruction); a standard-runtime Python "
        "manifest that does not set it gets PYTHON_FUEL (10G).",
    )
    memory: Size = Field(64 * 1024**2, le=MAX_MEMORY, description="Linear memory cap.")
    timeout: Duration = Field(2.0, description="Wall-clock deadline, seconds or '500ms'.")
    output: Size = Field(
        64 * 1024,
        description="Cap on stdout, stderr, the result, and a command's output files together: each.",
    )
    host_calls: int = Field(100, ge=0, description="Host-function calls allowed per call.")


class CallLimits(_Strict):
    """Limits of one call, on top of its manifest's (`tool.call(args, limits=...)`): each one
    set must be at most the manifest's, which the call then runs under instead; one left
    unset keeps the manifest's. Same units and forms as `Limits` ("500ms", "16MiB")."""

    fuel: int | None = Field(None, gt=0, le=2**63 - 1)
    memory: Size | None = Field(None, le=MAX_MEMORY)
    timeout: Duration | None = None
    output: Size | None = None
    host_calls: int | None = Field(None, ge=0)

    @classmethod
    def of(cls, given: CallLimits | Mapping[str, Any]) -> CallLimits:
        """`given` as CallLimits (a mapping is read like a manifest's `[limits]`); raises
        LimitsError naming the limit that is malformed."""
        if isinstance(given, CallLimits):
            return given
        if not isinstance(given, Mapping):
            raise LimitsError(f"limits must be a CallLimits or a mapping, got {type(given).__name__}")
        try:
            return cls.model_validate(dict(given))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "limits"
            raise LimitsError(f"limits.{where}: {first['msg']}") from None

    def applied_to(self, limits: Limits, tool: str) -> Limits:
        """`limits` tightened by the ones set here. Raises LimitsError for one above `limits`
        (a call may not loosen its manifest), naming `tool`, the limit and both values."""
        changes: dict[str, Any] = {}
        for name in _CALL_LIMITS:
            value = getattr(self, name)
            if value is None:
                continue
            allowed = getattr(limits, name)
            if value > allowed:
                raise LimitsError(
                    f"{tool}: limits.{name} = {_shown(name, value)} is above the manifest's "
                    f"{_shown(name, allowed)}: a call may only tighten its tool's limits (ask for less, or "
                    f"raise limits.{name} in the manifest)"
                )
            changes[name] = value
        return limits.model_copy(update=changes) if changes else limits


_CALL_LIMITS = ("fuel", "memory", "timeout", "output", "host_calls")


def _shown(name: str, value: float) -> str:
    if name in ("memory", "output"):
        return format_size(int(value))
    return f"{value:g} s" if name == "timeout" else f"{value:,}"


class Preopen(_Strict):
    """A host directory the guest sees at `guest`; read-only unless `writable`."""

    host: Path = Field(description="Host directory, relative to the manifest's folder.")
    guest: str = Field(description="Absolute path inside the guest, e.g. /data.")
    writable: bool = False
    # how `host` was resolved, for the grant checks (None for a Preopen made without validation)
    _resolved: _grants.Resolved | None = PrivateAttr(None)

    @field_validator("host", mode="before")
    @classmethod
    def _host_path(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            return _resolve(value, info)
        return value

    @model_validator(mode="after")
    def _resolve_host(self) -> Preopen:
        """`host` becomes the real directory, resolved once: what its path led to now, without
        a symlink on the way, is what every call opens (see `_capabilities/grants.py`)."""
        try:
            resolved = _grants.resolve(self.host)
        except (FileNotFoundError, NotADirectoryError):
            raise ValueError(f"host: not a directory: {self.host}") from None
        except OSError as exc:
            raise ValueError(f"host: {self.host}: {exc.strerror or exc}") from None
        if resolved.real == Path(resolved.real.anchor):
            raise ValueError("host: the host's root directory cannot be granted")
        object.__setattr__(self, "host", resolved.real)  # (frozen: set here, once, while validated)
        self._resolved = resolved
        return self

    @field_validator("guest")
    @classmethod
    def _guest_path(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not path.is_absolute() or ".." in path.parts or "\0" in value:
            raise ValueError("must be an absolute guest path without '..'")
        return str(path)


class EgressSecret(_Strict):
    """A credential the host adds to each request of its rule, after the request leaves the
    guest (see `_capabilities/egress.py`): the guest never holds it."""

    header: str = Field(
        pattern=HEADER_NAME, description="The request header it is sent in, e.g. Authorization."
    )
    prefix: str = Field("", description='Sent before the value, e.g. "Bearer ".')
    env: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The host environment variable holding it, read at each request.",
    )
    sandbox: str | None = Field(
        None,
        pattern=_NAME,
        description="The name it is given under in Sandbox(secrets={name: value or callable}).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> EgressSecret:
        if (self.env is None) == (self.sandbox is None):
            raise ValueError("give the secret's source: `env` (a host environment variable) or `sandbox`")
        if not header_value_ok(self.prefix):
            raise ValueError("prefix: control characters cannot be sent in a header")
        return self


class EgressRule(_Strict):
    """One `[network] allow` entry that says more than where it reaches; every limit left out
    is no limit (a plain "host:port" string is a rule with none)."""

    host: str = Field(
        description="Where it reaches, as a plain entry: 'host:port', an address, '[v6]:port', a CIDR."
    )
    methods: tuple[str, ...] | None = Field(
        None, strict=False, min_length=1, description='HTTP methods allowed, e.g. ["GET"].'
    )
    paths: tuple[str, ...] | None = Field(
        None,
        strict=False,
        min_length=1,
        description="Paths allowed: '*' is any run of characters within one segment, a last "
        'segment \'**\' any rest, e.g. ["/v1/forecast", "/repos/acme/*/issues/**"].',
    )
    query: tuple[str, ...] | None = Field(
        None, strict=False, description="Query parameter names allowed ([]: no query)."
    )
    headers: tuple[str, ...] | None = Field(
        None, strict=False, description="Request headers the guest may set ([]: none)."
    )
    forbid_headers: tuple[str, ...] = Field(
        (), strict=False, description="Request headers the guest may never set under this rule."
    )
    max_body: Size | None = Field(None, description="Cap on a request body.")
    max_calls: int | None = Field(None, ge=1, description="Requests sent under this rule per call.")
    secret: EgressSecret | None = Field(None, description="A credential the host adds to its requests.")


class Network(_Strict):
    """Egress through the `http.fetch` host function (see `_capabilities/allowlist.py`,
    `egress.py`, `fetch.py`)."""

    allow: tuple[str | EgressRule, ...] = Field(
        strict=False,
        min_length=1,
        description="Where requests may go: 'host:port', an address with or without ':port', "
        "'[v6]:port', a CIDR, or a table with `host` and the limits of its requests.",
    )
    max_response: Size = Field(1024**2, description="Cap on a response body.")
    timeout: Duration = Field(5.0, description="Cap on one fetch, redirects included.")

    @field_validator("allow")
    @classmethod
    def _allow(cls, value: tuple[str | EgressRule, ...]) -> tuple[str | EgressRule, ...]:
        compile_rules(value)  # ValueError names the entry
        return value


MEDIA_TYPE = r"^[a-z]+/[A-Za-z0-9][A-Za-z0-9.+_-]*$"


class OutputFile(_Strict):
    """A file the command writes in its scratch /tmp, returned in `CallResult.files`."""

    path: str = Field(description="Absolute guest path under /tmp, e.g. /tmp/out.png.")
    media_type: str | None = Field(
        None, pattern=MEDIA_TYPE, description="e.g. image/png; else sniffed from the bytes."
    )

    @field_validator("path")
    @classmethod
    def _under_scratch(cls, value: str) -> str:
        path = PurePosixPath(value)
        if (
            not path.is_absolute()
            or ".." in path.parts
            or "\0" in value
            or not _within(str(path), SCRATCH_GUEST_PATH)
            or str(path) == SCRATCH_GUEST_PATH
        ):
            raise ValueError(f"must be a file path under {SCRATCH_GUEST_PATH}, without '..'")
        return str(path)


def _output_file(value: object) -> object:
    return {"path": value} if isinstance(value, str) else value


class Inputs(_Strict):
    """Files a call may bring (`Tool.call(files=...)`, `run_python(files=...)`), written under
    /tmp/in before the guest starts."""

    size: Size = Field(description="The most bytes a call's files may hold together, e.g. '4MiB'.")
    count: int = Field(64, gt=0, le=4096, description="The most files a call may bring.")
    writable: bool = Field(
        False, description="Whether the guest may change them (they are then part of the scratch space)."
    )


def _output_glob(value: str) -> str:
    """A path or glob (`*`, `?`, `[...]`, `**`) under /tmp, as `outputs` takes it."""
    path = PurePosixPath(value)
    if (
        not isinstance(value, str)
        or not path.is_absolute()
        or ".." in path.parts
        or "\0" in value
        or not _within(str(path), SCRATCH_GUEST_PATH)
        or str(path) == SCRATCH_GUEST_PATH
    ):
        raise ValueError(f"{value!r}: must be a path or glob under {SCRATCH_GUEST_PATH}, without '..'")
    return str(path)


OutputGlob = Annotated[str, AfterValidator(_output_glob)]


class Command(_Strict):
    """How a WASI command tool is called with args (see `_command.py`), and what it returns."""

    argv: tuple[str, ...] | None = Field(
        None,
        strict=False,
        description='argv templates after `args`, e.g. ["-T{format}", "{*files}"]: '
        "{name} is an input_schema property, {*name} repeats the item per array element.",
    )
    stdin: str | None = Field(None, description='stdin template, e.g. "{graph}".')
    fail_on_exit_code: bool = Field(False, description="A nonzero exit code is a guest_error.")
    stdout_media_type: str | None = Field(
        None, pattern=MEDIA_TYPE, description="e.g. image/svg+xml; else sniffed from the bytes."
    )
    outputs: tuple[
        Annotated[
            OutputFile,
            BeforeValidator(_output_file),
            WithJsonSchema({"anyOf": [{"type": "string"}, OutputFile.model_json_schema()]}),
        ],
        ...,
    ] = Field((), strict=False, description="Files to return from /tmp (needs `scratch`).")

    @property
    def mapped(self) -> bool:
        """Whether argv/stdin come from the call's args (else from `Tool.call`'s keywords)."""
        return self.argv is not None or self.stdin is not None


EXPORT_NAME = r"^[^\x00-\x1f]{1,256}$"
ReactorSlot = Literal["argc", "argv", "out_len", "out_ptr"]
ReactorResult = Literal["cstring", "out_len", "ptr_len", "out_ptr", "exit_code", "none"]


class Allocator(_Strict):
    """The module's own allocator, through which the host writes strings and buffers."""

    export: str = Field(pattern=EXPORT_NAME, description="e.g. malloc, realloc, cabi_realloc.")
    signature: Literal["malloc", "realloc", "cabi_realloc"] = Field(
        "malloc",
        description="malloc: (size) -> ptr; realloc: (ptr, size) -> ptr, called with ptr 0; "
        "cabi_realloc: (old_ptr, old_size, align, size) -> ptr, called with 0, 0, 1.",
    )


class ReactorParam(_Strict):
    """One entry parameter from the call's args: exactly one of `cstring`, `buffer`, `integer`."""

    cstring: str | None = Field(None, description="A template; passed as a NUL-terminated string.")
    buffer: str | None = Field(None, description="A template; passed as two params: pointer, length.")
    integer: str | None = Field(None, description="A template that gives an integer (i32 or i64).")

    @model_validator(mode="after")
    def _one(self) -> ReactorParam:
        if sum(x is not None for x in (self.cstring, self.buffer, self.integer)) != 1:
            raise ValueError("give exactly one of cstring, buffer, integer")
        return self

    @property
    def template(self) -> str:
        found = self.cstring if self.cstring is not None else self.buffer
        found = found if found is not None else self.integer
        assert found is not None
        return found


class Reactor(_Strict):
    """A module called through its own exports (see `_backends/core/reactor.py`): `initialize`
    once per instance, then `entry` with the params and result shape declared here."""

    entry: str = Field(pattern=EXPORT_NAME, description="The export to call, e.g. graphviz_render.")
    initialize: str | None = Field(
        None,
        pattern=EXPORT_NAME,
        description="An export () -> () run first; if not given, _initialize when the module exports it.",
    )
    allocator: Allocator | None = Field(None, description="Needed for any param but `integer`.")
    params: tuple[ReactorSlot | ReactorParam, ...] = Field(
        (),
        strict=False,
        description='In order: {cstring = "{dot}"}, {buffer = ...}, {integer = ...}, or argc, argv '
        "(from [command] argv), out_len (a size_t the entry sets), out_ptr (a char * it sets).",
    )
    result: ReactorResult = Field(
        description="cstring: char * (NULL fails); out_len: char * with its length in the out_len "
        "param; ptr_len: (ptr, len) as i64 ptr<<32|len or two i32s; out_ptr: int status (0 is "
        "success) with the result in out_ptr/out_len; exit_code: int, the value {exit_code: n}; none.",
    )
    result_encoding: Literal["text", "bytes", "json"] = Field(
        "text", description="How a returned buffer becomes the value: UTF-8 text, bytes, or JSON."
    )
    error: str | None = Field(
        None,
        pattern=EXPORT_NAME,
        description="An export () -> char * whose string says why the entry failed, e.g. graphviz_last_error.",
    )

    @model_validator(mode="after")
    def _shape(self) -> Reactor:
        slots = [p for p in self.params if isinstance(p, str)]
        for slot in set(slots):
            if slots.count(slot) > 1:
                raise ValueError(f"params: {slot} is given more than once")
        if ("argc" in slots) != ("argv" in slots):
            raise ValueError("params: argc and argv go together")
        wants = {"out_len": {"out_len"}, "out_ptr": {"out_ptr", "out_len"}}.get(self.result, set())
        for slot in ("out_len", "out_ptr"):
            if slot in wants and slot not in slots:
                raise ValueError(f"result {self.result!r} needs an {slot} param")
            if slot in slots and slot not in wants:
                raise ValueError(f"params: {slot} is only for result 'out_len' or 'out_ptr'")
        needs_memory = any(not isinstance(p, ReactorParam) or p.integer is None for p in self.params)
        if needs_memory and self.allocator is None:
            raise ValueError("params passed through memory need an `allocator`")
        return self


class Manifest(_Strict):
    """A tool and its grants. Unknown keys are errors; relative paths follow the manifest file."""

    name: str = Field(pattern=_NAME, max_length=64)
    description: str = ""
    module: Path | None = Field(None, description="A core wasm module or .wat file.")
    runtime: Literal["python", "javascript"] | None = Field(
        None,
        description="Source run by a runtime of wasmbox's instead of a `module`: 'python' "
        "(CPython) or 'javascript' (QuickJS); without `source`, a grant set for run_python or "
        "run_javascript.",
    )
    source: Path | None = Field(None, description="The tool's Python or JavaScript source (with `runtime`).")
    python: Literal["standard", "scientific"] | None = Field(
        None,
        description="Which Python runtime (runtime = 'python'): the standard one (the default), "
        "or 'scientific' (numpy, pandas; docs/scientific.md).",
    )
    entry: str = "main"
    # the validators of `host_function_args` and `tool_args`, by ("host" | "tool", name)
    _narrowed: _Narrowed = PrivateAttr(default_factory=lambda: _Narrowed(None, None))
    host_functions: tuple[Annotated[str, Field(pattern=HOST_FUNCTION_NAME)], ...] = Field((), strict=False)
    host_function_args: ArgConstraints = Field(
        default_factory=dict,
        description="What this tool may pass each granted host function: per function, a JSON "
        'Schema per argument (`[host_function_args."kv.get"]` `key = {type = "string", '
        'pattern = "^public/"}`). Only the arguments named may be given, and each must be; a call '
        "outside them is capability_denied before the function runs.",
    )
    env: dict[str, str] = Field(default_factory=dict)
    args: tuple[str, ...] = Field((), strict=False)
    limits: Limits = Field(default_factory=Limits)
    preopens: tuple[Preopen, ...] = Field((), strict=False)
    scratch: Size | None = Field(
        None, description="A fresh writable /tmp of at most this size for each call, then deleted."
    )
    network: Network | None = None
    inputs: Inputs | None = Field(
        None, description="Files a call may bring, written under /tmp/in (needs `scratch`)."
    )
    outputs: tuple[OutputGlob, ...] = Field(
        (),
        strict=False,
        description="Files a Python or JavaScript call returns from /tmp, by path or glob (needs `scratch`).",
    )
    input_schema: dict[str, Any] | None = Field(
        None,
        description="The JSON Schema (Draft 2020-12) of the args, checked on every call; "
        "in a dict manifest or `Manifest(...)`, a Pydantic model class too (its `model_json_schema()`).",
    )
    output_schema: dict[str, Any] | None = Field(
        None,
        description="The JSON Schema (Draft 2020-12) of a call's value, checked on every "
        "call that succeeds (a value that breaks it is a bad_response); a Pydantic model class too. "
        "A Python tool without one takes its entry's return annotation.",
    )
    examples: tuple[dict[str, Any], ...] = Field(
        (),
        strict=False,
        max_length=16,
        description="Example args, each checked against the args schema at load; sent as "
        "Anthropic's input_examples, and in the description where a provider has no field.",
    )
    defer_loading: bool = Field(
        False,
        description="Offer the tool through the provider's tool search instead of up front "
        "(OpenAI Responses' and Anthropic's `defer_loading`).",
    )
    tools: tuple[Annotated[str, Field(pattern=_NAME, max_length=64)], ...] = Field(
        (),
        strict=False,
        description="Loaded tools this Python or JavaScript code may call as functions "
        "(`tools.word_count(text=...)`), each call checked and run as the tool's own, under its "
        "grants and limits, and counted as a host call.",
    )
    tool_args: ArgConstraints = Field(
        default_factory=dict,
        description="What the code may pass each tool in `tools`: per tool, a JSON Schema per "
        "argument, as `host_function_args` (only those arguments, each given); a call outside "
        "them is refused (capability_denied) before the tool runs.",
    )
    callers: tuple[Literal["model", "code"], ...] = Field(
        ("model", "code"),
        strict=False,
        min_length=1,
        description="Who may call the tool: the model directly (its specs list it, dispatch runs "
        "it), code whose manifest lists it in `tools`, or both (the default).",
    )
    command: Command | None = None
    reactor: Reactor | None = Field(
        None, description="Call the module through its own exports, not the wasmbox ABI or _start."
    )
    packages: tuple[str, ...] = Field(
        (),
        strict=False,
        description="Pure-Python packages a Python tool or grant set imports, pinned: "
        '["idna==3.10"], or hashed as pip takes them, ["idna==3.10 --hash=sha256:<hex>"] (then '
        "every pin of the set, dependencies too, and pip refuses a file with another digest); "
        'their dependencies are installed too (docs/python.md, "Third-party packages").',
    )
    requirements: Path | None = Field(
        None,
        description="A requirements file of pinned packages (with --hash options, lines continued "
        "with a backslash, as pip reads them), added to `packages`.",
    )

    @field_validator("module", "source", "requirements", mode="before")
    @classmethod
    def _relative_path(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            return _resolve(value, info)
        return value

    @field_validator("module", "source", "requirements")
    @classmethod
    def _file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("host_functions")
    @classmethod
    def _unique_functions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError("host functions are listed more than once")
        return value

    @field_validator("host_function_args", "tool_args")
    @classmethod
    def _constraints(cls, value: ArgConstraints) -> ArgConstraints:
        return _check_constraints(value)

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not key or "=" in key or "\0" in key or "\0" in item:
                raise ValueError(f"invalid environment variable {key!r}")
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any("\0" in arg for arg in value):
            raise ValueError("an argument contains a NUL byte")
        return value

    @field_validator("packages")
    @classmethod
    def _pinned(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _pins.check_pins(value)

    @field_validator("input_schema", "output_schema", mode="before")
    @classmethod
    def _model_schema(cls, value: object, info: ValidationInfo) -> object:
        """A Pydantic model class given as the schema: its `model_json_schema()` is the contract
        (of what it validates for args, of what it serializes to for a result)."""
        if isinstance(value, type) and issubclass(value, BaseModel):
            if info.field_name == "input_schema":
                return value.model_json_schema(mode="validation")
            return value.model_json_schema(mode="serialization")
        return value

    @field_validator("input_schema", "output_schema")
    @classmethod
    def _checked_schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            _schema.check_schema(value)
        return value

    @model_validator(mode="after")
    def _one_kind_of_tool(self) -> Manifest:  # noqa: C901 - a rule per field that one kind of tool excludes
        if self.runtime is None and self.module is None:
            raise ValueError('give `module`, or `runtime` ("python" or "javascript")')
        if self.runtime is not None and self.module is not None:
            raise ValueError("give either `module` or `runtime`, not both")
        if self.runtime is None and self.source is not None:
            raise ValueError('`source` needs `runtime` ("python" or "javascript")')
        if self.runtime is not None and self.source is None:
            given = [k for k in ("output_schema", "examples", "defer_loading") if getattr(self, k)]
            given += ["callers"] if set(self.callers) != {"model", "code"} else []
            if given:
                raise ValueError(
                    f"{', '.join(given)}: a grant set (runtime without source) describes no tool of its "
                    "own; give them on a tool's manifest"
                )
        guests = [p.guest for p in self.preopens]
        if len(set(guests)) != len(guests):
            raise ValueError("two preopens share a guest path")
        overlap = overlapping_preopens(self.preopens, self.preopens)
        if overlap:
            raise ValueError(overlap)
        if (self.network is None) != (FETCH not in self.host_functions):
            raise ValueError(f"[network] and the {FETCH} host function go together: grant both or neither")
        for guest in guests:
            if self.scratch is not None and _within(guest, SCRATCH_GUEST_PATH):
                raise ValueError(f"preopen {guest} would hide or nest in the scratch space at /tmp")
            if self.runtime == "python" and (
                _within(guest, STDLIB_GUEST_PATH) or _within(guest, PACKAGES_GUEST_PATH)
            ):
                raise ValueError(f"preopen {guest} is reserved for the Python runtime")
        if (self.inputs is not None or self.outputs) and self.scratch is None:
            raise ValueError("`inputs` and `outputs` are files in /tmp: they need `scratch`")
        writable = self.inputs is not None and self.inputs.writable
        if (
            writable
            and self.scratch is not None
            and self.inputs is not None
            and self.inputs.size > self.scratch
        ):
            raise ValueError(
                "writable inputs are part of the scratch space: `scratch` must be at least inputs.size"
            )
        if self.outputs and self.runtime is None:
            raise ValueError("`outputs` are for Python and JavaScript calls; a command lists command.outputs")
        self._check_packages()
        self._check_tools()
        self._check_narrowed()
        if self.python is not None:
            self._check_python_runtime(guests)
        if self.command is not None:
            self._check_command(self.command)
        if self.reactor is not None:
            self._check_reactor(self.reactor)
        if (
            self.runtime == "python"
            and self.python != "scientific"
            and "fuel" not in self.limits.model_fields_set
        ):
            # the interpreter's default fuel is sized to its deadline (Limits.fuel is a core module's)
            object.__setattr__(self, "limits", self.limits.model_copy(update={"fuel": PYTHON_FUEL}))
        return self

    def _check_packages(self) -> None:
        """`packages` (checked and sorted by `_pinned`) takes in the pins of `requirements`."""
        if (self.packages or self.requirements is not None) and self.runtime != "python":
            raise ValueError('`packages` and `requirements` are for Python tools (runtime = "python")')
        if self.requirements is not None:
            listed = _pins.check_pins(_pins.read_requirements(self.requirements), str(self.requirements))
            merged = _pins.check_pins((*self.packages, *listed), "packages and requirements")
            object.__setattr__(self, "packages", merged)  # (frozen: set here, once, while validated)

    def _check_tools(self) -> None:
        """`tools` grants `CALL_TOOL`, which is added to `host_functions` here (and is refused
        there without `tools`)."""
        if not self.tools:
            if CALL_TOOL in self.host_functions:
                raise ValueError(
                    f"{CALL_TOOL} is granted by `tools` (the tools the code may call), not by name"
                )
            return
        if self.runtime is None or self.python == "scientific":
            raise ValueError(
                '`tools` are called from Python or JavaScript code (runtime = "python" or "javascript")'
            )
        if len(set(self.tools)) != len(self.tools):
            raise ValueError("tools are listed more than once")
        if self.name in self.tools and self.source is not None:
            raise ValueError(f"tool {self.name!r} lists itself in `tools`")
        if CALL_TOOL not in self.host_functions:
            object.__setattr__(self, "host_functions", (*self.host_functions, CALL_TOOL))

    def _check_narrowed(self) -> None:
        """Each narrowed name is granted; the validators of the narrowed grants, built once."""
        if CALL_TOOL in self.host_function_args:
            raise ValueError(f"host_function_args: narrow each tool's args in `tool_args`, not {CALL_TOOL}'s")
        for table, granted, field in (
            (self.host_function_args, self.host_functions, "host_functions"),
            (self.tool_args, self.tools, "tools"),
        ):
            for name in table:
                if name not in granted:
                    owner = "host_function_args" if field == "host_functions" else "tool_args"
                    raise ValueError(f"{owner}: {name!r} is not in `{field}`: grant it there too")
        self._build_narrowed()

    def _narrowing(self, kind: Literal["host", "tool"], name: str) -> _schema.Validator | None:
        """The check of the args this manifest lets its guest pass host function (`kind`
        "host") or tool ("tool") `name`; None when that grant is not narrowed."""
        cache = self._narrowed
        if cache.host is not self.host_function_args or cache.tool is not self.tool_args:
            cache = (
                self._build_narrowed()
            )  # a copy with other tables (`model_copy(update=...)`), or unvalidated
        return cache.checks.get((kind, name))

    def _build_narrowed(self) -> _Narrowed:
        self._narrowed = _Narrowed(self.host_function_args, self.tool_args)
        return self._narrowed

    def _check_python_runtime(self, guests: list[str]) -> None:
        if self.runtime != "python":
            raise ValueError('`python` chooses the runtime of a Python tool (runtime = "python")')
        if self.python != "scientific":
            return
        if self.packages:
            raise ValueError('`packages` are for the standard Python runtime, not python = "scientific"')
        if self.host_functions:
            raise ValueError("the scientific Python runtime serves no host functions (nor [network])")
        for guest in guests:
            if _within(guest, SCIENTIFIC_LIB_GUEST_PATH):
                raise ValueError(f"preopen {guest} is reserved for the scientific runtime's stdlib")

    def _check_command(self, command: Command) -> None:
        if self.runtime is not None:
            raise ValueError("[command] is for WASI command modules, not Python tools")
        if command.mapped:
            try:
                _command.CommandMapping.parse(command.argv, command.stdin, self.input_schema)
            except ValueError as exc:
                raise ValueError(f"command: {exc}") from None
        paths = [output.path for output in command.outputs]
        if paths and self.scratch is None:
            raise ValueError("command.outputs are files in /tmp: they need `scratch`")
        if len(set(paths)) != len(paths):
            raise ValueError("command.outputs lists a file more than once")

    def _check_reactor(self, reactor: Reactor) -> None:
        if self.runtime is not None:
            raise ValueError("[reactor] is for a wasm module, not Python tools")
        if self.command is not None and self.command.fail_on_exit_code and reactor.result != "exit_code":
            raise ValueError('command.fail_on_exit_code needs reactor.result = "exit_code"')
        properties = (self.input_schema or {}).get("properties")
        for index, param in enumerate(reactor.params):
            if isinstance(param, ReactorParam):
                try:
                    template = _command.Template.parse(param.template, argv_item=False)
                    _command.check_names(template, properties, f"param {index}")
                except ValueError as exc:
                    raise ValueError(f"reactor: {exc}") from None

    def digest(self) -> str:
        """sha256 of the canonical JSON form: names this exact grant set. Not cached: a
        cached value would survive `model_copy(update=...)` and name the wrong grants."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    @classmethod
    def load(cls, source: ManifestSource) -> Manifest:
        """A manifest from a TOML/JSON file path, a dict, or a Manifest (returned as is)."""
        if isinstance(source, Manifest):
            return source
        if isinstance(source, Mapping):
            return cls._validate(dict(source), Path.cwd(), "<dict>")
        path = Path(source)
        try:
            text = read_regular_file(path).decode("utf-8")
        except OSError as exc:
            raise ManifestError(f"{path}: cannot read manifest: {exc.strerror or exc}") from None
        except ValueError as exc:  # not UTF-8, or a NUL byte in the path
            raise ManifestError(f"{path}: cannot read manifest: {exc}"[:300]) from None
        try:
            if path.suffix == ".json":
                data = json.loads(text)
            else:
                import tomllib  # (only a TOML manifest needs it: kept out of `import wasmbox`)

                data = tomllib.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise ManifestError(f"{path}: not valid {path.suffix[1:] or 'TOML'}: {exc}") from None
        if not isinstance(data, dict):
            raise ManifestError(f"{path}: a manifest must be a table/object")
        return cls._validate(data, path.resolve().parent, str(path))

    @classmethod
    def _validate(cls, data: dict[str, Any], base: Path, origin: str) -> Manifest:
        try:
            return cls.model_validate(data, context={"base_dir": base})
        except ValidationError as exc:
            raise ManifestError(_describe(exc, origin)) from None


ManifestSource = Manifest | Mapping[str, Any] | str | os.PathLike[str]


def _within(guest: str, root: str) -> bool:
    """Whether guest path `guest` is `root` or below it."""
    return (guest + "/").startswith(root + "/")


def _resolve(value: str, info: ValidationInfo) -> Path:
    base = (info.context or {}).get("base_dir") or Path.cwd()
    return (Path(base) / value).absolute()


def _describe(exc: ValidationError, origin: str) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(manifest)"
        message = re.sub(r"^Value error, ", "", error["msg"])
        lines.append(f"{origin}: {where}: {message}")
    return "\n".join(lines)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the manifest format (what `capabilities/manifest.schema.json` holds)."""
    schema = Manifest.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://wasmbox.dev/manifest.schema.json"
    return schema
