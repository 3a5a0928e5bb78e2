"""The per-call cost of checking a tool's args against its schema (pytest-benchmark).

    ./dev bench -k schema --benchmark-columns=median,ops

One typical args object (a search tool's: strings, an integer with bounds, an enum, a nested
object with a date and a list of tags), checked by each candidate in the same run: the
hand-written validator of a JSON Schema subset (`subset_validator.py`, the baseline),
jsonschema-rs (a validator compiled once from the schema, as a tool holds it), and jsonschema
(its `Draft202012Validator`, also built once). Each side checks a valid call and reports the
first error of an invalid one, the two things a tool call does. The schema is the subset's, so
all three can check it; the `$defs` case repeats it as Pydantic writes it, for the two
libraries.
"""

from __future__ import annotations

from typing import Any

import jsonschema_rs
import pytest

from . import subset_validator

jsonschema = pytest.importorskip("jsonschema")  # (installed with the test extra's mcp)

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "minLength": 1, "maxLength": 200},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        "mode": {"enum": ["web", "news", "images"]},
        "filters": {
            "type": "object",
            "properties": {
                "since": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 10},
                "safe": {"type": "boolean"},
            },
            "additionalProperties": False,
        },
    },
    "required": ["query"],
    "additionalProperties": False,
}
DEFS_SCHEMA: dict[str, Any] = {
    "$defs": {
        "Filters": {**SCHEMA["properties"]["filters"], "title": "Filters"},
        "Mode": {"enum": ["web", "news", "images"], "title": "Mode", "type": "string"},
    },
    "type": "object",
    "properties": {
        **SCHEMA["properties"],
        "mode": {"$ref": "#/$defs/Mode"},
        "filters": {"$ref": "#/$defs/Filters"},
    },
    "required": ["query"],
    "additionalProperties": False,
}
ARGS = {
    "query": "wasm sandboxes",
    "limit": 10,
    "mode": "news",
    "filters": {"since": "2026-01-01", "tags": ["wasm", "security", "llm"], "safe": True},
}
BAD = {**ARGS, "filters": {**ARGS["filters"], "tags": ["wasm", 3]}}


def _subset(schema: dict[str, Any]) -> Any:
    subset_validator.check_schema(schema)
    return lambda args: subset_validator.validate(args, schema)


def _rs(schema: dict[str, Any]) -> Any:
    validator = jsonschema_rs.Draft202012Validator(schema, validate_formats=True)

    def check(args: Any) -> str | None:
        if validator.is_valid(args):
            return None
        return next(iter(validator.iter_errors(args))).message

    return check


def _py(schema: dict[str, Any]) -> Any:
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )

    def check(args: Any) -> str | None:
        error = next(iter(validator.iter_errors(args)), None)
        return None if error is None else error.message

    return check


CANDIDATES = {"subset": _subset, "jsonschema_rs": _rs, "jsonschema": _py}


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_valid(benchmark: Any, name: str) -> None:
    check = CANDIDATES[name](SCHEMA)
    assert benchmark(check, ARGS) is None


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_invalid(benchmark: Any, name: str) -> None:
    check = CANDIDATES[name](SCHEMA)
    assert benchmark(check, BAD) is not None


@pytest.mark.parametrize("name", ["jsonschema_rs", "jsonschema"])
def test_valid_defs(benchmark: Any, name: str) -> None:
    check = CANDIDATES[name](DEFS_SCHEMA)
    assert benchmark(check, ARGS) is None


@pytest.mark.parametrize("name", ["jsonschema_rs", "jsonschema"])
def test_compile(benchmark: Any, name: str) -> None:
    """Building the validator: once per tool, at load."""
    benchmark(CANDIDATES[name], DEFS_SCHEMA)
