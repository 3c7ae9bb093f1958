"""A streamed answer as its events, for finding a secret in the text they assemble to and erasing
it from the events themselves: server-sent events (`data:` JSON, OpenAI, Anthropic, Gemini with
`alt=sse`, Mistral, the Responses API), a JSON array sent piece by piece (Gemini without `alt=sse`)
and AWS's binary event-stream frames (Bedrock; InvokeModel's frames carry an Anthropic event as
base64 inside). `read` parses a body into events; `Events.rebuilt` writes the events back in the
same framing, only the changed ones re-encoded.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

Path = tuple[Any, ...]  # keys and list indices from an event's root to one string in it
AWS_CONTENT_TYPE = "application/vnd.amazon.eventstream"
_PRELUDE = struct.Struct(">II")
_CRC = struct.Struct(">I")
_MAX_EVENTS = 1 << 20  # a stream of more events than this is not read as events (its whole body is still searched)


@dataclass
class Events:
    """The parsed events of one streamed body (an SSE event whose data is not JSON is its text;
    None where another event cannot be read), and how to write them back."""

    kind: str  # "sse", "json" (an array) or "aws"
    docs: list[Any]
    _parts: list[Any] = field(default_factory=list)  # per kind: what is kept to write the events back
    changed: set[int] = field(default_factory=set)

    def set(self, i: int, path: Path, value: str) -> None:
        """Put `value` at `path` of event `i`."""
        self.docs[i] = _set(self.docs[i], path, value)
        self.changed.add(i)

    def rebuilt(self) -> bytes:
        """The body with every changed event written again, everything else byte for byte."""
        if self.kind == "json":
            return json.dumps(self.docs, ensure_ascii=False).encode("utf-8", "surrogateescape")
        if self.kind == "aws":
            return b"".join(_aws_frame(headers, _aws_payload(self.docs[i], wrapped, raw) if i in self.changed else raw)
                            for i, (headers, raw, wrapped) in enumerate(self._parts))
        lines: list[bytes] = self._parts[0]
        blocks: list[list[int]] = self._parts[1]
        for i in self.changed:
            first, *rest = blocks[i]
            end = b"\r" if lines[first].endswith(b"\r") else b""
            if i in self._parts[2]:  # a text event: a data line per line of its text
                text = self.docs[i].encode("utf-8", "surrogateescape")
                lines[first] = b"\n".join(b"data: " + part + end for part in text.split(b"\n"))
            else:
                lines[first] = b"data: " + _dumps(self.docs[i]) + end
            for n in rest:
                lines[n] = None  # type: ignore[call-overload]
        return b"\n".join(line for line in lines if line is not None)


def read(body: bytes, content_type: str | None) -> Events | None:
    """The events of a streamed body; None when it holds none this module reads."""
    if content_type and content_type.lower().startswith(AWS_CONTENT_TYPE):
        return _aws(body)
    if body.lstrip()[:1] == b"[":
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
        if isinstance(doc, list) and len(doc) <= _MAX_EVENTS:
            return Events("json", doc)
    return _sse(body)


def _sse(body: bytes) -> Events | None:
    """`data:` lines grouped by event (a blank line ends one); an event of several data lines is
    their text joined by newlines, as the SSE standard reads it."""
    lines = body.split(b"\n")
    docs: list[Any] = []
    blocks: list[list[int]] = []
    current: list[int] = []
    raw: set[int] = set()  # events whose data is not JSON: written back as text
    for n, line in enumerate([*lines, b""]):
        if line.rstrip(b"\r") == b"":
            if current:
                data = b"\n".join(_data(lines[k]) for k in current)
                try:
                    doc = json.loads(data)
                except (ValueError, RecursionError):
                    doc = None
                if not isinstance(doc, (dict, list, str)):  # a text event (`4567` is text too): a string of its own
                    raw.add(len(docs))
                    doc = data.decode("utf-8", "surrogateescape")
                docs.append(doc)
                blocks.append(current)
                current = []
                if len(blocks) > _MAX_EVENTS:
                    return None
        elif line.startswith(b"data:"):
            current.append(n)
    return Events("sse", docs, [lines, blocks, raw]) if blocks else None


def _data(line: bytes) -> bytes:
    value = line[5:].rstrip(b"\r")
    return value[1:] if value[:1] == b" " else value


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogateescape")


def _aws(body: bytes) -> Events | None:
    """AWS event-stream frames: total length, headers length, prelude CRC, headers, payload,
    message CRC. A payload `{"bytes": base64}` (InvokeModel's chunk) is read as the event it wraps."""
    parts: list[Any] = []
    docs: list[Any] = []
    pos = 0
    while pos < len(body):
        if len(body) - pos < 16 or len(parts) >= _MAX_EVENTS:
            return None
        total, head = _PRELUDE.unpack_from(body, pos)
        if total < 16 or head > total - 16 or pos + total > len(body):
            return None
        headers, payload = body[pos + 12:pos + 12 + head], body[pos + 12 + head:pos + total - 4]
        doc, wrapped = _aws_doc(payload)
        docs.append(doc)
        parts.append((headers, payload, wrapped))
        pos += total
    return Events("aws", docs, parts) if parts else None


def _aws_doc(payload: bytes) -> tuple[Any, bool | None]:
    """A frame's payload as an event, and whether it wraps one in base64 (None: not JSON, its text)."""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return payload.decode("utf-8", "surrogateescape"), None
    inner = doc.get("bytes") if isinstance(doc, dict) else None
    if isinstance(inner, str):
        try:
            return {**doc, "bytes": json.loads(base64.b64decode(inner, validate=True))}, True
        except (ValueError, RecursionError, binascii.Error):
            pass
    return doc, False


def _aws_payload(doc: Any, wrapped: bool | None, raw: bytes) -> bytes:
    if wrapped is None:  # a text payload
        return doc.encode("utf-8", "surrogateescape")
    if wrapped:
        doc = {**doc, "bytes": base64.b64encode(json.dumps(doc["bytes"], separators=(",", ":")).encode()).decode()}
    return json.dumps(doc, separators=(",", ":")).encode() if doc is not None else raw


def _aws_frame(headers: bytes, payload: bytes) -> bytes:
    prelude = _PRELUDE.pack(16 + len(headers) + len(payload), len(headers))
    prelude += _CRC.pack(zlib.crc32(prelude))
    message = prelude + headers + payload
    return message + _CRC.pack(zlib.crc32(message))


def get(doc: Any, path: Path) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _set(doc: Any, path: Path, value: str) -> Any:
    if not path:
        return value
    doc[path[0]] = _set(doc[path[0]], path[1:], value)
    return doc
