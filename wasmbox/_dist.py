"""Installed distributions' versions, read from their `.dist-info` folder names.

This is what the cache keys need, without importing `importlib.metadata`, which would add to
every process's start (bench/README.md, "A new process").
"""

from __future__ import annotations

import functools
import os
import re
import sys


@functools.cache
def version(distribution: str) -> str:
    """The installed version of `distribution` (e.g. "componentize-py"); LookupError if absent."""
    prefix = re.sub(r"[-_.]+", "_", distribution).lower() + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and name.lower().startswith(prefix):
                return name[len(prefix) : -len(".dist-info")]
    raise LookupError(f"{distribution} is not installed")
