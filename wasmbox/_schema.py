"""Tool args schemas: JSON Schema Draft 2020-12, checked by jsonschema-rs.

`check_schema` runs at load: a keyword outside 2020-12's vocabularies, one whose meaning
wasmbox does not assert, a `$ref` outside the document or a schema the validator cannot build
is refused, naming the keyword and its path, so nothing in a schema is silently left unchecked.
`compile` gives the validator a tool holds; `Validator.problem` is the first violation of a
call's args as a message fit to show a model (the field's path and what it must be, never the
value). The formats of 2020-12's format vocabulary are checked (`FORMATS`); any other
`format` is an annotation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import jsonschema_rs
import pydantic_core

MAX_DEPTH = 64  # schemas nested deeper are refused (a deeper one only serves to exhaust the stack)
DRAFT = "https://json-schema.org/draft/2020-12/schema"
# the formats jsonschema-rs checks for Draft 2020-12; any other name is an annotation
FORMATS = (
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uri-template",
    "uuid",
    "json-pointer",
    "relative-json-pointer",
    "regex",
)
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_VALUES = (
    "items",
    "additionalProperties",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "not",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")
_KEYWORDS = {
    *_SCHEMA_MAPS,
    *_SCHEMA_VALUES,
    *_SCHEMA_LISTS,
    "$schema",
    "$id",
    "$ref",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$comment",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxContains",
    "minContains",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "format",
    "title",
    "description",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "examples",
    "discriminator",  # OpenAPI's, written by Pydantic beside a oneOf: a hint, the oneOf is checked
}
# keys that are not JSON Schema 2020-12, with what to write instead
_HINTS = {
    "optional": "list the properties that must be given in the object's `required` instead",
    "nullable": 'add "null" to `type` (or an anyOf branch {"type": "null"}) instead',
    "example": "write `examples`, a list",
    "dependencies": "write `dependentRequired` (names) or `dependentSchemas` (schemas), as 2020-12 does",
    "additionalItems": "write `prefixItems` for the leading items and `items` for the rest, as 2020-12 does",
    "$recursiveRef": "write `$dynamicRef`, as 2020-12 does",
    "$recursiveAnchor": "write `$dynamicAnchor`, as 2020-12 does",
    "contentEncoding": "wasmbox does not check content keywords: decode and check the string in the tool",
    "contentMediaType": "wasmbox does not check content keywords: decode and check the string in the tool",
    "contentSchema": "wasmbox does not check content keywords: decode and check the string in the tool",
    "$vocabulary": "it belongs in a meta-schema, not in a tool's args schema",
}


class Validator:
    """A schema compiled once (at load); `problem` checks one call's args. Thread-safe."""

    def __init__(self, schema: Mapping[str, Any] | bool) -> None:
        self.schema = schema
        self._validator = _build(schema)

    def problem(self, value: Any, path: str = "args") -> str | None:
        """The first violation of the schema by `value` as a message, or None if it conforms."""
        try:
            if self._validator.is_valid(value):
                return None
            error = next(iter(self._validator.iter_errors(value)))
        except ValueError as exc:  # a value that is not JSON (bytes, a set, an object)
            found = str(exc).removeprefix("Unsupported type: ")
            return f"{_not_json_at(value, path)}: holds a value that is not JSON ({found})"[:300]
        return _describe(error, path)

    def value_problem(self, value: Any, path: str = "result") -> str | None:
        """`problem` for a call's value, checked as the JSON a router forwards (`as_json`): bytes
        as base64 text, tuples as arrays, map keys as text."""
        try:
            if self._validator.is_valid(value):
                return None
        except ValueError:  # not JSON as it is: bytes, tuples, keys that are not text
            pass
        data = as_json(value)
        problem = self.problem(data, path)
        if problem is not None and data != value:  # (NaN is never equal: it is null in JSON)
            problem += " (checked as JSON: bytes as base64 text, NaN and infinities as null)"
        return problem


def as_json(value: Any) -> Any:
    """A call's value as `CallResult`'s JSON holds it: bytes as URL-safe base64 text, NaN and
    the infinities as null, tuples as arrays, map keys as text."""
    return json.loads(pydantic_core.to_json(value, bytes_mode="base64"))


def check_schema(schema: Any) -> None:
    """Raise ValueError naming the path and keyword when `schema` cannot be checked as written:
    a keyword that is not 2020-12's (with a hint for the common ones), a `$ref` outside this
    document, a value of the wrong shape, a dangling `$ref`, nesting past `MAX_DEPTH`."""
    _walk(schema, schema, "$", 1)
    compile(schema)


def compile(schema: Mapping[str, Any] | bool) -> Validator:
    """The validator of `schema`, built once per distinct schema (cached); ValueError if
    jsonschema-rs cannot build it. Call `check_schema` for the keyword checks."""
    return _compiled(json.dumps(schema, sort_keys=True))


def validate(value: Any, schema: Mapping[str, Any] | bool, path: str = "args") -> str | None:
    """The first violation of `schema` by `value` as a message, or None if it conforms."""
    return compile(schema).problem(value, path)


def accepts(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> bool:
    """Whether `value` conforms to `schema`, a part of the document `root` (its `$ref`s resolved
    there). False when the part cannot be checked on its own (a `$ref` `root` does not hold)."""
    if root is None or schema is root:
        target: Mapping[str, Any] = schema
    else:
        target = {**{k: root[k] for k in ("$defs", "definitions") if k in root}, **schema}
    try:
        return compile(target).problem(value) is None
    except ValueError:
        return False


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` that also accepts null (how strict mode says a property may be left out, and
    what a parameter defaulting to None takes)."""
    if "$ref" not in schema and accepts(None, schema):
        return schema
    types = schema.get("type")
    if types is not None and "enum" not in schema and "anyOf" not in schema:
        names = [types] if isinstance(types, str) else list(types)
        return {**schema, "type": [*names, "null"]}
    if "anyOf" in schema and len(schema) <= 2 and set(schema) <= {"anyOf", "description"}:
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    inner = {k: v for k, v in schema.items() if k != "description"}
    outer: dict[str, Any] = {"anyOf": [inner, {"type": "null"}]}
    if "description" in schema:
        outer = {"description": schema["description"], **outer}
    return outer


def resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """`schema` with a local `$ref` followed (repeatedly) to the part of `root` it names;
    `schema` itself when it has none or the pointer names nothing."""
    seen = 0
    while isinstance(schema.get("$ref"), str) and seen < MAX_DEPTH:
        target = _pointer(root, schema["$ref"])
        if not isinstance(target, Mapping):
            return schema
        schema, seen = target, seen + 1
    return schema


@lru_cache(maxsize=512)
def _compiled(text: str) -> Validator:
    return Validator(json.loads(text))


def _build(schema: Mapping[str, Any] | bool) -> Any:
    try:
        return jsonschema_rs.Draft202012Validator(
            schema if isinstance(schema, bool) else dict(schema),
            validate_formats=True,
            ignore_unknown_formats=True,
            retriever=_no_retrieval,
        )
    except jsonschema_rs.ValidationError as exc:  # the schema breaks the meta-schema
        where = _path("$", exc.instance_path)
        raise ValueError(f"{where}: {exc.message}"[:300]) from None
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"$: {str(exc).splitlines()[0]}"[:300]) from None


def _no_retrieval(uri: str) -> Any:
    raise ValueError(f"{uri}: wasmbox fetches no remote schema")


def _walk(schema: Any, root: Any, path: str, depth: int) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise ValueError(f"{path}: a schema must be an object or a boolean")  # noqa: TRY004 - every bad schema is a ValueError
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: nested deeper than {MAX_DEPTH} levels")
    unknown = sorted(str(key) for key in schema if key not in _KEYWORDS)
    if unknown:
        hints = [f"{key!r}: {_HINTS[key]}" for key in unknown if key in _HINTS]
        message = f"{path}: not JSON Schema 2020-12 keyword(s) {unknown}"
        raise ValueError(f"{message} ({'; '.join(hints)})" if hints else message)
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        raise ValueError(f"{path}.$ref: {ref!r} is outside this schema; wasmbox fetches no remote schema")
    if isinstance(ref, str) and ref.startswith("#/") and _pointer(root, ref) is None:
        raise ValueError(f"{path}.$ref: {ref!r} names no part of this schema")
    if isinstance(schema.get("items"), list):
        raise ValueError(f"{path}.items: a list of schemas; write `prefixItems`, as 2020-12 does")  # noqa: TRY004 - every bad schema is a ValueError
    for key in _SCHEMA_MAPS:
        subs = schema.get(key)
        if isinstance(subs, Mapping):
            for name, sub in subs.items():
                _walk(sub, root, f"{path}.{key}.{name}", depth + 1)
    for key in _SCHEMA_VALUES:
        if key in schema:
            _walk(schema[key], root, f"{path}.{key}", depth + 1)
    for key in _SCHEMA_LISTS:
        subs = schema.get(key)
        if isinstance(subs, list):
            for i, sub in enumerate(subs):
                _walk(sub, root, f"{path}.{key}[{i}]", depth + 1)


def _pointer(root: Mapping[str, Any], ref: str) -> Any:
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _not_json_at(value: Any, path: str, depth: int = 0) -> str:
    """The path of the first value in `value` that is not JSON (`path` itself if none is found)."""
    if depth < MAX_DEPTH and isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                return path
            if not _plain(item):
                return _not_json_at(item, f"{path}.{key}", depth + 1)
    elif depth < MAX_DEPTH and isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            if not _plain(item):
                return _not_json_at(item, f"{path}[{index}]", depth + 1)
    return path


def _plain(value: Any) -> bool:
    """Whether `value` is JSON all through (as far as `MAX_DEPTH`)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(item) for item in value)
    return False


def _path(root: str, parts: Any) -> str:
    out = root
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _describe(error: Any, path: str) -> str:
    where = _path(path, error.instance_path)
    kind = error.kind
    name = getattr(kind, "name", "")
    if name in ("anyOf", "oneOf"):
        inner = _best_branch(error, kind)
        if inner is not None:
            return _describe(inner, path)
    text = _message(name, kind, error)
    return f"{where}: {text}"[:500]


def _best_branch(error: Any, kind: Any) -> Any:
    """For a value no branch of a union fits: the first error of the branch the value has the
    shape of (no wrong type, const or enum at the value itself or at a property's name, such as
    a discriminator), the one with the fewest errors, then the deepest; None when it has the
    shape of none."""
    own = len(error.instance_path)
    best, score = None, None
    for errors in getattr(kind, "context", None) or []:
        if not errors:
            continue
        depths = [len(inner.instance_path) for inner in errors]
        if any(
            getattr(inner.kind, "name", "") in ("type", "const", "enum")
            and depth <= own + 1
            and (depth == own or getattr(inner.kind, "name", "") != "type")
            for inner, depth in zip(errors, depths)
        ):
            continue
        rank = (len(errors), -max(depths))
        if score is None or rank < score:
            best, score = errors[0], rank
    return best


def _message(name: str, kind: Any, error: Any) -> str:
    value = getattr(kind, "value", None)
    if type(kind).__name__ in ("BacktrackLimitExceeded", "RegexEngineFailure"):
        return "could not be matched against its pattern within the regex engine's backtracking limit"
    if name == "type":
        return f"expected {' or '.join(kind.types)}, got {_json_type(error.instance)}"
    if name == "required":
        return f"missing required property {kind.property!r}"
    if name in ("additionalProperties", "unevaluatedProperties"):
        names = list(kind.unexpected)
        return f"unexpected propert{'y' if len(names) == 1 else 'ies'} {', '.join(map(repr, names))}"[:200]
    if name == "enum":
        return f"must be one of {_short(kind.options)}"
    if name == "const":
        return f"must be {_short(value)}"
    simple = {
        "minimum": "must be >= {}",
        "maximum": "must be <= {}",
        "exclusiveMinimum": "must be > {}",
        "exclusiveMaximum": "must be < {}",
        "multipleOf": "must be a multiple of {}",
        "minLength": "shorter than {}",
        "maxLength": "longer than {}",
        "minItems": "fewer than {} items",
        "maxItems": "more than {} items",
        "minProperties": "fewer than {} properties",
        "maxProperties": "more than {} properties",
        "pattern": "does not match {!r}",
        "format": "not a valid {}",
    }
    if name in simple:
        return simple[name].format(_short(value) if not isinstance(value, (int, float, str)) else value)
    if name == "uniqueItems":
        return "items are not unique"
    if name == "anyOf":
        return "matches none of anyOf"
    if name == "oneOf":
        many = type(kind).__name__ == "OneOfMultipleValid"
        return "matches more than one of oneOf" if many else "matches none of oneOf"
    if name == "not":
        return "must not match the 'not' schema"
    if name == "falseSchema":
        return "not allowed"
    return str(error.message).splitlines()[0][:200]


def _short(value: Any) -> str:
    text = json.dumps(value, default=repr)
    return text if len(text) <= 200 else text[:200] + "…"


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    for name, kinds in (("string", str), ("null", type(None)), ("array", (list, tuple)), ("object", dict)):
        if isinstance(value, kinds):
            return name
    return type(value).__name__
