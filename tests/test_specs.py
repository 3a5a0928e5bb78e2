"""Tool definitions in each provider's format, and the strict-mode conversion of schemas."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wasmbox
from wasmbox import _schema
from wasmbox.integrations import FORMATS, prepare_args, strict_schema

from .conftest import CAPABILITIES, manifest
from .strict_rules import strict_problems

SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "What to echo", "minLength": 1},
        "times": {"type": "integer", "minimum": 1, "default": 1},
        "mode": {"enum": ["plain", "loud"]},
    },
    "required": ["text"],
    "additionalProperties": False,
}


@pytest.fixture
def echo(box: wasmbox.Sandbox) -> wasmbox.Tool:
    return box.load(manifest("echo", description="Echo the args", input_schema=SCHEMA))


@pytest.fixture
def capabilities(box: wasmbox.Sandbox, built_examples: Path) -> wasmbox.Sandbox:
    box.register_host_function("kv.get", lambda key: None)
    for path in sorted(CAPABILITIES.glob("*.toml")):
        box.load(path)
    return box


def test_each_format_has_the_providers_exact_shape(echo: wasmbox.Tool) -> None:
    name, description = "echo", "Echo the args"
    expected: dict[str, Any] = {
        "generic": {"name": name, "description": description, "parameters": SCHEMA},
        "openai": {"type": "function", "function": {
            "name": name, "description": description, "parameters": SCHEMA, "strict": False}},
        "openai-responses": {
            "type": "function", "name": name, "description": description, "parameters": SCHEMA,
            "strict": False},
        "anthropic": {"name": name, "description": description, "input_schema": SCHEMA},
        "mcp": {"name": name, "description": description, "inputSchema": SCHEMA,
                "annotations": {"readOnlyHint": True, "openWorldHint": False}},
    }  # fmt: skip
    assert set(expected) == set(FORMATS)
    for format, spec in expected.items():
        got = echo.spec(format)  # type: ignore[arg-type]
        assert json.dumps(got) == json.dumps(spec), format  # byte for byte, keys in order
    assert echo.spec() == expected["generic"]


def test_strict_specs_carry_the_converted_schema_and_flag(echo: wasmbox.Tool) -> None:
    converted = strict_schema(SCHEMA)
    assert echo.spec("openai", strict=True)["function"] == {
        "name": "echo", "description": "Echo the args", "parameters": converted, "strict": True,
    }  # fmt: skip
    assert echo.spec("openai-responses", strict=True)["strict"] is True
    anthropic = echo.spec("anthropic", strict=True)
    assert anthropic["strict"] is True and anthropic["input_schema"] == converted
    assert echo.spec("generic", strict=True)["parameters"] == converted


def test_conversion_keeps_the_meaning() -> None:
    converted = strict_schema(SCHEMA)
    assert strict_problems(converted) == []
    props = converted["properties"]
    assert converted["required"] == ["text", "times", "mode"]
    assert props["text"] == {"description": "What to echo (minLength: 1)", "type": "string"}
    assert props["times"] == {"description": "(default: 1)", "type": ["integer", "null"], "minimum": 1}
    assert props["mode"] == {"anyOf": [{"enum": ["plain", "loud"]}, {"type": "null"}]}


def test_nested_objects_oneof_and_const_are_converted() -> None:
    schema = {
        "type": "object",
        "properties": {
            "filter": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "op": {"const": "="}},
                "required": ["field"],
            },
            "values": {"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "number"}]},
                       "uniqueItems": True, "maxItems": 5},
        },
    }  # fmt: skip
    converted = strict_schema(schema)
    assert strict_problems(converted) == []
    nested = converted["properties"]["filter"]
    assert nested["type"] == ["object", "null"] and nested["additionalProperties"] is False
    assert nested["properties"]["op"] == {"anyOf": [{"enum": ["="]}, {"type": "null"}]}
    values = converted["properties"]["values"]
    assert values["items"] == {"anyOf": [{"type": "string"}, {"type": "number"}]}
    assert values["maxItems"] == 5 and "uniqueItems" not in values


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "object"}, "open to any property"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "string"}},
         "additionalProperties as a schema"),
        ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"minLength": 1}]}}}, "'allOf'"),
        ({"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}, "'not'"),
        ({"type": "object", "properties": {"a": {}}}, "accepts any value"),
        ({"type": "object", "properties": {"a": {"type": "array"}}}, "needs 'items'"),
        ({"anyOf": [{"type": "object", "properties": {}, "additionalProperties": False}]}, "root"),
    ],
)  # fmt: skip
def test_schemas_without_a_strict_form_are_refused_with_the_reason(
    box: wasmbox.Sandbox, schema: dict[str, Any], reason: str
) -> None:
    with pytest.raises(wasmbox.StrictSchemaError, match=reason):
        strict_schema(schema)
    if "type" not in schema:
        return  # (a spec gives such a root "type": "object", which has its own reason)
    tool = box.load(manifest("echo", input_schema=schema))
    with pytest.raises(wasmbox.StrictSchemaError, match=f"^echo: .*{reason}"):
        tool.spec("openai", strict=True)
    with pytest.warns(wasmbox.StrictSchemaWarning, match=f"echo: sent without strict mode: .*{reason}"):
        fallback = tool.spec("openai", strict="auto")
    assert fallback["function"]["strict"] is False
    assert fallback["function"]["parameters"] == schema


def test_every_bundled_manifest_is_strict_safe_after_conversion(capabilities: wasmbox.Sandbox) -> None:
    """The tools with an input_schema (word_count and csv_stats are not strict as written)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for format in ("openai", "openai-responses", "anthropic"):
            for spec in capabilities.specs(format, strict="auto", python=True):
                flat = spec.get("function", spec)
                schema = flat.get("parameters", flat.get("input_schema"))
                if flat["name"] == "fsprobe":  # a WASI command without input_schema: open args
                    assert not flat.get("strict")
                    continue
                assert flat.get("strict") is True, flat["name"]
                assert strict_problems(schema) == [], flat["name"]
    assert {str(w.message).split(":")[0] for w in caught} == {"fsprobe"}
    for name in ("word_count", "csv_stats"):
        raw = capabilities.tool(name).manifest.input_schema
        assert strict_problems(raw) != []  # why conversion is needed


def test_run_python_is_offered_as_a_tool(box: wasmbox.Sandbox) -> None:
    (spec,) = box.specs("openai", strict=True, python=True)
    assert spec["function"]["name"] == "run_python"
    assert spec["function"]["parameters"]["properties"] == {
        "code": {"description": "The Python source to run", "type": "string"}
    }
    assert strict_problems(spec["function"]["parameters"]) == []
    assert box.specs("openai") == []
    box.load(manifest("echo", name="run_python"))
    with pytest.raises(ValueError, match="named 'run_python'"):
        box.specs(python=True)


def test_mcp_annotations_follow_the_grants(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    writable = box.load(
        manifest("echo", preopens=[{"host": str(tmp_path), "guest": "/out", "writable": True}])
    )
    assert writable.spec("mcp")["annotations"] == {
        "readOnlyHint": False, "destructiveHint": True, "openWorldHint": False,
    }  # fmt: skip


def test_bad_format_or_strict_is_a_value_error(echo: wasmbox.Tool) -> None:
    with pytest.raises(ValueError, match="unknown spec format 'gemini'"):
        echo.spec("gemini")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strict must be"):
        echo.spec("openai", strict="yes")  # type: ignore[arg-type]


def test_prepare_args_strips_only_the_nulls_strictness_introduced() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "string"},
            "b": {"type": ["string", "null"]},
            "c": {"type": "string"},
            "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "list": {"type": "array", "items": {"type": "object", "properties": {"y": {"type": "string"}}}},
        },
        "required": ["c"],
    }
    args = {
        "a": None,
        "b": None,
        "c": None,
        "inner": {"x": None},
        "list": [{"y": None}, {"y": "k"}],
        "z": None,
    }
    assert prepare_args(args, schema) == {
        "b": None,  # the original allows null: kept as given
        "c": None,  # required: kept, and the schema check refuses it
        "inner": {}, "list": [{}, {"y": "k"}], "z": None,
    }  # fmt: skip
    assert prepare_args("x", schema) == "x"
    assert prepare_args({"a": None}, None) == {"a": None}


def test_importing_integrations_imports_no_sdk() -> None:
    code = (
        "import sys, wasmbox.integrations; "
        "print([m for m in ('openai', 'anthropic', 'mcp', 'httpx', 'pydantic_ai', 'langchain_core') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# -- the conversion, as a property ---------------------------------------------------------------

_leaf_schemas = st.one_of(
    st.fixed_dictionaries({"type": st.just("string")}, optional={
        "minLength": st.integers(0, 3), "maxLength": st.integers(3, 8), "pattern": st.just("^[a-z]*$")}),
    st.fixed_dictionaries({"type": st.sampled_from(["integer", "number"])}, optional={
        "minimum": st.integers(-5, 0), "maximum": st.integers(1, 50)}),
    st.just({"type": "boolean"}),
    st.just({"type": ["string", "null"]}),
    st.builds(lambda values: {"enum": values}, st.lists(st.sampled_from(["a", "b", 1, None]), min_size=1, max_size=3, unique=True)),
    st.builds(lambda value: {"const": value}, st.sampled_from(["x", 2, True])),
)  # fmt: skip


def _objects(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), inner, max_size=3).flatmap(
        lambda props: st.builds(
            lambda required, counts: {
                "type": "object", "properties": props, "required": required,
                "additionalProperties": False, **counts,
            },
            st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([]),
            st.fixed_dictionaries({}, optional={"minProperties": st.integers(0, 1), "maxProperties": st.integers(2, 4)}),
        )
    )  # fmt: skip


_schemas = st.recursive(
    _leaf_schemas,
    lambda inner: st.one_of(
        _objects(inner),
        st.builds(
            lambda items, n: {"type": "array", "items": items, "maxItems": n}, inner, st.integers(1, 3)
        ),
        st.builds(lambda branches: {"anyOf": branches}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda branches: {"oneOf": branches}, st.lists(inner, min_size=1, max_size=2)),
    ),
    max_leaves=8,
)


def _instance(draw: st.DrawFn, schema: dict[str, Any], depth: int = 0) -> Any:
    """A value drawn from `schema`'s shape (it may still break a keyword: filtered later)."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return draw(st.sampled_from(schema["enum"]))
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _instance(draw, draw(st.sampled_from(schema[key])), depth + 1)
    kind = schema["type"] if isinstance(schema["type"], str) else draw(st.sampled_from(schema["type"]))
    if kind == "object":
        props = schema["properties"]
        names = set(schema["required"]) | set(
            draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        )
        return {name: _instance(draw, props[name], depth + 1) for name in sorted(names)}
    if kind == "array":
        return [_instance(draw, schema["items"], depth + 1) for _ in range(draw(st.integers(0, 2)))]
    return draw({"string": st.from_regex("^[a-z]{0,6}$", fullmatch=True), "integer": st.integers(-5, 50),
                 "number": st.floats(-5, 50), "boolean": st.booleans(), "null": st.none()}[kind])  # fmt: skip


def _fill_nulls(value: Any, schema: dict[str, Any]) -> Any:
    """`value` as a strict model sends it: every optional property left out given as null."""
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, []):
            if _schema.validate(value, branch) is None:
                return _fill_nulls(value, branch)
    if isinstance(value, dict) and "properties" in schema:
        filled = {name: _fill_nulls(v, schema["properties"][name]) for name, v in value.items()}
        return {name: filled.get(name) for name in schema["properties"]}
    if isinstance(value, list) and "items" in schema:
        return [_fill_nulls(item, schema["items"]) for item in value]
    return value


@st.composite
def _schema_and_value(draw: st.DrawFn) -> tuple[dict[str, Any], Any]:
    root = draw(_objects(_schemas))
    return root, _instance(draw, root)


@settings(max_examples=400, deadline=None)
@given(_schema_and_value())
def test_every_value_the_tool_takes_survives_the_round_trip(case: tuple[dict[str, Any], Any]) -> None:
    """For closed schemas: the converted schema passes the strict rules; any args the tool takes,
    sent as a strict model sends them (nulls for what it leaves out), fit the converted schema
    and are turned back into those args by prepare_args."""
    schema, value = case
    if _schema.validate(value, schema) is not None:
        return  # broke a keyword the drawing does not follow (bounds, counts, oneOf)
    converted = strict_schema(schema)
    assert strict_problems(converted) == []
    sent = _fill_nulls(value, schema)
    assert _schema.validate(sent, converted) is None, (sent, converted)
    # the tool gets args it takes, which say what `value` says: a null for a property whose own
    # schema allows null may be passed on as given (left out and null are then the same to it)
    received = prepare_args(sent, schema)
    assert _schema.validate(received, schema) is None
    assert _no_nulls(received) == _no_nulls(value)


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(item) for item in value]
    return value
