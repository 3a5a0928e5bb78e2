"""Pydantic v2 models as tool schemas: each loads (as a class or as its `model_json_schema()`),
converts with strict=True and passes the strict rules, and through dispatch a call shaped like
the model reaches the tool with the model's values while a wrong one is `invalid_arguments`
naming the field. Also the schema the OpenAI SDK's `pydantic_function_tool` writes."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from enum import Enum
from typing import Annotated, Any, Literal
from uuid import UUID

import pytest
from pydantic import BaseModel, Field

import wasmbox
from wasmbox import _schema
from wasmbox.integrations import strict_schema

from .conftest import manifest
from .strict_rules import strict_problems


class Color(str, Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    street: str
    city: str


class Nested(BaseModel):
    name: str
    address: Address = Field(description="Where to deliver")


class WithEnum(BaseModel):
    color: Color
    shade: Color = Color.RED


class WithLiteral(BaseModel):
    size: Literal["s", "m", "l"]


class WithTimes(BaseModel):
    at: datetime
    on: date


class WithUuid(BaseModel):
    id: UUID


class WithOptional(BaseModel):
    text: str
    note: str | None = None
    count: int | None = Field(None, ge=0)


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = Field(ge=1, le=9)


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class WithUnion(BaseModel):
    pet: Annotated[Cat | Dog, Field(discriminator="kind")]


class Node(BaseModel):
    value: int
    children: list[Node] = []


class WithTree(BaseModel):
    root: Node


class Constrained(BaseModel):
    word: str = Field(min_length=2, max_length=5, pattern=r"^[a-z]+$")
    score: float = Field(gt=0, le=1)
    tags: list[str] = Field(min_length=1, max_length=3)
    step: int = Field(multiple_of=5)


# (model, a model-shaped instance, wrong args, the field the error names)
CASES: list[tuple[type[BaseModel], BaseModel, dict[str, Any], str]] = [
    (Nested, Nested(name="a", address=Address(street="1 Main", city="X")),
     {"name": "a", "address": {"street": "1 Main", "city": 5}}, "args.address.city"),
    (WithEnum, WithEnum(color=Color.GREEN), {"color": "blue"}, "args.color"),
    (WithLiteral, WithLiteral(size="m"), {"size": "xl"}, "args.size"),
    (WithTimes, WithTimes(at=datetime(2026, 12, 2, 8, 30, tzinfo=UTC), on=date(2026, 12, 2)),
     {"at": "2026-12-02T08:30:00Z", "on": "2 December"}, "args.on"),
    (WithUuid, WithUuid(id=UUID("12345678-1234-5678-1234-567812345678")), {"id": "not-a-uuid"}, "args.id"),
    (WithOptional, WithOptional(text="hi", count=3), {"text": "hi", "count": -1}, "args.count"),
    (WithUnion, WithUnion(pet=Cat(kind="cat", lives=3)), {"pet": {"kind": "cat", "lives": 12}}, "args.pet.lives"),
    (WithTree, WithTree(root=Node(value=1, children=[Node(value=2, children=[Node(value=3)])])),
     {"root": {"value": 1, "children": [{"value": 2, "children": [{"value": "x"}]}]}},
     "args.root.children[0].children[0].value"),
    (Constrained, Constrained(word="abc", score=0.5, tags=["x"], step=10),
     {"word": "abc", "score": 0.5, "tags": ["x"], "step": 7}, "args.step"),
]  # fmt: skip
IDS = [case[0].__name__ for case in CASES]


def _openai_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.mark.parametrize(("model", "instance", "wrong", "field"), CASES, ids=IDS)
def test_a_pydantic_model_is_a_tool_schema(
    box: wasmbox.Sandbox, model: type[BaseModel], instance: BaseModel, wrong: dict[str, Any], field: str
) -> None:
    tool = box.load(manifest("echo", input_schema=model))
    assert tool.parameters == model.model_json_schema()
    spec = tool.spec("openai", strict=True)["function"]
    assert spec["strict"] is True
    converted = spec["parameters"]
    assert strict_problems(converted) == []

    # a strict model sends every property (null for the ones it leaves out): what dispatch
    # hands the tool is the model's values, read back by the model class as the same instance
    sent = instance.model_dump(mode="json")
    assert _schema.validate(sent, converted) is None
    (reply,) = box.dispatch([_openai_call("echo", sent)], format="openai")
    assert model.model_validate(json.loads(reply["content"])) == instance

    result = tool.call(wrong)
    assert result.error is not None and result.error.kind is wasmbox.ErrorKind.INVALID_ARGUMENTS
    assert result.error.message.startswith(f"{field}:"), result.error.message


def test_a_model_class_in_a_manifest_object_is_its_json_schema() -> None:
    made = wasmbox.Manifest(name="t", module=str(manifest("echo")["module"]), input_schema=WithTree)
    assert made.input_schema == WithTree.model_json_schema()
    assert wasmbox.Manifest.load(made.model_dump()).input_schema == made.input_schema


def test_recursive_models_keep_their_references_in_strict_mode() -> None:
    converted = strict_schema(WithTree.model_json_schema())
    node = converted["$defs"]["Node"]
    assert node["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert converted["properties"]["root"] == {"$ref": "#/$defs/Node"}
    assert strict_problems(converted) == []
    # a recursive root model: Pydantic writes its root as a $ref, which strict mode inlines
    root = strict_schema(Node.model_json_schema())
    assert root["type"] == "object" and "$ref" not in root
    assert root["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert strict_problems(root) == []


def test_a_described_reference_is_inlined_for_strict_mode() -> None:
    converted = strict_schema(Nested.model_json_schema())
    address = converted["properties"]["address"]
    assert address["description"] == "Where to deliver"
    assert set(address["properties"]) == {"street", "city"} and "$ref" not in address


def test_formats_strict_mode_lacks_go_into_the_description() -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string", "format": "float"}}, "required": ["x"]}
    assert strict_schema(schema)["properties"]["x"] == {"description": "(format: float)", "type": "string"}
    dated = {"type": "object", "properties": {"d": {"type": "string", "format": "date"}}, "required": ["d"]}
    assert strict_schema(dated)["properties"]["d"]["format"] == "date"


def test_the_openai_sdks_pydantic_function_tool_schema_loads_and_dispatches(box: wasmbox.Sandbox) -> None:
    openai = pytest.importorskip("openai")
    parameters = openai.pydantic_function_tool(WithUnion)["function"]["parameters"]
    tool = box.load(manifest("echo", input_schema=parameters))
    assert strict_problems(tool.spec("openai", strict=True)["function"]["parameters"]) == []
    sent = {"pet": {"kind": "dog", "good": True}}
    (reply,) = box.dispatch([_openai_call("echo", sent)], format="openai")
    assert json.loads(reply["content"]) == sent
    result = tool.call({"pet": {"kind": "dog", "good": "yes"}})
    assert result.error is not None and result.error.message.startswith("args.pet.good:")


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "object", "properties": {"a": {"type": "string", "optional": True}}},
         r"\$.properties.a: not JSON Schema 2020-12 keyword\(s\) \['optional'\] .*required"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
         r"\$.properties.a.\$ref: .* outside this schema"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/B"}}}, r"\$.properties.a.\$ref: .* names no part"),
        ({"type": "object", "properties": {"a": {"type": "string", "contentEncoding": "base64"}}},
         r"\$.properties.a: .*contentEncoding.*not check"),
        ({"type": "array", "items": [{"type": "string"}]}, r"\$.items: .*prefixItems"),
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, r"\$.properties.a.type"),
    ],
)  # fmt: skip
def test_what_cannot_be_checked_is_refused_at_load_with_its_path(
    box: wasmbox.Sandbox, schema: dict[str, Any], words: str
) -> None:
    with pytest.raises(wasmbox.ManifestError, match=words):
        box.load(manifest("echo", input_schema=schema))


def test_2020_12_keywords_are_checked(box: wasmbox.Sandbox) -> None:
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "urn:example:args",
        "$comment": "a tool's args", "title": "Args", "type": "object",
        "properties": {
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False},
            "card": {"type": "string", "deprecated": True, "examples": ["4111"], "readOnly": False},
            "cvv": {"type": "string", "writeOnly": True},
            "country": {"enum": ["US", "NL"], "default": "US"},
            "zip": {"type": "string"},
        },
        "dependentRequired": {"card": ["cvv"]},
        "dependentSchemas": {"zip": {"required": ["country"]}},
        "if": {"properties": {"country": {"const": "US"}}, "required": ["country"]},
        "then": {"properties": {"zip": {"pattern": "^[0-9]{5}$"}}},
        "else": {"properties": {"zip": {"pattern": "^[0-9]{4} ?[A-Z]{2}$"}}},
        "unevaluatedProperties": False,
    }  # fmt: skip
    tool = box.load(manifest("echo", input_schema=schema))
    assert tool.call({"pair": ["a", 1], "country": "NL", "zip": "1234 AB"}).ok
    wrong = {
        "args.pair[1]": {"pair": ["a", "b"]},
        "args.pair": {"pair": ["a", 1, 2]},
        "args:": {"card": "4111"},  # dependentRequired: cvv
        "args.zip": {"country": "US", "zip": "1234 AB"},
        "args: missing required property 'country'": {"zip": "12345"},
        "args: unexpected property 'other'": {"other": 1},
    }
    for start, args in wrong.items():
        result = tool.call(args)
        assert result.error is not None and result.error.kind is wasmbox.ErrorKind.INVALID_ARGUMENTS, args
        assert result.error.message.startswith(start), (args, result.error.message)


def test_checked_formats_and_annotation_formats(box: wasmbox.Sandbox) -> None:
    properties = {
        name: {"type": "string", "format": name} for name in ("date", "date-time", "uuid", "email", "ipv4")
    }
    properties["price"] = {"type": "string", "format": "float"}  # OpenAPI's: an annotation
    tool = box.load(manifest("echo", input_schema={"type": "object", "properties": properties}))
    good = {
        "date": "2026-12-02", "date-time": "2026-12-02T08:30:00+01:00", "email": "a@example.com",
        "uuid": "12345678-1234-5678-1234-567812345678", "ipv4": "192.0.2.1", "price": "any text",
    }  # fmt: skip
    assert tool.call(good).ok
    for name in ("date", "date-time", "uuid", "email", "ipv4"):
        result = tool.call({**good, name: "2026-13-45T"})
        assert result.error is not None and result.error.message == f"args.{name}: not a valid {name}"


def test_an_error_message_never_holds_the_value(box: wasmbox.Sandbox) -> None:
    tool = box.load(
        manifest("echo", input_schema={"type": "object", "properties": {"n": {"type": "integer"}}})
    )
    result = tool.call({"n": "x" * 100_000})
    assert result.error is not None and result.error.message == "args.n: expected integer, got string"
