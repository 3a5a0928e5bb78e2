"""Grants are checked at load: a module's imports must be WASI or granted host functions."""

from __future__ import annotations

import pytest

import wasmbox

from .conftest import manifest


def test_ungranted_host_function_is_refused_at_load(box: wasmbox.Sandbox) -> None:
    box.register_host_function("secret.get", lambda: "s3cr3t")
    with pytest.raises(wasmbox.CapabilityError, match="'secret.get'.*not granted"):
        box.load(manifest("asks_secret"))
    # granted, it loads
    tool = box.load(manifest("asks_secret", host_functions=["secret.get"]))
    assert tool.info.host_functions == ("secret.get",)


def test_foreign_import_module_is_refused(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.CapabilityError, match="'env' 'system'"):
        box.load(manifest("foreign_import"))


def test_granting_an_unregistered_host_function_is_refused(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.CapabilityError, match="not registered"):
        box.load(manifest("echo", host_functions=["kv.get"]))


def test_granted_but_unused_functions_are_not_linked(box: wasmbox.Sandbox) -> None:
    box.register_host_function("kv.get", lambda key: None)
    tool = box.load(manifest("echo", host_functions=["kv.get"]))
    assert tool.info.host_functions == ()
    assert tool.call({"x": 1}).unwrap() == {"x": 1}


def test_host_function_names_are_checked(box: wasmbox.Sandbox) -> None:
    with pytest.raises(ValueError):
        box.register_host_function("not a name", lambda: None)
    box.register_host_function("a.b", lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        box.register_host_function("a.b", lambda: None)


def test_python_runtime_is_refused_until_it_exists(box: wasmbox.Sandbox) -> None:
    with pytest.raises(wasmbox.ManifestError, match="not available"):
        box.load({"name": "py", "runtime": "python"})
