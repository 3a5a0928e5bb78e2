"""Tool definitions in each provider's exact format, and OpenAI's strict schemas.

Strict mode (OpenAI's structured outputs, Anthropic's strict tools) accepts a subset of JSON
Schema: every object closed (`additionalProperties: false`) with every property in `required`,
optional ones nullable, the root an object. `strict_schema` converts a tool's schema to that
subset where the model can still say everything the tool accepts; the keywords it drops are
still checked, because wasmbox validates each call against the tool's original schema. The
nulls the conversion made the model send for omitted properties are removed before that check
(`prepare_args`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, get_args

from . import _schema
from ._capabilities.allowlist import FETCH
from ._errors import StrictSchemaError, StrictSchemaWarning
from ._manifest import Manifest
from ._stubs import Stubbed, javascript_stubs, python_stubs

SpecFormat = Literal["generic", "openai", "openai-responses", "anthropic", "mcp"]
StrictMode = bool | Literal["auto"]
FORMATS: tuple[str, ...] = get_args(SpecFormat)

# Dropped from a strict schema, written into its description, and still checked at call time
# (strict mode does not support them; each only narrows what the model may send).
_CHECKED_LATER = (
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
)
_KEPT = (
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
)
_REFUSED = ("allOf", "not", "$dynamicRef")  # no strict equivalent that keeps their meaning
_STRICT_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
# dropped from a strict schema (a `$ref` with only these beside it stays a `$ref`)
_ANNOTATIONS = {
    "title",
    "$comment",
    "$schema",
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "discriminator",
}

RUN_PYTHON = "run_python"  # `Sandbox.run_python` offered to a model as a tool
RUN_PYTHON_DESCRIPTION = (
    "Run Python 3.14 code in a fresh sandboxed interpreter (no network, no files, no processes "
    "unless granted). Returns the value of the last expression, with anything printed."
)
RUN_PYTHON_SESSION_DESCRIPTION = (
    "Run Python 3.14 code in a sandboxed interpreter (no network, no files, no processes unless "
    "granted) that keeps its variables, imports and files in /tmp from one call to the next, like "
    "a notebook. Returns the value of the last expression, with anything printed."
)
RUN_PYTHON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The Python source to run"}},
    "required": ["code"],
    "additionalProperties": False,
}
RUN_PYTHON_ANNOTATIONS: dict[str, Any] = {"readOnlyHint": True, "openWorldHint": False}
# what run_python's and run_javascript's descriptions add when their code may call tools
CALLS_TOOLS = (
    "\n\nThe code may call these tools as functions of `tools` (each call runs in the tool's own "
    "sandbox and returns its value; a failed call raises ToolCallError, with .kind and .message), "
    "so one run can call several tools, loop over their results and return only what is needed:"
    "\n```{language}\n{stubs}\n```"
)
RUN_JAVASCRIPT = "run_javascript"  # `Sandbox.run_javascript` offered to a model as a tool
RUN_JAVASCRIPT_DESCRIPTION = (
    "Run JavaScript (ES2023, QuickJS) in a fresh sandboxed context (no network, no files, no "
    "processes unless granted; top-level await works). Returns the value of the last expression "
    "as JSON, with anything console.log printed."
)
RUN_JAVASCRIPT_SESSION_DESCRIPTION = (
    "Run JavaScript (ES2023, QuickJS) in a sandboxed context (no network, no files, no processes "
    "unless granted; top-level await works) that keeps its global variables and functions and its "
    "files in /tmp from one call to the next, like a notebook (assign a name declared with let or "
    "const again instead of declaring it twice). Returns the value of the last expression as "
    "JSON, with anything console.log printed."
)
RUN_JAVASCRIPT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"code": {"type": "string", "description": "The JavaScript source to run"}},
    "required": ["code"],
    "additionalProperties": False,
}


class Described(Stubbed, Protocol):
    """What `spec_of` reads: a Tool, or a pool's stand-in for one (its name, description and
    schemas, as a stub shows them, and its manifest)."""

    @property
    def manifest(self) -> Manifest: ...


def spec_of(tool: Described, format: str, strict: StrictMode) -> dict[str, Any]:
    """`tool`'s definition in `format` (see `Tool.spec`)."""
    manifest = tool.manifest
    return tool_spec(
        tool.name,
        tool.description,
        tool.parameters,
        format,
        strict,
        mcp_annotations(manifest) if format == "mcp" else None,
        output_schema=tool.output_schema,
        examples=manifest.examples,
        defer_loading=manifest.defer_loading,
    )


def tool_spec(  # noqa: C901 - a branch per provider's format
    name: str,
    description: str,
    schema: Mapping[str, Any],
    format: str,
    strict: StrictMode,
    annotations: Mapping[str, Any] | None = None,
    *,
    output_schema: Mapping[str, Any] | None = None,
    examples: Sequence[Mapping[str, Any]] = (),
    defer_loading: bool = False,
) -> dict[str, Any]:
    """The definition of one tool in `format` (see `Tool.spec`). `output_schema` goes where the
    format has a field for it (generic, OpenAI Responses, MCP's `outputSchema`), `examples` into
    Anthropic's `input_examples` (filled for a strict schema) and generic's `examples`, else into
    the description; `defer_loading` where the format has it (generic, OpenAI Responses,
    Anthropic)."""
    if format not in FORMATS:
        raise ValueError(f"unknown spec format {format!r}; one of {', '.join(FORMATS)}")
    if strict not in (True, False, "auto"):
        raise ValueError(f"strict must be True, False or 'auto', got {strict!r}")
    parameters: dict[str, Any] = dict(schema)
    if format != "generic" and "type" not in parameters:
        parameters = {"type": "object", **parameters}  # every provider wants an object root
    is_strict = False
    if strict:
        try:
            parameters, is_strict = strict_schema(parameters), True
        except StrictSchemaError as exc:
            if strict is True:
                raise StrictSchemaError(f"{name}: {exc}") from None
            warnings.warn(f"{name}: sent without strict mode: {exc}", StrictSchemaWarning, stacklevel=3)
    if examples and format not in ("generic", "anthropic"):
        description = with_examples(description, examples)
    spec: dict[str, Any]
    if format == "openai":  # (Chat Completions has no field for a result schema or tool search)
        function = {"name": name, "description": description, "parameters": parameters, "strict": is_strict}
        return {"type": "function", "function": function}
    if format == "openai-responses":  # (its `strict` defaults to true: always say which)
        spec = {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": parameters,
            "strict": is_strict,
        }
        if output_schema is not None:
            spec["output_schema"] = dict(output_schema)
        if defer_loading:
            spec["defer_loading"] = True
        return spec
    if format == "anthropic":  # (no field for a result schema)
        spec = {"name": name, "description": description, "input_schema": parameters}
        if is_strict:
            spec["strict"] = True
        if examples:
            spec["input_examples"] = [filled(dict(e), parameters) if is_strict else dict(e) for e in examples]
        if defer_loading:
            spec["defer_loading"] = True
        return spec
    if format == "mcp":
        spec = {
            "name": name,
            "description": description,
            "inputSchema": parameters,
            "annotations": dict(annotations or {}),
        }
        if output_schema is not None:
            spec["outputSchema"] = mcp_output_schema(output_schema)
        return spec
    spec = {"name": name, "description": description, "parameters": parameters}
    if output_schema is not None:
        spec["output_schema"] = dict(output_schema)
    if examples:
        spec["examples"] = [dict(e) for e in examples]
    if defer_loading:
        spec["defer_loading"] = True
    return spec


def with_examples(description: str, examples: Sequence[Mapping[str, Any]]) -> str:
    """`description` followed by the example args, one compact JSON object a line."""
    lines = "\n".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) for e in examples)
    return f"{description}\n\nExample args:\n{lines}" if description else f"Example args:\n{lines}"


def filled(
    value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None, depth: int = 0
) -> Any:
    """`value` (args written for a tool's own schema) as strict mode's form of it takes them:
    each property it leaves out that `schema` (a strict one: every property required) lists is
    given as null, at any depth, as a model in strict mode would send it."""
    root = schema if root is None else root
    if depth > _schema.MAX_DEPTH or not isinstance(schema, Mapping):
        return value
    schema = _schema.resolve(schema, root)
    if isinstance(value, dict) and isinstance(schema.get("properties"), Mapping):
        properties = schema["properties"]
        value = {key: filled(item, properties.get(key, {}), root, depth + 1) for key, item in value.items()}
        value.update({key: None for key in properties if key not in value})
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        value = [filled(item, schema["items"], root, depth + 1) for item in value]
    for branch in schema.get("anyOf", ()):
        candidate = filled(value, branch, root, depth + 1)
        if candidate != value and _schema.accepts(candidate, _schema.resolve(branch, root), root):
            return candidate
    return value


def _is_object(schema: Mapping[str, Any]) -> bool:
    return (
        _types(_schema.resolve(schema, schema)) == ["object"]
        and "anyOf" not in schema
        and "oneOf" not in schema
    )


def mcp_output_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """MCP's `outputSchema` for a tool's `output_schema`: the same when its root is an object;
    else (before the 2026-07-28 revision MCP takes only objects) the value wrapped as the one
    property `result`, as `mcp_structured` wraps it."""
    if _is_object(schema):
        return dict(schema)
    defs = {key: schema[key] for key in ("$defs", "definitions") if key in schema}
    inner = {key: item for key, item in schema.items() if key not in defs}
    return {"type": "object", "properties": {"result": inner}, "required": ["result"], **defs}


def mcp_structured(value: Any, schema: Mapping[str, Any]) -> Any:
    """A call's value as MCP's `structuredContent` of a tool whose `output_schema` is `schema`:
    its JSON form, wrapped as `{"result": value}` when `mcp_output_schema` wraps the schema."""
    data = _schema.as_json(value)
    return data if _is_object(schema) else {"result": data}


class Specified(Described, Protocol):
    """What `tools_specs` reads: a Tool, or a pool's stand-in for one."""

    def spec(self, format: SpecFormat = "generic", *, strict: StrictMode = False) -> dict[str, Any]: ...


# The snippet tools a Sandbox can offer, by language: their name, schema, description (kept
# state and fresh), and how the tools their code may call are shown.
_SNIPPETS: dict[str, tuple[str, dict[str, Any], str, str, Callable[[Iterable[Stubbed]], str]]] = {
    "python": (
        RUN_PYTHON,
        RUN_PYTHON_SCHEMA,
        RUN_PYTHON_SESSION_DESCRIPTION,
        RUN_PYTHON_DESCRIPTION,
        python_stubs,
    ),
    "javascript": (
        RUN_JAVASCRIPT,
        RUN_JAVASCRIPT_SCHEMA,
        RUN_JAVASCRIPT_SESSION_DESCRIPTION,
        RUN_JAVASCRIPT_DESCRIPTION,
        javascript_stubs,
    ),
}


def _snippet_spec(
    tools: Mapping[str, Specified],
    language: str,
    session: bool,
    format: SpecFormat,
    strict: StrictMode,
    grants: Manifest | None,
) -> dict[str, Any]:
    """The spec of run_python or run_javascript (`language`): described as keeping its state
    with `session`, the tools its grant set lets the code call shown as stubs, MCP hints from
    the grant set. ValueError when a loaded tool has its name."""
    name, schema, kept, fresh, stubs = _SNIPPETS[language]
    if name in tools:
        raise ValueError(f"a loaded tool is named {name!r}; it cannot be added as well")
    description = kept if session else fresh
    if grants is not None and grants.tools:
        description += CALLS_TOOLS.format(language=language, stubs=stubs(tools[t] for t in grants.tools))
    return tool_spec(name, description, schema, format, strict, _snippet_annotations(format, grants))


def tools_specs(
    tools: Mapping[str, Specified],
    format: SpecFormat,
    strict: StrictMode,
    python: bool,
    session: bool = False,
    javascript: bool = False,
    python_grants: Manifest | None = None,
    javascript_grants: Manifest | None = None,
) -> list[dict[str, Any]]:
    """`Sandbox.specs`: the spec of each tool the model may call (`callers`), in order, and with
    `python` the run_python tool's (described as keeping its state with `session`; under
    `python_grants`, with MCP hints from them, and the tools they let its code call shown as
    stubs), with `javascript` the run_javascript tool's (`javascript_grants`; `session` too)."""
    specs = [tool.spec(format, strict=strict) for tool in tools.values() if "model" in tool.manifest.callers]
    for language, offered, grants in (
        ("python", python, python_grants),
        ("javascript", javascript, javascript_grants),
    ):
        if offered:
            specs.append(_snippet_spec(tools, language, session, format, strict, grants))
    return specs


def _snippet_annotations(format: str, grants: Manifest | None) -> dict[str, Any] | None:
    """MCP hints of run_python/run_javascript: read-only and closed without grants; under a
    grant set, as a tool's from its grants (tools its code may call are host calls whose effects
    are not known here: possibly destructive)."""
    if format != "mcp":
        return None
    return RUN_PYTHON_ANNOTATIONS if grants is None else mcp_annotations(grants)


def mcp_annotations(manifest: Manifest) -> dict[str, Any]:
    """MCP tool hints from the grants: read-only when nothing it may call or write can change
    the world (no writable preopen, no host function); open-world when it may reach the
    network. A tool that is not read-only is marked possibly destructive, since what its host
    functions do is not known here."""
    read_only = not manifest.host_functions and not any(p.writable for p in manifest.preopens)
    hints: dict[str, Any] = {"readOnlyHint": read_only}
    if not read_only:
        hints["destructiveHint"] = True
    hints["openWorldHint"] = FETCH in manifest.host_functions
    return hints


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` (a tool's args) in strict mode's subset, or StrictSchemaError naming the part
    that has no strict form: `allOf`/`not`, an object open to any property (no `properties`,
    or `additionalProperties` given as a schema, `patternProperties`), a value of any type, an
    array without `items` or with `prefixItems`, a `$dynamicRef`, a root that is not an
    object. Optional properties become required and nullable; `oneOf` becomes `anyOf`, `const`
    a one-value `enum`; `$defs` are converted and `$ref`s kept (one with sibling keywords is
    replaced by what it names, as strict mode takes no siblings, so a root `$ref` too);
    keywords that only narrow what is accepted (lengths, property counts, `uniqueItems`,
    `if`/`then`/`else`, `dependentRequired`, ...), a format strict mode lacks and a `default`
    move into the description (wasmbox checks them); other annotations are dropped."""
    root = dict(schema)
    if isinstance(root.get("$ref"), str):
        root = {**{k: v for k, v in root.items() if k != "$ref"}, **_target(root, root, "$")}
    converted = _strict(root, "$", root, 0)
    if _types(converted) != ["object"] or "anyOf" in converted:
        raise StrictSchemaError("$: the root must be an object (type 'object', not anyOf)")
    return converted


def _target(node: Mapping[str, Any], root: Mapping[str, Any], path: str) -> dict[str, Any]:
    """What `node`'s `$ref` names in `root`, without its own `$defs`."""
    target = _schema.resolve(node, root)
    if target is node:
        raise StrictSchemaError(f"{path}: $ref {node['$ref']!r} names no part of the schema")
    return {k: v for k, v in target.items() if k not in ("$defs", "definitions")}


def _strict(  # noqa: C901 - a branch per keyword strict mode rewrites or refuses
    node: Any, path: str, root: Mapping[str, Any], depth: int
) -> dict[str, Any]:
    if not isinstance(node, Mapping) or not node:
        raise StrictSchemaError(f"{path}: accepts any value; strict mode needs a type")
    if depth > _schema.MAX_DEPTH:
        raise StrictSchemaError(f"{path}: nested deeper than {_schema.MAX_DEPTH} levels")
    if isinstance(node.get("$ref"), str):
        siblings = {k: v for k, v in node.items() if k not in _ANNOTATIONS and k != "$ref"}
        if not siblings:  # a bare reference stays one (a recursive model's way back)
            return {"$ref": node["$ref"]}
        node = {**_target(node, root, path), **{k: v for k, v in node.items() if k != "$ref"}}
    wrapped = node.get("allOf")
    if isinstance(wrapped, list) and len(wrapped) == 1 and isinstance(wrapped[0], Mapping):
        outer = {k: v for k, v in node.items() if k != "allOf"}
        if not set(outer) & set(wrapped[0]):  # a lone allOf adds one schema's keywords
            return _strict({**outer, **wrapped[0]}, path, root, depth + 1)
    for key in _REFUSED:
        if key in node:
            raise StrictSchemaError(f"{path}: {key!r} has no strict-mode equivalent")
    out: dict[str, Any] = {}
    fmt = node.get("format")
    later = [key for key in _CHECKED_LATER if key in node]
    notes = [f"{key}: {json.dumps(node[key])}" for key in later]
    if isinstance(fmt, str) and fmt not in _STRICT_FORMATS:
        notes.insert(0, f"format: {fmt}")
    if "default" in node:
        notes.insert(0, f"default: {json.dumps(node['default'])}")
    description = node.get("description")
    if notes:
        description = f"{description} ({'; '.join(notes)})" if description else f"({'; '.join(notes)})"
    if description:
        out["description"] = description
    if "type" in node:
        out["type"] = node["type"]
    if "const" in node:
        out["enum"] = [node["const"]]
    elif "enum" in node:
        out["enum"] = list(node["enum"])
    for key in _KEPT:
        if key in node:
            out[key] = node[key]
    if isinstance(fmt, str) and fmt in _STRICT_FORMATS:
        out["format"] = fmt
    branches = [*node.get("anyOf", []), *node.get("oneOf", [])]
    if "anyOf" in node and "oneOf" in node:
        raise StrictSchemaError(f"{path}: 'anyOf' and 'oneOf' together have no strict-mode equivalent")
    if branches:
        key = "anyOf" if "anyOf" in node else "oneOf"
        out["anyOf"] = [_strict(sub, f"{path}.{key}[{i}]", root, depth + 1) for i, sub in enumerate(branches)]
    types = _types(node)
    if "object" in types or "properties" in node:
        _strict_object(node, out, path, root, depth)
    if "array" in types or "items" in node or "prefixItems" in node:
        if "prefixItems" in node:
            raise StrictSchemaError(f"{path}: 'prefixItems' (a tuple) has no strict-mode form")
        if "items" not in node:
            raise StrictSchemaError(f"{path}: an array needs 'items' in strict mode")
        out["items"] = _strict(node["items"], f"{path}.items", root, depth + 1)
    for key in ("$defs", "definitions"):
        if isinstance(node.get(key), Mapping):
            out[key] = {
                name: _strict(sub, f"{path}.{key}.{name}", root, depth + 1) for name, sub in node[key].items()
            }
    if "type" not in out and "enum" not in out and "anyOf" not in out:
        raise StrictSchemaError(f"{path}: no type (strict mode needs 'type', 'enum' or 'anyOf')")
    return out


def _strict_object(
    node: Mapping[str, Any], out: dict[str, Any], path: str, root: Mapping[str, Any], depth: int
) -> None:
    properties = node.get("properties", {})
    extra = node.get("additionalProperties", True)
    if not isinstance(extra, bool):
        raise StrictSchemaError(f"{path}: additionalProperties as a schema (a map) has no strict-mode form")
    if "patternProperties" in node:
        raise StrictSchemaError(f"{path}: patternProperties (properties by pattern) has no strict-mode form")
    if not properties and extra:
        raise StrictSchemaError(f"{path}: an object open to any property has no strict-mode form")
    if "type" not in out:
        out["type"] = "object"
    required = set(node.get("required", []))
    converted = {}
    for name, sub in properties.items():
        where = f"{path}.properties.{name}"
        schema = _strict(sub, where, root, depth + 1)
        converted[name] = schema if name in required else _schema.nullable(schema)
    out["properties"] = converted
    out["required"] = list(properties)
    out["additionalProperties"] = False


def _types(node: Mapping[str, Any]) -> list[str]:
    types = node.get("type", [])
    return [types] if isinstance(types, str) else list(types)


def prepare_args(args: Any, schema: Mapping[str, Any] | None) -> Any:
    """A model's `args` as the tool takes them: each null given for a property that `schema`
    (the tool's own, not the strict one) leaves optional and does not allow to be null is
    removed, at any depth. Such a null is what a strict schema makes the model send for an
    omitted property; the original schema would refuse it, so removing it never lets through
    a call that schema forbids. A null the property's schema allows is kept, unless only
    removing it makes the object fit (a property count). Anything else is returned as is."""
    if not isinstance(schema, Mapping) or not _holds_none(args, 0):  # (the usual case: no walk)
        return args
    return _without_nulls(args, schema, schema)


def _holds_none(value: Any, depth: int) -> bool:
    if type(value) is dict:
        items: Any = value.values()
    elif type(value) is list:
        items = value
    else:
        return False
    return depth > _schema.MAX_DEPTH or any(item is None or _holds_none(item, depth + 1) for item in items)


def _without_nulls(args: Any, schema: Any, root: Mapping[str, Any], depth: int = 0) -> Any:
    if not isinstance(schema, Mapping) or depth > _schema.MAX_DEPTH:
        return args
    schema = _schema.resolve(schema, root)
    if isinstance(args, dict):
        properties = schema.get("properties", {})
        required = set(schema.get("required", []))
        if isinstance(properties, Mapping) and properties:
            kept, allowed = {}, []
            for key, value in args.items():
                sub = properties.get(key)
                if sub is None:
                    kept[key] = value
                elif value is None and key not in required:
                    if not _schema.accepts(None, _schema.resolve(sub, root), root):
                        continue
                    kept[key] = None
                    allowed.append(key)
                else:
                    kept[key] = _without_nulls(value, sub, root, depth + 1)
            if allowed and not _schema.accepts(kept, schema, root):
                # nulls the schema allows are kept, unless only leaving them out fits it
                # (e.g. maxProperties counts them)
                without = {k: v for k, v in kept.items() if k not in allowed}
                if _schema.accepts(without, schema, root):
                    kept = without
            args = kept
    elif isinstance(args, list) and "items" in schema:
        args = [_without_nulls(item, schema["items"], root, depth + 1) for item in args]
    if isinstance(args, (dict, list)):
        for key in ("anyOf", "oneOf"):
            for branch in schema.get(key, []):
                candidate = _without_nulls(args, branch, root, depth + 1)
                if _schema.accepts(candidate, _schema.resolve(branch, root), root):
                    return candidate
    return args
