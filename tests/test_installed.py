"""The built wheel and sdist are the whole package: each holds every file of `wasmbox/`, and each,
installed into a clean venv and used from a folder outside the repository, runs a core tool, a
snippet of each interpreter, a Python tool with a declared package and the MCP server.

The artifacts are built once per module (`python -m build`), each installed once into a venv
of its own (its dependencies from PyPI, through pip's cache). The venvs' processes use the test
session's compile cache (`cache_dir`), so a runtime the other tests built is loaded, not built
again: a runtime's folder is named by the digest of its inputs, which each process reads from
its own installed package, so a reused runtime is one that package would have built (a missing
or changed input gives another digest, or fails). The scientific runtime uses the cache its
other tests share (`scientific_cache`), where it is built once per machine.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import tomllib
import zipfile
from pathlib import Path

import pytest

from .conftest import ROOT
from .test_packages import build_wheel

# what pip prints when the registry cannot be reached
_OFFLINE = re.compile(
    r"NewConnectionError|Failed to establish|Temporary failure in name resolution|"
    r"Network is unreachable|ConnectionError|ReadTimeoutError|No matching distribution found|"
    r"Could not find a version that satisfies"
)
_TIMEOUT = 600


def _registry_or_skip(done: subprocess.CompletedProcess[str], what: str) -> None:
    """Fails with the log when `done` failed, or skips when it failed for want of PyPI."""
    if done.returncode == 0:
        return
    log = done.stdout + done.stderr
    if _OFFLINE.search(log):
        pytest.skip(f"{what}: PyPI cannot be reached: {log.strip().splitlines()[-1]}")
    pytest.fail(f"{what} failed ({done.returncode}):\n{log[-4000:]}")


def _tracked() -> set[str]:
    """The files the distribution installs, as git tracks them: everything under wasmbox/ and
    the top-level modules (pyproject's py-modules); a skip outside a git checkout."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the package's files are those git tracks under wasmbox/")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    modules = [f"{name}.py" for name in setuptools.get("py-modules", [])]
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", "wasmbox", *modules],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    # a tracked file deleted in the working tree is not part of what is built
    return {name for name in listed.split("\0") if name and (ROOT / name).is_file()}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, each built from the source tree."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=_TIMEOUT,
    )  # fmt: skip
    _registry_or_skip(done, "python -m build (its build environment comes from PyPI)")
    (wheel,) = out.glob("wasmbox-*.whl")
    (sdist,) = out.glob("wasmbox-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(artifacts: dict[str, Path]) -> None:
    with zipfile.ZipFile(artifacts["wheel"]) as wheel:
        shipped = {name for name in wheel.namelist() if ".dist-info/" not in name}
    tracked = _tracked()
    assert sorted(tracked - shipped) == []  # e.g. the JavaScript runtime's prelude.mjs
    assert sorted(shipped - tracked) == []  # no bytecode, build output or stray files


def test_the_sdist_holds_every_file_of_the_package_and_nothing_else(artifacts: dict[str, Path]) -> None:
    with tarfile.open(artifacts["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        files = [m.name.removeprefix(f"{top}/") for m in sdist.getmembers() if m.isfile()]
    # what it installs: the package's folder and the top-level modules
    shipped = {
        name for name in files if name.startswith("wasmbox/") or ("/" not in name and name.endswith(".py"))
    }
    tracked = _tracked()
    assert sorted(tracked - shipped) == []
    assert sorted(shipped - tracked) == []


def _venv(folder: Path, artifact: Path) -> Path:
    """A clean venv with `artifact` and the mcp extra installed; its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=_TIMEOUT)
    python = folder / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"{artifact}[mcp]"],
        capture_output=True, text=True, timeout=_TIMEOUT, env=_clean_env(),
    )  # fmt: skip
    _registry_or_skip(done, f"pip install {artifact.name}")
    return python.parent


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without what would put the repository's wasmbox on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel_venv(artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-wheel"), artifacts["wheel"])


@pytest.fixture(scope="module")
def sdist_venv(artifacts: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv(tmp_path_factory.mktemp("venv-sdist"), artifacts["sdist"])


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def venv(request: pytest.FixtureRequest) -> Path:
    """The bin folder of a venv with the wheel, or the sdist, installed."""
    return Path(request.getfixturevalue(f"{request.param}_venv"))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working folder outside the repository."""
    assert ROOT not in tmp_path.resolve().parents
    return tmp_path


def _run(bin_dir: Path, args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT,
        env=_clean_env(WASMBOX_CACHE_DIR=str(cache)), stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _python(bin_dir: Path, code: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    # -I: neither the working directory nor PYTHON* variables reach sys.path
    return _run(bin_dir, ["python", "-I", "-c", textwrap.dedent(code)], cwd, cache)


def test_wasmbox_comes_from_the_venv(venv: Path, outside: Path, cache_dir: Path) -> None:
    done = _python(venv, "import wasmbox; print(wasmbox.__file__)", outside, cache_dir)
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).is_relative_to(venv.parent)


def test_a_core_tool_from_a_manifest(
    venv: Path, outside: Path, cache_dir: Path, built_examples: Path
) -> None:
    shutil.copy(built_examples / "word_count.wasm", outside)
    (outside / "data").mkdir()
    (outside / "data" / "a.txt").write_text("one two three\nfour\n")
    (outside / "wc.toml").write_text(
        'name = "wc"\nmodule = "word_count.wasm"\n[[preopens]]\nhost = "data"\nguest = "/data"\n'
    )
    done = _run(venv, ["wasmbox", "run", "wc.toml", "--args", '{"path": "/data/a.txt"}'], outside, cache_dir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["value"] == {"words": 4, "lines": 2, "bytes": 19}


def test_run_python(venv: Path, outside: Path, cache_dir: Path) -> None:
    done = _run(venv, ["wasmbox", "python", "import statistics\nprint('hi')\nstatistics.mean([1, 2, 6])"],
                outside, cache_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["value"], result["stdout"]) == (3, "hi\n")


def test_run_javascript(venv: Path, outside: Path, cache_dir: Path, javascript_runtime: None) -> None:
    done = _run(venv, ["wasmbox", "javascript", "console.log('hi'); [1, 2, 3].map(x => x * x)"],
                outside, cache_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["value"], result["stdout"]) == ([1, 4, 9], "hi\n")


def test_a_python_tool_with_a_declared_package(venv: Path, outside: Path, cache_dir: Path) -> None:
    wheels = outside / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "tinypkg", "1.0", {"tinypkg/__init__.py": "from tinydep import double\n"},
                requires=("tinydep==2.0",))  # fmt: skip
    build_wheel(wheels, "tinydep", "2.0", {"tinydep.py": "def double(x):\n    return 2 * x\n"})
    (outside / "tool.py").write_text(
        "import tinypkg\n\ndef main(n: int) -> int:\n    return tinypkg.double(n)\n"
    )
    (outside / "tool.toml").write_text(
        'name = "doubler"\nruntime = "python"\nsource = "tool.py"\npackages = ["tinypkg==1.0"]\n'
        "[limits]\nfuel = 500_000_000\n"
    )
    done = _python(venv, """
        import wasmbox
        with wasmbox.Sandbox(package_wheels="wheels") as box:
            print(box.load("tool.toml").call({"n": 21}).unwrap())
        """, outside, cache_dir)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"


def test_the_mcp_server_serves_run_javascript(
    venv: Path, outside: Path, cache_dir: Path, javascript_runtime: None
) -> None:
    pytest.importorskip("mcp", reason="the mcp SDK is in the test extra: pip install -e '.[test]'")
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp_types import TextContent

    params = StdioServerParameters(
        command=str(venv / "wasmbox"), args=["mcp", "serve", "--javascript"], cwd=outside,
        env=_clean_env(WASMBOX_CACHE_DIR=str(cache_dir)),
    )  # fmt: skip

    async def run() -> tuple[list[str], list[object]]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            names = [tool.name for tool in (await session.list_tools()).tools]
            result = await session.call_tool("run_javascript", {"code": "[1, 2].map(x => x + 1)"})
            assert result.is_error is False
            return names, [json.loads(c.text) for c in result.content if isinstance(c, TextContent)]

    names, texts = asyncio.run(asyncio.wait_for(run(), _TIMEOUT))
    assert names == ["run_javascript"]
    assert texts == [[2, 3]]


@pytest.mark.slow
def test_the_scientific_runtime_from_the_wheel(
    wheel_venv: Path, outside: Path, scientific_cache: Path
) -> None:
    done = _python(wheel_venv, """
        import json, wasmbox
        with wasmbox.Sandbox() as box:
            result = box.run_python("import numpy, pandas\\nint(numpy.arange(5).sum())", runtime="scientific")
            print(json.dumps([result.ok, result.value]))
        """, outside, scientific_cache)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, 10]
