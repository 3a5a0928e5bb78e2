"""Pinned requirements as manifests give them (`packages`, a `requirements` file): read,
checked (`name==version`, optional sha256 hashes, all or none) and put in one spelling, so a
set of packages has one digest. What installs them is `_backends/python/packages.py`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ._files import read_regular_file

PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r"(?P<extras>\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)$"
)
_NOT_NAME = r"[<>=!~;@ \[]"
# a pin's hash, as pip's requirements files give it: `--hash=sha256:<hex>` (or `--hash sha256:...`)
HASH_OPTION = re.compile(r"(?:^|\s)--hash(?:=|\s+)(?P<value>\S*)")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


def canonical_name(name: str) -> str:
    """The PEP 503 form of a project name: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_pins(items: Iterable[str], origin: str | None = None) -> tuple[str, ...]:
    """`items` as a sorted tuple of pins, `name==version` or, hashed, `name==version
    --hash=sha256:<hex>` (names in their PEP 503 form, spaces removed, hashes lower case and
    sorted), so one set has one spelling. Raises ValueError (its message starting `origin: `)
    naming the first requirement that is not pinned with `==`, a hash that is not a sha256, a
    project listed twice, and a set where some pins are hashed and others not (pip checks hashes
    for a whole set or none)."""
    pins: dict[str, str] = {}
    where = f"{origin}: " if origin else ""
    for item in items:
        digests = []
        for option in HASH_OPTION.finditer(item):
            algorithm, _, digest = option["value"].partition(":")
            if algorithm.lower() != "sha256" or not SHA256_HEX.match(digest.lower()):
                raise ValueError(
                    f"{where}{item!r}: {option['value']!r} is not a sha256 hash: give "
                    "--hash=sha256:<64 hex digits> (the wheel's `sha256sum`)"
                )
            digests.append(digest.lower())
        rest = HASH_OPTION.sub(" ", item)
        match = None if re.search(r"(?:^|\s)-", rest) else PIN.match(re.sub(r"\s+", "", rest))
        if match is None:
            name = re.split(_NOT_NAME, item.strip())[0] or "name"
            raise ValueError(
                f"{where}{item!r} is not pinned: give an exact version, e.g. "
                f"'{name}==1.2.3' (the set must be "
                "reproducible; markers, URLs and pip options other than --hash are not taken)"
            )
        name = canonical_name(match["name"])
        pin = f"{name}{(match['extras'] or '').lower()}=={match['version']}"
        pin += "".join(f" --hash=sha256:{digest}" for digest in sorted(set(digests)))
        if name in pins and pins[name] != pin:
            raise ValueError(f"{where}{match['name']} is listed twice: {pins[name]!r} and {pin!r}")
        pins[name] = pin
    hashed = [pin for pin in pins.values() if is_hashed(pin)]
    if hashed and len(hashed) != len(pins):
        bare = sorted(pin for pin in pins.values() if not is_hashed(pin))
        raise ValueError(
            f"{where}{', '.join(bare)} {'has' if len(bare) == 1 else 'have'} no --hash while other pins do: "
            "hash every pin of a set (its dependencies too) or none"
        )
    return tuple(sorted(pins.values()))


def is_hashed(pin: str) -> bool:
    """Whether a pin `check_pins` gave carries a sha256 hash."""
    return " --hash=" in pin


def pin_project(pin: str) -> str:
    """The `name==version` part of a pin `check_pins` gave."""
    return pin.split(" ", 1)[0]


def read_requirements(path: Path) -> list[str]:
    """The requirements in a requirements file: one pin a line (a line ending in `\\` goes on
    on the next, as pip reads them), `#` comments and blank lines ignored. Raises ValueError
    when the file cannot be read."""
    try:
        text = read_regular_file(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    text = re.sub(r"\\\r?\n", " ", text)
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]
