"""How a value is stored: tagged, zstd-compressed with a dictionary the store trained on its own
traffic, and read back only within a size bound.

LLM request and response bodies are small JSON documents that repeat one another's structure
(field names, roles, model names, the system prompt); compressed one at a time they shrink less
than 2x, because each frame starts from nothing. A dictionary trained on the store's first
exchanges gives every frame that shared start. The stored value says how it was written:

  0x00 + bytes                    stored as is (tiny, or incompressible)
  0x01 + zstd frame               compressed with the dictionary its frame header names by zstd's
                                  dictionary id (the `dicts` table's key), or none (id 0)
  0x03 + n + n sha256 + frame     compressed against other stored bodies (their bytes, in order,
                                  as a raw-content dictionary): a request against the previous
                                  request and answer of its session, which it mostly repeats

Every frame carries zstd's content checksum (XXH64 of what it holds, checked as it decompresses):
a damaged frame, or one decompressed with a dictionary other than its own, is refused, never
misread (a body is also hashed against its sha256 on every read, a record's bytes against its
head's CRC). A value copied to another store (merge) stays readable once its dictionary is copied
with it, under the same id: merge refuses shards whose ids name different dictionaries. Decoding
refuses a frame that declares, or turns out to hold, more than the caller's bound: a compressed
bomb in a store costs no more than on the wire.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

import zstandard

from noisefloor.errors import InputError, NoisefloorError

RAW, FRAME, REF = 0, 1, 3
KEY_SIZE = 4  # a dictionary's key: its zstd dictionary id, big-endian
_FRAMED = bytes([FRAME])
LEVEL = 3
DICT_SIZE = 64 << 10  # bytes; trained on about 100-200x as much sample data
_TINY = 24  # shorter values are not worth a frame header
BATCH_ITEM = 1 << 20  # `decode_many` decompresses frames declaring up to this together, one call for many
BATCH_BYTES = 32 << 20  # and at most about this much in one batch (memory stays bounded)


class TooLarge(InputError):
    """A stored value that would decompress to more than its bound (`declared`: the size its frame
    declares, when it declares one)."""

    def __init__(self, message: str, declared: int | None = None) -> None:
        super().__init__(message)
        self.declared = declared


class UnknownDictionary(NoisefloorError, KeyError):
    """A value names a dictionary the store does not hold."""


def dict_key(data: bytes) -> bytes:
    """The key of a dictionary (its zstd id; zero for bytes that are not a zstd dictionary)."""
    return zstandard.ZstdCompressionDict(data).dict_id().to_bytes(KEY_SIZE, "big")


def _key(dict_id: int) -> bytes:
    """The key of the dictionary a frame names by `dict_id` (b"": none)."""
    return dict_id.to_bytes(KEY_SIZE, "big") if dict_id else b""


def train(samples: list[bytes], size: int = DICT_SIZE) -> bytes | None:
    """A dictionary for values like `samples`, or None when they are too few or too alike to train on.
    Fixed fastCover parameters: the parameter search of the default costs seconds, on the record path.
    Its id is drawn at random (zstd's own range): a dictionary trained again gets another."""
    if len(samples) < 64:
        return None
    size = min(size, max(4096, sum(map(len, samples)) // 16))
    try:
        given: list[Any] = list(samples)
        dict_id = 32768 + secrets.randbelow((1 << 31) - 65536)
        return zstandard.train_dictionary(size, given, k=200, d=8, dict_id=dict_id).as_bytes()
    except zstandard.ZstdError:
        return None


class Against:
    """A compressor against the bytes of stored bodies `refs` ((sha256, bytes), at most 255), made
    before the value it compresses is known: creating it is most of the cost of compressing a
    request against its session's last exchange, so a recorder makes it while idle."""

    def __init__(self, refs: Sequence[tuple[bytes, bytes]]) -> None:
        # level 1: what the references leave is short; loading them into a level-3 matcher costs more
        self._c = zstandard.ZstdCompressor(level=1, dict_data=_raw_dict(b"".join(b for _, b in refs)),
                                           write_checksum=True)
        self._head = bytes([REF, len(refs)]) + b"".join(d for d, _ in refs)

    def encode(self, data: bytes) -> bytes:
        return self._head + self._c.compress(data)

    def warmed(self) -> Against:
        """Itself, its first frame's set-up (the context's tables, the references loaded) done: a
        value compressed next costs a fraction of the first (the bytes are the same either way)."""
        self._c.compress(b"{}")
        return self


class Codec:
    """Encoder and bounded decoder for one store; `load` fetches a dictionary by key (None if absent)."""

    def __init__(self, load: Callable[[bytes], bytes | None], level: int = LEVEL) -> None:
        self._load = load
        self._level = level  # what `encode` compresses at (decoding is as fast whatever it was)
        self._plain_c = zstandard.ZstdCompressor(level=level, write_checksum=True)
        self._plain_d = zstandard.ZstdDecompressor()
        self._c: dict[bytes, zstandard.ZstdCompressor] = {}
        self._d: dict[bytes, zstandard.ZstdDecompressor] = {}

    def encode(self, data: bytes, key: bytes | None = None) -> bytes:
        if len(data) < _TINY:
            return bytes([RAW]) + data
        frame = (self._plain_c if key is None else self._compressor(key)).compress(data)
        return bytes([RAW]) + data if len(frame) >= len(data) else _FRAMED + frame

    @staticmethod
    def refs_of(value: bytes) -> list[bytes]:
        """The sha256 digests of the bodies a stored value is compressed against (none for most)."""
        if value[:1] != bytes([REF]):
            return []
        n = value[1]
        return [bytes(value[2 + 32 * i:34 + 32 * i]) for i in range(n)]

    def decode(self, value: bytes, limit: int, resolve: Callable[[bytes], bytes] | None = None) -> bytes:
        """The stored bytes, at most `limit` of them (TooLarge beyond; zstd errors on damage).
        `resolve` gives a referenced body's bytes, verified, for values compressed against others."""
        tag = value[0] if value else None
        if tag == REF:
            if resolve is None:
                raise ValueError("a value compressed against other bodies, read without them")
            refs = self.refs_of(value)
            prefix = b"".join([resolve(d) for d in refs])
            frame = value[2 + 32 * len(refs):]
            fast = _against_prefix(frame, prefix, limit)
            if fast is not None:
                return fast
            return _bounded(zstandard.ZstdDecompressor(dict_data=_raw_dict(prefix)), frame, limit)
        if tag == RAW:
            if len(value) - 1 > limit:
                raise TooLarge(f"{len(value) - 1} bytes, more than the {limit} allowed")
            return bytes(value[1:])
        if tag == FRAME:
            frame = value[1:]
            return _bounded(self._decompressor(_key(zstandard.get_frame_parameters(frame).dict_id)), frame, limit)
        raise ValueError(f"unknown value encoding {tag!r}")

    def decode_many(self, values: Sequence[bytes], limit: int) -> list[bytes | None]:
        """`decode` of each value (None where it raises: the caller reads that one alone to say
        why). Frames of one dictionary, each declaring a size within `limit` and `BATCH_ITEM`, are
        decompressed in one call (`multi_decompress_to_buffer`: a third of the CPU of a call each,
        for values of a few kB); the others, and the frames of a call that fails, one at a time."""
        out: list[bytes | None] = [None] * len(values)
        groups: dict[int, list[int]] = {}
        bound, total = min(limit, BATCH_ITEM), 0
        for i, params in enumerate(list(map(_params, values))):
            if params is not None and 0 <= params.content_size <= bound and total < BATCH_BYTES:
                groups.setdefault(params.dict_id, []).append(i)
                total += params.content_size
            else:
                out[i] = self._decoded_or_none(values[i], limit)
        for dict_id, where in groups.items():
            try:
                frames: list[Any] = [values[i][1:] for i in where]
                buffers: Any = self._decompressor(_key(dict_id)).multi_decompress_to_buffer(frames, threads=1)
                texts = [t.tobytes() for t in buffers]
            except Exception:  # a frame that is not what it declares: each read alone, to find which
                texts = [self._decoded_or_none(values[i], limit) for i in where]
            for i, text in zip(where, texts, strict=True):
                out[i] = text
        return out

    def _decoded_or_none(self, value: bytes, limit: int) -> bytes | None:
        try:
            return self.decode(value, limit)
        except Exception:  # whatever it is, the caller's own read of this value says it
            return None

    def dictionary_of(self, value: bytes) -> bytes | None:
        """The key of the dictionary a stored value needs, if any (merge copies it along)."""
        params = _params(value)
        return _key(params.dict_id) or None if params is not None else None

    def _dict(self, key: bytes) -> zstandard.ZstdCompressionDict:
        data = self._load(key)
        if data is None:
            raise UnknownDictionary(f"compression dictionary {key.hex()} is missing")
        return zstandard.ZstdCompressionDict(data)

    def _compressor(self, key: bytes) -> zstandard.ZstdCompressor:
        c = self._c.get(key)
        if c is None:
            d = self._dict(key)
            d.precompute_compress(level=self._level)  # else every frame loads the dictionary again
            c = self._c[key] = zstandard.ZstdCompressor(level=self._level, dict_data=d, write_checksum=True)
        return c

    def _decompressor(self, key: bytes) -> zstandard.ZstdDecompressor:
        if not key:
            return self._plain_d
        d = self._d.get(key)
        if d is None:
            d = self._d[key] = zstandard.ZstdDecompressor(dict_data=self._dict(key))
        return d


def _raw_dict(prefix: bytes) -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(prefix, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def sound_as_stored(value: bytes, limit: int) -> bool:
    """Whether a stored body's frame declares a size within `limit`: merge's check of a body whose
    content it hashed already (`verify_bodies`), without decompressing it again (a raw one is
    hashed again, which costs no decompression; what every body decompresses to is still hashed
    and bounded on every read)."""
    at = 1 if value[:1] == _FRAMED else 2 + 32 * value[1] if value[:1] == bytes([REF]) and len(value) > 1 else 0
    try:
        return bool(at) and 0 <= zstandard.frame_content_size(value[at:]) <= limit
    except zstandard.ZstdError:  # not a frame
        return False


_reused = threading.local()  # one zstd decompression context per thread, for values compressed against others


def _against_prefix(frame: bytes, prefix: bytes, limit: int) -> bytes | None:
    """`frame` decompressed with `prefix` as its raw-content dictionary in a context reused across
    calls (zstandard's cffi backend; None where it is absent or the frame declares no size: the
    caller builds a decompressor, whose context alone costs most of a request body's read and of
    merge's check). Bounded as `_bounded` is: the declared size is checked first."""
    lib = _cffi()
    if lib is None:
        return None
    declared = zstandard.frame_content_size(frame)
    if declared > limit:
        raise TooLarge(f"declares {declared} bytes, more than the {limit} allowed", declared)
    if declared < 0:
        return None
    dctx = getattr(_reused, "dctx", None)
    if dctx is None:
        dctx = _reused.dctx = _FFI.gc(lib.ZSTD_createDCtx(), lib.ZSTD_freeDCtx)
    out, src = bytearray(declared), frame if type(frame) is bytes else _FFI.from_buffer(frame)  # a memoryview: LMDB's
    got = lib.ZSTD_decompress_usingDict(dctx, _FFI.from_buffer(out), declared, src, len(frame), prefix, len(prefix))
    if lib.ZSTD_isError(got) or got != declared:  # damage: a frame that is not what it declares
        raise zstandard.ZstdError("a value compressed against other bodies does not decompress (damaged)")
    return bytes(out)


_FFI: Any = None
_LIB: Any = False  # not looked up yet


def _cffi() -> Any:
    """zstandard's cffi bindings (its C library's own calls), or None where cffi is not installed."""
    global _FFI, _LIB
    if _LIB is False:
        try:
            from zstandard import backend_cffi
            _FFI, _LIB = backend_cffi.ffi, backend_cffi.lib
        except ImportError:
            _LIB = None
    return _LIB


def _params(value: bytes) -> Any:
    """The frame parameters of a FRAME value (None: not a frame)."""
    if value[:1] != _FRAMED:
        return None
    try:
        return zstandard.get_frame_parameters(value[1:])
    except zstandard.ZstdError:
        return None


def _bounded(dctx: zstandard.ZstdDecompressor, frame: bytes, limit: int) -> bytes:
    """Decompress at most `limit` bytes. A frame's declared size is what one-shot decompression
    allocates (whatever max_output_size says), so it is checked first; a frame without one is
    read as a stream, one byte past the limit at most."""
    declared = zstandard.frame_content_size(frame)
    if declared > limit:
        raise TooLarge(f"declares {declared} bytes, more than the {limit} allowed", declared)
    if declared >= 0:
        return dctx.decompress(frame)
    with dctx.stream_reader(frame) as reader:
        out = bytearray()
        while len(out) <= limit:
            chunk = reader.read(min(1 << 20, limit + 1 - len(out)))
            if not chunk:
                return bytes(out)
            out += chunk
    raise TooLarge(f"holds more than the {limit} bytes allowed")
