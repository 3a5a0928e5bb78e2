"""The JSON Schema subset that tool-calling models use, checked strictly.

`input_schema` in a manifest is validated here: first the schema itself (a keyword outside the
subset is refused at load, so nothing is silently left unchecked), then each call's args.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list, tuple),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}
_ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$comment"}
_KEYWORDS = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "not",
    "minProperties", "maxProperties",
}  # fmt: skip


MAX_DEPTH = 64  # schemas nested deeper are refused (a deeper one only serves to exhaust the stack)
_COUNTS = {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"}
_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


def check_schema(schema: Any, path: str = "$", depth: int = 1) -> None:
    """Raise ValueError if `schema` uses anything outside the supported subset, or a keyword
    with a value of the wrong shape (so that `validate` can rely on every value it reads)."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise ValueError(f"{path}: a schema must be an object or a boolean")  # noqa: TRY004 - every bad schema is a ValueError
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise ValueError(f"{path}: unsupported schema keyword(s) {sorted(map(str, unknown))}")
    if "type" in schema:
        types = schema["type"]
        names = [types] if isinstance(types, str) else types
        if not isinstance(names, list) or not names:
            raise ValueError(f"{path}.type: must be a type name or a non-empty list of them")
        for name in names:
            if not isinstance(name, str) or name not in _TYPES:
                raise ValueError(f"{path}.type: unknown type {name!r}")
    for key in _COUNTS & set(schema):
        value = schema[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{path}.{key}: must be a non-negative integer")
    for key in _BOUNDS & set(schema):
        value = schema[key]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ValueError(f"{path}.{key}: must be a finite number")
    if "uniqueItems" in schema and not isinstance(schema["uniqueItems"], bool):
        raise ValueError(f"{path}.uniqueItems: must be a boolean")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise ValueError(f"{path}.enum: must be a list")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise ValueError(f"{path}.required: must be a list of property names")
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ValueError(f"{path}.properties: must be an object")  # noqa: TRY004 - pydantic reports ValueErrors
    for name, sub in properties.items():
        check_schema(sub, f"{path}.properties.{name}", depth + 1)
    for key in ("additionalProperties", "items", "not"):
        if key in schema:
            check_schema(schema[key], f"{path}.{key}", depth + 1)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            subs = schema[key]
            if not isinstance(subs, list) or not subs:
                raise ValueError(f"{path}.{key}: must be a non-empty list of schemas")
            for i, sub in enumerate(subs):
                check_schema(sub, f"{path}.{key}[{i}]", depth + 1)
    if "pattern" in schema:
        if not isinstance(schema["pattern"], str):
            raise ValueError(f"{path}.pattern: must be a string")
        try:
            re.compile(schema["pattern"])
        except (re.error, RecursionError, OverflowError) as exc:
            raise ValueError(f"{path}.pattern: {exc}") from None


def validate(value: Any, schema: Any, path: str = "args") -> str | None:
    """The first violation of `schema` by `value` as a message, or None if it conforms."""
    if schema is True or schema is None:
        return None
    if schema is False:
        return f"{path}: not allowed"
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is_type(value, name) for name in names):
            return f"{path}: expected {' or '.join(names)}, got {_json_type(value)}"
    if "const" in schema and value != schema["const"]:
        return f"{path}: must be {schema['const']!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: must be one of {schema['enum']!r}"
    problem = _check_bounds(value, schema, path)
    if problem:
        return problem
    if isinstance(value, dict):
        problem = _check_object(value, schema, path)
        if problem:
            return problem
    if isinstance(value, (list, tuple)) and "items" in schema:
        for i, item in enumerate(value):
            problem = validate(item, schema["items"], f"{path}[{i}]")
            if problem:
                return problem
    return _check_combinators(value, schema, path)


def _check_bounds(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: must be >= {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: must be <= {schema['maximum']}"
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return f"{path}: must be > {schema['exclusiveMinimum']}"
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            return f"{path}: must be < {schema['exclusiveMaximum']}"
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{path}: shorter than {schema['minLength']}"
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{path}: longer than {schema['maxLength']}"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{path}: does not match {schema['pattern']!r}"
    if isinstance(value, (list, tuple)):
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{path}: fewer than {schema['minItems']} items"
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{path}: more than {schema['maxItems']} items"
        if schema.get("uniqueItems") and len({repr(v) for v in value}) != len(value):
            return f"{path}: items are not unique"
    return None


def _check_object(value: dict[Any, Any], schema: Mapping[str, Any], path: str) -> str | None:
    for name in schema.get("required", []):
        if name not in value:
            return f"{path}: missing required property {name!r}"
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        return f"{path}: fewer than {schema['minProperties']} properties"
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        return f"{path}: more than {schema['maxProperties']} properties"
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub = properties.get(key, extra)
        problem = validate(item, sub, f"{path}.{key}")
        if problem:
            return problem if sub is not False else f"{path}: unexpected property {key!r}"
    return None


def _check_combinators(value: Any, schema: Mapping[str, Any], path: str) -> str | None:
    for sub in schema.get("allOf", []):
        problem = validate(value, sub, path)
        if problem:
            return problem
    if "anyOf" in schema and all(validate(value, s, path) for s in schema["anyOf"]):
        return f"{path}: matches none of anyOf"
    if "oneOf" in schema:
        matches = sum(validate(value, s, path) is None for s in schema["oneOf"])
        if matches != 1:
            return f"{path}: matches {matches} of oneOf, expected exactly 1"
    if "not" in schema and validate(value, schema["not"], path) is None:
        return f"{path}: must not match the 'not' schema"
    return None


def _is_type(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return name == "boolean"
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[name])


def _json_type(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "null", "array", "object"):
        if _is_type(value, name):
            return name
    return type(value).__name__
