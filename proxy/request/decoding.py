"""Undo Content-Encoding with a cap on the decoded size, enforced while decoding.

A body is written by whoever sent it: 1.6 kB of brotli can decode to a gigabyte. Every decoder
here stops as soon as its output passes `limit` bytes, so a bomb costs at most the cap plus one
step of output, never the size it claims.
"""

from __future__ import annotations

import io
import zlib

import brotli
import zstandard

from noisefloor.errors import InputError

DEFAULT_LIMIT = 64 << 20  # bytes of decoded body, per body
_BROTLI_STEP = 64  # compressed bytes fed per step: brotli 1.1 (mitmproxy's pin) has no output cap


class BodyTooLarge(InputError):
    """The decoded body would pass the cap."""

    def __init__(self, limit: int, encoding: str | None = None) -> None:
        how = f" after undoing Content-Encoding {encoding}" if encoding else ""
        super().__init__(f"body larger than {limit >> 20} MiB{how}; raise --max-body-mb if this is legitimate")
        self.limit = limit


def decode(raw: bytes, content_encoding: str | None, limit: int = DEFAULT_LIMIT) -> bytes:
    """`raw` with every listed encoding undone (last applied first). Raises BodyTooLarge past
    `limit`, InputError (or a decoder's own error) on a body that is not what it claims to be."""
    if len(raw) > limit:
        raise BodyTooLarge(limit)
    if not raw or not content_encoding:
        return raw
    data = raw
    for enc in reversed([e.strip().lower() for e in content_encoding.split(",") if e.strip()]):
        data = _decode_one(data, enc, limit)
        if len(data) > limit:
            raise BodyTooLarge(limit, content_encoding)
    return data


def decode_body(raw: bytes, content_encoding: str | None, limit: int = DEFAULT_LIMIT) -> tuple[bytes, str | None]:
    """Undo Content-Encoding so that compression never reaches the key.

    Returns the decoded bytes and a note when decoding was impossible or the decoded body would
    pass `limit` (the raw bytes are then keyed as they are, which is still deterministic).
    """
    if not raw or not content_encoding:
        return raw, None
    try:
        return decode(raw, content_encoding, limit), None
    except BodyTooLarge as exc:
        return raw, f"{exc}; keyed on raw bytes"
    except Exception as exc:  # noqa: BLE001 - any decoder failure falls back to raw bytes
        return raw, f"body not decodable as {content_encoding!r} ({exc.__class__.__name__}); keyed on raw bytes"


def _decode_one(data: bytes, enc: str, limit: int) -> bytes:
    if enc in ("identity", ""):
        return data
    if enc in ("gzip", "x-gzip"):
        return _zlib(data, 16 + zlib.MAX_WBITS, limit, members=True)
    if enc == "deflate":
        try:
            return _zlib(data, zlib.MAX_WBITS, limit)
        except zlib.error:
            return _zlib(data, -zlib.MAX_WBITS, limit)
    if enc == "br":
        return _brotli(data, limit)
    if enc == "zstd":
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as reader:
            out = reader.read(limit + 1)
        if len(out) > limit:
            raise BodyTooLarge(limit, enc)
        return out
    raise InputError(f"unknown content-encoding {enc}")


class _Sink:
    """Decoded pieces, counted as they come: past the limit it raises, before any copy is made."""

    def __init__(self, limit: int, enc: str) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.enc = enc

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self.size > self.limit:
            self.parts.clear()
            raise BodyTooLarge(self.limit, self.enc)
        self.parts.append(piece)

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def _zlib(data: bytes, wbits: int, limit: int, members: bool = False) -> bytes:
    sink = _Sink(limit, "gzip" if members else "deflate")
    while data:
        d = zlib.decompressobj(wbits)
        sink.add(d.decompress(data, limit + 1 - sink.size))
        if not d.eof:
            if d.unconsumed_tail:  # stopped at max_length: more output than the limit allows
                raise BodyTooLarge(limit, sink.enc)
            raise zlib.error("truncated stream")
        data = d.unused_data if members else b""
    return sink.bytes()


def _brotli(data: bytes, limit: int) -> bytes:
    d = brotli.Decompressor()
    sink = _Sink(limit, "br")
    for i in range(0, len(data), _BROTLI_STEP):
        sink.add(d.process(data[i:i + _BROTLI_STEP]))
    if not d.is_finished():
        raise brotli.error("truncated stream")
    return sink.bytes()
