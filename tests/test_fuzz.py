"""Property tests with hostile input: manifests, guest results and call arguments.

Whatever a manifest, a guest or a caller hands wasmbox, the host never raises anything but the
documented, typed error: `ManifestError` (or `CapabilityError`) at load, and a `CallResult`
whose value is right or whose error has a kind at call time. The byte-level ABI properties are
in `test_abi.py`; the coverage-guided fuzzer is `fuzz/abi_fuzz.py` (`./dev fuzz`).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wasmbox
from wasmbox import CapabilityError, ErrorKind, Manifest, ManifestError, _abi

from .abi_oracle import check_echo, check_pointer, check_reply
from .conftest import manifest, wat

# Calls into wasm are fast but not free: a modest number of examples, no per-example deadline.
settings.register_profile(
    "wasm", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
WASM = settings.get_profile("wasm")
PY_EXAMPLES = settings(WASM, max_examples=25)  # ~1-2 ms a call, plus the odd slow one

# -- value strategies -------------------------------------------------------------------

scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20)
)  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# What MessagePack can carry back from a guest: also bytes, and non-str map keys.
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=4),
                      inner, max_size=4),
    max_leaves=20,
)  # fmt: skip

# -- manifests ----------------------------------------------------------------------------

SCHEMA_KEYWORDS = [
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "not",
    "minProperties", "maxProperties", "description", "format",
]  # fmt: skip
schemas = st.recursive(
    st.booleans() | st.dictionaries(st.sampled_from(SCHEMA_KEYWORDS), json_values, max_size=3),
    lambda inner: st.dictionaries(
        st.sampled_from(SCHEMA_KEYWORDS),
        inner | json_values | st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=5), inner, max_size=3)
        | st.sampled_from(["object", "string", "integer", "array", "number", "nope", "(a"]),
        max_size=4,
    ),
    max_leaves=15,
)  # fmt: skip
sizes = st.integers(-5, 2**65) | st.sampled_from(["64MiB", "1KiB", "0", "1.5B", "9e9GiB", "10 parsecs"])
durations = st.floats() | st.integers(-5, 10**6) | st.sampled_from(["500ms", "1m", "0s", "-1s", "inf"])
limits = st.fixed_dictionaries(
    {},
    optional={
        "fuel": st.integers(-5, 2**65) | json_values, "memory": sizes, "output": sizes,
        "timeout": durations, "host_calls": st.integers(-5, 10**9) | json_values,
    },
)  # fmt: skip
preopens = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "host": st.sampled_from([".", "/", "..", "/nonexistent", "a\0b", ""]) | st.text(max_size=10),
            "guest": st.sampled_from(["/data", "data", "/a/../b", "/", "/x\0"]) | st.text(max_size=10),
            "writable": st.booleans() | json_values,
        },
    )
    | json_values,
    max_size=3,
)  # fmt: skip
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["echo", "a-b_c", "", "1x", "x" * 65]) | st.text(max_size=10),
    "description": st.text(max_size=20),
    "module": st.sampled_from([wat("echo"), wat("spin"), "missing.wasm", "", "\0"]) | st.text(max_size=10),
    "runtime": st.sampled_from(["python", "ruby"]) | json_values,
    "source": st.sampled_from([str(Path(__file__)), "nope.py"]) | json_values,
    "entry": st.text(max_size=10) | json_values,
    "host_functions": st.lists(
        st.sampled_from(["kv.get", "a..b", "", "x.y"]) | st.text(max_size=6), max_size=3
    ),
    "env": st.dictionaries(st.text(max_size=6), st.text(max_size=6) | json_values, max_size=3),
    "args": st.lists(st.text(max_size=6) | json_values, max_size=3),
    "limits": limits | json_values,
    "preopens": preopens,
    "input_schema": schemas | json_values,
}
_OVERRIDABLE = sorted(set(FIELDS) - {"name", "module", "runtime", "source"})
# A valid echo manifest with one or two fields fuzzed: most of these load, so what loads is
# checked too (fully random dicts almost never load).
near_valid = st.lists(
    st.sampled_from(_OVERRIDABLE).flatmap(lambda key: FIELDS[key].map(lambda value: (key, value))),
    min_size=1, max_size=2,
).map(lambda fields: {"name": "echo", "module": wat("echo"), **dict(fields)})  # fmt: skip
manifest_dicts = (
    near_valid
    | st.fixed_dictionaries({}, optional=FIELDS)
    | st.dictionaries(st.text(max_size=10), json_values, max_size=4)  # unknown keys too
)


def _load(source: Any) -> Manifest | None:
    """`Manifest.load(source)`, or None if it raised the documented error (anything else fails)."""
    try:
        return Manifest.load(source)
    except ManifestError as exc:
        assert str(exc)  # says what is wrong
        return None


@settings(max_examples=300, deadline=None)
@given(manifest_dicts)
def test_manifest_dicts_load_or_raise_manifest_error(data: dict[str, Any]) -> None:
    loaded = _load(data)
    if loaded is not None:  # whatever loads is within the documented bounds
        assert loaded.limits.fuel > 0 and loaded.limits.memory > 0 and loaded.limits.timeout > 0
        assert (loaded.module is None) != (loaded.runtime is None)


@settings(max_examples=200, deadline=None)
@given(schemas)
def test_input_schemas_are_refused_at_load_or_usable_at_call_time(schema: Any) -> None:
    """A schema the loader accepts must never make a call raise: every keyword's value is
    checked at load, so validating arguments against it cannot hit a wrong-typed value."""
    loaded = _load({"name": "echo", "module": wat("echo"), "input_schema": schema})
    if loaded is None:
        return
    from wasmbox import _schema

    assert loaded.input_schema is not None
    for args in ({}, {"a": 1}, {"a": "x", "b": [1, 2, 2]}, {"a": {"b": None}}, {"n": 1.5}):
        problem = _schema.validate(args, loaded.input_schema)
        assert problem is None or isinstance(problem, str)


TOML_FRAGMENTS = [
    'name = "echo"\n', f'module = "{wat("echo")}"\n', 'runtime = "python"\n', "[limits]\n",
    "fuel = 1_000\n", 'memory = "2MiB"\n', "timeout = 1e400\n", 'output = "1KiB"\n', "[[preopens]]\n",
    'host = "."\n', 'guest = "/data"\n', "writable = true\n", "[input_schema]\n", 'type = "object"\n',
    "[env]\n", 'TZ = "UTC"\n', "host_functions = [\"kv.get\"]\n", "a = [[[[1]]]]\n", "x = {", "= 1\n",
    '"\\u0000" = 1\n', "nan = nan\n", "inf = -inf\n", "\n", "[", "]", '"', "'''", "\\",
]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.sampled_from(TOML_FRAGMENTS) | st.text(max_size=8), max_size=12).map("".join)
    | st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.sampled_from([".toml", ".json", ""]),
)
def test_manifest_files_load_or_raise_manifest_error(tmp_path: Path, text: str, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_text(text, encoding="utf-8")
    _load(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(manifest_dicts)
def test_manifest_json_files_load_or_raise_manifest_error(tmp_path: Path, data: dict[str, Any]) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    _load(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300))
def test_manifest_files_of_arbitrary_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "m.toml"
    path.write_bytes(data)
    _load(path)


@pytest.mark.parametrize(
    ("content", "suffix"),
    [
        (b'name = "\xff"\n', ".toml"),  # not UTF-8
        (b"a = " + b"[" * 100_000 + b"]" * 100_000, ".toml"),  # nested past the recursion limit
        (b"[" * 100_000 + b"]" * 100_000, ".json"),
    ],
    ids=["not-utf8", "deep-toml", "deep-json"],
)
def test_hostile_manifest_files_are_manifest_errors(tmp_path: Path, content: bytes, suffix: str) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_bytes(content)
    with pytest.raises(ManifestError, match="m" + suffix):
        Manifest.load(path)
    with pytest.raises(ManifestError, match="cannot read"):
        Manifest.load(str(tmp_path / "a\0b.toml"))  # a NUL in the path


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    for _ in range(depth):
        schema = {"not": schema}
    return schema


@pytest.mark.parametrize(
    "schema",
    [{"type": 5}, {"properties": [1]}, {"anyOf": 3}, {"anyOf": []}, {"pattern": 3}, {"type": [[1]]},
     {"minLength": "3"}, {"maximum": True}, {"minimum": math.nan}, {"required": "a"},
     {"uniqueItems": 1}, {"enum": "ab"}, _nested(65), _nested(5000)],
    ids=["type-int", "properties-list", "anyOf-int", "anyOf-empty", "pattern-int", "type-list",
         "minLength-str", "maximum-bool", "minimum-nan", "required-str", "uniqueItems-int",
         "enum-str", "nested-65", "nested-5000"],
)  # fmt: skip
def test_malformed_input_schemas_are_manifest_errors(schema: dict[str, Any]) -> None:
    """Each is refused at load with a ManifestError: not a TypeError, AttributeError or
    RecursionError from the schema check, nor (minLength "3") loaded to make every call raise."""
    with pytest.raises(ManifestError, match="input_schema"):
        Manifest.load({"name": "echo", "module": wat("echo"), "input_schema": schema})


# -- through a Sandbox and real guests ----------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_box(cache_dir: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        box.register_host_function("kv.get", lambda key: None)
        yield box


@WASM
@given(manifest_dicts)
def test_sandbox_load_raises_only_load_errors(fuzz_box: wasmbox.Sandbox, data: dict[str, Any]) -> None:
    data = {**data, "name": "fuzzed"}  # replace=True keeps one tool slot
    data.pop("runtime", None)  # the Python runtime's own load is fuzzed below, through its calls
    data.pop("source", None)
    try:
        tool = fuzz_box.load(data, replace=True)
    except (ManifestError, CapabilityError):
        return
    assert isinstance(tool.call({}), wasmbox.CallResult)


@pytest.fixture(scope="module")
def reflect(fuzz_box: wasmbox.Sandbox) -> wasmbox.Tool:
    return fuzz_box.load(manifest("reflect", limits={"output": "512B"}))


@WASM
@given(st.binary(max_size=700))
def test_arbitrary_bytes_from_a_guest_are_a_value_or_a_typed_error(
    reflect: wasmbox.Tool, reply: bytes
) -> None:
    check_reply(reflect.call({"r": reply}), reply, 512)


replies = (
    st.builds(lambda v: {"ok": v}, msgpack_values)
    | st.builds(lambda m: {"error": m}, st.text(max_size=30) | msgpack_values)
    | st.dictionaries(st.sampled_from(["ok", "error", "kind"]) | st.text(max_size=3), msgpack_values, max_size=3)
    | msgpack_values
)  # fmt: skip


@WASM
@given(replies, st.data())
def test_arbitrary_structures_from_a_guest_are_a_value_or_a_typed_error(
    reflect: wasmbox.Tool, structure: Any, data: st.DataObject
) -> None:
    reply = _abi.pack(structure)
    if reply and data.draw(st.booleans()):  # and a damaged copy: cut short or one byte changed
        i = data.draw(st.integers(0, len(reply) - 1))
        reply = (
            reply[:i]
            if data.draw(st.booleans())
            else reply[:i] + bytes([data.draw(st.integers(0, 255))]) + reply[i + 1 :]
        )
    check_reply(reflect.call({"r": reply}), reply, 512)


@WASM
@given(st.integers(-(2**63), 2**63 - 1) | st.builds(_abi.join, st.integers(0, 70_000), st.integers(0, 600)))
def test_arbitrary_result_pointers_are_bounds_checked(reflect: wasmbox.Tool, packed: int) -> None:
    check_pointer(reflect.call({"p": struct.pack("<q", packed)}), packed, 512)


# -- call arguments -------------------------------------------------------------------------

args_dicts = st.dictionaries(
    st.text(max_size=8), msgpack_values | st.sets(st.integers(), max_size=2), max_size=5
)
ECHO_SCHEMA = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "maxLength": 10, "pattern": "^[a-z]*$"},
        "n": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
    "additionalProperties": {"anyOf": [{"type": "number"}, {"type": "null"}, {"type": "array"}]},
}


def _normal(value: Any) -> Any:
    """What a value looks like after a MessagePack round trip (tuples become lists)."""
    return _abi.unpack(_abi.pack(value))


@WASM
@given(args_dicts | st.dictionaries(st.integers() | st.binary(max_size=3), scalars, min_size=1, max_size=2)
       | scalars | st.lists(scalars, max_size=2))  # fmt: skip
def test_arbitrary_args_are_echoed_or_a_typed_error(fuzz_box: wasmbox.Sandbox, args: Any) -> None:
    echo = fuzz_box.tool("echo") if "echo" in fuzz_box.tools else fuzz_box.load(manifest("echo"))
    # unencodable or not a map: refused; deeper than a result may be: the reply is refused
    refusals = (ErrorKind.INVALID_ARGUMENTS, ErrorKind.BAD_RESPONSE)
    check_echo(echo.call(args), {} if args is None else args, *refusals)  # None means {}


@WASM
@given(args_dicts | st.fixed_dictionaries({"tags": st.lists(st.text(max_size=3) | json_values, max_size=4)}))
def test_arbitrary_args_against_a_schema(fuzz_box: wasmbox.Sandbox, args: dict[str, Any]) -> None:
    name = "echo_schema"
    tool = fuzz_box.tools.get(name) or fuzz_box.load(manifest("echo", name=name, input_schema=ECHO_SCHEMA))
    check_echo(tool.call(args), args, ErrorKind.INVALID_ARGUMENTS)


def test_deep_args_with_a_recursive_schema_keyword_are_invalid_arguments(fuzz_box: wasmbox.Sandbox) -> None:
    """uniqueItems compared items by repr(): args nested past the recursion limit raised
    RecursionError out of `Tool.call`."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    tool = fuzz_box.tools.get("echo_schema") or fuzz_box.load(
        manifest("echo", name="echo_schema", input_schema=ECHO_SCHEMA)
    )
    result = tool.call({"tags": deep})
    assert result.error is not None and result.error.kind is ErrorKind.INVALID_ARGUMENTS
    assert "nested deeper" in result.error.message
    assert tool.call({"tags": ["a", "b"]}).unwrap() == {"tags": ["a", "b"]}


# -- the Python runtime -------------------------------------------------------------------


@pytest.fixture(scope="module")
def py_echo(fuzz_box: wasmbox.Sandbox, tmp_path_factory: pytest.TempPathFactory) -> wasmbox.Tool:
    source = tmp_path_factory.mktemp("py") / "echo.py"
    source.write_text("def main(**kwargs):\n    return kwargs\n")
    return fuzz_box.load({"name": "py_echo", "runtime": "python", "source": str(source)})


PYTHON_KINDS = (ErrorKind.INVALID_ARGUMENTS, ErrorKind.GUEST_ERROR, ErrorKind.BAD_RESPONSE)


@PY_EXAMPLES
@given(args_dicts)
def test_arbitrary_args_to_a_python_tool(py_echo: wasmbox.Tool, args: dict[str, Any]) -> None:
    result = py_echo.call(args)
    if result.ok:
        assert _abi.pack(result.value) == _abi.pack(_normal(args))
    else:
        assert result.error is not None and result.error.kind in PYTHON_KINDS, result.error


@PY_EXAMPLES
@given(st.text(max_size=60) | st.lists(st.sampled_from(
    ["1/0", "x", "import os", "print('a')", "[", "'\\x00'", "b'\\xff'", "{1: 2}", "float('nan')", "\n",
     "raise SystemExit(3)", "raise KeyboardInterrupt", "object()", "{(1,): 2}", ";", "  "]), max_size=4
).map("\n".join))  # fmt: skip
def test_arbitrary_code_is_a_result_never_an_exception(fuzz_box: wasmbox.Sandbox, code: str) -> None:
    result = fuzz_box.run_python(code)
    assert isinstance(result, wasmbox.CallResult)
    assert result.ok or (result.error is not None and result.error.kind in PYTHON_KINDS), result.error
