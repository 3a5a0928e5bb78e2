"""A Python tool's args and result schemas, from its entry's signature as the runtime's CPython
read it.

The guest driver reports the parameters of a plain top-level `def` (names, kinds, annotations
as source text, literal defaults, docstring; `_signature` in the driver); this maps them to the
JSON Schema a model is shown. Annotations are read as expressions, never evaluated: the common
forms (`int`, `float`, `str`, `bool`, `None`, `list[T]`, `tuple[T, ...]`, `set[T]`,
`dict[str, T]`, `T | None`, `Optional[T]`, `Union[...]`, `Literal[...]`, `Annotated[T, "doc"]`,
`Any`) have a schema; any other type (a class, a TypedDict) leaves the value unconstrained.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from ... import _schema

_SCALARS = {
    "int": "integer",
    "float": "number",
    "str": "string",
    "bool": "boolean",
    "None": "null",
    "NoneType": "null",
}
_ARRAYS = {
    "list",
    "List",
    "Sequence",
    "MutableSequence",
    "Iterable",
    "Collection",
    "set",
    "Set",
    "frozenset",
    "FrozenSet",
    "tuple",
    "Tuple",
}
_MAPS = {"dict", "Dict", "Mapping", "MutableMapping"}
_ANY = {"Any", "object"}
_PARAMS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments):\s*$")


def signature_schema(signature: Any) -> tuple[dict[str, Any] | None, str]:
    """(the args schema, or None when there is no signature to go by; the docstring's summary,
    or "")."""
    if not isinstance(signature, dict) or not isinstance(signature.get("params"), list):
        return None, ""
    doc: str = signature["doc"] if isinstance(signature.get("doc"), str) else ""
    described = _param_docs(doc)
    properties: dict[str, Any] = {}
    required: list[str] = []
    open_ended = False
    for param in signature["params"]:
        if not isinstance(param, dict) or not isinstance(param.get("name"), str):
            return None, ""
        name, kind = param["name"], param.get("kind")
        if kind == "var_keyword":
            open_ended = True
            continue
        if kind in ("var_positional", "positional_only"):
            continue  # entry(**args) cannot pass these
        schema = _annotation(param.get("annotation"))
        if name in described:
            schema = {"description": described[name], **schema}
        if "default" in param:
            if param["default"] is None and schema:  # `x: int = None` takes None too
                schema = _schema.nullable(schema)
            schema["default"] = param["default"]
        elif not param.get("has_default"):
            required.append(name)
        properties[name] = schema
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    if not open_ended:
        result["additionalProperties"] = False
    try:
        _schema.check_schema(result)
    except ValueError:
        return None, _summary(doc)
    return result, _summary(doc)


def return_schema(signature: Any) -> dict[str, Any] | None:
    """The schema of the entry's result, from its return annotation (as parameters' are read);
    None when it has none or the annotation constrains nothing (`Any`, a class)."""
    if not isinstance(signature, dict):
        return None
    schema = _annotation(signature.get("returns"))
    if not schema or set(schema) == {"description"}:
        return None
    try:
        _schema.check_schema(schema)
    except ValueError:
        return None
    return schema


def entry_problem(entry: str, defined: Any) -> str | None:
    """Why a Python tool's `entry` cannot be called, from what the runtime found at the top
    level of its source (`defined`: None when `entry` may be bound there): the functions it
    defines and the closest to `entry`."""
    if not isinstance(defined, dict) or not isinstance(defined.get("functions"), list):
        return None
    functions = [name for name in defined["functions"] if isinstance(name, str)]
    if not functions:
        return f"the source binds no {entry!r} at its top level, and defines no function there"
    import difflib  # (only a missing entry needs it: kept out of `import wasmbox`)

    close = difflib.get_close_matches(entry, functions, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(map(repr, functions[:20])) + (", ..." if len(functions) > 20 else "")
    return f"the source binds no {entry!r} at its top level; its functions: {listed}{hint}"


def _annotation(text: Any) -> dict[str, Any]:
    if not isinstance(text, str):
        return {}
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):  # newer syntax than the host's Python
        return {}
    try:
        return _expr(tree, 0)
    except RecursionError:
        return {}


def _expr(node: ast.expr, depth: int) -> dict[str, Any]:  # noqa: C901 - a branch per kind of annotation
    if depth > 16:
        return {}
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"type": "null"}
        if isinstance(node.value, str):  # a forward reference
            return _annotation(node.value)
        return {}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([_expr(node.left, depth + 1), _expr(node.right, depth + 1)])
    name = _name(node)
    if name is not None:
        if name in _SCALARS:
            return {"type": _SCALARS[name]}
        if name in _ARRAYS:
            return {"type": "array"}
        if name in _MAPS:
            return {"type": "object"}
        return {}
    if not isinstance(node, ast.Subscript):
        return {}
    base = _name(node.value)
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if base in ("Optional",):
        return _union([_expr(args[0], depth + 1), {"type": "null"}])
    if base == "Union":
        return _union([_expr(arg, depth + 1) for arg in args])
    if base == "Literal":
        try:
            values = [ast.literal_eval(arg) for arg in args]
        except ValueError:
            return {}
        if all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
            return {"enum": values}
        return {}
    if base == "Annotated":
        inner = _expr(args[0], depth + 1)
        notes = [a.value for a in args[1:] if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        return {"description": notes[0], **inner} if notes else inner
    if base in _ARRAYS:
        homogeneous = base not in ("tuple", "Tuple") or (len(args) == 2 and _is_ellipsis(args[1]))
        if homogeneous:
            items = _expr(args[0], depth + 1)
            return {"type": "array", "items": items} if items else {"type": "array"}
        return {"type": "array", "minItems": len(args), "maxItems": len(args)}
    if base in _MAPS:
        if len(args) == 2 and _name(args[0]) == "str":
            value = _expr(args[1], depth + 1)
            return {"type": "object", "additionalProperties": value} if value else {"type": "object"}
        return {"type": "object"}
    return {}


def _union(branches: list[dict[str, Any]]) -> dict[str, Any]:
    if any(not branch for branch in branches):
        return {}  # one branch takes anything
    if all(set(branch) == {"type"} and isinstance(branch["type"], str) for branch in branches):
        types = list(dict.fromkeys(branch["type"] for branch in branches))
        return {"type": types[0] if len(types) == 1 else types}
    return {"anyOf": branches}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # typing.Optional, t.List, collections.abc.Sequence
        return node.attr
    return None


def _is_ellipsis(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _summary(doc: str) -> str:
    """The docstring's first paragraph, on one line."""
    paragraph = doc.strip().split("\n\n", 1)[0] if doc else ""
    return " ".join(paragraph.split())


def _param_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions from a Google-style `Args:` section or `:param name:` lines."""
    found: dict[str, str] = {}
    for match in re.finditer(r"^\s*:param\s+(?:[^:]*\s)?(\w+):\s*(.+)$", doc, re.MULTILINE):
        found[match.group(1)] = match.group(2).strip()
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if not _PARAMS_HEADER.match(line):
            continue
        indent = None
        current = None
        for entry in lines[i + 1 :]:
            if not entry.strip():
                current = None
                continue
            width = len(entry) - len(entry.lstrip())
            if indent is None:
                indent = width
            if width < indent or (width == indent and _PARAMS_HEADER.match(entry)):
                break
            item = re.match(r"^\s*\**(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", entry)
            if width == indent and item:
                current = item.group(1)
                found[current] = item.group(2).strip()
            elif current is not None and width > indent:
                found[current] = f"{found[current]} {entry.strip()}".strip()
    return {name: text for name, text in found.items() if text}
