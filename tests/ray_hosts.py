"""Host functions for tests/test_ray.py and tests/security/test_ray_pool.py, importable by the Ray actors (they import them by name)."""

from __future__ import annotations

import os
import time

import wasmbox

_STORE = {"greeting": "hello", "empty": ""}


def kv_get(key: str) -> str | None:
    if key.startswith("secret/"):
        raise wasmbox.CapabilityDeniedError("secret keys are not readable")
    return _STORE.get(key)


def shout(text: str) -> str:
    return text.upper()


def nap(seconds: float) -> None:
    time.sleep(seconds)


def environ(name: str) -> str | None:
    """The actor process's own environment variable `name` (so a test can show what it holds)."""
    return os.environ.get(name)
