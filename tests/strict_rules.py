"""OpenAI's strict-mode rules (structured outputs / strict function calling), as a checker.

Written from OpenAI's structured-outputs guide ("Supported schemas"): the root is an object and
not `anyOf`; every object has `additionalProperties: false` and lists every property in
`required`; only the keywords below are supported (`allOf`, `not`, `oneOf`, `if`/`then`/`else`,
`dependent*`, `patternProperties`, length, property-count and `uniqueItems` keywords are not);
a `$ref` points into the schema and stands alone (the OpenAI SDK inlines one with siblings);
at most 5000 object properties and 10 levels of nesting; at most 1000 enum values, and 120,000
characters of property names, enum values and consts in all. Anthropic's strict tools take the
same subset, so tests apply this to both.
"""

from __future__ import annotations

from typing import Any

TYPES = {"string", "number", "integer", "boolean", "object", "array", "null"}
SUPPORTED = {
    "type", "description", "properties", "required", "additionalProperties", "items", "enum",
    "const", "anyOf", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "$ref", "$defs", "definitions",
}  # fmt: skip
MAX_PROPERTIES = 5000
MAX_DEPTH = 10
MAX_ENUM_VALUES = 1000
MAX_CHARS = 120_000


def strict_problems(schema: Any) -> list[str]:
    """Every way `schema` breaks the rules (empty when it is strict-safe)."""
    problems: list[str] = []
    totals = {"properties": 0, "enum": 0, "chars": 0}
    if not isinstance(schema, dict):
        return ["$: the root must be a schema object"]
    if schema.get("type") != "object":
        problems.append("$: the root must have type 'object'")
    if "anyOf" in schema:
        problems.append("$: the root must not be anyOf")
    _check(schema, "$", 1, problems, totals)
    if totals["properties"] > MAX_PROPERTIES:
        problems.append(f"more than {MAX_PROPERTIES} object properties")
    if totals["enum"] > MAX_ENUM_VALUES:
        problems.append(f"more than {MAX_ENUM_VALUES} enum values")
    if totals["chars"] > MAX_CHARS:
        problems.append(f"more than {MAX_CHARS} characters of names and enum values")
    return problems


def _check(  # noqa: C901 - a branch per keyword the providers' strict modes restrict
    node: Any, path: str, depth: int, problems: list[str], totals: dict[str, int]
) -> None:
    if not isinstance(node, dict):
        problems.append(f"{path}: a schema must be an object, got {node!r}")
        return
    if depth > MAX_DEPTH:
        problems.append(f"{path}: nested deeper than {MAX_DEPTH} levels")
    for key in set(node) - SUPPORTED:
        problems.append(f"{path}: unsupported keyword {key!r}")
    if "$ref" in node and set(node) - {"$ref"}:
        problems.append(f"{path}: a $ref takes no sibling keywords")
    if "$ref" in node and not str(node["$ref"]).startswith("#"):
        problems.append(f"{path}: a $ref must point into the schema")
    if not ({"type", "anyOf", "enum", "const", "$ref"} & set(node)):
        problems.append(f"{path}: no type")
    types = node.get("type", [])
    names = [types] if isinstance(types, str) else types
    if not isinstance(names, list) or not all(name in TYPES for name in names):
        problems.append(f"{path}: bad type {types!r}")
        names = []
    if "enum" in node:
        totals["enum"] += len(node["enum"])
        totals["chars"] += sum(len(v) for v in node["enum"] if isinstance(v, str))
    if "object" in names or "properties" in node:
        properties = node.get("properties", {})
        if node.get("additionalProperties") is not False:
            problems.append(f"{path}: an object needs additionalProperties: false")
        if sorted(node.get("required", [])) != sorted(properties):
            problems.append(f"{path}: every property must be in required")
        totals["properties"] += len(properties)
        for name, sub in properties.items():
            totals["chars"] += len(name)
            _check(sub, f"{path}.properties.{name}", depth + 1, problems, totals)
    if "array" in names and "items" not in node:
        problems.append(f"{path}: an array needs items")
    if "items" in node:
        _check(node["items"], f"{path}.items", depth + 1, problems, totals)
    for i, sub in enumerate(node.get("anyOf", [])):
        _check(sub, f"{path}.anyOf[{i}]", depth + 1, problems, totals)
    for key in ("$defs", "definitions"):
        for name, sub in node.get(key, {}).items():  # (a definition is checked as a schema of its own)
            _check(sub, f"{path}.{key}.{name}", 1, problems, totals)
