"""The replay index: what replay looks up per request, read from LMDB on demand.

Replay needs, for one request, the recorded answers with its key; for order notes, one recorded
session's requests; for a miss, the few recorded requests most like it. None of that needs the
whole index in memory, so start-up and memory do not grow with the store.

Layout 2: each recorded exchange's entry (the `recorded` table, appended in id order,
so its pages fill whole) is a msgpack array that also carries its request's bucket and MinHash
sketch; one LMDB table, `lookups`, sorted duplicates of fixed 4-byte exchange ids (big-endian, so
oldest first; a store holds fewer than 2^32 exchanges) under four kinds of key:

  k + key(first 8 bytes)   the exchanges with this request key (entries are checked for the full key)
  s + session(8)           ... of this recorded session (sha256 of its name; entries checked for the name)
  b + bucket(8)            ... asked on this route and model (the miss search's fallback)
  n + band(8)              ... whose request's sketch has this band (locality-sensitive: requests
                           that share most of their content share a band)

A key shared by many exchanges costs 4 bytes per exchange (LMDB keeps the ids packed under it),
where layout 1 paid a whole row each.

Layout 3 (store formats noisefloor-log/5 and /6): the same rows, smaller. An entry keeps no id
(its table key is the id); its route and bucket, shared by most of a store, are a 4-byte
reference to a row of the `index_routes` table (`route_row`: a hash of them, so that every store
names a route alike and merge copies entries as they are; a hash already taking another route's
row keeps its route inline); a lookup's key is its kind and 5 bytes (`TAG3`) instead of 8. A tag
shared by chance costs a read (keys and sessions are checked on their entries; a band so shared
brings a candidate whose own sketch is then compared), never a different hit. The sketch stays
32 x 32 bits: measured, keeping each minimum's low 16 bits made bands that share one true value
match by chance on the other (1 in 65,536, but per stored sketch: about 2 stray candidates a miss
at 100k, growing with the store), which changed the nearest request for 3 of 1,031 misses.

Layout 4 (`VERSION`, store format noisefloor-log/7): layout 3's rows, each entry's sketch kept
at 16 bits a minimum (64 bytes instead of 128: each entry about 30% smaller). The bands are
still taken from the full 32-bit minima when the exchange is recorded (so a band is never shared
by chance on a truncated value: the stray matches layout 3 measured), and the 16-bit minima are
only compared, once the bands found a candidate: two different minima agree by chance 1 time in
65,536, which moves a candidate's estimated similarity by 1/32 for at most 1 candidate in 2,048.
Measured on a 1M store: the same nearest request for 400 of 400 misses. What a
16-bit sketch cannot give back is its bands: they live only in `lookups`, so merge and compact
copy lookup rows rather than computing them again, and a repair (a merge killed before its
lookups were in) computes the sketch again from the exchange's stored request. A layout-4 store
may also hold layout-3 entries (merged from a noisefloor-log/6 shard as they were stored).

Layout 1 (stores recorded before; one table `rindex` of prefixed keys: k + key(32) + id,
s + session(12) + id, b + bucket + id, n + band + id, and g + id -> sketch; JSON entries) is still
read as it is, and written to by a recorder appending to such a store; `nfproxy migrate` (or
`compact`) rewrites it in today's layout. All layouts answer the same: the same ids under the
same bands, buckets, keys and sessions, the same sketches (layout 4's at 16 bits a minimum).

Stores recorded before these rows existed are indexed in memory instead (`MemoryIndex`), with
the content dependencies recomputed from their exchanges, and nothing is written to them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
import sys
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:  # the store imports this module for its row layout
    from noisefloor.proxy.request.keys import CanonicalRequest
    from noisefloor.proxy.store.log import Store

VERSION = 4
READ = (1, 2, 3, VERSION)  # the layouts this version reads
PACKED = (2, 3, VERSION)  # the layouts whose lookups are `lookups`' sorted duplicates
ROUTED = (3, VERSION)  # ... whose entries name their route by an `index_routes` row (5-byte tags)
_U64 = struct.Struct(">Q")
ID = struct.Struct(">I")  # an exchange id in a layout-2 lookup
KEY, SESSION, BUCKET, BAND, SKETCH = b"k", b"s", b"b", b"n", b"g"
TAG = 8  # bytes of a request key or session hash in a layout-2 lookup key
TAG3 = 5  # ... in a layout-3 one (every kind: a row under a shared tag costs a read, never an answer)
MERGING = "merge_lookups_from"  # meta: a merge copying lookups after the records began at this id

_HASHES = 32  # MinHash values per sketch
_ROWS = 2  # values per band: 16 bands; two requests with Jaccard J share a band with 1-(1-J^2)^16
_PRIME = (1 << 31) - 1
_MAX_FEATURES = 2048
_CHUNK = 4  # words per feature of a long string
BAND_READ = 32  # newest ids read per band
RANKED = 64  # candidates whose sketches are compared


def tag(version: int | None) -> int:
    """Bytes of a hash in a lookup key of this layout."""
    return TAG if version == 2 else TAG3


def lookup_key_bytes(version: int | None) -> int:
    return 1 + tag(version)


@dataclass(frozen=True)
class RecordedEntry:
    """What replay needs to know about one recorded exchange, without loading it (the `recorded`
    table's value: `entry_json` writes it, `entry` reads it)."""

    id: int
    key: str
    session: str
    occurrence: int
    seq: int
    route: str  # "METHOD host path": narrows the nearest-request search on a miss
    start: float | None = None  # when the request arrived and when its answer was complete: the
    end: float | None = None  # recorded happens-before order (None in stores recorded before it)
    deps: tuple[int, ...] = ()  # seqs (same session) of the recorded answers this request carries
    # the nearest-request index's entry, written with the exchange (not part of the JSON entry)
    near: tuple[bytes, tuple[bytes, ...], bytes] | None = None  # (bucket, bands, signature)


_ENTRY_REQUIRED = ("id", "key", "session", "occurrence", "seq", "route")


class _Entry(msgspec.Struct, array_like=True):
    """A layout-2 entry as stored (strings as UTF-8 bytes, lone surrogates passed through)."""

    version: int
    id: int
    key: bytes
    session: bytes
    occurrence: int
    seq: int
    route: bytes
    start: float | None
    end: float | None
    deps: tuple[int, ...]
    bucket: bytes | None
    sketch: bytes | None


class _Entry3(msgspec.Struct, array_like=True):
    """A layout-3 or -4 entry as stored: no id (the table's key is it), the route and bucket inline
    or (an int) a reference to their `index_routes` row; layout 4's sketch `SHORT` bytes."""

    version: int
    key: bytes
    session: bytes
    occurrence: int
    seq: int
    route: bytes | int
    start: float | None
    end: float | None
    deps: tuple[int, ...]
    bucket: bytes | None
    sketch: bytes | None


_ENCODE = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(_Entry)
_DECODE3 = msgspec.msgpack.Decoder(_Entry3)


_ROUTED_TAGS = (b"\x03", b"\x04")  # the version byte of a layout-3 or -4 entry (msgpack's positive fixint)


def _decoded(raw: bytes) -> _Entry | _Entry3:
    """A msgpack entry of layout 2, 3 or 4 (the array's first item is its version); ValueError if
    its sketch is not its layout's width."""
    e: _Entry | _Entry3 = _DECODE3.decode(raw) if raw[1:2] in _ROUTED_TAGS else _DECODE.decode(raw)
    if e.sketch is not None and len(e.sketch) != sketch_width(e.version):
        raise ValueError(f"a replay-index sketch of {len(e.sketch)} bytes")
    return e


def sketch_width(version: int) -> int:
    """Bytes of a sketch as an entry of this layout stores it (a layout-4 one: `SHORT`)."""
    return SHORT if version == VERSION else _SIG.size


def short(sig: bytes) -> bytes:
    """A 32-bit sketch as layout 4 stores it: each minimum's low 16 bits (its first two bytes,
    little-endian; on the record path: slices, not 32 integers)."""
    out = bytearray(SHORT)
    out[0::2], out[1::2] = sig[0::4], sig[1::4]
    return bytes(out)


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogatepass")


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


RouteOf = Callable[[int], tuple[str, bytes]]  # a store's `index_routes` row: (route, bucket); ValueError if none


def route_row(route: str, bucket_: bytes) -> tuple[bytes, bytes]:
    """(key, value) of a route and bucket's `index_routes` row: the key a hash of the value."""
    value = bucket_ + _utf8(route)
    return hashlib.blake2b(value, digest_size=4).digest(), value


def route_value(value: bytes) -> tuple[str, bytes]:
    """An `index_routes` value as (route, bucket); ValueError if it is not one."""
    if len(value) < 8:
        raise ValueError("a replay-index route row cut short")
    return _text(value[8:]), value[:8]


def _route(e: _Entry | _Entry3, route_of: RouteOf) -> tuple[str, bytes | None]:
    if isinstance(e.route, int):
        return route_of(e.route)
    return _text(e.route), e.bucket


def entry(raw: bytes, exchange_id: int, route_of: RouteOf) -> RecordedEntry:
    """A stored entry of any layout, stored under `exchange_id` (layout 1's are JSON objects;
    layouts 1 and 2 carry their id, which is the one given; layout 3's route from `route_of`)."""
    if raw[:1] == b"{":
        doc = json.loads(raw)
        return RecordedEntry(**{k: doc[k] for k in _ENTRY_REQUIRED}, start=doc.get("start"), end=doc.get("end"),
                             deps=tuple(doc.get("deps", ())))
    e = _decoded(raw)
    return RecordedEntry(e.id if isinstance(e, _Entry) else exchange_id, e.key.hex(), _text(e.session), e.occurrence,
                         e.seq, _route(e, route_of)[0], e.start, e.end, e.deps)


def entry_sketch(raw: bytes, route_of: RouteOf) -> tuple[bytes, bytes] | None:
    """(bucket, sketch) a layout-2, -3 or -4 entry carries (None: its request had none; a layout-4
    sketch is `SHORT` bytes). On every miss for 64 entries: `_decoded` and `_route` written out."""
    e = _DECODE3.decode(raw) if raw[1:2] in _ROUTED_TAGS else _DECODE.decode(raw)
    sk, route = e.sketch, e.route
    if sk is None:
        return None
    if len(sk) != sketch_width(e.version):
        raise ValueError(f"a replay-index sketch of {len(sk)} bytes")
    buck = e.bucket if route.__class__ is bytes else route_of(route)[1]  # type: ignore[arg-type]
    return None if buck is None else (buck, sk)


def moved_entry(raw: bytes, exchange_id: int) -> bytes:
    """A layout-2, -3 or -4 entry as stored, under another id (merge): checked by decoding it as the
    entry type (a value that does not decode is a msgspec.DecodeError, ValidationError or
    ValueError); layout 3's and 4's, holding no id, are copied as they are."""
    e = _decoded(raw)
    if isinstance(e, _Entry3):  # its route's row is copied with the table (`Store.adopt_index_routes`)
        return bytes(raw)
    e.id = exchange_id
    return _ENCODE.encode(e)


def as_current(raw: bytes) -> bytes:
    """A layout-3 entry as layout 4 stores it (its sketch shortened: its lookups are alike); any
    other as it is."""
    if raw[1:2] != b"\x03":
        return raw
    e = _decoded(raw)
    if not isinstance(e, _Entry3):
        return raw
    e.version = VERSION
    e.sketch = None if e.sketch is None else short(e.sketch)
    return _ENCODE.encode(e)


def lookups_of(e: _Entry | _Entry3) -> int:
    """How many rows `lookup_rows` gives an entry: key and session, then bucket and bands when
    its request had a sketch."""
    bucketed = e.bucket is not None or isinstance(e.route, int)
    return 2 + (1 + _HASHES // _ROWS if bucketed and e.sketch is not None else 0)


def entry_lookups(raw: bytes) -> int:
    return lookups_of(_decoded(raw))


def entry_shape(raw: bytes) -> tuple[int, int | None]:
    """An entry's lookups count and the `index_routes` row it names (None: its route is inline)."""
    e = _decoded(raw)
    return lookups_of(e), e.route if isinstance(e.route, int) else None


def entry_bytes(exchange_id: int, e: RecordedEntry, version: int | None, ref: bytes | None = None) -> bytes:
    """The entry as a store of this index layout keeps it (layouts 2 to 4: with its sketch, layout
    4's `short`; layouts 3 and 4: its route and bucket as `ref`, their row's key, when given)."""
    if version not in PACKED:
        return entry_json(exchange_id, e)
    bucket_, _, sketch_ = e.near if e.near is not None else (None, (), None)
    if version == 2:
        return _ENCODE.encode(_Entry(2, exchange_id, bytes.fromhex(e.key), _utf8(e.session), e.occurrence, e.seq,
                                     _utf8(e.route), e.start, e.end, e.deps, bucket_, sketch_))
    route: bytes | int = _utf8(e.route) if ref is None else ID.unpack(ref)[0]
    if version == VERSION and sketch_ is not None and len(sketch_) == _SIG.size:
        sketch_ = short(sketch_)
    return _ENCODE.encode(_Entry3(version, bytes.fromhex(e.key), _utf8(e.session), e.occurrence, e.seq, route,
                                  e.start, e.end, e.deps, None if ref is not None else bucket_, sketch_))


def entry_json(exchange_id: int, e: RecordedEntry) -> bytes:
    doc: dict[str, Any] = {"id": exchange_id, "key": e.key, "session": e.session, "occurrence": e.occurrence,
                           "seq": e.seq, "route": e.route, "start": e.start, "end": e.end}
    if e.deps:
        doc["deps"] = list(e.deps)
    return json.dumps(doc).encode()


def session_tag(session: str) -> bytes:
    return hashlib.sha256(session.encode("utf-8", "surrogateescape")).digest()[:12]


def after(prefix: bytes) -> bytes | None:
    """The smallest key above every key that starts with `prefix`."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return None


def rows_v1(exchange_id: int, entry: RecordedEntry) -> Iterator[tuple[bytes, bytes]]:
    """Layout 1's rows of one recorded exchange (a store of that layout recorded into)."""
    idb = _U64.pack(exchange_id)
    yield KEY + bytes.fromhex(entry.key) + idb, b""
    yield SESSION + session_tag(entry.session) + idb, b""
    if entry.near is not None:
        bucket, bands, sketch_bytes = entry.near
        yield BUCKET + bucket + idb, b""
        for band in bands:
            yield BAND + band + idb, b""
        yield SKETCH + idb, sketch_bytes


def key_tag(key: str, version: int | None = VERSION) -> bytes:
    return KEY + bytes.fromhex(key)[:tag(version)]


def session_key(session: str, version: int | None = VERSION) -> bytes:
    return SESSION + session_tag(session)[:tag(version)]


def lookup_rows(exchange_id: int, entry: RecordedEntry, version: int | None = VERSION) -> Iterator[tuple[bytes, bytes]]:
    """Layout 2's or 3's lookups of one recorded exchange: (key, its id), each an LMDB duplicate."""
    idb, n = ID.pack(exchange_id), tag(version)
    yield key_tag(entry.key, version), idb
    yield session_key(entry.session, version), idb
    if entry.near is not None:
        bucket, bands, _ = entry.near
        yield BUCKET + bucket[:n], idb
        for band in bands:
            yield BAND + band[:n], idb


# -- the nearest-request sketch ------------------------------------------------------------------


def indexed_route(canonical: CanonicalRequest) -> str:
    """The route a request is indexed under: "METHOD host path"."""
    return f"{canonical.method} {canonical.host} {canonical.path}"


def bucket(route: str, body: Any) -> bytes:
    model = body.get("model") if isinstance(body, dict) else None
    return hashlib.sha256(f"{route}|{model if isinstance(model, str) else ''}".encode()).digest()[:8]


# The MinHash's (a, b) pairs: fixed, since sketches written by one process are read by another
# (drawn once as `numpy.random.default_rng(20261201).integers(1 or 0, _PRIME, 32)`; a test checks it)
_A = (917594528, 1431606922, 495468044, 120644322, 1160987411, 834415267, 716424181, 758740233, 1790575344,
      1338064477, 893892222, 332683070, 920026888, 754013510, 1798385883, 1064283169, 137422017, 403642013,
      1891238790, 1078611062, 513887166, 174450998, 1330963835, 520958413, 202746379, 617979687, 670929981,
      1996169635, 810212870, 1103327289, 1904597908, 436735895)
_B = (2119253654, 1115689071, 1455360172, 1156079090, 1064680245, 1430009448, 1629810886, 896589773, 2137624838,
      1539244850, 883014253, 1143942708, 1203318372, 632016368, 2002738074, 742244558, 782102548, 900954583,
      1604013398, 1705916142, 341563855, 1765437306, 1474081769, 1433842241, 1150346897, 1016003382, 1416561790,
      577416553, 2053460888, 552361298, 726460660, 1941780096)
_SIG = struct.Struct(f"<{_HASHES}I")  # a sketch as computed (and stored by layouts 1-3): 32 little-endian 4-byte minima
SHORT = 2 * _HASHES  # bytes of a layout-4 sketch as stored: each minimum's low 16 bits, little-endian
# Up to this many features a signature is computed in plain Python (~32 operations a feature)
# unless numpy is already loaded; above, with numpy, whose import (~0.2 CPU-s a process) is paid
# only where bodies are large. The two give the same values (a test checks both).
SMALL = 16


def _signature(features: Iterable[int]) -> tuple[int, ...]:
    """The MinHash signature (32 minima) of a set of feature hashes (< 2^32: exact in uint64 too)."""
    xs = list(features)
    if len(xs) <= SMALL and "numpy" not in sys.modules:
        return _signature_python(xs)
    return _signature_numpy(xs)


def _signature_python(xs: list[int]) -> tuple[int, ...]:
    """The signature with the 32 hash functions side by side in one integer (a 64-bit lane each:
    a*x + b < 2^64), so a feature costs ~20 big-integer operations instead of 32 of each kind:
    the record path computes one per request. `% _PRIME` is done as a Mersenne fold, the minimum
    with a borrow bit per lane (values stay below 2^32, so no lane spills into the next)."""
    low = None
    for x in xs:
        y = _PA * x + _PB
        r = (y & _LP) + ((y >> 31) & _L33)
        r = (r & _LP) + ((r >> 31) & _L33)  # below 2^31 + 8: at most one _PRIME too many
        r -= ((r + _LC) >> 40 & _L1) * _PRIME
        if low is None:
            low = r
        else:  # the lanes where low >= r take r's value
            low ^= (low ^ r) & ((((low | _LH) - r) >> 63 & _L1) * 0xFFFFFFFF)
    if low is None:
        raise ValueError("min() arg is an empty sequence")
    return _LANES.unpack(low.to_bytes(8 * _HASHES, "little"))[::2]


def _lanes(values: Iterable[int]) -> int:
    return sum(v << (64 * i) for i, v in enumerate(values))


_PA, _PB = _lanes(_A), _lanes(_B)
_LP, _L33, _L1, _LH = (_lanes([v] * _HASHES) for v in (_PRIME, (1 << 33) - 1, 1, 1 << 63))
_LC = _lanes([(1 << 40) - _PRIME] * _HASHES)  # bit 40 of r + this is set where r >= _PRIME
_LANES = struct.Struct(f"<{2 * _HASHES}I")


def _signature_numpy(xs: list[int]) -> tuple[int, ...]:
    a, b = _numpy_hashes()
    import numpy as np

    return tuple(((a * np.array(xs, dtype=np.uint64) + b) % _PRIME).min(axis=1).tolist())


@functools.cache
def _numpy_hashes() -> tuple[Any, Any]:
    """The (a, b) pairs as uint64 columns, made once."""
    import numpy as np

    return np.array(_A, dtype=np.uint64)[:, None], np.array(_B, dtype=np.uint64)[:, None]


@functools.lru_cache(maxsize=8192)
def _long_string(path: str, value: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A long string's features (the whole leaf, then each run of `_CHUNK` words, so that a changed
    word keeps most of a long message's features) and their signature. Cached: a conversation's
    next request repeats its earlier messages and the system prompt at the same paths, so only the
    new turn is hashed (a signature is the minimum over features: parts combine by minimum)."""
    crc, join = zlib.crc32, " ".join
    words = value.split()
    seed = crc(path.encode())
    feats = [crc(f"{path}={value}".encode("utf-8", "surrogatepass"))]
    feats.extend(crc(join(words[i:i + _CHUNK]).encode("utf-8", "surrogatepass"), seed)
                 for i in range(0, min(len(words), _CHUNK * (_MAX_FEATURES - 1)), _CHUNK))
    return tuple(feats), _signature(feats)


class _Features:
    """Hashes of (path, leaf) for every leaf of a JSON body, at most `_MAX_FEATURES` in all (the
    first, in document order); long strings that fit whole contribute their cached signature."""

    def __init__(self, route: str) -> None:
        self.loose = [zlib.crc32(route.encode())]
        self.parts: list[tuple[int, ...]] = []
        self.whole: list[tuple[int, ...]] = []  # the features behind `parts`
        self.count = 1

    def walk(self, value: Any, path: str) -> None:
        if self.count >= _MAX_FEATURES:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                self.walk(v, f"{path}/{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                self.walk(v, f"{path}/{i}")
        elif isinstance(value, str) and len(value) > 40:
            feats, sig = _long_string(path, value)
            room = _MAX_FEATURES - self.count
            if len(feats) <= room:
                self.parts.append(sig)
                self.whole.append(feats)
            else:
                self.loose.extend(feats[:room])
            self.count += min(len(feats), room)
        else:
            text = f"{path}={value}" if isinstance(value, str) else f"{path}={value!r}"
            self.loose.append(zlib.crc32(text.encode("utf-8", "surrogatepass")))
            self.count += 1

    def signature(self) -> tuple[int, ...]:
        sig = _signature(set(self.loose))
        return tuple(map(min, zip(sig, *self.parts))) if self.parts else sig


def features(canonical: CanonicalRequest, route: str) -> set[int]:
    """What the sketch summarizes: their exact Jaccard similarity is what two sketches estimate."""
    feats = _Features(route)
    feats.walk(canonical.body, "")
    return set(feats.loose).union(*feats.whole)


def jaccard(a: set[int], b: set[int]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def sketch(canonical: CanonicalRequest, route: str) -> tuple[bytes, tuple[bytes, ...], bytes]:
    """(bucket, bands, sketch bytes) of a request's canonical form."""
    feats = _Features(route)
    feats.walk(canonical.body, "")
    sig = _SIG.pack(*feats.signature())
    buck = bucket(route, canonical.body)
    return buck, bands(buck, sig), sig


def bands(buck: bytes, sig: bytes) -> tuple[bytes, ...]:
    """The locality-sensitive bands of a sketch (`_ROWS` values each) within its bucket."""
    step = 4 * _ROWS
    start = hashlib.blake2b(buck, digest_size=8)  # the bucket hashed once, each band continuing from it
    out = []
    for i in range(_HASHES // _ROWS):
        h = start.copy()
        h.update(_BAND_TAGS[i] + sig[i * step:(i + 1) * step])
        out.append(h.digest())
    return tuple(out)


_BAND_TAGS = [bytes([i]) for i in range(_HASHES // _ROWS)]


class ShortSketch(ValueError):
    """A layout-4 entry's sketch, whose bands cannot be computed again from it (they are in `lookups`)."""


def stored_near(store: Store, ids: list[int]) -> list[tuple[bytes, tuple[bytes, ...], bytes] | None]:
    """The nearest-request entries of recorded exchanges as their store holds them (None for one
    without: a body that is not JSON), to write them again elsewhere (merge, compact): the sketch
    and its bucket, the bands computed again from both. `ShortSketch` for a layout-4 entry."""
    if not store.has_replay_index():
        return [None] * len(ids)
    out = []
    for got in store.stored_sketches(ids):
        if got is not None and len(got[1]) != _SIG.size:
            raise ShortSketch("a layout-4 sketch keeps 16 bits a minimum: its bands are only in the store's lookups")
        out.append(None if got is None else (got[0], bands(got[0], got[1]), got[1]))
    return out


def agreement(a: bytes, others: list[bytes]) -> list[float]:
    """Estimated Jaccard similarity of sketch `a` (32-bit) with each of `others`: the share of
    equal minima, compared at each stored sketch's width (a layout-4 one's low 16 bits)."""
    if not others:
        return []
    if all(len(o) == SHORT for o in others):
        a, fmt = short(a), f"<{_HASHES}H"
    elif all(len(o) == _SIG.size for o in others):
        fmt = _SIG.format
    else:  # a layout-4 store holding layout-3 entries (merged from an older shard): each at its width
        return [agreement(a, [o])[0] for o in others]
    if "numpy" in sys.modules:  # the same shares, counted at once
        import numpy as np

        dtype = "<u2" if fmt.endswith("H") else "<u4"
        rows = np.frombuffer(b"".join(others), dtype=dtype).reshape(len(others), _HASHES)
        return ((rows == np.frombuffer(a, dtype=dtype)).sum(axis=1) / _HASHES).tolist()
    mine = struct.unpack(fmt, a)
    return [sum(x == y for x, y in zip(mine, struct.unpack(fmt, o))) / _HASHES for o in others]


# -- the two index kinds -------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Near:
    """A recorded request the miss search found: its id, the sketch's estimate of how much of its
    content it shares with the asked request (None: not estimated), and whether it was asked on
    the same route and model."""

    id: int
    score: float | None
    same_route_model: bool

    def rank(self) -> tuple[bool, float, int]:
        """Sort key, best first; equal estimates fall back to recorded order (the smaller id)."""
        return (not self.same_route_model, -(self.score or 0.0), self.id)


@dataclass
class _Session:
    """One recorded session's requests, for order notes and for which requests a miss affects."""

    entries: list[RecordedEntry]
    by_seq: dict[int, RecordedEntry]

    @functools.cached_property
    def by_key(self) -> dict[str, list[RecordedEntry]]:
        """Its requests by key, each key's in occurrence order: the candidates when this session
        alone answers a replay (`replay_from`), without reading every exchange of the key."""
        out: dict[str, list[RecordedEntry]] = defaultdict(list)
        for e in sorted(self.entries, key=lambda e: e.occurrence):
            out[e.key].append(e)
        return dict(out)


class LmdbIndex:
    """Lookups in the store's `rindex` rows: nothing loaded up front."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sessions: dict[str, _Session] = {}
        self._first: dict[str, int | None] = {}

    def count(self) -> int:
        return self.store.recorded_count()

    def candidates(self, key: str) -> list[RecordedEntry]:
        """Recorded answers for `key`, in the order their sessions began, then occurrence."""
        found = [e for e in self.store.recorded_entries_by_id(self.store.key_ids(key)) if e.key == key]
        return sorted(found, key=lambda e: (self.first_id(e.session) or 0, e.occurrence))

    def first_id(self, session: str) -> int | None:
        """The session's first exchange id: sessions are ordered by when they began."""
        if session not in self._first:
            self._first[session] = self.store.session_first(session)
        return self._first[session]

    def session(self, name: str) -> _Session:
        if name not in self._sessions:
            entries = self.store.session_entries(name)
            self._sessions[name] = _Session(entries, {e.seq: e for e in entries})
        return self._sessions[name]

    def near(self, canonical: CanonicalRequest, route: str) -> list[Near]:
        """The recorded requests most like this one, best first (see `Near.rank`): those on the
        same route and model before the others, then by the sketch's estimated similarity, then
        in recorded order. Those the bands find, or else the newest on the route and model."""
        buck, bands, mine = sketch(canonical, route)
        hits: Counter[int] = Counter()
        for found in self.store.bands_newest(bands, BAND_READ):
            hits.update(found)
        if not hits:  # nothing shares a band: the newest on the same route and model, then any
            ids = self.store.bucket_newest(buck, 4)
            if ids:
                return sorted(Near(i, None, True) for i in ids)
            return sorted(Near(i, None, False) for i in self.store.latest_recorded_ids(4))
        pool = sorted(hits, key=lambda i: (-hits[i], i))[:RANKED]
        got = self.store.sketches_for(pool, buck)
        kept = [(i, s, b) for i, (s, b) in zip(pool, got) if s]
        if not kept:
            return sorted(Near(i, None, b) for i, (_, b) in zip(pool, got))[:4]
        scores = agreement(mine, [s for _, s, _ in kept])
        found = [Near(i, round(float(x), 4), b) for (i, _, b), x in zip(kept, scores)]
        return sorted(found, key=Near.rank)[:4]


class MemoryIndex:
    """A store without index rows (recorded before them): indexed in memory, dependencies
    recomputed from its exchanges; the store is not written."""

    def __init__(self, store: Store, rules: Any) -> None:
        from noisefloor.proxy.request.dependencies import recompute

        entries = list(store.recorded_entries())
        deps = recompute(store, rules, entries) if not any(e.deps for e in entries) else {}
        if deps:
            from dataclasses import replace

            entries = [replace(e, deps=deps.get(e.id, ())) for e in entries]
        self._entries = entries
        first: dict[str, int] = {}
        by_session: dict[str, list[RecordedEntry]] = defaultdict(list)
        for e in entries:
            first.setdefault(e.session, e.id)
            by_session[e.session].append(e)
        self._firsts = first
        self._by_key: dict[str, list[RecordedEntry]] = defaultdict(list)
        for e in sorted(entries, key=lambda e: (first[e.session], e.occurrence)):
            self._by_key[e.key].append(e)
        self._sessions = {n: _Session(lst, {e.seq: e for e in lst}) for n, lst in by_session.items()}

    def count(self) -> int:
        return len(self._entries)

    def candidates(self, key: str) -> list[RecordedEntry]:
        return self._by_key.get(key, [])

    def first_id(self, session: str) -> int | None:
        return self._firsts.get(session)

    def session(self, name: str) -> _Session:
        return self._sessions.get(name) or _Session([], {})

    def near(self, canonical: CanonicalRequest, route: str) -> list[Near]:
        """The newest distinct requests on the same route (or any): a scan, as before the index;
        the caller compares each with the request."""
        latest: dict[str, RecordedEntry] = {}
        for e in self._entries:
            latest[e.key] = e
        pool = [e for e in latest.values() if e.route == route]
        same = bool(pool)
        return sorted(Near(e.id, None, same) for e in (pool or list(latest.values()))[-RANKED:])


def open_index(store: Store, rules: Any) -> LmdbIndex | MemoryIndex:
    """The store's index; refused while a merge into it has copied records but not all their
    lookups (killed: replay would miss what the merge brought)."""
    if store.meta(MERGING) is not None:
        from noisefloor.proxy.store.env import StoreError

        raise StoreError(f"store {store.path}: a merge into it was interrupted before its replay index was "
                         "complete; run the same nfproxy merge again to finish it")
    return LmdbIndex(store) if store.has_replay_index() else MemoryIndex(store, rules)

