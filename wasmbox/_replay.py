"""Record and replay of what calls received from outside, for debugging and evaluations.

`recording()` keeps, for each call made inside it (`CallTape`, one per call): its tool and
the sha256 of its args (argv and stdin for a command) and of each input file; the files under
its manifest's preopens as it started (sha256 and size of each: a replay names a file that
changed); and, in the order the guest asked for them, every host-function exchange (name,
request's sha256, the reply the guest got, after `redact`), every clock reading and every
draw of random bytes.
`replaying(recording)` serves those back: no host function runs, the clock and the random
bytes are the recorded ones, so the same call gets the same result offline. Where the calls
ask for something else, `Replay.divergence` says where, and live values (or, for a host
call, an error reply) stand in.

Matching is per call, so concurrent calls replay deterministically. Each call takes a place
in the recording: a call handed to a worker thread (`acall`, dispatch's concurrent calls)
when it is handed off, on the caller's thread, so in program order; any other when it
starts. A replayed call is served the recorded call of the same tool and inputs at its own
place, else the first such not served yet; with none, the first unserved call of that tool
(a divergence: its inputs differ). Within a call, everything is served in order.

The tape lives in a `contextvars` context: work handed to the worker threads carries it
(`_call.carried`); a thread started without that context records nothing. Only the
outermost call is taped: a tool its code calls (`wasmbox.call_tool`) is the reply its caller
got, and is not run again in a replay. Off, the call path reads one module global
(`open_tapes`).
"""

from __future__ import annotations

import base64
import contextvars
import dataclasses
import hashlib
import itertools
import json
import os
import posixpath
import stat
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from ._audit import args_digest
from ._capabilities.hostfuncs import HostFunction, HostReply, refusal
from ._errors import ErrorKind
from ._manifest import Preopen
from ._results import HostCallRecord
from ._schema import Validator

open_tapes = 0  # recordings and replays open in the process (off: the call path reads this)
_count_lock = threading.Lock()
_tape: contextvars.ContextVar[Recording | Replay | None] = contextvars.ContextVar(
    "wasmbox_tape", default=None
)
# the place a call handed to a worker thread took when it was handed off (`hand_off`)
_handed: contextvars.ContextVar[int | None] = contextvars.ContextVar("wasmbox_place", default=None)
# the tape of the call starting in this context, for `_call.perform` to take (`taping`)
_starting: contextvars.ContextVar[Taped | None] = contextvars.ContextVar("wasmbox_call", default=None)

MAX_FILES = 1000  # files under a call's preopens digested at its start; more are listed by size only
MAX_FILE_BYTES = 64 * 1024**2  # bytes of them read for digests, all together


@dataclasses.dataclass(frozen=True)
class HostExchange:
    """One host call as a recording keeps it: the function, its request's sha256, the reply
    the guest got (after `redact`), and the host's record of it."""

    name: str
    request_sha256: str
    payload: bytes
    record: HostCallRecord
    failure: ErrorKind | None = None


@dataclasses.dataclass
class CallTape:
    """What one call received from outside, as `Recording.calls` keeps it: `place` (its
    order among the recording's calls), `tool`, `args_sha256` (`_audit.args_digest` of its
    args), `input_files` (path → sha256 of each file given with `files=`), `files` (guest path
    → sha256, or None past `MAX_FILE_BYTES`, and size, of the files under its manifest's
    preopens when it started), then in the order asked: `exchanges`, `clock` (what each
    reading was of, e.g. "wall", "monotonic", "clock 1"; and its value in nanoseconds, or
    minus a WASI errno) and `random` (the bytes of each draw)."""

    place: int
    tool: str
    args_sha256: str
    input_files: dict[str, str] = dataclasses.field(default_factory=dict)
    files: dict[str, tuple[str | None, int]] = dataclasses.field(default_factory=dict)
    exchanges: list[HostExchange] = dataclasses.field(default_factory=list)
    clock: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    random: list[bytes] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "place": self.place,
            "tool": self.tool,
            "args_sha256": self.args_sha256,
            "input_files": self.input_files,
            "files": {path: list(entry) for path, entry in self.files.items()},
            "exchanges": [
                {
                    **dataclasses.asdict(e),
                    "payload": base64.b64encode(e.payload).decode(),
                    "failure": e.failure.value if e.failure else None,
                }
                for e in self.exchanges
            ],
            "clock": [list(reading) for reading in self.clock],
            "random": [draw.hex() for draw in self.random],
        }

    @classmethod
    def from_dict(cls, item: dict[str, Any]) -> CallTape:
        return cls(
            int(item["place"]),
            str(item["tool"]),
            str(item["args_sha256"]),
            {str(k): str(v) for k, v in item["input_files"].items()},
            {str(k): (v[0], int(v[1])) for k, v in item["files"].items()},
            [
                HostExchange(
                    e["name"],
                    e["request_sha256"],
                    base64.b64decode(e["payload"], validate=True),
                    HostCallRecord(**e["record"]),
                    ErrorKind(e["failure"]) if e["failure"] else None,
                )
                for e in item["exchanges"]
            ],
            [(str(kind), int(value)) for kind, value in item["clock"]],
            [bytes.fromhex(draw) for draw in item["random"]],
        )


class Recording:
    """The calls made while `recording()` was open (`calls`, in the order of their places).
    `id` names it; a recorded call's audit record carries `"<id>#<place>"` (`reference`).
    `to_json()` / `Recording.from_json()` keep it as text (payloads in base64)."""

    def __init__(self, redact: Callable[[str, bytes], bytes] | None = None) -> None:
        self.id = uuid.uuid4().hex
        self._calls: list[CallTape] = []
        self._redact = redact
        self._lock = threading.Lock()
        self._places = itertools.count(1)

    @property
    def calls(self) -> list[CallTape]:
        with self._lock:
            return sorted(self._calls, key=_place)

    @property
    def exchanges(self) -> list[HostExchange]:
        """Every call's host exchanges, call after call."""
        return [exchange for call in self.calls for exchange in call.exchanges]

    def reference(self, call: CallTape) -> str:
        """What an audit record of `call` carries to find it: `"<id>#<place>"`."""
        return f"{self.id}#{call.place}"

    def _take_place(self) -> int:
        with self._lock:
            return next(self._places)

    def _begin(self, call: CallTape) -> Taped:
        with self._lock:
            self._calls.append(call)
        return _Recorder(call, self._redact)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "calls": [call.as_dict() for call in self.calls]})

    @classmethod
    def from_json(cls, text: str) -> Recording:
        """ValueError (or KeyError, TypeError) for text `to_json` did not make."""
        data = json.loads(text)
        recording = cls()
        recording.id = str(data["id"])
        recording._calls = [CallTape.from_dict(item) for item in data["calls"]]
        return recording


class Taped:
    """What one call's guest gets from outside while it is taped: `host`, `clock`, `random`."""

    def host(self, function: HostFunction, request: bytes, narrowed: Validator | None) -> HostReply:
        raise NotImplementedError

    def clock(self, kind: str, read: Callable[[], int]) -> int:
        """A reading of clock `kind` (nanoseconds, or minus a WASI errno): `read()`, kept or
        replayed."""
        raise NotImplementedError

    def random(self, size: int, draw: Callable[[], bytes]) -> bytes:
        """`size` random bytes: `draw()`, kept or replayed."""
        raise NotImplementedError


class _Recorder(Taped):
    def __init__(self, call: CallTape, redact: Callable[[str, bytes], bytes] | None) -> None:
        self.call = call
        self._redact = redact

    def host(self, function: HostFunction, request: bytes, narrowed: Validator | None) -> HostReply:
        reply = function.invoke(request, narrowed)
        name = function.name
        payload = reply.payload if self._redact is None else self._redact(name, reply.payload)
        if not isinstance(payload, bytes):
            raise TypeError(f"redact must return bytes, got {type(payload).__name__}")
        self.call.exchanges.append(HostExchange(name, _sha256(request), payload, reply.record, reply.failure))
        return reply

    def clock(self, kind: str, read: Callable[[], int]) -> int:
        value = read()
        self.call.clock.append((kind, value))
        return value

    def random(self, size: int, draw: Callable[[], bytes]) -> bytes:
        data = draw()
        self.call.random.append(data)
        return data


class Replay:
    """A recording served back (`replaying`); `divergence` says where the calls first asked
    for something else (the diverging call with the earliest place first; None: they asked
    for exactly what was recorded), `divergences` all of them, one per call at most."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording
        self._unserved = recording.calls
        self._players: list[_Player] = []
        self._places = itertools.count(1)
        self._lock = threading.Lock()
        self._ended: list[str] = []

    @property
    def divergences(self) -> list[str]:
        with self._lock:
            players = sorted(self._players, key=lambda player: player.place)
        return [p.divergence for p in players if p.divergence is not None] + self._ended

    @property
    def divergence(self) -> str | None:
        found = self.divergences
        return found[0] if found else None

    def _take_place(self) -> int:
        with self._lock:
            return next(self._places)

    def _begin(self, call: CallTape) -> Taped:
        with self._lock:
            same = [c for c in self._unserved if c.tool == call.tool and _inputs(c) == _inputs(call)]
            of_tool = [c for c in self._unserved if c.tool == call.tool]
            candidates = same or of_tool
            chosen = next((c for c in candidates if c.place == call.place), None)
            chosen = chosen or (candidates[0] if candidates else None)
            if chosen is not None:
                self._unserved.remove(chosen)
            player = _Player(call, chosen)
            self._players.append(player)
        if chosen is None:
            player.diverge("it is not in the recording")
        else:
            player.diverge(_differs(chosen, call))
        return player

    def _finish(self) -> None:
        for call in self._unserved:
            self._ended.append(f"call {call.place} ({call.tool}) was recorded and not made")
        for player in self._players:
            player.finish()


class _Player(Taped):
    """One replayed call: the recorded call it is served (`recorded`), and how far."""

    def __init__(self, call: CallTape, recorded: CallTape | None) -> None:
        self.place = call.place
        self._tool = call.tool
        self.recorded = recorded
        self.divergence: str | None = None
        self._served = [0, 0, 0]  # exchanges, clock readings, random draws

    def diverge(self, what: str | None) -> None:
        if what is not None and self.divergence is None:
            self.divergence = f"call {self.place} ({self._tool}): {what}"

    def host(self, function: HostFunction, request: bytes, narrowed: Validator | None) -> HostReply:
        name = function.name
        index = self._served[0]
        kept = self.recorded.exchanges if self.recorded is not None else []
        if index >= len(kept):
            problem = f"host call {index + 1}: {name} was called; the recording has {index}"
        elif kept[index].name != name:
            problem = f"host call {index + 1}: {name} was called; the recording has {kept[index].name}"
        elif kept[index].request_sha256 != _sha256(request):
            problem = f"host call {index + 1}: {name} was called with other arguments than recorded"
        else:
            self._served[0] += 1
            return HostReply(kept[index].payload, kept[index].record, kept[index].failure)
        self.diverge(problem)
        where = f"call {self.place} ({self._tool}): {problem}"
        return refusal(name, "error", f"replay diverged at {where}", len(request))

    def clock(self, kind: str, read: Callable[[], int]) -> int:
        index = self._served[1]
        kept = self.recorded.clock if self.recorded is not None else []
        if index < len(kept) and kept[index][0] == kind:
            self._served[1] += 1
            return kept[index][1]
        recorded = (
            f"the recording has {kept[index][0]}" if index < len(kept) else f"the recording has {index}"
        )
        self.diverge(f"clock reading {index + 1}: {kind} was read; {recorded}")
        return read()

    def random(self, size: int, draw: Callable[[], bytes]) -> bytes:
        index = self._served[2]
        kept = self.recorded.random if self.recorded is not None else []
        if index < len(kept) and len(kept[index]) == size:
            self._served[2] += 1
            return kept[index]
        recorded = f"{len(kept[index])} recorded" if index < len(kept) else f"the recording has {index} draws"
        self.diverge(f"random draw {index + 1}: {size} bytes were asked for; {recorded}")
        return draw()

    def finish(self) -> None:
        if self.recorded is None:
            return
        left = (
            ("host call(s)", len(self.recorded.exchanges) - self._served[0]),
            ("clock reading(s)", len(self.recorded.clock) - self._served[1]),
            ("random draw(s)", len(self.recorded.random) - self._served[2]),
        )
        for what, count in left:
            if count:
                self.diverge(f"it ended with {count} recorded {what} not used")


@contextmanager
def recording(redact: Callable[[str, bytes], bytes] | None = None) -> Iterator[Recording]:
    """Record what the calls made inside the block receive from outside (see the module),
    those handed to the worker threads too. `redact(name, payload) -> payload` changes what
    is kept of a host reply (not what the guest gets). RuntimeError inside another recording
    or replay."""
    tape = Recording(redact)
    with _open(tape):
        yield tape


@contextmanager
def replaying(recording: Recording) -> Iterator[Replay]:
    """Serve `recording` to the calls made inside the block, no host function run; afterwards
    `divergence` says where they asked for something else. RuntimeError inside another
    recording or replay."""
    tape = Replay(recording)
    with _open(tape):
        yield tape
    tape._finish()


@contextmanager
def _open(tape: Recording | Replay) -> Iterator[None]:
    global open_tapes
    if _tape.get() is not None:
        raise RuntimeError("a recording or replay is already open here")
    token = _tape.set(tape)
    with _count_lock:
        open_tapes += 1
    try:
        yield
    finally:
        _tape.reset(token)
        with _count_lock:
            open_tapes -= 1


def hand_off() -> None:
    """In a context copied for work handed to a worker thread: the call it makes takes its
    place now (in the order work is handed off, on the caller's thread)."""
    tape = _tape.get()
    if tape is not None:
        _handed.set(tape._take_place())


@contextmanager
def taping(tool: str, args: object, files: object, preopens: tuple[Preopen, ...]) -> Iterator[str | None]:
    """Around one outermost call of `tool` (its `args`, input `files` as given, and its manifest's
    `preopens`): its tape is set for `_call.perform` to take (`starting`); yields the reference
    its audit record carries (None without a recording or replay open, or a call a replay has
    no recorded one for)."""
    tape = _tape.get()
    if tape is None:
        yield None
        return
    place = _handed.get()
    if place is None:
        place = tape._take_place()
    else:
        _handed.set(None)  # (only the call it was handed off for has this place)
    call = CallTape(place, tool, args_digest(args), _input_digests(files), _preopened(preopens))
    taped = tape._begin(call)
    recording = tape if isinstance(tape, Recording) else tape.recording
    served = taped.recorded if isinstance(taped, _Player) else call
    reference = recording.reference(served) if served is not None else None
    token = _starting.set(taped)
    try:
        yield reference
    finally:
        _starting.reset(token)


def starting() -> Taped | None:
    """The tape of the call starting in this context (taken once: the calls it makes from
    host functions are not taped)."""
    taped = _starting.get()
    if taped is not None:
        _starting.set(None)
    return taped


def _input_digests(files: object) -> dict[str, str]:
    """sha256 of each input file as the caller gave it (bytes, or str as UTF-8; anything else
    by its args digest: the call refuses it)."""
    if not isinstance(files, Mapping):
        return {}
    digests = {}
    for name, content in files.items():
        if isinstance(content, str):
            content = content.encode("utf-8", "surrogatepass")
        data = bytes(content) if isinstance(content, (bytes, bytearray, memoryview)) else None
        digests[str(name)] = _sha256(data) if data is not None else args_digest(content)
    return digests


def _preopened(preopens: tuple[Preopen, ...]) -> dict[str, tuple[str | None, int]]:
    """The regular files under `preopens` (links not followed), by guest path: sha256 and
    size, the sha256 None past `MAX_FILES` files or `MAX_FILE_BYTES` read."""
    found: dict[str, tuple[str | None, int]] = {}
    budget = MAX_FILE_BYTES
    for preopen in preopens:
        for folder, dirs, names in os.walk(preopen.host, followlinks=False):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(folder, name)
                guest = posixpath.join(preopen.guest, os.path.relpath(path, preopen.host))
                try:
                    info = os.lstat(path)
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    digest = None
                    if len(found) < MAX_FILES and info.st_size <= budget:
                        digest = _file_sha256(path)
                        budget -= info.st_size
                except OSError:
                    continue  # gone or unreadable: as if it was not there
                found[guest] = (digest, info.st_size)
    return found


def _file_sha256(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _inputs(call: CallTape) -> tuple[str, dict[str, str]]:
    return call.args_sha256, call.input_files


def _differs(recorded: CallTape, call: CallTape) -> str | None:
    """How `call`'s inputs and files differ from those of the recorded call it is served."""
    if recorded.args_sha256 != call.args_sha256:
        return "its args differ from the recorded call's"
    for path in sorted(recorded.input_files.keys() | call.input_files.keys()):
        if recorded.input_files.get(path) != call.input_files.get(path):
            return f"input file {path} differs from the recorded one"
    for path in sorted(recorded.files.keys() | call.files.keys()):
        before, now = recorded.files.get(path), call.files.get(path)
        if before is None:
            return f"file {path} is new since the recording"
        if now is None:
            return f"file {path} is gone since the recording"
        if before != now:
            return f"file {path} changed since the recording"
    return None


def _place(call: CallTape) -> int:
    return call.place


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
