"""The outcome table (`_outcome.decide`): each rule, and which rule wins when several apply.

The end-to-end cases (real guests hitting each cap) are in test_errors.py, test_faults.py and
tests/security/; these pin the precedence that ARCHITECTURE.md's table states.
"""

from __future__ import annotations

import pytest

from wasmbox import CallError, ErrorKind, Limits
from wasmbox._outcome import RULES, Evidence, decide

LIMITS = Limits(memory=1024 * 1024, output=1024)
AT_CAP = LIMITS.memory  # a memory this size cannot grow by another page
HOST = CallError(kind=ErrorKind.HOST_ERROR, message="host-call limit (3) exceeded")


def err(kind: ErrorKind, message: str = "boom") -> CallError:
    return CallError(kind=kind, message=message)


CASES = [
    # (what, evidence, the decided kind or None)
    ("success", Evidence(LIMITS, None), None),
    # what `_call.finish` relies on when it skips `decide`: with no error, no stop, no cut and
    # no scratch over its cap, a host function's failure and a full memory still give success
    (
        "success despite a host function's failure and a full memory",
        Evidence(LIMITS, None, failure=ErrorKind.CAPABILITY_DENIED, peak_memory=AT_CAP),
        None,
    ),
    ("a plain trap", Evidence(LIMITS, err(ErrorKind.TRAP)), ErrorKind.TRAP),
    ("abort beats success", Evidence(LIMITS, None, abort=HOST), ErrorKind.HOST_ERROR),
    (
        "abort beats every other piece of evidence",
        Evidence(
            LIMITS, err(ErrorKind.GUEST_ERROR, "MemoryError"), abort=HOST,
            failure=ErrorKind.CAPABILITY_DENIED, peak_memory=AT_CAP, truncated="stdout",
            scratch_over="scratch space /tmp exceeded its 1 KiB cap",
        ),
        ErrorKind.HOST_ERROR,
    ),
    ("a stack past its guard beats success", Evidence(LIMITS, None, overflowed="stack"), ErrorKind.TRAP),
    (
        "a stack past its guard beats the guest's own claim",
        Evidence(LIMITS, err(ErrorKind.GUEST_ERROR, "MemoryError"), overflowed="stack", scratch_over="over"),
        ErrorKind.TRAP,
    ),
    (
        "the host's stop beats a stack past its guard",
        Evidence(LIMITS, None, abort=HOST, overflowed="stack"),
        ErrorKind.HOST_ERROR,
    ),
    ("scratch over on success", Evidence(LIMITS, None, scratch_over="over"), ErrorKind.OUTPUT_LIMIT),
    (
        "scratch over beats a host function's failure",
        Evidence(LIMITS, err(ErrorKind.GUEST_ERROR), failure=ErrorKind.CAPABILITY_DENIED, scratch_over="over"),
        ErrorKind.OUTPUT_LIMIT,
    ),
    (
        "scratch over does not hide a trap",
        Evidence(LIMITS, err(ErrorKind.OUT_OF_FUEL), scratch_over="over"),
        ErrorKind.OUT_OF_FUEL,
    ),
    (
        "a host function's failure explains the guest's error",
        Evidence(LIMITS, err(ErrorKind.GUEST_ERROR, "MemoryError"), failure=ErrorKind.CAPABILITY_DENIED),
        ErrorKind.CAPABILITY_DENIED,
    ),
    (
        "a host function's failure does not explain a trap",
        Evidence(LIMITS, err(ErrorKind.TRAP), failure=ErrorKind.CAPABILITY_DENIED),
        ErrorKind.TRAP,
    ),
    ("MemoryError in the guest's words", Evidence(LIMITS, err(ErrorKind.GUEST_ERROR, "MemoryError: x")), ErrorKind.MEMORY_LIMIT),
    ("a trap at the memory cap", Evidence(LIMITS, err(ErrorKind.TRAP), peak_memory=AT_CAP), ErrorKind.MEMORY_LIMIT),
    ("a trap below the memory cap", Evidence(LIMITS, err(ErrorKind.TRAP), peak_memory=AT_CAP // 2), ErrorKind.TRAP),
    (
        "the memory cap beats a cut stdout",
        Evidence(LIMITS, err(ErrorKind.TRAP), peak_memory=AT_CAP, truncated="stdout"),
        ErrorKind.MEMORY_LIMIT,
    ),
    ("a cut stdout on success", Evidence(LIMITS, None, truncated="stdout"), ErrorKind.OUTPUT_LIMIT),
    (
        "a cut stdout explains the host's stop of a guest that then misbehaved",
        Evidence(LIMITS, err(ErrorKind.TRAP), abort=err(ErrorKind.GUEST_ERROR, "no sleeping"), truncated="stdout"),
        ErrorKind.OUTPUT_LIMIT,
    ),
    (
        "a cut stdout does not explain the host's verdict of its own",
        Evidence(LIMITS, err(ErrorKind.TRAP), abort=HOST, truncated="stdout"),
        ErrorKind.HOST_ERROR,
    ),
    (
        "a cut stdout explains a host function's failure the cut can cause",
        Evidence(LIMITS, err(ErrorKind.GUEST_ERROR), failure=ErrorKind.BAD_RESPONSE, truncated="stderr"),
        ErrorKind.OUTPUT_LIMIT,
    ),
    ("a cut stderr explains a bad response", Evidence(LIMITS, err(ErrorKind.BAD_RESPONSE), truncated="stderr"), ErrorKind.OUTPUT_LIMIT),
    ("a cut stdout does not hide running out of fuel", Evidence(LIMITS, err(ErrorKind.OUT_OF_FUEL), truncated="stdout"), ErrorKind.OUT_OF_FUEL),
    ("a cut stdout does not hide bad args", Evidence(LIMITS, err(ErrorKind.INVALID_ARGUMENTS), truncated="stdout"), ErrorKind.INVALID_ARGUMENTS),
]  # fmt: skip


@pytest.mark.parametrize(("evidence", "kind"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(evidence: Evidence, kind: ErrorKind | None) -> None:
    error = decide(evidence)
    assert (error.kind if error is not None else None) is kind


def test_messages_say_which_cap() -> None:
    cut = decide(Evidence(LIMITS, None, truncated="stderr"))
    assert cut is not None and cut.message == "stderr exceeded the 1KiB output cap"
    oom = decide(Evidence(LIMITS, err(ErrorKind.TRAP, "unreachable"), peak_memory=AT_CAP))
    assert oom is not None and oom.message == "unreachable (memory cap reached)"
    failed = decide(
        Evidence(LIMITS, err(ErrorKind.GUEST_ERROR, "kv.get refused"), failure=ErrorKind.CAPABILITY_DENIED)
    )
    assert failed is not None and failed.message == "kv.get refused"


def test_every_rule_decides_some_case() -> None:
    """No rule of the table is dead: each one is the first to apply for one of CASES whose
    outcome it gives (not overridden by the output cut)."""
    used = set()
    for _, evidence, kind in CASES:
        first = next(i for i, (_, applies, _) in enumerate(RULES) if applies(evidence))
        if kind is not ErrorKind.OUTPUT_LIMIT or RULES[first][0].startswith("the scratch folder"):
            used.add(first)
    assert used == set(range(len(RULES)))
