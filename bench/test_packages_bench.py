"""Importing a third-party package in a Python call (pytest-benchmark). Run: ./dev bench -k packages

The wheel is re-zipped from this venv's idna (see `package_import.py`, which also measures the
same import without bytecode); compare the import against the bare call in the same run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox

from .package_import import PACKAGES, wheel_of

IMPORT_IDNA = PACKAGES["idna"]


@pytest.fixture(scope="module")
def box_and_pin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[wasmbox.Sandbox, str]]:
    wheels = tmp_path_factory.mktemp("wheels")
    pin = wheel_of("idna", wheels)
    cache = Path.home() / ".cache" / "wasmbox-bench"
    with wasmbox.Sandbox(cache_dir=cache, package_wheels=wheels) as sandbox:
        sandbox.run_python("1", {"name": "idna", "runtime": "python", "packages": [pin]})  # installs it
        yield sandbox, pin


def test_packages_none_baseline(benchmark, box_and_pin: tuple[wasmbox.Sandbox, str]) -> None:  # type: ignore[no-untyped-def]
    """The same call without packages: what the /packages preopen and sys.path entry add."""
    box, _ = box_and_pin
    assert benchmark(box.run_python, "sum(range(100))").value == 4950


def test_packages_bare_call_baseline(benchmark, box_and_pin: tuple[wasmbox.Sandbox, str]) -> None:  # type: ignore[no-untyped-def]
    box, pin = box_and_pin
    grants = {"name": "idna", "runtime": "python", "packages": [pin]}
    assert benchmark(box.run_python, "sum(range(100))", grants).value == 4950


def test_packages_import_idna(benchmark, box_and_pin: tuple[wasmbox.Sandbox, str]) -> None:  # type: ignore[no-untyped-def]
    box, pin = box_and_pin
    grants = {"name": "idna", "runtime": "python", "packages": [pin]}
    assert benchmark(box.run_python, f"{IMPORT_IDNA}\n1", grants).value == 1
