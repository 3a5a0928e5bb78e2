"""A Python tool without input_schema is shown a schema derived from its entry's signature."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import wasmbox
from wasmbox._backends.python.signature import signature_schema
from wasmbox.integrations import strict_schema

from .strict_rules import strict_problems

SOURCE = '''
from typing import Literal, Optional, Annotated

def main(
    path: str,
    column: str = "units",
    limit: int | None = None,
    mode: Literal["sum", "mean"] = "sum",
    tags: list[str] = [],
    weights: dict[str, float] = {},
    ratio: Optional[float] = None,
    note: Annotated[str, "A note to log"] = "",
    *,
    scale: float = 1.0,
    flag: bool = False,
) -> dict:
    """Summarise a column of a CSV file.

    Longer text that is not part of the summary.

    Args:
        path: The CSV file, under /data.
        column: The column to summarise,
            which must be numeric.
        limit (int): At most this many rows.
    """
    return {"path": path, "column": column, "limit": limit, "mode": mode, "tags": tags,
            "weights": weights, "ratio": ratio, "note": note, "scale": scale, "flag": flag}
'''


@pytest.fixture
def summarise(box: wasmbox.Sandbox, tmp_path: Path) -> wasmbox.Tool:
    source = tmp_path / "summarise.py"
    source.write_text(SOURCE)
    return box.load({"name": "summarise", "runtime": "python", "source": str(source)})


def test_the_schema_follows_annotations_defaults_and_docstring(summarise: wasmbox.Tool) -> None:
    assert summarise.description == "Summarise a column of a CSV file."
    assert summarise.parameters == {
        "type": "object",
        "properties": {
            "path": {"description": "The CSV file, under /data.", "type": "string"},
            "column": {"description": "The column to summarise, which must be numeric.", "type": "string",
                       "default": "units"},
            "limit": {"description": "At most this many rows.", "type": ["integer", "null"], "default": None},
            "mode": {"enum": ["sum", "mean"], "default": "sum"},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "weights": {"type": "object", "additionalProperties": {"type": "number"}, "default": {}},
            "ratio": {"type": ["number", "null"], "default": None},
            "note": {"description": "A note to log", "type": "string", "default": ""},
            "scale": {"type": "number", "default": 1.0},
            "flag": {"type": "boolean", "default": False},
        },
        "required": ["path"],
        "additionalProperties": False,
    }  # fmt: skip


def test_a_derived_schema_goes_through_strict_mode_and_dispatch(
    summarise: wasmbox.Tool, box: wasmbox.Sandbox
) -> None:
    with pytest.raises(wasmbox.StrictSchemaError, match="weights: additionalProperties as a schema"):
        summarise.spec("openai", strict=True)
    parameters = dict(summarise.parameters)
    parameters["properties"] = {k: v for k, v in parameters["properties"].items() if k != "weights"}
    assert strict_problems(strict_schema(parameters)) == []
    # a strict model sends every property, null for the ones it leaves out
    args = {"path": "/data/x.csv", "column": None, "limit": None, "mode": None, "tags": None,
            "ratio": 0.5, "note": None, "scale": None, "flag": True}  # fmt: skip
    call = {"id": "c1", "type": "function", "function": {"name": "summarise", "arguments": json.dumps(args)}}
    (reply,) = box.dispatch([call], format="openai")
    assert json.loads(reply["content"]) == {
        "path": "/data/x.csv",
        "column": "units",
        "limit": None,
        "mode": "sum",
        "tags": [],
        "weights": {},
        "ratio": 0.5,
        "note": "",
        "scale": 1.0,
        "flag": True,
    }  # fmt: skip  (limit allows null: passed as given, which is its default too)


def test_no_schema_without_a_plain_def(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    cases = {
        "decorated": "import functools\n@functools.cache\ndef main(x: int):\n    return x\n",
        "rebound": "def main(x: int):\n    return x\nmain = print\n",
        "lambda": "main = lambda x: x\n",
        "in_try": "def main(x: int):\n    return x\ntry:\n    def main(y): return y\nexcept Exception:\n    pass\n",
    }
    for name, text in cases.items():
        source = tmp_path / f"{name}.py"
        source.write_text(text)
        tool = box.load({"name": name, "runtime": "python", "source": str(source)})
        assert tool.parameters == {"type": "object"}, name


def test_kwargs_leave_the_schema_open_and_unknown_types_unconstrained(
    box: wasmbox.Sandbox, tmp_path: Path
) -> None:
    source = tmp_path / "open.py"
    source.write_text(
        "class Point: ...\n"
        "def main(p: Point, q: 'int', /, r, *rest, s: tuple[int, int] = (0, 0), **extra) -> None:\n"
        "    ':param r: The r value'\n"
    )
    tool = box.load({"name": "open", "runtime": "python", "source": str(source)})
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "r": {"description": "The r value"},
            "s": {"type": "array", "minItems": 2, "maxItems": 2, "default": [0, 0]},
        },
        "required": ["r"],
    }
    with pytest.warns(wasmbox.StrictSchemaWarning, match="open: sent without strict mode"):
        assert tool.spec("openai", strict="auto")["function"]["strict"] is False
    manifest_schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    tool = box.load(
        {"name": "given", "runtime": "python", "source": str(source), "input_schema": manifest_schema}
    )
    assert tool.parameters == manifest_schema  # the manifest's own schema wins


def test_signature_schema_is_defensive() -> None:
    assert signature_schema(None) == (None, "")
    assert signature_schema({"params": "nope"}) == (None, "")
    assert signature_schema({"params": [{"kind": "positional_or_keyword"}]}) == (None, "")
    odd = {
        "params": [
            {"name": "x", "kind": "positional_or_keyword", "annotation": "int |", "has_default": False}
        ]
    }
    assert signature_schema(odd) == ({"type": "object", "properties": {"x": {}}, "required": ["x"],
                                      "additionalProperties": False}, "")  # fmt: skip


CHECKED = """
from typing import Literal

def main(name: str, times: int = 1, mode: Literal["plain", "loud"] = "plain", limit: int = None):
    return (name * times).upper() if mode == "loud" else name * times
"""


def test_calls_are_checked_against_the_derived_schema(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """What the model is shown is what is enforced: a value the schema refuses never reaches
    the entry (it would have run, or failed later as the tool's own TypeError)."""
    source = tmp_path / "greet.py"
    source.write_text(CHECKED)
    tool = box.load({"name": "greet", "runtime": "python", "source": str(source)})
    assert tool.parameters["properties"]["limit"] == {"type": ["integer", "null"], "default": None}
    assert tool.call({"name": "ab", "times": 2, "mode": "loud", "limit": None}).unwrap() == "ABAB"
    for args, message in [
        ({"name": 3.5}, "args.name: expected string, got number"),
        ({"name": "ab", "times": "2"}, "args.times: expected integer, got string"),
        ({"name": "ab", "mode": "shout"}, 'args.mode: must be one of ["plain", "loud"]'),
        ({"name": "ab", "extra": 1}, "args: unexpected property 'extra'"),
        ({}, "args: missing required property 'name'"),
    ]:
        result = tool.call(args)
        assert result.error is not None and result.error.kind is wasmbox.ErrorKind.INVALID_ARGUMENTS, args
        assert result.error.message == message


def test_a_decorated_or_rebound_entry_is_bound_as_before(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    """Without a signature to go by, the call itself decides: binding fails as invalid_arguments,
    a wrong type reaches the entry."""
    source = tmp_path / "wrapped.py"
    source.write_text("import functools\n@functools.lru_cache\ndef main(name: str):\n    return name * 2\n")
    tool = box.load({"name": "wrapped", "runtime": "python", "source": str(source)})
    assert tool.parameters == {"type": "object"}
    assert tool.call({"name": 3}).unwrap() == 6
    result = tool.call({"other": 1})
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.INVALID_ARGUMENTS


def test_an_entry_the_source_does_not_define_is_refused_at_load(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    source = tmp_path / "typo.py"
    source.write_text("def helper():\n    pass\n\ndef main(x: int):\n    return x\n")
    with pytest.raises(
        wasmbox.ManifestError,
        match=r"typo.py: entry: the source binds no 'mian' at its top level; its functions: 'helper', "
        r"'main' \(did you mean 'main'\?\)",
    ):
        box.load({"name": "typo", "runtime": "python", "source": str(source), "entry": "mian"})
    # bound otherwise than by a def, or possibly out of sight: loaded, and the call decides
    for text in ("main = print\n", "from os.path import *\n", "globals()['main'] = len\n"):
        source.write_text(text)
        box.load({"name": "typo", "runtime": "python", "source": str(source)}, replace=True)
