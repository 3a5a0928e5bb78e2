"""Guest stdout/stderr: captured through the WASI C API, kept up to the output cap.

wasmtime-py's `stdout_custom` registers a finalizer that Wasmtime may run on one of its own
threads after the store is gone, even while the interpreter shuts down (which aborts the
process noisily). Here the callback has no finalizer: the call that owns an `Output` attaches
it before the guest runs and detaches it afterwards.
"""

from __future__ import annotations

import ctypes
import errno
from typing import Literal

import wasmtime
from wasmtime import _ffi as ffi

from . import capi as _capi

_live: _capi.Handles[Output] = _capi.Handles()
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

    def reset(self, cap: int) -> None:
        """Empty, with a new cap: the next run of a session that keeps this stream attached."""
        self.cap = cap
        self.size = 0
        self.truncated = False
        self._chunks = []

    def write(self, data: bytes) -> int:
        room = self.cap - self.size
        if len(data) > room:
            self.truncated = True
            if room <= 0:
                return -errno.ENOSPC
            data = data[:room]
        self._chunks.append(data)
        self.size += len(data)
        return len(data)

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
        setter = (
            ffi.wasi_config_set_stdout_custom if stream == "stdout"
            else ffi.wasi_config_set_stderr_custom
        )  # fmt: skip
        setter(wasi.ptr(), _write, self._id, _capi.NO_FINALIZER)

    def detach(self) -> None:
        _live.discard(self._id)


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
