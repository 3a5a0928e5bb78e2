"""Third-party pure-Python packages for Python tools and run_python grant sets.

A manifest's `packages` (pinned `name==version`, plus a `requirements` file's) are installed
by pip, as wheels only, for any platform (`--platform any --implementation py --abi none
--python-version 3.14`), with their dependencies, into `packages-<key>/site` under the cache
directory. The key is the sha256 of the sorted pins and the Sandbox's index options, so one
set is built once per cache, however many manifests name it. Every installed distribution
must be pure Python (its WHEEL says `Root-Is-Purelib: true` and only `py*-none-any` tags; no
`.so`/`.pyd`/`.dll`/`.dylib` file anywhere); else the load fails naming it. The set is built
in a temporary folder, byte-compiled by the runtime (`precompile`), and renamed into place
under a lock, so a second process waits for the first and then reuses its build.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..._errors import ManifestError
from ..._pins import canonical_name, is_hashed, pin_project
from ..._progress import Progress, Step
from .build import _locked

GUEST_PYTHON = "3.14"  # the runtime's CPython, whose wheels pip is asked for
NATIVE_SUFFIXES = (".so", ".pyd", ".dll", ".dylib")
PIP_TIMEOUT = 300.0  # seconds for one pip run, downloads included
_RECORD = "wasmbox-packages.json"


@dataclass(frozen=True)
class PackageSet:
    """An installed set: `site` is the folder the guest sees at /packages."""

    site: Path
    installed: tuple[str, ...]  # every distribution, "name==version", dependencies included


class PackageInstaller:
    """Installs package sets into `root()` (the cache directory) with pip, once per set. Raises
    ValueError when `wheels` is not a directory."""

    def __init__(
        self,
        root: Callable[[], Path],
        *,
        index_url: str | None = None,
        wheels: Path | None = None,
        timeout: float = PIP_TIMEOUT,
    ) -> None:
        if wheels is not None and not wheels.is_dir():
            raise ValueError(f"package_wheels: not a directory: {wheels}")
        self._root = root
        self._index_url = index_url
        self._wheels = wheels.resolve() if wheels is not None else None
        self._timeout = timeout
        self._sets: dict[tuple[str, ...], PackageSet] = {}
        self._lock = threading.Lock()

    def key(self, pins: tuple[str, ...]) -> str:
        """The digest naming `pins` installed from this installer's index options."""
        options = {
            "pins": list(pins),
            "index_url": self._index_url,
            "python": GUEST_PYTHON,
            "wheels": str(self._wheels) if self._wheels is not None else None,
        }
        return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()

    def install(
        self, pins: tuple[str, ...], precompile: Callable[[Path], None], progress: Progress
    ) -> PackageSet:
        """The installed set for `pins`, built first when the cache has none (`precompile`
        byte-compiles a fresh `site` folder). Raises ManifestError when a package cannot be
        found or installed, or is not pure Python."""
        found = self._sets.get(pins)  # installed sets are served without waiting on a build
        if found is not None:
            return found
        with self._lock:  # one build at a time in this process; the file lock for others
            found = self._sets.get(pins)
            if found is None:
                found = self._install(pins, precompile, progress)
                self._sets[pins] = found
            return found

    def _install(
        self, pins: tuple[str, ...], precompile: Callable[[Path], None], progress: Progress
    ) -> PackageSet:
        root = self._root()
        key = self.key(pins)[:32]
        target = root / f"packages-{key}"
        done = _read_record(target)
        if done is not None:
            return done
        try:
            with _locked(root / f".packages-{key}.lock"):
                done = _read_record(target)  # another process built it while we waited
                if done is not None:
                    return done
                stage = Path(tempfile.mkdtemp(dir=root, prefix=".build-packages-"))
                try:
                    with Step(
                        progress,
                        f"installing packages {', '.join(map(pin_project, pins))}",
                        f"pip from {self._source()}, once per cache",
                    ):
                        self._pip(pins, stage / "site")
                    installed = check_pure(stage / "site")
                    with Step(progress, "byte-compiling them inside the runtime", "seconds, once per cache"):
                        precompile(stage / "site")
                    record = {"pins": list(pins), "installed": list(installed)}
                    (stage / _RECORD).write_text(json.dumps(record))
                    if target.exists():  # without its record (written last): not a set to keep
                        shutil.rmtree(target)
                    os.replace(stage, target)
                finally:
                    shutil.rmtree(stage, ignore_errors=True)
        except OSError as exc:
            raise ManifestError(f"packages: cannot install into {root}: {exc}") from None
        progress(f"installed {len(installed)} distributions: {', '.join(installed)}")
        return PackageSet(target / "site", installed)

    def _pip(self, pins: tuple[str, ...], site: Path) -> None:
        if importlib.util.find_spec("pip") is None:
            raise ManifestError(
                f"packages: installing {', '.join(map(pin_project, pins))} needs pip in {sys.executable}'s environment"
            )
        command = [
            # -I: neither the working directory (a writable grant may hold it: a planted pip/
            # there would run on the host) nor PYTHON* variables nor the user site on sys.path
            sys.executable,
            "-I",
            "-m",
            "pip",
            "install",
            "-vv",
            "--isolated",
            "--no-input",
            "--disable-pip-version-check",
            "--no-warn-script-location",
            "--target",
            str(site),
            "--only-binary=:all:",
            "--no-compile",
            "--platform",
            "any",
            "--implementation",
            "py",
            "--abi",
            "none",
            "--python-version",
            GUEST_PYTHON,
            "--timeout",
            "15",
            "--retries",
            "1",
        ]
        if self._index_url is not None:
            command += ["--index-url", self._index_url]
        elif self._wheels is not None:
            command += ["--no-index"]
        if self._wheels is not None:
            command += ["--find-links", str(self._wheels)]
        # the pins as a requirements file (the only way pip takes their hashes), in the stage folder
        requirements = site.parent / "requirements.txt"
        requirements.write_text("".join(f"{pin}\n" for pin in pins))
        command += ["--require-hashes"] if any(is_hashed(pin) for pin in pins) else []
        command += ["-r", str(requirements)]
        import subprocess  # (only an install runs one: kept out of `import wasmbox`)

        try:
            done = subprocess.run(  # noqa: S603 - an argv of our own: pip, the pins, no shell
                command,
                check=False,
                capture_output=True,
                text=True,
                timeout=self._timeout,
                stdin=subprocess.DEVNULL,
                cwd=site.parent,  # the private stage folder
            )
        except subprocess.TimeoutExpired:
            raise ManifestError(
                f"packages: pip did not finish installing {', '.join(map(pin_project, pins))} in {self._timeout:.0f} s "
                f"(is {self._source()} reachable?)"
            ) from None
        if done.returncode != 0:
            raise ManifestError(self._describe_failure(pins, done.stdout + done.stderr))

    def _source(self) -> str:
        if self._index_url is not None:
            return f"the index {self._index_url}"
        if self._wheels is not None:
            return f"the wheel folder {self._wheels}"
        return "PyPI"

    def _describe_failure(self, pins: tuple[str, ...], log: str) -> str:
        errors = [line.removeprefix("ERROR: ") for line in log.splitlines() if line.startswith("ERROR: ")]
        missing = re.search(r"No matching distribution found for (\S+)", log)
        projects = ", ".join(map(pin_project, pins))
        message = f"packages: pip could not install {projects} from {self._source()}"
        mismatched = re.findall(
            r"^\s*(\S+) from (\S+).*:\s*\n\s*Expected sha256 (\S+)((?:\s*\n\s*or \S+)*)\s*\n\s*Got\s+(\S+)",
            log,
            re.MULTILINE,
        )
        if "DO NOT MATCH THE HASHES" in log and mismatched:
            described = []
            for project, url, first, more, got in mismatched:
                expected = " or ".join([first, *re.findall(r"or (\S+)", more)])
                described.append(
                    f"{project} ({url.rsplit('/', 1)[-1]}) has sha256 {got}, the manifest pins {expected}"
                )
            return (
                f"packages: refused a download whose hash is not the pinned one: {'; '.join(described)} "
                f"({self._source()} served another file than the one pinned: if the pin is what you meant, "
                "the file was changed)"
            )[:2000]
        unhashed = re.findall(r"^\s+(\S+==\S+ --hash=sha256:[0-9a-f]{64})\s*$", log, re.MULTILINE)
        if "missing from some requirements" in log and unhashed:
            return (
                f"packages: {', '.join(map(pin_project, unhashed))} (a dependency) has no pin with a hash, "
                "and a hashed set needs every distribution it installs pinned with one: add "
                f"{', '.join(repr(line) for line in unhashed)} after checking that is the file you "
                "trust (these are the digests of what was downloaded)"
            )[:2000]
        if missing is None:
            detail = "; ".join(errors[-3:]) or log.strip()[-600:]
            return f"{message}: {detail}"[:2000]
        wanted = missing[1]
        name = canonical_name(re.split(r"[<>=!~\[;]", wanted)[0])
        pinned = wanted.split("==", 1)[1] if "==" in wanted else None
        native: dict[str, list[str]] = {}  # version -> the tags of its wheels
        sdists, other_python = False, False
        for line in log.splitlines():
            link = _link(line)
            if link is None or _file_project(link) != name:
                continue
            if "Link requires a different Python" in line:
                other_python = True
            skipped = re.match(r"\s*Skipping link: none of the wheel's tags \((.*?)\) are compatible", line)
            if skipped:
                native.setdefault(_file_version(link), []).extend(skipped[1].split(", "))
            if re.search(r"No (?:binaries|sources) permitted for", line):
                sdists = True
        tags = (
            native.get(pinned, [])
            if pinned is not None and pinned in native
            else [t for v in native.values() for t in v]
        )
        unreachable = re.search(
            r"Could not fetch URL (\S+?):? (?:connection error: )?(.*?)(?: - skipping)?$", log, re.MULTILINE
        )
        if unreachable:
            why = f"{self._source()} could not be reached ({unreachable[1]}: {unreachable[2]})"
        elif tags:
            shown = ", ".join(sorted(set(tags))[:4]) + (", ..." if len(set(tags)) > 4 else "")
            why = (
                f"only native (platform) wheels exist ({shown}), built for CPython on an operating system: "
                "the Python runtime is WebAssembly and runs only pure-Python wheels (py3-none-any); "
                "use a pure-Python alternative or an older version that ships one, or run the native "
                "code as a module tool of its own"
            )
        elif other_python:
            why = f"its wheels require another Python than the runtime's {GUEST_PYTHON} (Requires-Python)"
        elif sdists:
            why = "only a source distribution was found: wasmbox installs wheels and builds nothing"
        else:
            why = f"it is not in {self._source()}"
        return (
            f"{message}: no pure-Python wheel of {wanted}: {why} "
            "(give wheels with Sandbox(package_wheels=...) or an index with package_index=...)"
        )


def _link(line: str) -> str | None:
    """The distribution file a line of pip's log names (the URL or path after ": "), if any:
    pip may follow it with "(from <index page>)" and "(requires-python:...)"."""
    found = re.search(r": (\S+?\.(?:whl|tar\.gz|tar\.bz2|zip))(?:#\S*)?(?:\s|$)", line)
    return found[1] if found else None


def _file_version(url: str) -> str:
    """The version in a wheel or sdist's file name ("" when there is none)."""
    parts = url.rsplit("/", 1)[-1].split("#", 1)[0].split("-")
    return parts[1].removesuffix(".tar.gz").removesuffix(".zip") if len(parts) > 1 else ""


def _file_project(url: str) -> str:
    filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
    return canonical_name(filename.split("-", 1)[0])


def check_pure(site: Path) -> tuple[str, ...]:
    """Every distribution installed in `site` as "name==version", sorted. Raises ManifestError
    naming one that is not pure Python, and why."""
    owners: dict[str, str] = {}
    installed = []
    for info in sorted(site.glob("*.dist-info")):
        metadata = _headers(info / "METADATA")
        project = f"{metadata.get('Name', [info.name])[0]}=={metadata.get('Version', ['?'])[0]}"
        installed.append(project)
        wheel = _headers(info / "WHEEL")
        tags = wheel.get("Tag", [])
        impure = [tag for tag in tags if not (tag.startswith("py") and tag.endswith("-none-any"))]
        if impure or not tags:
            _refuse(project, f"its wheel is tagged {', '.join(impure) or '(no tag)'}, not py3-none-any")
        if [value.lower() for value in wheel.get("Root-Is-Purelib", [])] != ["true"]:
            _refuse(project, "its wheel is not a purelib wheel (Root-Is-Purelib is not true)")
        try:
            record = (info / "RECORD").read_text("utf-8")
        except OSError:
            record = ""
        for line in record.splitlines():
            owners[os.path.normpath(line.rsplit(",", 2)[0])] = project
    for folder, _, names in os.walk(site):
        for name in names:
            if name.endswith(NATIVE_SUFFIXES) or ".so." in name:
                path = os.path.relpath(os.path.join(folder, name), site)
                _refuse(owners.get(path, path), f"it contains native code ({path})")
    return tuple(sorted(installed, key=str.lower))


def _refuse(project: str, why: str) -> None:
    raise ManifestError(
        f"packages: {project} is not pure Python: {why}. The Python runtime is WebAssembly and "
        "cannot load native extensions: use a pure-Python package (or its pure-Python wheel)"
    )


def _headers(path: Path) -> dict[str, list[str]]:
    """The `Key: value` header lines of a METADATA or WHEEL file (values by key)."""
    found: dict[str, list[str]] = {}
    try:
        text = path.read_text("utf-8", errors="replace")
    except OSError:
        return found
    for line in text.split("\n\n", 1)[0].splitlines():
        key, colon, value = line.partition(":")
        if colon and not key.startswith((" ", "\t")):
            found.setdefault(key.strip(), []).append(value.strip())
    return found


def _read_record(target: Path) -> PackageSet | None:
    try:
        record = json.loads((target / _RECORD).read_text())
        return PackageSet(target / "site", tuple(record["installed"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
