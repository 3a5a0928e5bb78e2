"""The compile cache: shared across processes, private, and never trusting a bad entry."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import wasmbox
from wasmbox._cache import artifact_digest
from wasmbox._errors import WasmboxError

from .conftest import manifest

LOAD_AND_REPORT = """
import json, sys, wasmbox
box = wasmbox.Sandbox(cache_dir=sys.argv[1])
tool = box.load({"name": "echo", "module": sys.argv[2]})
value = tool.call({"n": 1}).unwrap()
s = box.cache_stats
print(json.dumps({"compiles": s.compiles, "hits": s.hits, "rejected": s.rejected, "value": value}))
"""


def _load_in_new_process(cache: Path, module: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", LOAD_AND_REPORT, str(cache), module],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout)


def test_second_process_does_not_recompile(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    module = manifest("echo")["module"]
    first = _load_in_new_process(cache, module)
    second = _load_in_new_process(cache, module)
    assert first == {"compiles": 1, "hits": 0, "rejected": 0, "value": {"n": 1}}
    assert second == {"compiles": 0, "hits": 1, "rejected": 0, "value": {"n": 1}}


def test_cache_dir_is_private(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    wasmbox.Sandbox(cache_dir=cache).close()
    assert cache.stat().st_mode & 0o777 == 0o700


def test_group_writable_cache_dir_is_refused(tmp_path: Path) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.raises(WasmboxError, match="writable by others"):
        wasmbox.Sandbox(cache_dir=cache)


def _entries(cache: Path) -> tuple[Path, Path]:
    (artifact,) = cache.glob("*.cwasm")
    return artifact, artifact.with_suffix(".json")


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap_meta", "garbage_meta", "delete_meta"])
def test_damaged_entry_is_rebuilt_not_trusted(tmp_path: Path, damage: str) -> None:
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        box.load(manifest("echo"))
    artifact, meta = _entries(cache)
    data = artifact.read_bytes()
    if damage == "truncate":
        artifact.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        # same size, one byte of code changed: only the digest can tell
        i = len(data) // 2
        artifact.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    elif damage == "swap_meta":
        record = json.loads(meta.read_text())
        record["wasm_sha256"] = "0" * 64
        meta.write_text(json.dumps(record))
    elif damage == "garbage_meta":
        meta.write_text("{not json")
    else:
        meta.unlink()
    with wasmbox.Sandbox(cache_dir=cache) as box:
        tool = box.load(manifest("echo"))
        assert box.cache_stats.compiles == 1 and box.cache_stats.hits == 0
        assert tool.call({"ok": True}).unwrap() == {"ok": True}
    # the entry was rewritten and is trusted again
    with wasmbox.Sandbox(cache_dir=cache) as box:
        box.load(manifest("echo"))
        assert box.cache_stats.hits == 1


def test_a_noted_check_skips_the_digest_until_the_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full check that passed is noted in the entry's metadata, and the same file unchanged
    is then loaded without its digest; a file written in place since, even at its old size
    with its modification time set back, or another file put in its place, is checked in full
    again (and a damaged one rebuilt, never loaded)."""
    monkeypatch.setattr(wasmbox._cache, "_SETTLED_NS", 0)  # (the entry's change time is just now)
    digests: list[int] = []
    real_digest = wasmbox._cache.artifact_digest

    def counted(data: bytes | mmap.mmap) -> str:
        digests.append(len(data))
        return real_digest(data)

    monkeypatch.setattr(wasmbox._cache, "artifact_digest", counted)
    cache = tmp_path / "cache"

    def load() -> tuple[int, int, int]:
        digests.clear()
        with wasmbox.Sandbox(cache_dir=cache) as box:
            assert box.load(manifest("echo")).call({"n": 2}).unwrap() == {"n": 2}
            return box.cache_stats.hits, box.cache_stats.compiles, len(digests)

    assert load() == (0, 1, 1)  # compiled, stored with its digest
    artifact, meta = _entries(cache)
    assert "checked" not in json.loads(meta.read_text())  # (a store notes none: its file is new)
    assert load() == (1, 0, 1)  # checked in full, and noted
    assert json.loads(meta.read_text())["checked"][2] == artifact.stat().st_size
    assert load() == (1, 0, 0)  # the noted file, unchanged: no digest
    data, before = artifact.read_bytes(), artifact.stat()
    time.sleep(0.05)  # past the clock's granularity, so that the write's change time differs
    i = len(data) // 2
    artifact.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1 :])
    os.utime(artifact, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert load() == (0, 1, 2)  # checked in full, refused, compiled and stored again
    assert load() == (1, 0, 1)
    replaced = artifact.with_name("replacement")
    replaced.write_bytes(artifact.read_bytes())
    os.replace(replaced, artifact)  # the same bytes in another file
    assert load() == (1, 0, 1)  # checked in full again


def test_engine_settings_are_part_of_the_key(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        box.load(manifest("echo"))
    settings = wasmbox.EngineSettings(max_wasm_stack=256 * 1024)
    with wasmbox.Sandbox(cache_dir=cache, settings=settings) as box:
        box.load(manifest("echo"))
        assert box.cache_stats.compiles == 1
    assert len(list(cache.glob("*.cwasm"))) == 2


def test_no_cache_dir_compiles_in_memory(tmp_path: Path) -> None:
    with wasmbox.Sandbox(cache_dir=None) as box:
        box.load(manifest("echo"))
        assert box.cache_stats.compiles == 1
    assert os.listdir(tmp_path) == []


def test_big_artifacts_are_digested_piece_by_piece_and_every_piece_counts() -> None:
    piece = 16 * 1024 * 1024
    data = bytearray(os.urandom(2 * piece + 12345))
    expected = hashlib.sha256(
        b"".join(hashlib.sha256(data[i : i + piece]).digest() for i in range(0, len(data), piece))
    ).hexdigest()
    assert artifact_digest(bytes(data)) == expected
    assert artifact_digest(b"small") == hashlib.sha256(b"small").hexdigest()
    for at in (0, piece + 1, len(data) - 1):  # a flipped byte in any piece changes the digest
        flipped = bytearray(data)
        flipped[at] ^= 1
        assert artifact_digest(bytes(flipped)) != expected


def _keys(cache: Path, kind: str = "module") -> set[str]:
    return {p.stem for p in cache.glob(f"{kind}-*.json")}


def _entry_size(cache: Path, key: str) -> int:
    return (cache / f"{key}.json").stat().st_size + (cache / f"{key}.cwasm").stat().st_size


def test_cache_cap_evicts_the_least_recently_used_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache, cache_max_bytes=None) as box:
        box.load(manifest("echo"))
        (echo,) = _keys(cache)
        box.load(manifest("state"))
        (state,) = _keys(cache) - {echo}
        box.load(manifest("reflect"))
        (reflect,) = _keys(cache) - {echo, state}
    sizes = {key: _entry_size(cache, key) for key in (echo, state, reflect)}
    (cache / f"{reflect}.json").unlink()  # reflect is compiled again below
    (cache / f"{reflect}.cwasm").unlink()
    os.utime(cache / f"{echo}.json", (1_000_000, 1_000_000))  # echo is the least recently used,
    os.utime(cache / f"{state}.json", (2_000_000, 2_000_000))  # then state
    cap = sum(sizes.values()) - 1  # room for two of the three
    with wasmbox.Sandbox(cache_dir=cache, cache_max_bytes=cap) as box:
        box.load(manifest("echo"))  # a hit: echo becomes the most recently used
        assert box.cache_stats.hits == 1 and _keys(cache) == {echo, state}
        box.load(manifest("reflect"))  # stored, and over the cap: state goes
        assert _keys(cache) == {echo, reflect}
        assert not (cache / f"{state}.cwasm").exists()
        assert box.cache_stats.evicted == 1
        assert box.call("echo", {"still": "served"}).unwrap() == {"still": "served"}
    with wasmbox.Sandbox(cache_dir=cache, cache_max_bytes="1KiB") as box:
        box.load(manifest("echo"))  # a hit: Wasmtime maps the entry's file
        box.load(manifest("state"))  # every entry is bigger than the cap: none is kept
        assert _keys(cache) == set() and box.cache_stats.evicted == 3
        # an evicted entry's file, mapped by a loaded tool, goes on serving it
        assert box.call("echo", {"mapped": True}).unwrap() == {"mapped": True}


def test_cache_cap_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from wasmbox._cache import DEFAULT_MAX_BYTES, default_max_bytes

    monkeypatch.delenv("WASMBOX_CACHE_MAX", raising=False)
    assert default_max_bytes() == DEFAULT_MAX_BYTES == 2 * 1024**3
    monkeypatch.setenv("WASMBOX_CACHE_MAX", "500MiB")
    assert default_max_bytes() == 500 * 1024**2
    monkeypatch.setenv("WASMBOX_CACHE_MAX", "lots")
    with pytest.raises(ValueError):
        default_max_bytes()
    with pytest.raises(ValueError, match="not a size"):
        wasmbox.Sandbox(cache_dir=None, cache_max_bytes=-1)


def test_a_module_refused_after_its_compile_leaves_no_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        # WASI preview1 has no such function: Wasmtime's linker refuses it, after the compile
        with pytest.raises(wasmbox.CapabilityError, match="no_such_fn"):
            box.load(manifest("unknown_wasi"))
        assert box.cache_stats.compiles == 1 and box.cache_stats.discarded == 1
        assert _keys(cache) == set() and not list(cache.glob("*.cwasm"))
        box.load(manifest("echo"))  # and the Sandbox keeps serving
        assert len(_keys(cache)) == 1


def test_a_hit_refused_by_another_manifest_keeps_its_entry(tmp_path: Path) -> None:
    # the entry was compiled for a load that succeeded; a manifest refusing it (here: a
    # [command] table for a reactor) does not take it from the cache
    cache = tmp_path / "cache"
    with wasmbox.Sandbox(cache_dir=cache) as box:
        box.load(manifest("echo"))
        with pytest.raises(wasmbox.ManifestError, match="command"):
            box.load(manifest("echo", name="echo2", command={}))
        assert len(_keys(cache)) == 1 and box.cache_stats.discarded == 0
