"""The tools code may call, written as that code's own declarations, for a model to be shown.

`python_stubs` gives a typed `def` per tool (keyword-only parameters from its args schema, the
return type from its `output_schema`, the description as the docstring), `javascript_stubs` a
TypeScript-style declaration per tool. Types a schema cannot say in the language's own terms
are `Any` / `any`; what the schema checks beyond types (bounds, patterns) is not shown, and is
still checked at each call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import _schema

_PY_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_JS_SCALARS = {
    "string": "string",
    "integer": "number",
    "number": "number",
    "boolean": "boolean",
    "null": "null",
}
_DEPTH = 8  # nesting shown; deeper is Any


class Stubbed(Protocol):
    """What a stub is made of: a Tool, or a pool's stand-in for one."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def parameters(self) -> dict[str, Any]: ...
    @property
    def output_schema(self) -> dict[str, Any] | None: ...


def python_stubs(tools: Iterable[Stubbed]) -> str:
    """`def name(*, param: type = None, ...) -> type: "description"` for each tool, as `tools.name`
    is called from Python."""
    return "\n\n".join(_python_stub(tool) for tool in tools)


def javascript_stubs(tools: Iterable[Stubbed]) -> str:
    """`/** description */ tools.name(args: {param: type; ...}): type;` for each tool."""
    return "\n".join(_javascript_stub(tool) for tool in tools)


def _python_stub(tool: Stubbed) -> str:
    schema = tool.parameters
    found = schema.get("properties")
    properties: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    required = set(schema.get("required", ()))
    params = []
    for name, sub in properties.items():
        hint = _python_type(sub, schema, 0)
        if name in required:
            params.append(f"{name}: {hint}")
        else:  # an optional parameter: its schema's default, else None (left out of the call)
            default = sub.get("default") if isinstance(sub, Mapping) else None
            if default is not None and _literal(default):
                params.append(f"{name}: {hint} = {default!r}")
            else:
                nullable = hint == "Any" or "None" in hint.split(" | ")
                params.append(f"{name}: {hint if nullable else hint + ' | None'} = None")
    if schema.get("additionalProperties", True) is not False and not properties:
        params.append("**args: Any")
    returns = _python_type(tool.output_schema, tool.output_schema or {}, 0) if tool.output_schema else "Any"
    star = "*, " if params and not params[0].startswith("**") else ""
    lines = [f"def {tool.name}({star}{', '.join(params)}) -> {returns}:"]
    doc = [tool.description.strip()] if tool.description.strip() else []
    described = [
        f"{name}: {sub['description']}"
        for name, sub in properties.items()
        if isinstance(sub, Mapping) and isinstance(sub.get("description"), str)
    ]
    if described:
        doc += ["", "Args:", *(f"    {line}" for line in described)]
    if doc:
        text = "\n".join(doc).replace('"""', '\\"\\"\\"')
        body = "\n".join(f"    {line}" if line else "" for line in text.splitlines())
        lines.append(f'    """{body.lstrip()}\n    """')
    lines.append("    ...")
    return "\n".join(lines)


def _python_type(schema: Any, root: Mapping[str, Any], depth: int) -> str:
    return _type(_PYTHON, schema, root, depth)


def _javascript_stub(tool: Stubbed) -> str:
    args = _javascript_type(tool.parameters, tool.parameters, 0)
    returns = (
        _javascript_type(tool.output_schema, tool.output_schema or {}, 0) if tool.output_schema else "any"
    )
    doc = " ".join(tool.description.split()).replace("*/", "* /")
    comment = f"/** {doc} */\n" if doc else ""
    return f"{comment}tools.{tool.name}(args: {args}): {returns};"


def _javascript_type(schema: Any, root: Mapping[str, Any], depth: int) -> str:
    return _type(_JAVASCRIPT, schema, root, depth)


@dataclass(frozen=True)
class _Language:
    """How a language writes the types a schema says: anything, its scalars, a union of literal
    values, an array of a type, an object (from its schema, with `typed` for its members)."""

    anything: str
    scalars: Mapping[str, str]
    literals: Callable[[list[Any]], str]
    array: Callable[[str], str]
    object: Callable[[Mapping[str, Any], Callable[[Any], str]], str]


def _type(language: _Language, schema: Any, root: Mapping[str, Any], depth: int) -> str:
    """`schema` (a part of `root`) as a type of `language`; its `anything` where it has none."""
    if not isinstance(schema, Mapping) or depth > _DEPTH:
        return language.anything
    schema = _schema.resolve(schema, root)

    def typed(sub: Any) -> str:
        return _type(language, sub, root, depth + 1)

    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list):
        return language.literals(values) if all(map(_literal, values)) else language.anything
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        return _join([typed(branch) for branch in branches], language.anything)
    types = schema.get("type")
    names = [types] if isinstance(types, str) else list(types) if isinstance(types, list) else []
    shown = []
    for name in names:
        if name in language.scalars:
            shown.append(language.scalars[name])
        elif name == "array":
            shown.append(language.array(typed(schema.get("items"))))
        elif name == "object":
            shown.append(language.object(schema, typed))
    return _join(shown, language.anything)


def _python_object(schema: Mapping[str, Any], typed: Callable[[Any], str]) -> str:
    extra = schema.get("additionalProperties")
    return f"dict[str, {typed(extra) if isinstance(extra, Mapping) else 'Any'}]"


def _javascript_object(schema: Mapping[str, Any], typed: Callable[[Any], str]) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping) or not properties:
        return "object"
    required = set(schema.get("required", ()))
    fields = [f"{key}{'' if key in required else '?'}: {typed(sub)}" for key, sub in properties.items()]
    return "{ " + "; ".join(fields) + " }"


_PYTHON = _Language(
    "Any",
    _PY_SCALARS,
    lambda values: f"Literal[{', '.join(map(repr, values))}]",
    lambda inner: f"list[{inner}]",
    _python_object,
)
_JAVASCRIPT = _Language(
    "any",
    _JS_SCALARS,
    lambda values: " | ".join(json.dumps(v) for v in values),
    lambda inner: f"{inner}[]",
    _javascript_object,
)


def _join(shown: list[str], anything: str) -> str:
    if not shown or anything in shown:
        return anything
    return " | ".join(dict.fromkeys(shown))


def _literal(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))
