"""The replay index: what replay looks up per request, read from LMDB on demand.

Replay needs, for one request, the recorded answers with its key; for order notes, one recorded
session's requests; for a miss, the few recorded requests most like it. None of that needs the
whole index in memory, so start-up and memory do not grow with the store.

Each recorded exchange's entry (the `recorded` table, appended in id order, so its pages fill
whole) is a msgpack array without its id (the table's key is the id) that also carries its
request's bucket and MinHash sketch; its route and bucket, shared by most of a store, are a
4-byte reference to a row of the `index_routes` table (`route_row`: a hash of them, so that every
store names a route alike and merge copies entries as they are; a hash already taking another
route's row keeps its route inline). One LMDB table, `lookups`, holds sorted duplicates of fixed
4-byte exchange ids (big-endian, so oldest first; a store holds fewer than 2^32 exchanges) under
four kinds of key, each its kind and a `TAG`-byte hash:

  k + key         the exchanges with this request key (entries are checked for the full key)
  s + session     ... of this recorded session (sha256 of its name; entries checked for the name)
  b + bucket      ... asked on this route and model (the miss search's fallback)
  n + band        ... whose request's sketch has this band (locality-sensitive: requests that
                  share most of their content share a band)

A key shared by many exchanges costs 4 bytes per exchange (LMDB keeps the ids packed under it).
A tag shared by chance costs a read (keys and sessions are checked on their entries; a band so
shared brings a candidate whose own sketch is then compared), never a different hit.

Each entry's sketch is kept at 16 bits a minimum. The bands are taken from the full 32-bit minima
when the exchange is recorded, so a band is never shared by chance on a truncated value, and the
16-bit minima are only compared once the bands found a candidate: two different minima agree by
chance 1 time in 65,536. What a 16-bit sketch cannot give back is its bands: they live only in
`lookups`, so merge and compact copy lookup rows rather than computing them again, and a repair
(a merge killed before its lookups were in) computes the sketch again from the exchange's stored
request.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import sys
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from noisefloor.proxy.store.env import INDEX_LAYOUT

if TYPE_CHECKING:  # the store imports this module for its row layout
    from noisefloor.proxy.request.keys import CanonicalRequest
    from noisefloor.proxy.store.log import Store

VERSION = INDEX_LAYOUT  # the layout of the `recorded` entries and `lookups` rows (meta "replay_index")
_U64 = struct.Struct(">Q")
ID = struct.Struct(">I")  # an exchange id in a lookup, and an `index_routes` row's key
KEY, SESSION, BUCKET, BAND = b"k", b"s", b"b", b"n"
TAG = 5  # bytes of a hash in a lookup key (every kind: a row under a shared tag costs a read, never an answer)
LOOKUP_KEY = 1 + TAG  # bytes of a lookup's key: its kind and the tag
MERGING = "merge_lookups_from"  # meta: a merge copying lookups after the records began at this id

_HASHES = 32  # MinHash values per sketch
_ROWS = 2  # values per band: 16 bands; two requests with Jaccard J share a band with 1-(1-J^2)^16
_PRIME = (1 << 31) - 1
_MAX_FEATURES = 2048
_CHUNK = 4  # words per feature of a long string
BAND_READ = 32  # newest ids read per band
RANKED = 64  # candidates whose sketches are compared


@dataclass(frozen=True)
class RecordedEntry:
    """What replay needs to know about one recorded exchange, without loading it (the `recorded`
    table's value: `entry_bytes` writes it, `entry` reads it)."""

    id: int
    key: str
    session: str
    occurrence: int
    seq: int
    route: str  # "METHOD host path": narrows the nearest-request search on a miss
    start: float | None = None  # when the request arrived and when its answer was complete: the
    end: float | None = None  # recorded happens-before order
    deps: tuple[int, ...] = ()  # seqs (same session) of the recorded answers this request carries
    # the nearest-request index's entry, written with the exchange (its sketch stored `short`)
    near: tuple[bytes, tuple[bytes, ...], bytes] | None = None  # (bucket, bands, 32-bit sketch)


class StoredEntry(msgspec.Struct, array_like=True):
    """An entry as stored: no id (the table's key is it), the route and bucket inline or (an int)
    a reference to their `index_routes` row, the sketch `SHORT` bytes."""

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
_DECODE = msgspec.msgpack.Decoder(StoredEntry)


def decoded_entry(raw: bytes) -> StoredEntry:
    """A stored entry; ValueError (or msgspec's errors) where it is not one of this layout."""
    e = _DECODE.decode(raw)
    if e.version != VERSION:
        raise ValueError(f"a replay-index entry of layout {e.version}")
    if e.sketch is not None and len(e.sketch) != SHORT:
        raise ValueError(f"a replay-index sketch of {len(e.sketch)} bytes")
    return e


def short(sig: bytes) -> bytes:
    """A 32-bit sketch as an entry stores it: each minimum's low 16 bits (its first two bytes,
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


def entry(raw: bytes, exchange_id: int, route_of: RouteOf) -> RecordedEntry:
    """A stored entry, stored under `exchange_id` (its route from `route_of` where it names a row)."""
    e = decoded_entry(raw)
    route = route_of(e.route)[0] if isinstance(e.route, int) else _text(e.route)
    return RecordedEntry(exchange_id, e.key.hex(), _text(e.session), e.occurrence, e.seq, route, e.start, e.end,
                         e.deps)


def entry_sketch(raw: bytes, route_of: RouteOf) -> tuple[bytes, bytes] | None:
    """(bucket, sketch) an entry carries (None: its request had none). On every miss for 64
    entries: `decoded_entry` and the route written out."""
    e = _DECODE.decode(raw)
    sk, route = e.sketch, e.route
    if sk is None:
        return None
    if len(sk) != SHORT:
        raise ValueError(f"a replay-index sketch of {len(sk)} bytes")
    buck = e.bucket if route.__class__ is bytes else route_of(route)[1]  # type: ignore[arg-type]
    return None if buck is None else (buck, sk)


def moved_entry(raw: bytes) -> bytes:
    """An entry as stored, checked by decoding it (merge: it holds no id, so it moves under
    another as it is; a value that does not decode is a msgspec error or ValueError)."""
    decoded_entry(raw)
    return bytes(raw)


def lookups_of(e: StoredEntry) -> int:
    """How many rows `lookup_rows` gives an entry: key and session, then bucket and bands when
    its request had a sketch."""
    bucketed = e.bucket is not None or isinstance(e.route, int)
    return 2 + (1 + _HASHES // _ROWS if bucketed and e.sketch is not None else 0)


def entry_shape(raw: bytes) -> tuple[int, int | None]:
    """An entry's lookups count and the `index_routes` row it names (None: its route is inline)."""
    e = decoded_entry(raw)
    return lookups_of(e), e.route if isinstance(e.route, int) else None


def entry_bytes(e: RecordedEntry, ref: bytes | None = None) -> bytes:
    """The entry as the `recorded` table keeps it: its sketch `short`, its route and bucket as
    `ref`, their `index_routes` row's key, when given."""
    bucket_, _, sketch_ = e.near if e.near is not None else (None, (), None)
    route: bytes | int = _utf8(e.route) if ref is None else ID.unpack(ref)[0]
    if sketch_ is not None and len(sketch_) == _SIG.size:
        sketch_ = short(sketch_)
    return _ENCODE.encode(StoredEntry(VERSION, bytes.fromhex(e.key), _utf8(e.session), e.occurrence, e.seq, route,
                                      e.start, e.end, e.deps, None if ref is not None else bucket_, sketch_))


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


def key_tag(key: str) -> bytes:
    return KEY + bytes.fromhex(key)[:TAG]


def session_key(session: str) -> bytes:
    return SESSION + session_tag(session)[:TAG]


def lookup_rows(exchange_id: int, entry: RecordedEntry) -> Iterator[tuple[bytes, bytes]]:
    """The lookups of one recorded exchange: (key, its id), each an LMDB duplicate."""
    idb = ID.pack(exchange_id)
    yield key_tag(entry.key), idb
    yield session_key(entry.session), idb
    if entry.near is not None:
        bucket, bands, _ = entry.near
        yield BUCKET + bucket[:TAG], idb
        for band in bands:
            yield BAND + band[:TAG], idb


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
_SIG = struct.Struct(f"<{_HASHES}I")  # a sketch as computed: 32 little-endian 4-byte minima
SHORT = 2 * _HASHES  # bytes of a sketch as stored: each minimum's low 16 bits, little-endian
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


def agreement(a: bytes, others: list[bytes]) -> list[float]:
    """Estimated Jaccard similarity of sketch `a` (32-bit) with each of `others` (stored, `short`):
    the share of equal minima, compared at the stored width (16 bits)."""
    if not others:
        return []
    a = short(a)
    if "numpy" in sys.modules:  # the same shares, counted at once
        import numpy as np

        rows = np.frombuffer(b"".join(others), dtype="<u2").reshape(len(others), _HASHES)
        return ((rows == np.frombuffer(a, dtype="<u2")).sum(axis=1) / _HASHES).tolist()
    fmt = f"<{_HASHES}H"
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
    """Lookups in the store's `lookups` rows: nothing loaded up front."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._sessions: dict[str, _Session] = {}
        self._first: dict[str, int | None] = {}

    def count(self) -> int:
        return self.store.tables.count("recorded")

    def candidates(self, key: str) -> list[RecordedEntry]:
        """Recorded answers for `key`, in the order their sessions began, then occurrence."""
        found = [e for e in self.store.index.entries_by_id(self.store.index.key_ids(key)) if e.key == key]
        return sorted(found, key=lambda e: (self.first_id(e.session) or 0, e.occurrence))

    def first_id(self, session: str) -> int | None:
        """The session's first exchange id: sessions are ordered by when they began."""
        if session not in self._first:
            self._first[session] = self.store.index.session_first(session)
        return self._first[session]

    def session(self, name: str) -> _Session:
        if name not in self._sessions:
            entries = self.store.index.session_entries(name)
            self._sessions[name] = _Session(entries, {e.seq: e for e in entries})
        return self._sessions[name]

    def near(self, canonical: CanonicalRequest, route: str) -> list[Near]:
        """The recorded requests most like this one, best first (see `Near.rank`): those on the
        same route and model before the others, then by the sketch's estimated similarity, then
        in recorded order. Those the bands find, or else the newest on the route and model."""
        buck, bands, mine = sketch(canonical, route)
        hits: Counter[int] = Counter()
        for band_ids in self.store.index.bands_newest(bands, BAND_READ):
            hits.update(band_ids)
        if not hits:  # nothing shares a band: the newest on the same route and model, then any
            ids = self.store.index.bucket_newest(buck, 4)
            if ids:
                return sorted(Near(i, None, True) for i in ids)
            return sorted(Near(i, None, False) for i in self.store.index.latest_ids(4))
        pool = sorted(hits, key=lambda i: (-hits[i], i))[:RANKED]
        got = self.store.index.sketches_for(pool, buck)
        kept = [(i, s, b) for i, (s, b) in zip(pool, got) if s]
        if not kept:
            return sorted(Near(i, None, b) for i, (_, b) in zip(pool, got))[:4]
        scores = agreement(mine, [s for _, s, _ in kept])
        found = [Near(i, round(float(x), 4), b) for (i, _, b), x in zip(kept, scores)]
        return sorted(found, key=Near.rank)[:4]


def open_index(store: Store) -> LmdbIndex:
    """The store's index; refused while a merge into it has copied records but not all their
    lookups (killed: replay would miss what the merge brought)."""
    if store.meta(MERGING) is not None:
        from noisefloor.proxy.store.env import StoreError

        raise StoreError(f"store {store.path}: a merge into it was interrupted before its replay index was "
                         "complete; run the same nfproxy merge again to finish it")
    return LmdbIndex(store)

