"""Third-party pure-Python packages: wheels built here (no network), installed by pip from a
local folder (`--no-index --find-links`), imported by Python tools and run_python snippets."""

from __future__ import annotations

import base64
import hashlib
import re
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import wasmbox
from wasmbox import ManifestError


def build_wheel(
    folder: Path, name: str, version: str, files: dict[str, str | bytes], *,
    tag: str = "py3-none-any", purelib: bool = True, requires: tuple[str, ...] = (),
) -> Path:  # fmt: skip
    """A wheel with `files`, its .dist-info (METADATA, WHEEL, RECORD) written by hand."""
    info = f"{name}-{version}.dist-info"
    contents: dict[str, bytes] = {
        path: data.encode() if isinstance(data, str) else data for path, data in files.items()
    }
    requires_lines = "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires_lines}".encode()
    )
    contents[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: wasmbox-tests\nRoot-Is-Purelib: {str(purelib).lower()}\nTag: {tag}\n"
    ).encode()
    record = []
    for path, data in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in contents.items():
            archive.writestr(path, data)
    return wheel


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    build_wheel(folder, "tinypkg", "1.0", {
        "tinypkg/__init__.py": "from tinydep import double\n\ndef answer():\n    return double(21)\n",
    }, requires=("tinydep==2.0",))  # fmt: skip
    build_wheel(folder, "tinydep", "2.0", {"tinydep.py": "def double(x):\n    return 2 * x\n"})
    build_wheel(
        folder, "nativepkg", "1.0", {"nativepkg/__init__.py": "", "nativepkg/_speedups.so": b"\x7fELF"},
        tag="cp314-cp314-manylinux_2_17_x86_64", purelib=False,
    )  # fmt: skip
    build_wheel(folder, "sneaky", "1.0", {"sneaky/__init__.py": "", "sneaky/_core.so": b"\x7fELF"})
    return folder


@pytest.fixture
def pbox(cache_dir: Path, wheels: Path) -> Iterator[wasmbox.Sandbox]:
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as sandbox:
        yield sandbox


def tool(tmp_path: Path, name: str, source: str, **fields: object) -> dict[str, object]:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return {"name": name, "runtime": "python", "source": str(path), **fields}


USES_TINYPKG = (
    "import tinypkg\n\ndef main():\n    return {'answer': tinypkg.answer(), 'file': tinypkg.__file__}\n"
)


def package_sets(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("packages-*"))


def test_a_tool_imports_a_declared_package_and_its_dependency(pbox: wasmbox.Sandbox, tmp_path: Path) -> None:
    loaded = pbox.load(tool(tmp_path, "uses", USES_TINYPKG, packages=["tinypkg==1.0"]))
    value = loaded.call({}).unwrap()
    assert value == {"answer": 42, "file": "/packages/tinypkg/__init__.py"}


def test_the_same_set_in_two_manifests_is_built_once(cache_dir: Path, wheels: Path, tmp_path: Path) -> None:
    manifest = tool(tmp_path, "first", USES_TINYPKG, packages=["tinydep==2.0", "tinypkg==1.0"])
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as box:
        box.load(manifest)
    built = [p for p in package_sets(cache_dir) if "tinydep==2.0" in (p / "wasmbox-packages.json").read_text()
             and '"pins": ["tinydep==2.0", "tinypkg==1.0"]' in (p / "wasmbox-packages.json").read_text()]  # fmt: skip
    assert len(built) == 1
    inode = built[0].stat().st_ino
    for wheel in wheels.iterdir():  # nothing left to install from: only the cached build can serve
        wheel.unlink()
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as box:
        # the same set in another order and spelling, in another tool
        again = tool(tmp_path, "second", USES_TINYPKG, packages=["TinyPkg == 1.0", "tinydep==2.0"])
        assert box.load(again).call({}).unwrap()["answer"] == 42
        assert box.load({**again, "name": "third"}).call({}).ok
    assert built[0].stat().st_ino == inode
    assert not list(cache_dir.glob(".build-packages-*"))


def test_packages_are_bytecode_compiled_by_the_runtime(
    pbox: wasmbox.Sandbox, tmp_path: Path, cache_dir: Path
) -> None:
    pbox.load(tool(tmp_path, "uses", USES_TINYPKG, packages=["tinypkg==1.0"]))
    site = next(
        p / "site"
        for p in package_sets(cache_dir)
        if '"pins": ["tinypkg==1.0"]' in (p / "wasmbox-packages.json").read_text()
    )
    assert (site / "tinypkg" / "__pycache__" / "__init__.cpython-314.pyc").is_file()
    assert (site / "__pycache__" / "tinydep.cpython-314.pyc").is_file()


def test_a_wheel_with_native_code_is_refused_naming_it(pbox: wasmbox.Sandbox, tmp_path: Path) -> None:
    with pytest.raises(
        ManifestError, match=r"nativepkg==1\.0: only native \(platform\) wheels exist \(cp314-cp314-manylinux"
    ):
        pbox.load(tool(tmp_path, "native", "def main():\n    return 1\n", packages=["nativepkg==1.0"]))
    with pytest.raises(ManifestError, match=r"sneaky==1\.0 is not pure Python.*native code.*_core\.so"):
        pbox.load(tool(tmp_path, "sneaky", "def main():\n    return 1\n", packages=["sneaky==1.0"]))
    assert "native" not in pbox.tools and pbox.run_python("1 + 1").value == 2  # still serving


NATIVE_ONLY = r"no pure-Python wheel of {pin}: only native \(platform\) wheels exist \({tags}"


def test_a_project_with_only_native_wheels_on_an_index_says_so(
    cache_dir: Path, wheels: Path, tmp_path: Path
) -> None:
    # a PEP 503 index in a folder: pip names each file with "(from <index page>)" after it
    page = tmp_path / "simple" / "nativepkg"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text(
        f'<a href="{(wheels / "nativepkg-1.0-cp314-cp314-manylinux_2_17_x86_64.whl").as_uri()}">wheel</a>\n'
    )
    refused = NATIVE_ONLY.format(pin=r"nativepkg==1\.0", tags="cp314-cp314-manylinux")
    with (
        wasmbox.Sandbox(cache_dir=cache_dir, package_index=(tmp_path / "simple").as_uri()) as box,
        pytest.raises(ManifestError, match=refused),
    ):
        box.load(tool(tmp_path, "native", "def main():\n    return 1\n", packages=["nativepkg==1.0"]))


PYPI_OFFLINE = re.compile(
    r"could not be reached|timed out|NewConnectionError|Temporary failure in name resolution|Network is unreachable"
)


def test_a_pypi_project_with_only_native_wheels_says_so(cache_dir: Path, tmp_path: Path) -> None:
    # pyyaml 6.0.3 ships wheels for CPython on each platform and an sdist, no py3-none-any
    # (pip's cache keeps the index page; skipped when PyPI cannot be reached)
    uses_yaml = tool(
        tmp_path, "yaml", "import yaml\n\ndef main():\n    return 1\n", packages=["pyyaml==6.0.3"]
    )
    with wasmbox.Sandbox(cache_dir=cache_dir) as box, pytest.raises(ManifestError) as refused:
        box.load(uses_yaml)
    message = str(refused.value)
    if PYPI_OFFLINE.search(message) and "only native" not in message:
        pytest.skip(f"PyPI cannot be reached: {message[:300]}")
    assert re.search(NATIVE_ONLY.format(pin=r"pyyaml==6\.0\.3", tags="cp3"), message), message
    assert "not in PyPI" not in message


@pytest.mark.parametrize("requirement", ["tinypkg", "tinypkg>=1.0", "tinypkg~=1.0", "tinypkg==1.*; python_version>'3'",
                                         "https://example.com/tinypkg-1.0.whl", "--index-url=http://x"])  # fmt: skip
def test_an_unpinned_requirement_is_refused(requirement: str, tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="is not pinned: give an exact version"):
        wasmbox.Manifest.load(
            tool(tmp_path, "unpinned", "def main():\n    return 1\n", packages=[requirement])
        )


def test_a_project_pinned_twice_and_packages_on_a_module_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="listed twice"):
        wasmbox.Manifest.load(tool(tmp_path, "t", "", packages=["idna==3.10", "IDNA==3.9"]))
    with pytest.raises(ManifestError, match="for Python tools"):
        wasmbox.Manifest.load({"name": "m", "module": __file__, "packages": ["idna==3.10"]})
    with pytest.raises(ManifestError, match="reserved for the Python runtime"):
        wasmbox.Manifest.load(
            tool(tmp_path, "t", "", preopens=[{"host": str(tmp_path), "guest": "/packages"}])
        )


def test_a_missing_package_is_a_quick_clear_error(pbox: wasmbox.Sandbox, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(
        ManifestError, match=r"no pure-Python wheel of nothere==9\.9: it is not in the wheel folder"
    ):
        pbox.load(tool(tmp_path, "missing", "def main():\n    return 1\n", packages=["nothere==9.9"]))
    assert time.monotonic() - started < 120  # pip found nothing and said so: no network wait, no hang


def test_a_requirements_file_adds_to_packages(pbox: wasmbox.Sandbox, tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("# pinned\ntinypkg==1.0  # the one we use\n\n")
    manifest = wasmbox.Manifest.load(
        tool(
            tmp_path,
            "req",
            USES_TINYPKG,
            requirements=str(tmp_path / "requirements.txt"),
            packages=["tinydep==2.0"],
        )
    )
    assert manifest.packages == ("tinydep==2.0", "tinypkg==1.0")
    assert pbox.load(manifest).call({}).unwrap()["answer"] == 42
    (tmp_path / "bad.txt").write_text("tinypkg>=1\n")
    with pytest.raises(ManifestError, match="'tinypkg>=1' is not pinned"):
        wasmbox.Manifest.load(tool(tmp_path, "req", USES_TINYPKG, requirements=str(tmp_path / "bad.txt")))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_hashed_pins_install_only_the_pinned_files(cache_dir: Path, wheels: Path, tmp_path: Path) -> None:
    pkg, dep = (
        sha256(wheels / "tinypkg-1.0-py3-none-any.whl"),
        sha256(wheels / "tinydep-2.0-py3-none-any.whl"),
    )
    pinned = [f"tinypkg==1.0 --hash=sha256:{pkg}", f"TinyDep == 2.0 --hash sha256:{dep.upper()}"]
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as box:
        loaded = box.load(tool(tmp_path, "hashed", USES_TINYPKG, packages=pinned))
        assert loaded.manifest.packages == (
            f"tinydep==2.0 --hash=sha256:{dep}",
            f"tinypkg==1.0 --hash=sha256:{pkg}",
        )
        assert loaded.call({}).unwrap()["answer"] == 42
        # a dependency without a pin (so without a hash) is refused, naming it and its digest
        with pytest.raises(ManifestError, match=rf"tinydep==2\.0 \(a dependency\).*--hash=sha256:{dep}"):
            box.load(tool(tmp_path, "nodep", USES_TINYPKG, packages=[pinned[0]]))

    # pip's requirements-file form: a hash on a continued line
    (tmp_path / "requirements.txt").write_text(
        f"tinypkg==1.0 \\\n    --hash=sha256:{pkg}  # ours\ntinydep==2.0 \\\n    --hash=sha256:{'0' * 64} \\\n"
        f"    --hash=sha256:{dep}\n"
    )
    manifest = wasmbox.Manifest.load(
        tool(tmp_path, "req", USES_TINYPKG, requirements=str(tmp_path / "requirements.txt"))
    )
    assert manifest.packages == (
        f"tinydep==2.0 --hash=sha256:{'0' * 64} --hash=sha256:{dep}", f"tinypkg==1.0 --hash=sha256:{pkg}"
    )  # fmt: skip

    # the wheel folder now serves another tinypkg 1.0: refused, naming it and both digests
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    (swapped / "tinydep-2.0-py3-none-any.whl").write_bytes(
        (wheels / "tinydep-2.0-py3-none-any.whl").read_bytes()
    )
    other = build_wheel(
        swapped, "tinypkg", "1.0", {"tinypkg/__init__.py": "def answer():\n    return 'theirs'\n"}
    )
    with wasmbox.Sandbox(cache_dir=tmp_path / "fresh", package_wheels=swapped) as box:
        with pytest.raises(ManifestError) as refused:
            box.load(tool(tmp_path, "hashed", USES_TINYPKG, packages=pinned))
        assert f"tinypkg==1.0 (tinypkg-1.0-py3-none-any.whl) has sha256 {sha256(other)}" in str(refused.value)
        assert f"the manifest pins {pkg}" in str(refused.value)
        assert not list((tmp_path / "fresh").glob("packages-*")), "nothing of the refused set is kept"
        assert box.run_python("1 + 1").value == 2  # and the Sandbox serves on


@pytest.mark.parametrize(
    "packages, message",
    [
        (
            ["tinypkg==1.0 --hash=sha256:" + "a" * 64, "tinydep==2.0"],
            "tinydep==2.0 has no --hash while other pins do",
        ),
        (["tinypkg==1.0 --hash=md5:" + "a" * 32], "is not a sha256 hash"),
        (["tinypkg==1.0 --hash=sha256:" + "a" * 63], "is not a sha256 hash"),
        (["tinypkg==1.0 --hash=sha256:" + "g" * 64], "is not a sha256 hash"),
        (["tinypkg==1.0 --index-url=http://evil.example/"], "is not pinned"),
        (["tinypkg==1.0 -r other.txt"], "is not pinned"),
        (
            ["tinypkg==1.0 --hash=sha256:" + "a" * 64, "tinypkg==1.0 --hash=sha256:" + "b" * 64],
            "listed twice",
        ),
    ],
)
def test_malformed_hashed_pins_are_refused_at_load(packages: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=re.escape(message)):
        wasmbox.Manifest.load(tool(tmp_path, "t", "", packages=packages))


def test_run_python_grant_sets_with_packages(pbox: wasmbox.Sandbox) -> None:
    grants = {"name": "snippet", "runtime": "python", "packages": ["tinypkg==1.0"]}
    assert pbox.run_python("import tinypkg; tinypkg.answer()", grants).value == 42
    without = pbox.run_python("import sys\ntry:\n    import tinypkg\nexcept ImportError as e:\n    r = repr(e)\n"
                              "r, '/packages' in sys.path")  # fmt: skip
    assert without.value == ["ModuleNotFoundError(\"No module named 'tinypkg'\")", False]
    other = {"name": "snippet", "runtime": "python", "packages": ["tinydep==2.0"]}
    assert wasmbox.Manifest.load(grants).digest() != wasmbox.Manifest.load(other).digest()
    assert not pbox.run_python("import tinypkg", other).ok  # another set's spare is never used
    assert pbox.run_python("import tinydep; tinydep.double(4)", other).value == 8


def test_a_guest_cannot_write_into_its_packages(pbox: wasmbox.Sandbox, cache_dir: Path) -> None:
    grants = {"name": "snippet", "runtime": "python", "packages": ["tinypkg==1.0"]}
    attempts = """
import os, tinypkg
done = []
for action in (lambda: open('/packages/tinypkg/__init__.py', 'a').write('X = 1'),
               lambda: open('/packages/evil.py', 'w').write('x'),
               lambda: os.remove('/packages/tinydep.py'),
               lambda: os.mkdir('/packages/new')):
    try:
        action()
        done.append('written')
    except OSError as exc:
        done.append(type(exc).__name__)
done
"""
    result = pbox.run_python(attempts, grants)
    assert result.ok, result.error
    assert "written" not in result.value
    site = next(
        p / "site"
        for p in package_sets(cache_dir)
        if '"pins": ["tinypkg==1.0"]' in (p / "wasmbox-packages.json").read_text()
    )
    assert not (site / "evil.py").exists() and (site / "tinydep.py").is_file()
    assert pbox.run_python("import tinypkg; tinypkg.answer()", grants).value == 42


def test_an_undeclared_package_fails_saying_how_to_add_it(box: wasmbox.Sandbox) -> None:
    result = box.run_python("import tinypkg")
    assert result.error is not None and result.error.kind.value == "guest_error"
    assert "No module named 'tinypkg'" in result.error.message
    assert 'packages = ["name==version"]' in result.error.message
    stdlib = box.run_python("import json.nothere")  # a stdlib package's: no package would help
    assert stdlib.error is not None and "packages = [" not in stdlib.error.message


RACE = """
import sys, wasmbox
with wasmbox.Sandbox(cache_dir=sys.argv[1], package_wheels=sys.argv[2]) as box:
    box.prepare_python()
    print("ready", flush=True)
    sys.stdin.readline()  # both start installing at the same moment
    print(box.run_python("import racepkg; racepkg.N", {"name": "r", "runtime": "python",
          "packages": ["racepkg==3.0", "tinydep==2.0"], "limits": {"timeout": 30}}).value)
"""


def test_two_processes_install_a_set_once(cache_dir: Path, wheels: Path) -> None:
    # a set no other test installs, in the shared cache (the runtime is built there already)
    build_wheel(wheels, "racepkg", "3.0", {"racepkg.py": "N = 3\n"})
    with wasmbox.Sandbox(cache_dir=cache_dir) as box:
        box.prepare_python()
    processes = [
        subprocess.Popen([sys.executable, "-c", RACE, str(cache_dir), str(wheels)], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]  # fmt: skip
    for process in processes:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [out for out, _ in outputs] == ["3\n", "3\n"], outputs
    installs = sum(err.count("wasmbox: installing packages racepkg==3.0, tinydep==2.0") for _, err in outputs)
    assert installs == 1, outputs  # the other waited on the lock, then reused the set
    assert (
        len([p for p in package_sets(cache_dir) if "racepkg" in (p / "wasmbox-packages.json").read_text()])
        == 1
    )


def test_an_unreachable_index_is_a_quick_clear_error(cache_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as unused:  # a loopback port nothing listens on
        unused.bind(("127.0.0.1", 0))
        index = f"http://127.0.0.1:{unused.getsockname()[1]}/simple"
    with wasmbox.Sandbox(cache_dir=cache_dir, package_index=index) as box:
        started = time.monotonic()
        with pytest.raises(
            ManifestError,
            match=r"tinypkg==1\.0: the index http://127\.0\.0\.1:\d+/simple could not be reached",
        ):
            box.load(tool(tmp_path, "offline", USES_TINYPKG, packages=["tinypkg==1.0"]))
        assert time.monotonic() - started < 120


def test_a_set_whose_record_is_missing_is_installed_again(
    cache_dir: Path, wheels: Path, tmp_path: Path
) -> None:
    build_wheel(wheels, "redo", "1.0", {"redo.py": "V = 'fresh'\n"})
    manifest = tool(
        tmp_path, "redo", "import redo\n\ndef main():\n    return redo.V\n", packages=["redo==1.0"]
    )
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as box:
        box.load(manifest)
    (built,) = [
        p for p in package_sets(cache_dir) if "redo==1.0" in (p / "wasmbox-packages.json").read_text()
    ]
    (built / "wasmbox-packages.json").unlink()  # as if a build had stopped before its last step
    (built / "site" / "redo.py").write_text("V = 'stale'\n")
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as box:
        assert box.load(manifest).call({}).unwrap() == "fresh"


def test_a_pip_planted_in_the_working_directory_never_runs_on_the_host(
    cache_dir: Path, wheels: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A guest with a writable grant of the host's working directory writes a `pip` package
    there; the install of a later set must run the real pip, not that one."""
    work = tmp_path / "work"
    work.mkdir()
    witness = tmp_path / "ran-on-the-host"
    monkeypatch.chdir(work)
    with wasmbox.Sandbox(cache_dir=cache_dir, package_wheels=wheels) as box:
        planted = box.run_python(
            "import os\nos.makedirs('/w/pip', exist_ok=True)\n"
            "open('/w/pip/__init__.py', 'w').write('')\n"
            f"open('/w/pip/__main__.py', 'w').write({f'open({str(witness)!r}, chr(119)).write(chr(120))'!r})\n"
            "sorted(os.listdir('/w/pip'))",
            {"name": "planter", "runtime": "python", "limits": {"fuel": 2_000_000_000, "timeout": 30},
             "preopens": [{"host": str(work), "guest": "/w", "writable": True}]},
        )  # fmt: skip
        assert planted.value == ["__init__.py", "__main__.py"], planted
        result = box.run_python("import tinydep; tinydep.double(3)",
                                {"name": "uses", "runtime": "python", "packages": ["tinydep==2.0"]})  # fmt: skip
    assert not witness.exists()
    assert result.value == 6, result
