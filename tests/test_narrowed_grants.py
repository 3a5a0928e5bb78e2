"""Grants narrowed to their args, as a manifest writes them: `host_function_args` and
`tool_args` read from TOML, checked at load (a bad schema is a ManifestError naming the
function and argument), part of the grant set's digest, and kept when a manifest travels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox import Manifest, ManifestError

from .conftest import wat

TOML = """
name = "lookup"
module = "{module}"
host_functions = ["host.fn"]

[host_function_args."host.fn"]      # only keys under public/, and a limit of 1 to 10
key = {{ type = "string", pattern = "^public/[a-z]+$" }}
limit = {{ type = "integer", minimum = 1, maximum = 10 }}
"""


def test_toml_narrows_a_host_function(box: wasmbox.Sandbox, tmp_path: Path) -> None:
    path = tmp_path / "lookup.toml"
    path.write_text(TOML.format(module=wat("forward")))
    box.register_host_function("host.fn", lambda key, limit: [key, limit])
    tool = box.load(path)
    assert tool.manifest.host_function_args["host.fn"]["limit"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 10,
    }
    assert tool.call({"key": "public/a", "limit": 3}).unwrap() == ["public/a", 3]
    refused = tool.call({"key": "public/a", "limit": 30})
    assert refused.error is not None and refused.error.kind is wasmbox.ErrorKind.CAPABILITY_DENIED
    assert "host function 'host.fn' refused: args.limit: must be <= 10" in refused.error.message


def grants(**fields: Any) -> dict[str, Any]:
    return {"name": "g", "runtime": "python", "host_functions": ["kv.get"], **fields}


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"host_function_args": {"kv.get": {"key": {"type": "strng"}}}}, "host_function_args: kv.get.key: $.type"),
        ({"host_function_args": {"kv.get": {"key": {"nullable": True}}}}, "kv.get.key: $: not JSON Schema 2020-12 keyword(s) ['nullable']"),
        ({"host_function_args": {"kv.get": {"key": {"$ref": "https://x/s.json"}}}}, "kv.get.key: $.$ref"),
        ({"host_function_args": {"kv.get": {"key": {"pattern": "^a"}}}}, 'kv.get.key: `pattern` applies to strings only, so a value of another type would pass it: add type = "string"'),
        ({"host_function_args": {"kv.get": {"n": {"maximum": 3}}}}, 'kv.get.n: `maximum` applies to numbers only'),
        ({"host_function_args": {"kv.get": {"q": {"type": "object", "properties": {"t": {"maxLength": 3}}}}}}, "kv.get.q: `maxLength` applies to strings only"),
        ({"host_function_args": {"kv.get": {"key": {"type": "string", "pattern": "("}}}}, "kv.get.key:"),
        ({"host_function_args": {"kv.put": {}}}, "host_function_args: 'kv.put' is not in `host_functions`: grant it there too"),
        ({"tools": ["t"], "host_function_args": {"wasmbox.call_tool": {}}}, "narrow each tool's args in `tool_args`"),
        ({"tool_args": {"t": {"x": {"type": "string"}}}}, "tool_args: 't' is not in `tools`"),
        ({"tools": ["t"], "tool_args": {"t": {"x": {"minLength": 1}}}}, "tool_args: t.x: `minLength` applies to strings only"),
        ({"host_function_args": {"kv.get": {"key": 5}}}, "host_function_args.kv.get.key"),
    ],
)  # fmt: skip
def test_a_bad_narrowing_is_refused_at_load_naming_the_function(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ManifestError) as caught:
        Manifest.load(grants(**fields))
    assert words in str(caught.value)


def test_typed_schemas_and_consts_need_no_more() -> None:
    narrowed = {"kv.get": {"key": {"enum": ["a", "b"]}, "n": {"const": 3}, "x": True,
                           "q": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}}}  # fmt: skip
    check = Manifest.load(grants(host_function_args=narrowed))._narrowing("host", "kv.get")
    assert check is not None
    assert check.problem({"key": "a", "n": 3, "x": [1], "q": None}) is None
    assert check.problem({"key": "c", "n": 3, "x": 1, "q": None}) == 'args.key: must be one of ["a", "b"]'


def test_an_empty_narrowing_allows_no_arguments() -> None:
    check = Manifest.load(grants(host_function_args={"kv.get": {}}))._narrowing("host", "kv.get")
    assert check is not None and check.problem({}) is None
    assert check.problem({"key": "a"}) == "args: unexpected property 'key'"


def test_narrowing_is_part_of_the_grant_sets_identity() -> None:
    plain = Manifest.load(grants())
    narrow = Manifest.load(grants(host_function_args={"kv.get": {"key": {"const": "a"}}}))
    assert plain._narrowing("host", "kv.get") is None
    assert plain.digest() != narrow.digest()  # run_python's grant sets and sessions are keyed by it
    travelled = Manifest.load(narrow.model_dump(mode="json"))  # as a Ray actor gets it
    assert travelled.digest() == narrow.digest()
    check = travelled._narrowing("host", "kv.get")
    assert check is not None and check.problem({"key": "b"}) == 'args.key: must be "a"'


def test_a_copy_with_other_narrowing_checks_its_own() -> None:
    narrow = Manifest.load(grants(host_function_args={"kv.get": {"key": {"const": "a"}}}))
    other = narrow.model_copy(update={"host_function_args": {"kv.get": {"key": {"const": "b"}}}})
    first, second = narrow._narrowing("host", "kv.get"), other._narrowing("host", "kv.get")
    assert first is not None and second is not None
    assert first.problem({"key": "a"}) is None and second.problem({"key": "a"}) == 'args.key: must be "b"'
