"""The audit trail: a record per call to every sink, and a hash-chained JSONL file."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

import wasmbox
from wasmbox.cli import main as cli

from .conftest import CAPABILITIES, manifest, wat


def test_every_call_produces_a_record(cache_dir: Path, built_examples: Path) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        tool = box.load(CAPABILITIES / "word_count.toml")
        ok = tool.call({"text": "a b c"})
        refused = tool.call({"nope": 1})  # refused before the guest runs: recorded too
        failed = tool.call({"path": "/data/missing.txt"})
    assert [r.seq for r in records] == [1, 2, 3]
    first = records[0]
    wasm = (built_examples / "word_count.wasm").read_bytes()
    assert first.tool == "word_count" and first.ok and first.error_kind is None
    assert first.code_digest == hashlib.sha256(wasm).hexdigest()
    assert first.manifest_digest == tool.manifest.digest()
    assert first.args_digest == hashlib.sha256(wasmbox._abi.pack({"text": "a b c"})).hexdigest()
    assert first.fuel_used == ok.fuel_used and first.duration_s == ok.duration_s
    assert first.peak_memory == ok.peak_memory and ok.peak_memory is not None and ok.peak_memory > 0
    assert first.limits == tool.manifest.limits
    assert records[1].error_kind == refused.error.kind.value == "invalid_arguments"  # type: ignore[union-attr]
    assert records[2].error_kind == failed.error.kind.value == "guest_error"  # type: ignore[union-attr]
    assert records[1].args_digest != first.args_digest


def test_host_calls_are_recorded_with_their_verdicts(cache_dir: Path) -> None:
    records: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:

        @box.host_function("host.fn")
        def secret_get(name: str) -> str:
            raise wasmbox.CapabilityDeniedError(f"{name} is not for you")

        box.load(manifest("forward", host_functions=["host.fn"])).call({"name": "root"})
        box.run_python("import wasmbox_guest\ntry:\n    wasmbox_guest.call_host('kv.get', key='a')\n"
                       "except wasmbox_guest.HostCallError:\n    pass")  # fmt: skip
    core, python = records
    assert [(c.name, c.verdict) for c in core.host_calls] == [("host.fn", "denied")]
    assert core.refused == list(core.host_calls)
    assert [(c.name, c.verdict) for c in python.host_calls] == [("kv.get", "denied")]
    assert python.ok and python.refused


def test_logging_sink_warns_on_refusals(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.audit")
    with (
        wasmbox.Sandbox(cache_dir=cache_dir, audit=logger) as box,
        caplog.at_level(logging.INFO, "test.audit"),
    ):
        box.load(manifest("echo")).call({"a": 1})
        box.run_python("import wasmbox_guest\ntry: wasmbox_guest.call_host('x')\nexcept Exception: pass")
    levels = [r.levelno for r in caplog.records if r.name == "test.audit"]
    assert levels == [logging.INFO, logging.WARNING]
    line = json.loads(caplog.records[0].getMessage())
    assert line["tool"] == "echo" and line["ok"] is True and "limits" in line


def test_a_failing_sink_does_not_fail_the_call(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    def broken(record: wasmbox.AuditRecord) -> None:
        raise RuntimeError("disk on fire")

    seen: list[wasmbox.AuditRecord] = []
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=[broken, seen.append]) as box:
        assert box.load(manifest("echo")).call({"a": 1}).unwrap() == {"a": 1}
    assert len(seen) == 1
    assert "disk on fire" in caplog.text


def _nested(depth: int) -> list[object]:
    outer: list[object] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]  # type: ignore[assignment]
    return outer


class _NoRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    "args",
    [{"deep": _nested(5000)}, {"n": 10**5000}, {"x": _NoRepr()}, {"deep": _nested(5000), "n": 10**5000}],
    ids=["nested-5000", "int-past-digit-limit", "raising-repr", "both"],
)
def test_args_that_cannot_be_encoded_still_get_a_result_and_a_record(
    cache_dir: Path, tmp_path: Path, args: dict[str, object]
) -> None:
    records: list[wasmbox.AuditRecord] = []
    source = tmp_path / "takes.py"
    source.write_text("def main(**args):\n    return len(args)\n")
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=records.append) as box:
        core = box.load(manifest("echo"))
        python = box.load({"name": "takes", "runtime": "python", "source": str(source)})
        results = [core.call(args), python.call(args), box.run_python(args)]  # type: ignore[arg-type]
        assert core.call({"still": "serving"}).unwrap() == {"still": "serving"}
    for result in results:
        assert result.error is not None and result.error.kind is wasmbox.ErrorKind.INVALID_ARGUMENTS, result
    assert [r.tool for r in records] == ["echo", "takes", "python", "echo"]
    assert [r.error_kind for r in records[:3]] == ["invalid_arguments"] * 3
    assert all(len(r.args_digest) == 64 for r in records)


def test_not_a_sink_is_refused() -> None:
    with pytest.raises(TypeError, match="not an audit sink"):
        wasmbox.Sandbox(cache_dir=None, audit=["audit.jsonl"])  # type: ignore[list-item]


def _log_some_calls(path: Path, cache_dir: Path, calls: int) -> str:
    with wasmbox.AuditLog(path) as log:
        with wasmbox.Sandbox(cache_dir=cache_dir, audit=log) as box:
            tool = box.load(manifest("echo"))
            for n in range(calls):
                tool.call({"n": n})
        return log.head


def test_audit_log_chain_verifies_and_continues_across_opens(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _log_some_calls(path, cache_dir, 3)
    head = _log_some_calls(path, cache_dir, 2)  # reopening continues the chain
    outcome = wasmbox.verify_audit_log(path, head)
    assert outcome.ok and outcome.records == 5 and outcome.head == head
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["args_digest"] == hashlib.sha256(wasmbox._abi.pack({"n": 0})).hexdigest()
    assert (path.stat().st_mode & 0o777) == 0o600


@pytest.mark.parametrize("damage", ["edit", "delete", "insert", "swap", "truncate-end", "cut-line"])
def test_tampering_is_detected(tmp_path: Path, cache_dir: Path, damage: str) -> None:
    path = tmp_path / "audit.jsonl"
    head = _log_some_calls(path, cache_dir, 4)
    lines = path.read_bytes().splitlines(keepends=True)
    if damage == "edit":
        lines[1] = lines[1].replace(b'"ok":true', b'"ok":false')
    elif damage == "delete":
        del lines[1]
    elif damage == "insert":
        lines.insert(2, lines[1])
    elif damage == "swap":
        lines[1], lines[2] = lines[2], lines[1]
    elif damage == "truncate-end":
        del lines[-1]
    else:
        lines[-1] = lines[-1][:20]
    path.write_bytes(b"".join(lines))
    outcome = wasmbox.verify_audit_log(path, head)
    assert not outcome.ok and outcome.problem
    assert cli(["audit", "verify", str(path), "--head", head]) == 1


def test_cli_verifies_a_good_log(tmp_path: Path, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    head = _log_some_calls(path, cache_dir, 2)
    assert cli(["audit", "verify", str(path)]) == 0
    assert f"ok, 2 records, head {head}" in capsys.readouterr().out


def test_one_writer_per_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    with wasmbox.AuditLog(path), pytest.raises(wasmbox.WasmboxError, match="another AuditLog"):
        wasmbox.AuditLog(path)
    wasmbox.AuditLog(path).close()  # free again once closed


def test_audit_log_write_failure_is_reported(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = wasmbox.AuditLog(path)
    import os

    os.close(log._fd)  # the disk went away
    with wasmbox.Sandbox(cache_dir=cache_dir, audit=log) as box:
        tool = box.load({"name": "e", "module": wat("echo")})
        assert tool.call({"a": 1}).ok  # the call stands
        with pytest.raises(wasmbox.WasmboxError, match="audit log failed"):
            log.flush()
        assert tool.call({"a": 2}).ok  # and the Sandbox keeps serving
