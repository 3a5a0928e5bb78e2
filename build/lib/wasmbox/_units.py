"""Human sizes ("64MiB") and durations ("500ms") as they appear in manifests."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
}
_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")

SIZE_PATTERN = r"^\s*[0-9][0-9_]*(\.[0-9]+)?\s*([kKmMgG][iI]?[bB]|[bB])?\s*$"
DURATION_PATTERN = r"^\s*[0-9][0-9_]*(\.[0-9]+)?\s*(us|ms|s|m)?\s*$"


def parse_size(value: object) -> object:
    """An int of bytes from an int or a string such as "64MiB"; other input is returned as is."""
    if not isinstance(value, str):
        return value
    number, unit = _split(value, "size")
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} (use B, KiB, MiB, GiB, KB, MB, GB)")
    size = number * factor
    if size != int(size):
        raise ValueError(f"size {value!r} is not a whole number of bytes")
    return int(size)


def parse_duration(value: object) -> object:
    """Seconds as a float from a number or a string such as "500ms"; other input is returned as is."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if not isinstance(value, str):
        return value
    number, unit = _split(value, "duration")
    factor = _DURATION_UNITS.get(unit or "s")
    if factor is None:
        raise ValueError(f"unknown duration unit {unit!r} (use us, ms, s, m)")
    return number * factor


def _split(value: str, what: str) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(value)
    if not match:
        raise ValueError(f"not a {what}: {value!r}")
    number = float(match.group(1).replace("_", ""))
    if not math.isfinite(number):
        raise ValueError(f"not a {what}: {value!r}")
    return number, match.group(2)


def format_size(size: int) -> str:
    """The shortest exact binary form of a byte count, e.g. 65536 -> "64KiB"."""
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return f"{size}B"
