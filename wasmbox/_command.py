"""A WASI command tool's mapping from its checked args to argv and stdin (`[command]` in a
manifest), so that a model, which can only send JSON args, can call it.

A template is a string with placeholders that name properties of `input_schema`:

- `{name}`: the arg's value; a string as is, anything else as compact JSON (`3`, `true`, `[1,2]`).
- `{*name}`: only in an argv item, at most one per item; the arg must be an array, and the item
  is repeated once per element (`"-D{*defines}"` → `-DA -DB`; no elements, no items).
- `{{` and `}}`: literal braces.

An argv item (or the stdin template) whose placeholders name an arg that is absent (and has no
`default` in its property's schema) or null is dropped (stdin is then empty). A value is always
substituted into its own item: one template item gives at most one argv item, or one per element
for `{*name}`, so no value can add argv items of its own (a value can still start with `-`: the
manifest's `input_schema` or a `--` item is what keeps it from being read as an option).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"\{\{|\}\}|\{(\*?)([A-Za-z_][A-Za-z0-9_-]*)\}|\{|\}")
_MISSING = object()


@dataclass(frozen=True, slots=True)
class _Slot:
    name: str
    expand: bool


@dataclass(frozen=True, slots=True)
class Template:
    parts: tuple[str | _Slot, ...]
    names: tuple[str, ...]
    expand: str | None  # the `{*name}` placeholder's name, if the template has one

    @classmethod
    def parse(cls, text: str, *, argv_item: bool) -> Template:
        """Raise ValueError for an unmatched brace, a bad placeholder, or a misplaced `{*name}`."""
        parts: list[str | _Slot] = []
        literal: list[str] = []
        position = 0
        for match in _TOKEN.finditer(text):
            literal.append(text[position : match.start()])
            position = match.end()
            token = match.group()
            if token in ("{{", "}}"):
                literal.append(token[0])
            elif match.group(2) is None:
                raise ValueError(f"{text!r}: unmatched {token!r} (write {token * 2!r} for a literal brace)")
            else:
                if joined := "".join(literal):
                    parts.append(joined)
                literal = []
                parts.append(_Slot(match.group(2), bool(match.group(1))))
        literal.append(text[position:])
        if joined := "".join(literal):
            parts.append(joined)
        slots = [part for part in parts if isinstance(part, _Slot)]
        expanding = [slot.name for slot in slots if slot.expand]
        if expanding and not argv_item:
            raise ValueError(f"{text!r}: {{*{expanding[0]}}} expands to argv items: not in stdin")
        if len(expanding) > 1:
            raise ValueError(f"{text!r}: at most one {{*name}} placeholder per argv item")
        names = tuple(dict.fromkeys(slot.name for slot in slots))
        return cls(tuple(parts), names, expanding[0] if expanding else None)

    def render(self, values: Mapping[str, Any]) -> list[str]:
        """The strings this template gives for `values`: none when an arg it names is missing
        (or null), one per element for `{*name}`, else one."""
        if any(values.get(name) is None for name in self.names):
            return []
        if self.expand is None:
            return [self._fill(values, None)]
        elements = values[self.expand]
        if not isinstance(elements, (list, tuple)):
            raise TypeError(f"{self.expand!r} must be an array to expand into argv items")
        return [self._fill(values, element) for element in elements]

    def _fill(self, values: Mapping[str, Any], element: Any) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                out.append(_text(element if part.expand else values[part.name]))
        return "".join(out)


def _text(value: Any) -> str:
    """A string as is, anything else as compact JSON (numbers and booleans without `json`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float) and math.isfinite(value):
        return float.__repr__(value)  # what json.dumps writes for it
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def check_names(template: Template, properties: object, origin: str) -> None:
    """Raise ValueError when `template` names an arg that `properties` (an input_schema's) does
    not have, or expands one that is not an array."""
    if not isinstance(properties, Mapping):
        raise ValueError(  # noqa: TRY004 - the manifest's validator reports ValueErrors
            "templates need an `input_schema` with `properties`"
        )
    for name in template.names:
        if name not in properties:
            raise ValueError(f"{origin}: {{{name}}} is not a property of input_schema")
    if template.expand is not None:
        declared = properties[template.expand]
        kinds = declared.get("type") if isinstance(declared, Mapping) else None
        if kinds != "array":
            raise ValueError(f'{origin}: {{*{template.expand}}} needs its property to be of type "array"')


def schema_defaults(properties: object) -> dict[str, Any]:
    """The `default` of each property that has one (filled in for an absent arg)."""
    if not isinstance(properties, Mapping):
        return {}
    return {
        name: sub["default"]
        for name, sub in properties.items()
        if isinstance(sub, Mapping) and "default" in sub
    }


@dataclass(frozen=True, slots=True)
class CommandMapping:
    """A manifest's `[command]` argv and stdin templates, checked against its `input_schema`."""

    argv: tuple[Template, ...]
    stdin: Template | None
    defaults: Mapping[str, Any]

    @classmethod
    def parse(
        cls, argv: tuple[str, ...] | None, stdin: str | None, schema: Mapping[str, Any] | None
    ) -> CommandMapping:
        """Raise ValueError naming the first template that is malformed or names an arg that
        `schema` (an object schema with `properties`) does not have."""
        items = tuple(Template.parse(item, argv_item=True) for item in argv or ())
        data = Template.parse(stdin, argv_item=False) if stdin is not None else None
        properties = (schema or {}).get("properties")
        if not isinstance(properties, Mapping):
            raise ValueError(  # noqa: TRY004 - the manifest's validator reports ValueErrors
                "argv and stdin templates need an `input_schema` with `properties`"
            )
        for template, origin in [*((t, f"argv item {i}") for i, t in enumerate(items)), (data, "stdin")]:
            if template is not None:
                check_names(template, properties, origin)
        return cls(items, data, schema_defaults(properties))

    def render(self, args: Mapping[str, Any]) -> tuple[tuple[str, ...], bytes]:
        """The argv (after the manifest's fixed `args`) and stdin for checked `args`. Raises
        ValueError for a value that cannot go into argv (a NUL byte, a lone surrogate), TypeError
        for a non-array to expand."""
        values = {**self.defaults, **args} if self.defaults else args
        argv: list[str] = []
        for template in self.argv:
            argv += template.render(values)
        for item in argv:
            if "\0" in item:
                raise ValueError("an argument would contain a NUL byte")
            item.encode()  # UnicodeEncodeError (a ValueError) for a lone surrogate
        stdin = b""
        if self.stdin is not None:
            rendered = self.stdin.render(values)
            stdin = rendered[0].encode() if rendered else b""
        return tuple(argv), stdin
