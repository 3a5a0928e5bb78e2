"""Record and replay of what calls received from outside, for debugging and evaluations.

`recording()` keeps, for the calls made on this thread while it is open, every host-function
exchange: the function's name, its request's sha256, and the reply the guest got, in order;
and the random seeds their runtimes were given (the JavaScript runtime's `Math.random` seed)
(`http.fetch` and `wasmbox.call_tool` are host functions too: a tool called by code is kept
as the reply its caller got, not run again). `redact(name, payload)` may change a reply before
it is kept (the guest still gets the real one). `replaying(recording)` serves those replies
back, in order, without running any host function: the same call then gets the same result
offline. A host call that differs from the recorded one (another function, other arguments,
one more) gets an error reply instead, and the replay's `divergence` says which call and how;
recorded exchanges or seeds left unused at the end are a divergence too.

Only the outermost call's exchanges are kept (those of a tool its code calls belong to that
call's reply); off, a host call reads one module global (`open_tapes`).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from ._capabilities.hostfuncs import HostFunction, HostReply, refusal
from ._errors import ErrorKind
from ._results import HostCallRecord
from ._schema import Validator

_local = threading.local()  # `tape`: the Recording or Replay open on this thread
open_tapes = 0  # recordings and replays open in the process (off: a host call reads this)
_count_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class HostExchange:
    """One host call as a recording keeps it: the function, its request's sha256, the reply
    the guest got (after `redact`), and the host's record of it."""

    name: str
    request_sha256: str
    payload: bytes
    record: HostCallRecord
    failure: ErrorKind | None = None


class Recording:
    """The host exchanges of the calls made on one thread while `recording()` was open, in
    order. `to_json()` / `Recording.from_json()` keep it as text (payloads in base64)."""

    def __init__(self, redact: Callable[[str, bytes], bytes] | None = None) -> None:
        self.exchanges: list[HostExchange] = []
        self.seeds: list[bytes] = []  # the random seeds the calls' runtimes were given, in order
        self._redact = redact
        self._depth = 0

    def _random(self, make: Callable[[], bytes]) -> bytes:
        seed = make()
        self.seeds.append(seed)
        return seed

    def _serve(self, name: str, request: bytes, invoke: Callable[[], HostReply]) -> HostReply:
        self._depth += 1  # (a tool its code calls runs for real, unrecorded)
        try:
            reply = invoke()
        finally:
            self._depth -= 1
        payload = reply.payload if self._redact is None else self._redact(name, reply.payload)
        if not isinstance(payload, bytes):
            raise TypeError(f"redact must return bytes, got {type(payload).__name__}")
        self.exchanges.append(HostExchange(name, _sha256(request), payload, reply.record, reply.failure))
        return reply

    def to_json(self) -> str:
        exchanges = [
            {
                **dataclasses.asdict(e),
                "payload": base64.b64encode(e.payload).decode(),
                "failure": e.failure.value if e.failure else None,
            }
            for e in self.exchanges
        ]
        return json.dumps({"exchanges": exchanges, "seeds": [seed.hex() for seed in self.seeds]})

    @classmethod
    def from_json(cls, text: str) -> Recording:
        """ValueError (or KeyError, TypeError) for text `to_json` did not make."""
        recording = cls()
        data = json.loads(text)
        recording.seeds = [bytes.fromhex(seed) for seed in data["seeds"]]
        for item in data["exchanges"]:
            recording.exchanges.append(
                HostExchange(
                    item["name"],
                    item["request_sha256"],
                    base64.b64decode(item["payload"], validate=True),
                    HostCallRecord(**item["record"]),
                    ErrorKind(item["failure"]) if item["failure"] else None,
                )
            )
        return recording


class Replay:
    """A recording served back (`replaying`); `divergence` says where the calls first asked
    for something else (None: they asked for exactly what was recorded)."""

    def __init__(self, recording: Recording) -> None:
        self._exchanges = list(recording.exchanges)
        self._seeds = list(recording.seeds)
        self.position = 0  # exchanges served so far
        self.seeds_used = 0
        self.divergence: str | None = None
        self._depth = 0

    def _random(self, make: Callable[[], bytes]) -> bytes:
        if self.seeds_used < len(self._seeds):
            self.seeds_used += 1
            return self._seeds[self.seeds_used - 1]
        if self.divergence is None:
            self.divergence = (
                f"seed {self.seeds_used + 1}: a runtime asked for one more random seed than recorded"
            )
        return make()

    def _serve(self, name: str, request: bytes, invoke: Callable[[], HostReply]) -> HostReply:
        index = self.position
        if self.divergence is None:
            if index >= len(self._exchanges):
                self.divergence = f"host call {index + 1}: {name} was called; the recording has {index}"
            else:
                expected = self._exchanges[index]
                if expected.name != name:
                    self.divergence = (
                        f"host call {index + 1}: {name} was called; the recording has {expected.name}"
                    )
                elif expected.request_sha256 != _sha256(request):
                    self.divergence = (
                        f"host call {index + 1}: {name} was called with other arguments than recorded"
                    )
                else:
                    self.position += 1
                    return HostReply(expected.payload, expected.record, expected.failure)
        return refusal(name, "error", f"replay diverged at {self.divergence}", len(request))

    def _finish(self) -> None:
        left = len(self._exchanges) - self.position
        if self.divergence is None and left:
            self.divergence = f"the calls ended with {left} recorded host call(s) not made"
        seeds = len(self._seeds) - self.seeds_used
        if self.divergence is None and seeds:
            self.divergence = f"the calls ended with {seeds} recorded random seed(s) not used"


@contextmanager
def recording(redact: Callable[[str, bytes], bytes] | None = None) -> Iterator[Recording]:
    """Record the host exchanges of the calls made on this thread inside the block (see the
    module). `redact(name, payload) -> payload` changes what is kept (not what the guest
    gets). RuntimeError inside another recording or replay."""
    tape = Recording(redact)
    with _open(tape):
        yield tape


@contextmanager
def replaying(recording: Recording) -> Iterator[Replay]:
    """Serve `recording`'s replies to the calls made on this thread inside the block, no host
    function run; afterwards `divergence` says where they asked for something else.
    RuntimeError inside another recording or replay."""
    tape = Replay(recording)
    with _open(tape):
        yield tape
    tape._finish()


@contextmanager
def _open(tape: Recording | Replay) -> Iterator[None]:
    global open_tapes
    if getattr(_local, "tape", None) is not None:
        raise RuntimeError("a recording or replay is already open on this thread")
    _local.tape = tape
    with _count_lock:
        open_tapes += 1
    try:
        yield
    finally:
        _local.tape = None
        with _count_lock:
            open_tapes -= 1


def serve(function: HostFunction, request: bytes, narrowed: Validator | None = None) -> HostReply:
    """`function.invoke(request, narrowed)`, recorded by the recording open on this thread; or
    the reply the replay open on it gives (the recorded call passed the same checks)."""
    tape: Recording | Replay | None = getattr(_local, "tape", None)
    if tape is None or tape._depth:
        return function.invoke(request, narrowed)
    return tape._serve(function.name, request, partial(function.invoke, request, narrowed))


def randomness(make: Callable[[], bytes]) -> bytes:
    """`make()` (a runtime's random seed for a call), kept by the recording open on this
    thread; or the recorded seed the replay open on it gives."""
    tape: Recording | Replay | None = getattr(_local, "tape", None) if open_tapes else None
    if tape is None or tape._depth:
        return make()
    return tape._random(make)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
