"""The audit trail: one record per call, delivered to the Sandbox's sinks.

Sinks are a Python callable (gets the `AuditRecord`), a `logging.Logger` (one JSON line per
call; WARNING when a host call was refused, since a guest reaching for what it was not granted
is an incident), or an `AuditLog`: an append-only JSONL file in which each line carries the
sha256 of the line before it, so an edited, inserted or deleted line breaks the chain
(`wasmbox audit verify FILE`). Lines cut from the end leave a valid shorter chain: keep
`AuditLog.head` somewhere else and pass it to `verify` to catch that too.

With no sinks nothing is built. An `AuditLog` serializes, hashes and writes on its own thread,
so the calling thread only queues the record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import itertools
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from . import _abi
from ._errors import WasmboxError
from ._manifest import Limits
from ._results import CallResult, HostCallRecord

GENESIS = "0" * 64  # the `prev` of a log's first line
# An AuditLog's thread gathers records this long before writing them: woken per record, it
# would contend for the GIL with the calling threads in every call (bench/README.md,
# "Built-in capabilities").
_LINGER_S = 0.02
_log = logging.getLogger("wasmbox.audit")


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """What one call did, for operators. Digests are sha256 hex: `manifest_digest` names the
    exact grant set, `code_digest` the wasm module or Python source that ran (for `run_python`, the runtime's
    build; the snippet is in the args),
    `args_digest` the MessagePack of the args (argv and stdin for WASI commands)."""

    seq: int
    time: float  # Unix time the call ended
    tool: str
    manifest_digest: str
    code_digest: str
    args_digest: str
    limits: Limits
    ok: bool
    error_kind: str | None
    error_message: str | None
    fuel_used: int
    duration_s: float
    peak_memory: int | None  # bytes of linear memory (None for the Python runtime)
    stdout_bytes: int
    stderr_bytes: int
    truncated: bool
    host_calls: tuple[HostCallRecord, ...]
    session: str | None = None  # a session run's: the session's name, and its unique id
    session_id: str | None = None
    # A tool call's id in this process, and for a call made by code through `tools`, the id of
    # the call whose code made it (its record comes later: it ends after the calls it made).
    call_id: str | None = None
    parent_id: str | None = None
    # A call made while a recording or replay was open: `"<Recording.id>#<place>"`, the
    # recorded call it was kept as or served from (`wasmbox.recording`).
    recording: str | None = None

    @property
    def refused(self) -> list[HostCallRecord]:
        """Host calls that were denied or refused for a limit."""
        return [r for r in self.host_calls if r.verdict in ("denied", "limit")]

    def as_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["limits"] = self.limits.model_dump(mode="json")
        data["host_calls"] = [dataclasses.asdict(r) for r in self.host_calls]
        return data


AuditSink = Callable[[AuditRecord], None] | logging.Logger


class Auditor:
    """The Sandbox's sinks; `enabled` is False (and nothing is built) without any."""

    def __init__(self, sinks: AuditSink | AuditLog | Iterable[AuditSink | AuditLog] | None) -> None:
        if sinks is None:
            items: list[Any] = []
        elif callable(sinks) or isinstance(sinks, (logging.Logger, AuditLog)):
            items = [sinks]
        else:
            items = list(sinks)
        # each sink with how a record is delivered to it, decided once
        self._sinks = tuple((sink, _delivery(sink)) for sink in items)
        self._logs = tuple(sink for sink in items if isinstance(sink, AuditLog))
        self.enabled = bool(items)
        self._seq = itertools.count(1)

    def record(
        self,
        result: CallResult,
        manifest_digest: str,
        code_digest: str,
        args: object,
        limits: Limits,
        *,
        session: str | None = None,
        session_id: str | None = None,
        call_id: str | None = None,
        parent_id: str | None = None,
        recording: str | None = None,
    ) -> None:
        """Deliver the record of `result` (of a run of `session`, if given) to every sink.
        Never raises: a failing sink is logged, and the call's result stands."""
        record = AuditRecord(
            seq=next(self._seq),
            time=time.time(),
            tool=result.tool,
            manifest_digest=manifest_digest,
            code_digest=code_digest,
            args_digest=args_digest(args),
            limits=limits,
            ok=result.ok,
            error_kind=result.error.kind.value if result.error else None,
            error_message=result.error.message if result.error else None,
            fuel_used=result.fuel_used,
            duration_s=result.duration_s,
            peak_memory=result.peak_memory,
            stdout_bytes=_utf8_size(result.stdout),
            stderr_bytes=_utf8_size(result.stderr),
            truncated=result.truncated,
            host_calls=tuple(result.host_calls),
            session=session,
            session_id=session_id,
            call_id=call_id,
            parent_id=parent_id,
            recording=recording,
        )
        self._send(record)

    def deliver(self, record: AuditRecord) -> None:
        """Deliver a record made by another process's Sandbox (e.g. a Ray actor's) to every
        sink, numbered in this Auditor's sequence. Never raises."""
        self._send(dataclasses.replace(record, seq=next(self._seq)))

    def _send(self, record: AuditRecord) -> None:
        for sink, deliver in self._sinks:
            try:
                deliver(record)
            except Exception:  # noqa: BLE001 - an audit sink must not fail the call
                _log.exception("audit sink %r failed", sink)

    def flush(self) -> None:
        """Wait for the AuditLogs' queues; a failed log is logged, not raised."""
        for log in self._logs:
            try:
                log.flush()
            except WasmboxError:
                _log.exception("audit log %s failed", log.path)


def _delivery(sink: object) -> Callable[[AuditRecord], None]:
    if isinstance(sink, AuditLog):
        return sink.write
    if isinstance(sink, logging.Logger):
        return functools.partial(_log_record, sink)
    if callable(sink):
        return sink
    raise TypeError(f"not an audit sink: {sink!r} (a callable, a Logger or an AuditLog)")


def _log_record(logger: logging.Logger, record: AuditRecord) -> None:
    level = logging.WARNING if record.refused else logging.INFO
    if logger.isEnabledFor(level):
        logger.log(level, "%s", _json(record.as_dict()), extra={"wasmbox_audit": record})


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode())


def args_digest(args: object) -> str:
    """sha256 of the args' MessagePack; for args that cannot be encoded, of their repr; for
    args that have none either (nested past the recursion limit, an int past the digit limit,
    a raising `__repr__`), of a line naming their type. Never raises: every call is recorded."""
    try:
        data = _abi.pack(dict(args) if isinstance(args, Mapping) else args)
    except Exception:  # noqa: BLE001 - whatever the caller passed, the call gets its record
        try:
            data = repr(args).encode("utf-8", "surrogatepass")
        except Exception as exc:  # noqa: BLE001 - RecursionError, ValueError, a hostile __repr__
            data = (
                f"<{type(args).__name__} args without an encoding or a repr: {type(exc).__name__}>".encode()
            )
    return hashlib.sha256(data).hexdigest()


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True, default=str)


class AuditLog:
    """An append-only, hash-chained JSONL audit file. One writer per file: it is locked
    (`flock`) while open, and reopening an existing file continues its chain."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise WasmboxError(f"{self.path}: another AuditLog is writing this file") from None
        self.head = _last_hash(self.path)
        self._queue: queue.Queue[AuditRecord | None] = queue.Queue()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="wasmbox-audit", daemon=True)
        self._thread.start()
        self._finalizer = weakref.finalize(self, _stop, self._queue, self._thread, self._fd)

    def write(self, record: AuditRecord) -> None:
        """Queue `record`; it is written on the log's own thread."""
        if not self._thread.is_alive():
            raise WasmboxError(f"{self.path}: the audit log is closed")
        if self._error is not None:
            raise WasmboxError(f"{self.path}: audit log failed: {self._error}")
        self._queue.put(record)

    def flush(self) -> None:
        """Wait until every queued record is on disk (written and fsync'ed)."""
        self._queue.join()
        if self._error is not None:
            raise WasmboxError(f"{self.path}: audit log failed: {self._error}")

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            batch = [self._queue.get()]
            if batch[0] is not None:
                time.sleep(_LINGER_S)  # gather more: one wake-up and one fsync per batch
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = None in batch
            try:
                records = [record for record in batch if record is not None]
                if records:
                    self._append(records)
            except OSError as exc:
                self._error = exc
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _append(self, records: list[AuditRecord]) -> None:
        chunks = []
        for record in records:
            data = record.as_dict()
            data["prev"] = self.head
            line = _json(data).encode() + b"\n"
            self.head = hashlib.sha256(line).hexdigest()
            chunks.append(line)
        pending = b"".join(chunks)
        while pending:
            written = os.write(self._fd, pending)
            pending = pending[written:]
        os.fsync(self._fd)


def _stop(items: queue.Queue[AuditRecord | None], thread: threading.Thread, fd: int) -> None:
    if thread.is_alive():
        items.put(None)
        if threading.current_thread() is not thread:
            thread.join()
    with contextlib.suppress(OSError):
        os.close(fd)


def _last_hash(path: Path) -> str:
    """The hash of the file's last line, or GENESIS for an empty file."""
    with path.open("rb") as file:
        file.seek(0, os.SEEK_END)
        end = file.tell()
        if end == 0:
            return GENESIS
        step, start = 4096, end
        while True:
            start = max(0, start - step)
            file.seek(start)
            tail = file.read(end - start)
            cut = tail.rstrip(b"\n").rfind(b"\n")
            if cut >= 0 or start == 0:
                return hashlib.sha256(tail[cut + 1 :]).hexdigest()
            step *= 2


@dataclass(frozen=True)
class Verification:
    """The outcome of `verify`: `ok`, how many records were read, the last hash, and what is
    wrong (the first problem) when not ok."""

    ok: bool
    records: int
    head: str
    problem: str | None = None


def verify_audit_log(path: str | os.PathLike[str], head: str | None = None) -> Verification:
    """Check an audit file's hash chain (and, given `head`, that it ends where it should)."""
    prev = GENESIS
    count = 0
    with Path(path).open("rb") as file:
        for number, line in enumerate(file, 1):
            if not line.endswith(b"\n"):
                return Verification(False, count, prev, f"line {number}: cut short (no newline)")
            try:
                data = json.loads(line)
            except ValueError:
                return Verification(False, count, prev, f"line {number}: not JSON")
            if not isinstance(data, dict) or data.get("prev") != prev:
                return Verification(
                    False,
                    count,
                    prev,
                    f"line {number}: chain broken (a line before it was edited, removed or inserted, or this one was)",
                )
            prev = hashlib.sha256(line).hexdigest()
            count += 1
    if head is not None and head != prev:
        return Verification(False, count, prev, f"the file ends at {prev}, not at the expected head {head}")
    return Verification(True, count, prev)
