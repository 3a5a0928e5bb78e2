"""What goes back to a model for one call: `result_content(result) -> Content`."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

import pydantic_core

from ._results import CallResult
from ._wasmtime.output import sniff

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Raster images the providers take as image content (Anthropic, MCP, OpenAI Responses)."""
PDF = "application/pdf"
INLINE_BASE64 = 4096
"""Binary outputs up to this many bytes, other than images, are also written into the text as
standard base64, so a text-only channel (OpenAI Chat) carries them whole."""
_OCTETS = "application/octet-stream"
_BLOCKS = IMAGE_TYPES | {PDF}  # (never sent as text, even when their bytes are UTF-8)
_NOT_TEXT = re.compile(
    "[\x00-\x07\x0b\x0e-\x1a\x1c-\x1f\ufffd]"
)  # U+FFFD, and C0 controls but \t\n\f\r\b ESC


@dataclass(frozen=True, slots=True)
class Attachment:
    """An output that is not text: `name` ("stdout", "stderr", or the file's guest path),
    its `media_type` (declared, sniffed, else application/octet-stream) and exact `data`."""

    name: str
    media_type: str
    data: bytes

    @property
    def is_image(self) -> bool:
        """A raster image (PNG, JPEG, GIF, WebP) that image content blocks carry."""
        return self.media_type in IMAGE_TYPES

    @property
    def is_pdf(self) -> bool:
        """A PDF, which Anthropic, OpenAI Responses and the frameworks take as a document."""
        return self.media_type == PDF

    @property
    def filename(self) -> str:
        """The last part of `name` ("chart.png" for "/tmp/chart.png")."""
        return self.name.rsplit("/", 1)[-1] or self.name

    def base64(self) -> str:
        """`data` as standard base64 (`+/`, padded), as provider content blocks take it."""
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        """`data:<media type>;base64,<data>`, as OpenAI's image and file inputs take it."""
        return f"data:{self.media_type};base64,{self.base64()}"


@dataclass(frozen=True, slots=True)
class Content:
    """A tool result as a model reads it: `text`, whether it reports a failure, and the
    outputs that are not text (`parts`), which the text lists by name, media type and size."""

    text: str
    is_error: bool
    parts: tuple[Attachment, ...] = ()


def result_content(result: CallResult) -> Content:
    """The text a model gets for `result`, `is_error` (True exactly when the call failed), and
    its binary outputs as `parts` for the channels that carry them.

    - Success, nothing printed, no files: the value; a string as is, anything else as JSON
      (bytes as base64, as in `CallResult.model_dump_json`).
    - Success with output: `{"value": v, "stdout": "...", "stderr": "...", "files": {...},
      "attachments": [...]}`, each key only when not empty (a WASI command's output is its
      stdout; its value is `{"exit_code": n}`).
    - Failure: `{"error": {"kind": k, "message": m}}`, with the same keys beside `"error"`
      when the guest printed anything before it failed.
    - `"files"`: output files that are text (SVG, CSV, ...) by guest path, whole.
    - `"attachments"`: one `{"name", "media_type", "size"}` per `parts` item: an image or PDF
      (declared or sniffed), or a stream or file that is binary (not UTF-8, and not mostly
      text: see `_text_view`); such a stream is then absent from `"stdout"`/`"stderr"`. A part
      of at most `INLINE_BASE64` bytes that is not an image also has `"base64"` (standard
      alphabet).
    - A value that is `bytes` of an image or PDF (sniffed, as a command's output is) is a part
      named "value", listed in `"attachments"`, and the object has no `"value"`.
    - `"truncated": true` is added to either object when stdout or stderr was cut at the
      tool's output cap (`limits.output`, which bounds streams and files together).

    JSON is compact, non-ASCII kept as is. Never raises for any `CallResult`.
    """
    extra: dict[str, Any] = {}
    parts: tuple[Attachment, ...] = ()
    shown = _value_part(result)
    if (
        result.media_types
        or result.files
        or result.stdout_bytes is not None
        or result.stderr_bytes is not None
        or shown is not None
    ):
        parts = _outputs(result, extra, shown)
    else:  # text streams only, the common case
        if result.stdout:
            extra["stdout"] = result.stdout
        if result.stderr:
            extra["stderr"] = result.stderr
    if result.truncated:
        extra["truncated"] = True
    if result.error is not None:
        error = {"kind": result.error.kind.value, "message": result.error.message}
        return Content(_json({"error": error, **extra}), True, parts)
    if shown is not None:
        return Content(_json(extra), False, parts)
    if extra:
        return Content(_json({"value": result.value, **extra}), False, parts)
    if isinstance(result.value, str):
        return Content(result.value, False)
    return Content(_json(result.value), False)


def _value_part(result: CallResult) -> Attachment | None:
    """The value as a part, when it is `bytes` of an image or PDF and the call succeeded."""
    value = result.value
    if result.error is not None or not isinstance(value, bytes):
        return None
    media_type = sniff(value)
    return Attachment("value", media_type, value) if media_type in _BLOCKS else None


def _outputs(
    result: CallResult, extra: dict[str, Any], shown: Attachment | None = None
) -> tuple[Attachment, ...]:
    """Sort the streams and files into `extra` (text) and the parts (binary, returned), and
    note the parts in `extra`; `shown`, the value as a part, first."""
    parts: list[Attachment] = [] if shown is None else [shown]
    streams = (("stdout", result.stdout, result.stdout_bytes), ("stderr", result.stderr, result.stderr_bytes))
    for stream, text, raw in streams:
        media_type = result.media_types.get(stream)
        if raw is None and media_type not in _BLOCKS:  # exact text
            if text:
                extra[stream] = text
            continue
        data = text.encode() if raw is None else raw
        view = _text_view(data, media_type)
        if view is None:
            parts.append(Attachment(stream, media_type or _OCTETS, data))
        else:
            extra[stream] = view
    files: dict[str, str] = {}
    for path, data in result.files.items():
        media_type = result.media_types.get(path)
        view = _text_view(data, media_type)
        if view is None:
            parts.append(Attachment(path, media_type or _OCTETS, data))
        else:
            files[path] = view
    if files:
        extra["files"] = files
    if parts:
        extra["attachments"] = [_note(part) for part in parts]
    return tuple(parts)


def _text_view(data: bytes, media_type: str | None) -> str | None:
    """What a model reads of an output as text, or None when it is sent as a part: UTF-8 is
    text unless it is declared or sniffed an image or PDF; other bytes are text (U+FFFD where
    not UTF-8) when their media type is textual, or when it is unknown and at most a quarter of
    the characters are U+FFFD or control characters (Latin-1 text, a stream cut mid-character
    at the output cap); else a part."""
    if media_type in _BLOCKS:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    if media_type is not None and not _textual(media_type):
        return None
    text = data.decode("utf-8", "replace")
    if media_type is not None or len(_NOT_TEXT.findall(text)) * 4 <= len(text):
        return text
    return None


def _textual(media_type: str) -> bool:
    return media_type.startswith("text/") or media_type.endswith(("+xml", "+json", "/xml", "/json"))


def _note(part: Attachment) -> dict[str, Any]:
    note: dict[str, Any] = {"name": part.name, "media_type": part.media_type, "size": len(part.data)}
    if not part.is_image and len(part.data) <= INLINE_BASE64:
        note["base64"] = part.base64()
    return note


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):  # bytes, non-string keys, NaN: pydantic's rules (as a router's)
        try:
            return pydantic_core.to_json(value, bytes_mode="base64", inf_nan_mode="null").decode()
        except pydantic_core.PydanticSerializationError:  # (not a value a guest can return)
            return json.dumps(repr(value), ensure_ascii=False)
