"""`wasmbox lint`: broad and unused grants are warned about; the bundled manifests are clean."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import wasmbox
from wasmbox._lint import lint
from wasmbox.cli import main as cli

from .conftest import CAPABILITIES, manifest


def test_bundled_manifests_grant_only_what_they_use(
    built_examples: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = sorted(CAPABILITIES.glob("*.toml"))
    assert len(paths) >= 5
    assert cli(["lint", "--strict", *map(str, paths)]) == 0
    assert capsys.readouterr().out.count(": ok") == len(paths)


def big_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "a" / "tree"
    tree.mkdir(parents=True)
    for n in range(1100):
        (tree / f"{n}.txt").write_text("x")
    return tree


@pytest.mark.parametrize(
    "fields, expected",
    [
        (
            {"limits": {"memory": "2GiB", "fuel": 10**11, "timeout": "10m"}},
            ["limits.fuel", "limits.memory", "limits.timeout"],
        ),
        (
            {"host_functions": ["http.fetch"], "network": {"allow": ["0.0.0.0/0"]}},
            ["a whole range", "internal addresses", "never imports"],
        ),
        (
            {"host_functions": ["http.fetch"], "network": {"allow": ["169.254.169.254"]}},
            ["internal addresses", "never imports"],
        ),
        ({"scratch": "4GiB"}, ["scratch is 4GiB", "does not import WASI"]),
        ({"env": {"A": "b"}}, ["env is granted"]),
        ({"preopens": [{"host": "/tmp", "guest": "/t", "writable": True}]}, ["top-level folder"]),
        (
            {
                "host_functions": ["http.fetch"],
                "network": {"allow": ["93.184.216.34:443"], "max_response": "1GiB"},
            },
            ["network.max_response is 1GiB"],
        ),
    ],
)
def test_broad_or_unused_grants_are_warned(fields: dict[str, Any], expected: list[str]) -> None:
    warnings = lint(wasmbox.Manifest.load(manifest("echo", **fields)))
    for text in expected:
        assert any(text in w for w in warnings), (text, warnings)


def test_writable_large_tree_is_warned(tmp_path: Path) -> None:
    tree = big_tree(tmp_path)
    grants = manifest("echo", preopens=[{"host": str(tree), "guest": "/t", "writable": True}])
    assert any("large tree" in w for w in lint(wasmbox.Manifest.load(grants)))
    grants["preopens"][0]["writable"] = False
    assert not any("large tree" in w for w in lint(wasmbox.Manifest.load(grants)))


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broad.toml"
    path.write_text(f'name = "b"\nmodule = "{manifest("echo")["module"]}"\n[limits]\nmemory = "2GiB"\n')
    assert cli(["lint", str(path)]) == 0  # warnings are advice ...
    assert "warning: limits.memory" in capsys.readouterr().out
    assert cli(["lint", "--strict", str(path)]) == 1  # ... that --strict makes fatal, for CI
    assert "warning: limits.memory" in capsys.readouterr().out
    path.write_text('name = "b"\nmodule = 5\n')
    assert cli(["lint", str(path)]) == 2
    assert cli(["lint", "--strict", str(path)]) == 2


def test_python_tool_granted_a_host_function_its_source_never_names(tmp_path: Path) -> None:
    source = tmp_path / "tool.py"
    source.write_text("def main():\n    return 1\n")
    grants = {"name": "py", "runtime": "python", "source": str(source), "host_functions": ["kv.get"],
              "host_function_args": {"kv.get": {"key": {"type": "string"}}}}  # fmt: skip
    assert lint(wasmbox.Manifest.load(grants)) == [
        "host function kv.get is granted but the source never names it"
    ]
    source.write_text(
        "from wasmbox_guest import call_host\ndef main():\n    return call_host('kv.get', key='a')\n"
    )
    assert lint(wasmbox.Manifest.load(grants)) == []


@pytest.mark.parametrize(
    ("host", "words"),
    [("/proc", "/proc/self/environ"), ("/proc/self", "/proc/self/environ"), ("/sys", "hardware"),
     ("/dev", "devices"), ("/etc", "configuration"), ("/etc/ssl", "configuration"),
     ("HOME", "home folder"), ("HOME_PARENT", "home folder"), ("CACHE", "compile cache"),
     ("CACHE_PARENT", "compile cache"), ("CACHE_INSIDE", "compile cache")],
)  # fmt: skip
def test_read_only_grants_of_system_folders_homes_and_the_cache_are_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str, words: str
) -> None:
    """A read-only grant of /proc would let its guest read the host's secrets from
    /proc/self/environ: lint warns about it, and about the other system folders, homes and the
    cache."""
    home, cache = tmp_path / "home" / "alice", tmp_path / "cache" / "wasmbox"
    (cache / "inside").mkdir(parents=True)
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WASMBOX_CACHE_DIR", str(cache))
    path = {"HOME": home, "HOME_PARENT": home.parent, "CACHE": cache, "CACHE_PARENT": cache.parent,
            "CACHE_INSIDE": cache / "inside"}.get(host, Path(host))  # fmt: skip
    warnings = lint(wasmbox.Manifest.load(manifest("spam", preopens=[{"host": str(path), "guest": "/g"}])))
    assert any(words in w and "preopen /g: grants" in w for w in warnings), warnings
    inside_home = home / "project"
    inside_home.mkdir()
    fine = manifest("spam", preopens=[{"host": str(inside_home), "guest": "/g"}])
    assert lint(wasmbox.Manifest.load(fine)) == []


def test_a_grant_given_through_a_symlink_is_warned(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    grants = manifest("spam", preopens=[{"host": str(tmp_path / "link"), "guest": "/g"}])
    warnings = lint(wasmbox.Manifest.load(grants))
    expected = (
        f"preopen /g: given through a symlink ({tmp_path / 'link'}); whoever can write the "
        f"folder holding it chooses what is granted: give the real path {tmp_path / 'real'}"
    )
    assert warnings == [expected]


def test_packages_pinned_without_a_hash_are_warned(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("def main():\n    return 1\n")
    python = {"name": "t", "runtime": "python", "source": str(tmp_path / "t.py")}
    bare = lint(wasmbox.Manifest.load({**python, "packages": ["idna==3.10", "six==1.17.0"]}))
    expected = (
        "packages idna==3.10, six==1.17.0 are pinned by version only: whoever serves the index or wheel "
        "folder chooses the code; pin each (dependencies too) with --hash=sha256:<digest>, e.g. from "
        "`pip hash` or `pip-compile --generate-hashes`"
    )
    assert [w for w in bare if "pinned by version only" in w] == [expected]
    hashed = lint(wasmbox.Manifest.load({**python, "packages": ["idna==3.10 --hash=sha256:" + "a" * 64]}))
    assert not [w for w in hashed if "pinned by version" in w]


def _fetching(tmp_path: Path, *allow: Any, writable: bool = False) -> wasmbox.Manifest:
    """A Python tool that names http.fetch, granted `allow` (and a preopen, if `writable`)."""
    source = tmp_path / "tool.py"
    source.write_text(
        "from wasmbox_guest import call_host\ndef main():\n    return call_host('http.fetch', url='x')\n"
    )
    grants: dict[str, Any] = {"name": "py", "runtime": "python", "source": str(source),
                              "host_functions": ["http.fetch"], "network": {"allow": list(allow)}}  # fmt: skip
    if writable:
        (tmp_path / "out").mkdir()
        grants["preopens"] = [{"host": str(tmp_path / "out"), "guest": "/out", "writable": True}]
    return wasmbox.Manifest.load(grants)


def test_egress_rules_without_method_or_path_limits_are_warned(tmp_path: Path) -> None:
    (plain,) = lint(_fetching(tmp_path, "api.example.com:443"))
    assert (
        plain.startswith("network.allow[0] (api.example.com:443): any method and any path")
        and "methods" in plain
    )
    (no_paths,) = lint(_fetching(tmp_path, {"host": "api.example.com:443", "methods": ["GET"]}))
    assert "any path:" in no_paths and "any method" not in no_paths
    (everything,) = lint(
        _fetching(tmp_path, {"host": "api.example.com:443", "methods": ["GET"], "paths": ["/**"]})
    )
    assert "any path:" in everything
    assert (
        lint(_fetching(tmp_path, {"host": "api.example.com:443", "methods": ["GET"], "paths": ["/v1/x"]}))
        == []
    )


def test_secrets_on_wide_rules_are_warned(tmp_path: Path) -> None:
    secret = {"header": "Authorization", "env": "API_TOKEN"}
    wide = lint(_fetching(tmp_path, {"host": "203.0.113.0/24", "methods": ["GET"], "secret": secret}))
    (warning,) = [w for w in wide if "secret" in w]
    assert "$API_TOKEN" in warning and "256 addresses, any port, any path" in warning
    narrow = {"host": "api.example.com:443", "methods": ["GET"], "paths": ["/v1/x"], "secret": secret}
    assert lint(_fetching(tmp_path, narrow)) == []


def test_a_writable_preopen_beside_narrow_egress_is_still_warned(tmp_path: Path) -> None:
    narrow = {"host": "api.example.com:443", "methods": ["GET"], "paths": ["/v1/x"]}
    (warning,) = lint(_fetching(tmp_path, narrow, writable=True))
    assert (
        warning.startswith("preopen /out is writable and the tool can send data out")
        and "read-only" in warning
    )


def test_grants_for_any_arguments_are_warned_with_what_to_narrow() -> None:
    grants = {"name": "g", "runtime": "python", "host_functions": ["kv.get", "kv.put"], "tools": ["t"]}
    hint = "(a JSON Schema per argument: a pattern, enum, const or maximum)"
    assert lint(wasmbox.Manifest.load(grants)) == [
        f'host function kv.get is granted for any arguments: narrow what this tool may pass it in [host_function_args."kv.get"] {hint}',
        f'host function kv.put is granted for any arguments: narrow what this tool may pass it in [host_function_args."kv.put"] {hint}',
        "tool t is granted to the code for any args its own schema accepts: narrow what the code may pass it in [tool_args.t] (a JSON Schema per argument)",
    ]  # fmt: skip
    narrowed = {**grants, "host_function_args": {"kv.get": {"key": {"const": "a"}}, "kv.put": {}},
                "tool_args": {"t": {"x": {"type": "integer"}}}}  # fmt: skip
    assert lint(wasmbox.Manifest.load(narrowed)) == []


def test_a_writable_grant_beside_egress_is_warned(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    preopens = [{"host": str(folder), "guest": "/notes", "writable": True}]
    fetching = {"host_functions": ["http.fetch"], "network": {"allow": ["93.184.216.34:443"]}}
    warnings = lint(wasmbox.Manifest.load(manifest("echo", preopens=preopens, **fetching)))
    assert any(w.startswith("preopen /notes is writable and the tool can send data out (http.fetch)") and
               "make the preopen read-only" in w for w in warnings), warnings  # fmt: skip
    preopens[0]["writable"] = False
    assert not any(
        "send data out" in w
        for w in lint(wasmbox.Manifest.load(manifest("echo", preopens=preopens, **fetching)))
    )
    preopens[0]["writable"] = True
    assert not any(
        "send data out" in w for w in lint(wasmbox.Manifest.load(manifest("echo", preopens=preopens)))
    )


EXAMPLES = [{"text": "hello"}, {"text": "a longer example"}]


def test_raised_limits_far_above_what_the_examples_use_are_warned(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """echo.wat's examples use a few thousand units of fuel, no host call and one page: limits
    raised to a billion, 5,000 host calls and 512 MiB are each far above that (fuel and memory
    do not depend on the machine's speed, so neither does this test)."""
    limits = {"fuel": 10**9, "host_calls": 5000, "memory": "512MiB"}
    grants = wasmbox.Manifest.load(manifest("echo", examples=EXAMPLES, limits=limits))
    warnings = lint(grants, cache_dir=cache_dir)
    for name in ("fuel", "host_calls", "memory"):
        assert any(w.startswith(f"limits.{name} is ") and "the manifest's examples use at most" in w
                   and "lower it toward" in w for w in warnings), (name, warnings)  # fmt: skip
    assert not any("examples use" in w for w in lint(grants, run_examples=False))
    # not raised (the defaults), or nothing to compare with: nothing run, nothing said
    assert lint(wasmbox.Manifest.load(manifest("echo", examples=EXAMPLES)), cache_dir=cache_dir) == []
    assert lint(wasmbox.Manifest.load(manifest("echo", limits={"fuel": 10**9})), cache_dir=cache_dir) == []
    monkeypatch.setenv("WASMBOX_CACHE_DIR", str(cache_dir))  # the CLI's Sandbox: the default cache
    path = tmp_path / "raised.json"
    path.write_text(json.dumps(manifest("echo", examples=EXAMPLES, limits=limits)))
    assert cli(["lint", "--no-examples", "--strict", str(path)]) == 0
    assert cli(["lint", "--strict", str(path)]) == 1
    assert (
        "warning: limits.fuel is 1,000,000,000 but the manifest's examples use at most"
        in capsys.readouterr().out
    )


def test_an_example_that_fails_under_its_limits_is_warned(cache_dir: Path) -> None:
    limits = {"fuel": 10**9, "output": "100KiB"}
    failing = manifest("forward_loop", host_functions=["host.fn"], examples=[{}], limits=limits)
    # host.fn is the application's: lint's Sandbox has none, so the tool is not run
    assert not any("examples" in w for w in lint(wasmbox.Manifest.load(failing), cache_dir=cache_dir))
    big = manifest("echo", examples=[{"text": "x" * 200}], limits={"fuel": 10**9, "output": 100})
    warnings = lint(wasmbox.Manifest.load(big), cache_dir=cache_dir)
    assert any(w.startswith("examples[0] fails (output_limit:") for w in warnings), warnings
