"""The public API, pinned: `wasmbox.__all__` is exactly what the package binds, each name is
documented, and every type a public signature names is itself public, so callers never hold
an object whose type they cannot import."""

from __future__ import annotations

import inspect
import subprocess
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

import wasmbox
import wasmbox.integrations
import wasmbox.testing
from wasmbox import EngineSettings, Sandbox
from wasmbox._backends.python.build import PythonRuntime
from wasmbox._cache import ArtifactCache, CacheStats, Entry
from wasmbox._sandbox import _Default

# The public modules: what they export is the API. (The SDK adapters in wasmbox.integrations'
# submodules are public too, each behind its optional extra.)
PUBLIC_MODULES = (wasmbox, wasmbox.integrations, wasmbox.testing)
# Third-party packages whose types a public signature may name (the runtime dependencies a
# caller already has).
THIRD_PARTY = {"pydantic", "pydantic_core", "wasmtime"}


def _public_objects(modules: tuple[types.ModuleType, ...]) -> set[int]:
    return {id(getattr(module, name)) for module in modules for name in module.__all__}


def _foreign(obj: type | Callable[..., Any]) -> bool:
    """A builtin, stdlib or allowed third-party type (or function)."""
    top = obj.__module__.split(".")[0]
    return top == "builtins" or top in sys.stdlib_module_names or top in THIRD_PARTY


def _is_public_type(kind: type, public: set[int]) -> bool:
    return _foreign(kind) or id(kind) in public


def _types_in(hint: Any) -> Iterator[type]:
    """Every class a type hint names, through unions, generics, Callable, Annotated, TypeVars."""
    if hint is None or hint is type(None) or hint is Any or hint is Ellipsis:
        return
    if isinstance(hint, typing.TypeVar):
        for bound in (hint.__bound__, *hint.__constraints__):
            yield from _types_in(bound)
        return
    if isinstance(hint, list):  # Callable's parameter list
        for item in hint:
            yield from _types_in(item)
        return
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return
    if origin is typing.Annotated:
        yield from _types_in(typing.get_args(hint)[0])
        return
    if origin is not None:
        if isinstance(origin, type) and origin not in (types.UnionType,):
            yield origin
        for arg in typing.get_args(hint):
            yield from _types_in(arg)
        return
    if isinstance(hint, type):
        yield hint
        return
    raise AssertionError(f"a type hint this test does not understand: {hint!r}")


def _signatures(
    modules: tuple[types.ModuleType, ...],
) -> Iterator[tuple[str, Callable[..., Any] | type, dict[str, Any]]]:
    """(where, the callable or class, its default values by parameter) for every public
    function, and every method, property and annotated attribute a public class defines
    (inherited ones from builtins, the stdlib or pydantic are theirs to keep)."""
    seen: set[int] = set()
    for module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj, _defaults(obj)
            elif inspect.isclass(obj):
                yield from _members(obj)


def _members(cls: type) -> Iterator[tuple[str, Callable[..., Any] | type, dict[str, Any]]]:
    for owner in cls.__mro__:
        if _foreign(owner):
            continue
        hints = inspect.get_annotations(owner)
        if any(not attr.startswith("_") for attr in hints):
            yield f"{cls.__name__} (attributes)", owner, {}
        for attr, value in vars(owner).items():
            if attr.startswith("_") and attr != "__init__":
                continue
            where = f"{cls.__name__}.{attr}"
            if isinstance(value, property) and value.fget is not None:
                yield where, value.fget, {}
            elif isinstance(value, (staticmethod, classmethod)):
                yield where, value.__func__, _defaults(value.__func__)
            elif inspect.isfunction(value) and not _foreign(value):  # (pydantic adds some)
                yield where, value, _defaults(value)


def _defaults(func: Callable[..., Any]) -> dict[str, Any]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(func).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


def _private_types(modules: tuple[types.ModuleType, ...] = PUBLIC_MODULES) -> list[str]:
    public = _public_objects(modules)
    found = []
    for where, obj, defaults in _signatures(modules):
        hints = typing.get_type_hints(obj, include_extras=True)
        if inspect.isclass(obj):  # its attributes: public ones only
            hints = {k: v for k, v in hints.items() if not k.startswith("_")}
        for parameter, hint in hints.items():
            # a private sentinel type whose instance is the default (callers never pass one)
            sentinel = type(defaults[parameter]) if parameter in defaults else None
            for kind in _types_in(hint):
                if kind is not sentinel and not _is_public_type(kind, public):
                    found.append(f"{where}: {parameter}: {kind.__module__}.{kind.__qualname__}")
    return sorted(set(found))


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_every_exported_name_is_importable_and_documented(module: types.ModuleType) -> None:
    undocumented = []
    for name in module.__all__:
        obj = getattr(module, name)  # AttributeError: exported but not there
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not (obj.__doc__ or "").strip():
            undocumented.append(name)
    assert undocumented == []


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_all_is_exactly_the_public_names_the_package_binds(module: types.ModuleType) -> None:
    bound = {
        name for name, value in vars(module).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }  # fmt: skip
    assert sorted(module.__all__) == sorted(bound)


# A Tool is made by Sandbox.load, never by its callers: its constructor takes the Sandbox's
# private parts. (Its other parameters are checked: they are the Tool's public attributes.)
INTERNAL_PARAMETERS = {
    "Tool.__init__: runner: wasmbox._tool.Runner",
    "Tool.__init__: auditor: wasmbox._audit.Auditor",
    "Tool.__init__: counts: wasmbox._stats.CallCounts",
    "Tool.__init__: gate: wasmbox._admission.Gate",
    # a Session is made by Sandbox.session
    "Session.__init__: auditor: wasmbox._audit.Auditor",
    "Session.__init__: gate: wasmbox._admission.Gate",
    "Session.__init__: kernel: wasmbox._backends.python.session.Kernel",
    "Session.__init__: table: wasmbox._backends.python.session.SessionTable",
}


def test_public_signatures_name_only_public_types() -> None:
    """Each class a public function, method, property or attribute takes or returns is
    exported from a public module, or is a builtin, stdlib, pydantic or wasmtime type."""
    found = _private_types()
    assert INTERNAL_PARAMETERS <= set(found)  # else the exemption is stale: remove it
    assert sorted(set(found) - INTERNAL_PARAMETERS) == []


def test_the_signature_check_finds_private_types() -> None:
    """The check above is not vacuous: private classes named by a public class's method,
    property, attribute and parameters are each caught, and public, stdlib and sentinel
    types are not."""
    probe = types.ModuleType("probe")
    probe.__all__ = ["Probe", "Sandbox"]  # type: ignore[attr-defined]
    probe.Probe = _Probe  # type: ignore[attr-defined]
    probe.Sandbox = wasmbox.Sandbox  # type: ignore[attr-defined]
    found = _private_types((probe,))
    assert [line for line in found if line.startswith("_Probe")] == [
        "_Probe (attributes): stats: wasmbox._cache.CacheStats",
        "_Probe.cache: return: wasmbox._cache.ArtifactCache",
        "_Probe.digest: return: wasmbox._cache.Entry",
        "_Probe.load: settings: wasmbox._wasmtime.engine.EngineSettings",
        "_Probe.run: progress: wasmbox._backends.python.build.PythonRuntime",
    ]


class _Probe:
    """A stand-in public class whose signatures name private types."""

    stats: CacheStats
    name: str

    @property
    def digest(self) -> list[Entry] | None:
        return None

    def cache(self, *, flags: Mapping[str, int] | None = None) -> ArtifactCache | None:
        return None

    def load(self, settings: EngineSettings | _Default = _Default.CACHE_DIR) -> Sandbox | None:
        return None  # EngineSettings is public in wasmbox, not in `probe`; _Default a sentinel

    def run(self, progress: Callable[[PythonRuntime], None]) -> None:
        return None


# What `import wasmbox` leaves for first use: the event loop (`acall`, `arun_python`), TLS and
# HTTP (the first `http.fetch`), what only a runtime build or a package install runs (a process,
# a tar archive), TOML (a manifest file), and the close matches of a name that is missing.
LAZY_MODULES = ("asyncio", "ssl", "http.client", "subprocess", "tarfile", "tomllib", "difflib")


def test_importing_wasmbox_leaves_modules_for_their_first_use() -> None:
    code = f"import sys, wasmbox; print([m for m in {LAZY_MODULES!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
