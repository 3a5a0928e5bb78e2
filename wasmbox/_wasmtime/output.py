"""Guest stdout/stderr: captured through the WASI C API, kept up to the output cap.

wasmtime-py's `stdout_custom` registers a finalizer that Wasmtime may run on one of its own
threads after the store is gone, even while the interpreter shuts down (which aborts the
process noisily). Here the callback has no finalizer: the call that owns an `Output` attaches
it before the guest runs and detaches it afterwards.

Streaming: inside a `streaming(listener)` block, what a call started on this thread writes
to stdout or stderr also goes to `listener(stream, text)` as it is written (the part within
the cap, decoded as UTF-8 across writes), before the write returns: a line a call printed has
reached the listener even if the call is then stopped. Wasmtime makes a component's writes on
a thread of its own, so an `Output` takes its listener from the thread that made it or last
reset it (`reset`, when an instance made ahead on another thread, or a session's, is renewed
for a call); without one, a write pays one attribute check.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import errno
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Literal

import wasmtime
from wasmtime import _ffi as ffi

from . import capi as _capi

_live: _capi.Handles[Output] = _capi.Handles()
OutputListener = Callable[[str, str], None]
"""`listener(stream, text)`: "stdout" or "stderr", and what the guest wrote (decoded)."""


class _Local(threading.local):
    listener: OutputListener | None = None  # this thread's listener, if any (`streaming`)


_local = _Local()
_log = logging.getLogger("wasmbox")
_WriteCallback = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ubyte), ctypes.c_size_t
)


class Output:
    """A guest output stream, kept up to `cap` bytes; writes past the cap fail with ENOSPC."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.size = 0
        self.truncated = False
        self._chunks: list[bytes] = []
        self._id = 0
        self.stream = "stdout"  # set by `attach`
        self._decoder: codecs.IncrementalDecoder | None = None  # made at the first streamed write
        self._listener: OutputListener | None = _local.listener

    def reset(self, cap: int) -> None:
        """Empty, with a new cap and this thread's listener: the next call of an instance made
        ahead, or the next run of a session, which keeps this stream attached."""
        self.cap = cap
        self.size = 0
        self.truncated = False
        self._chunks = []
        self._decoder = None
        self._listener = _local.listener

    def write(self, data: bytes) -> int:
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
            if room <= 0:
                return -errno.ENOSPC
            data = data[:room]
        self._chunks.append(data)
        self.size += len(data)
        if self._listener is not None:
            self._tell(self._listener, data)
        return len(data)

    def _tell(self, listener: OutputListener, data: bytes) -> None:
        """Hand `data` to the listener; one that raises is told nothing more by this stream
        (logged), and the guest's write goes on."""
        if self._decoder is None:
            self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = self._decoder.decode(data)
        if not text:
            return
        try:
            listener(self.stream, text)
        except Exception:  # noqa: BLE001 - the caller's code: it must not fail the guest's write
            _log.exception("wasmbox: an on_output listener raised; it is told nothing more for this call")
            self._listener = None

    def note(self, data: bytes) -> None:
        """Add the host's own `data` after what the guest wrote, past the cap if need be (it
        is not the guest's output: it never counts towards the cap nor marks it cut)."""
        self._chunks.append(data)

    def text(self) -> str:
        return self.data().decode("utf-8", "replace")

    def data(self) -> bytes:
        return b"".join(self._chunks)

    def attach(self, wasi: wasmtime.WasiConfig, stream: Literal["stdout", "stderr"]) -> None:
        """Route the guest's `stream` into this Output until `detach`."""
        self._id = _live.add(self)
        self.stream = stream
        setter = (
            ffi.wasi_config_set_stdout_custom if stream == "stdout" else ffi.wasi_config_set_stderr_custom
        )
        setter(wasi.ptr(), _write, self._id, _capi.NO_FINALIZER)

    def detach(self) -> None:
        _live.discard(self._id)


def listening() -> bool:
    """Whether a listener is set on this thread (a `streaming` block with one is open)."""
    return _local.listener is not None


@contextlib.contextmanager
def streaming(listener: OutputListener | None) -> Iterator[None]:
    """Send what calls started on this thread write to stdout/stderr to `listener` until the
    block ends (None: to nobody, e.g. for a call a host function makes: its output is its own)."""
    outer = _local.listener
    _local.listener = listener
    try:
        yield
    finally:
        _local.listener = outer


def views(data: bytes) -> tuple[str, bytes | None]:
    """`data` as text, and as itself when the text is not exact (it is not UTF-8: each bad
    sequence became U+FFFD); None when `text.encode()` gives `data` back."""
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return data.decode("utf-8", "replace"), data


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)


def sniff(data: bytes) -> str | None:
    """The media type of `data` by its first bytes: PNG, JPEG, GIF, WebP, PDF, SVG; else None."""
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    head = data[:1024].lstrip()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in head):
        return "image/svg+xml"
    return None


@_WriteCallback
def _write(handle: int | None, data: ctypes._Pointer[ctypes.c_ubyte], size: int) -> int:
    try:
        output = _live.get(handle)
        if output is None:  # the call is over: nobody is listening any more
            return -errno.EPIPE
        return output.write(ctypes.string_at(data, size))
    except BaseException:  # noqa: BLE001 - never unwind into Wasmtime
        return -errno.EIO
