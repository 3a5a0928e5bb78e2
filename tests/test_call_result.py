"""The runners' fast CallResult constructor makes exactly what pydantic's `model_construct` does."""

from __future__ import annotations

import wasmbox
from wasmbox import ErrorKind
from wasmbox._results import CallError, CallResult, HostCallRecord, construct_result

from .conftest import manifest


def _fields() -> dict[str, object]:
    record = HostCallRecord(name="kv.get", verdict="ok", duration_s=0.001, bytes_in=3, bytes_out=4)
    return {
        "tool": "t", "ok": False, "value": None, "error": CallError(kind=ErrorKind.TRAP, message="m"),
        "stdout": "out\ufffd", "stderr": "err", "stdout_bytes": b"out\xff", "stderr_bytes": None,
        "files": {"/tmp/a.png": b"\x89PNG"}, "media_types": {"/tmp/a.png": "image/png"}, "truncated": True, "fuel_used": 7, "duration_s": 0.5,
        "peak_memory": 65536, "host_calls": [record],
    }  # fmt: skip


def test_construct_result_is_model_construct() -> None:
    fast, slow = construct_result(**_fields()), CallResult.model_construct(**_fields())
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set == set(CallResult.model_fields)
    assert fast.model_dump() == slow.model_dump() and fast.model_dump_json() == slow.model_dump_json()
    assert repr(fast) == repr(slow)


def test_results_of_real_calls_have_every_field(box: wasmbox.Sandbox) -> None:
    """`finish` gives every field (a field added to CallResult must be added there too)."""
    result = box.load(manifest("echo")).call({"n": 1})
    assert result.__dict__.keys() == CallResult.model_fields.keys()
    assert CallResult.model_validate(result.model_dump()) == result
