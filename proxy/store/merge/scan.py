"""Merge's check of a shard, through its heads (a part of Store): what merge needs of each
exchange (its session and identity, the bodies it names), every record and body verified.

A record was checked against the record type when its head was written, and its head carries a
CRC-32 of the record as stored (`store_heads`): a record whose bytes still match its checked
head is decompressed and read for the few fields merge needs, not parsed whole, as `nfproxy log
--json` trusts it (its identity read from its head, its bodies from the rest). Anything else (no head, a head that fails its CRC or
was not written from a checked record, bytes that are not those the head was written for, a
text the narrow read refuses) takes the full parse, which names what is damaged. Every body is
checked as a reader checks it (present, within its recorded size, hashing to its digest).
"""

from __future__ import annotations

import struct
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from hashlib import sha256
from typing import TYPE_CHECKING, Any

import lmdb
import msgspec

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store.env import DAMAGE, StoreError
from noisefloor.proxy.store.exchange import NOT_LISTED

if TYPE_CHECKING:
    from noisefloor.proxy.store.log import Store

_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
_RECENT = 4096  # decoded bodies kept while checking (refs and repeats) ...
_RECENT_BYTES = 64 << 20  # ... and at most this many bytes of them
Identity = tuple[str, str, str, int, int, float]  # session, mode, key, occurrence, seq, time (`merge_sessions.identity_hash`)


class _Body(msgspec.Struct, gc=False):
    body: str | None = None
    body_size: int | None = None


class _Identity(msgspec.Struct, gc=False):
    """The fields merge reads of a record whose head vouches for its type (unknown keys skipped)."""

    id: int
    time: float
    mode: str
    session: str
    key: str
    occurrence: int
    seq: int
    request: _Body
    response: _Body | None


class _Rest(msgspec.Struct, gc=False):
    """What merge reads of a /5 record stored stripped (its identity is in its head)."""

    seq: int
    request: _Body
    response: _Body | None


_VIEW = msgspec.json.Decoder(_Identity)
_REST = msgspec.json.Decoder(_Rest)
_STORED = msgspec.msgpack.Decoder(store_heads.Stored)


def checked_value(k: bytes, value: Any, raw: Any) -> bool:
    """Whether head `value` of exchange key `k` passes its CRC, is tied to the record's stored
    bytes `raw`, and was written from a record checked against the record type."""
    if value is None or len(value) < store_heads.HEAD_AT:
        return False
    crc, u32 = zlib.crc32, _U32.unpack_from
    if u32(value)[0] != crc(value[4:], crc(k)) or u32(value, 4)[0] != crc(raw):
        return False
    try:
        return store_heads.left_out(value) != NOT_LISTED
    except (msgspec.ValidationError, msgspec.DecodeError):
        return False


class _Recent:
    """Verified bodies, oldest first, bounded in count and bytes (first in, first out: a session's
    next request refers to the bodies just checked); `resolve` gives a referenced body, verified
    (`fallback` reads one that is not here, as `Bodies.get` does)."""

    def __init__(self, fallback: Callable[[bytes], bytes]) -> None:
        self.data: OrderedDict[bytes, bytes] = OrderedDict()
        self.size = 0
        self.fallback = fallback
        self.exchange_id = 0  # the exchange being checked, for the fallback's error

    def resolve(self, digest: bytes) -> bytes:
        got = self.data.get(digest)
        if got is None:
            got = self.fallback(digest)
            self.add(digest, got)
        return got

    def add(self, digest: bytes, data: bytes) -> None:
        self.data[digest] = data
        self.size += len(data)
        while len(self.data) > _RECENT or self.size > _RECENT_BYTES:
            self.size -= len(self.data.popitem(last=False)[1])


class MergeScan:
    """The check that merge makes of every shard, over its store's parts."""

    def __init__(self, store: Store, hash_bodies: bool = True) -> None:
        self.store, self.tables, self.path = store, store.tables, store.path
        self.records, self.max_body = store.records, store.max_body
        self._codec = store.codec
        self._exchanges, self._heads, self._bodies = (store.tables.db[n] for n in ("exchanges", "heads", "bodies"))
        self._packed_sets: dict[tuple[str, int], bytes] = {}  # checked labels / routes copied (`copied_records`)
        self.hash_bodies = hash_bodies  # each body hashed (off where merge hashes the whole bodies table)

    def recent_bodies(self) -> _Recent:
        """The verified bodies a check keeps while it reads (`check_body`)."""
        get = self.store.bodies.get  # a digest given: bytes, or its StoreError
        recent = _Recent(lambda ref: get(ref.hex(), exchange_id=recent.exchange_id, part="referenced") or b"")
        return recent

    def check_body(self, txn: lmdb.Transaction, hexdigest: str, size: int | None, exchange_id: int, name: str,
                   recent: _Recent) -> None:
        """One body checked as `body` checks it: decompressed within its recorded size and hashed
        against the digest it is stored under (a CRC alone would pass a body forged to another
        content under a good digest, and OUT would then serve it in place of the real one to every
        exchange that shares that digest); on any failure `body` itself reads it again, to raise
        its one-line error."""
        digest = bytes.fromhex(hexdigest)
        if digest in recent.data:
            return
        raw: Any = txn.get(digest, db=self._bodies)
        limit = self.max_body if size is None else min(size, self.max_body)
        if not self.hash_bodies and raw is not None and codec.sound_as_stored(raw, limit):
            return  # its content is hashed by merge's pass over the whole bodies table (`verify_bodies`)
        data = None
        if raw is not None:
            recent.exchange_id = exchange_id
            try:
                data = self.store.codec.decode(raw, limit, recent.resolve)
            except (codec.TooLarge, *DAMAGE):
                data = None
        if data is None or sha256(data).digest() != digest:
            data = self.store.bodies.get(hexdigest, size=size, exchange_id=exchange_id, part=name) or b""  # raises, or b""
        recent.add(digest, data)

    def scan(self, start: int = 1, stop: int | None = None, bodies: bool = True,
                   plans: bytearray | None = None) -> Iterator[tuple[int, Identity]]:
        """(id, identity) of exchanges start <= id < stop in write order, each yielded once its
        record (and, with `bodies`, every body it names) passed the checks (a StoreError naming the
        exchange otherwise). With `plans`, each exchange's `PLAN` bytes are appended to it: what
        the copy takes of the check instead of decompressing the record again."""
        recent = self.recent_bodies()
        with self.tables.reading("exchanges"), self.tables.begin(buffers=True) as txn:
            cur = txn.cursor(db=self._exchanges)
            if not cur.set_range(_U64.pack(start)):
                return
            for k, raw in cur:
                exchange_id = _U64.unpack(k)[0]
                if stop is not None and exchange_id >= stop:
                    return
                found = self._viewed(txn, k, exchange_id, raw)
                if bodies:
                    for name, part in (("request", found[1]), ("response", found[2])):
                        if part is not None and part[0] is not None:
                            self.check_body(txn, part[0], part[1], exchange_id, name, recent)
                if plans is not None:
                    plans += _plan(found)
                yield exchange_id, found[0]

    def _viewed(self, txn: Any, k: bytes, exchange_id: int, raw: Any) -> Viewed:
        """A record's identity, its request's and response's (body digest, size), and whether merge
        copies it as stored (a record stored stripped, its head checked, no replay: its
        source id would change): read narrowly when its head vouches for it, else from the full
        parse (which raises on damage)."""
        value = txn.get(k, db=self._heads)
        if checked_value(k, value, raw):
            try:
                text = self._codec.decode(raw, self.max_body)
                if not text.startswith(b'{"id":'):  # a record stored stripped: its
                    # identity is its head's, its bodies the rest's
                    return *self._rest_viewed(txn, value, text), not _is_replay(text)
                v = _VIEW.decode(text)
            except (msgspec.ValidationError, msgspec.DecodeError, ValueError, LookupError):
                v = None  # not reached for a record its head vouches for: the full parse says why
            except Exception:  # noqa: BLE001 - zstd's errors: the full parse names the damage
                v = None
            if v is not None and v.id == exchange_id:
                resp = v.response
                return ((v.session, v.mode, v.key, v.occurrence, v.seq, v.time), (v.request.body, v.request.body_size),
                        None if resp is None else (resp.body, resp.body_size), False)
        ex = self.records.decode(exchange_id, raw, value, txn)
        parts = [(p.get("body"), p.get("body_size")) if p else None for p in (ex.request, ex.response)]
        return (ex.session, ex.mode, ex.key, ex.occurrence, ex.seq, ex.time), parts[0], parts[1], False

    def _rest_viewed(self, txn: Any, value: Any, text: bytes) -> tuple[Identity, Any, Any]:
        """`_viewed` of a /5 record stored stripped, from its checked head and the rest's text."""
        s = _STORED.decode(value[store_heads.HEAD_AT:])
        r = _REST.decode(text)
        labels, route = self.records.set(txn, "labels", s.labels), self.records.set(txn, "routes", s.route)
        resp = r.response
        return ((labels[0], route[0], s.key.hex() if s.other_key is None else s.other_key, s.occurrence, r.seq,
                 s.time), (r.request.body, r.request.body_size), None if resp is None else (resp.body, resp.body_size))

    def copied_records(self, ids: list[int], as_stored: bool = False, plans: bytes | None = None) -> list[Copied]:
        """The records of these exchanges as JSON bytes (decoded, not parsed; whole, id first),
        each with its head as merge copies it (`HeadTail`: its labels and route as packed, the
        fields after them) where the head passes `checked_value` (None: merge reads the head from
        the text). With `as_stored`, a /5 or /6 record stored stripped whose head passes (and that
        is no replay: its source id changes) comes as its text left stripped, its head, and its
        bytes as stored, which merge copies untouched; with `plans` (the check's `PLAN` bytes of
        each id), one the check found so comes without its text (None), not decompressed again:
        its bytes still pass its head's CRC of them, so they are those the check read."""
        out: list[Copied] = []
        with self.tables.reading("exchanges"), self.tables.begin() as txn:
            rows = []
            for i in ids:
                k = _U64.pack(i)
                raw = txn.get(k, db=self._exchanges)
                if raw is None:
                    raise StoreError(f"store {self.path}: exchange {i} is missing; restore it from a copy")
                rows.append((k, raw, txn.get(k, db=self._heads)))
            tails = [self._head_tail(txn, value) if checked_value(k, value, raw) else None for k, raw, value in rows]
            planned = [as_stored and plans is not None and plans[n * PLAN] == 1 and tails[n] is not None
                       for n in range(len(rows))]
            texts = self._codec.decode_many([raw for (_, raw, _), p in zip(rows, planned) if not p], self.max_body)
            left = iter(texts)  # one call for the batch
            for (k, raw, value), tail, p in zip(rows, tails, planned, strict=True):
                if p:
                    out.append((None, tail, raw))
                    continue
                text = next(left)
                if text is None:  # one that does not decode: read alone, to raise its error
                    text = self._codec.decode(raw, self.max_body)
                if as_stored and tail is not None and b'"replay":{' not in text and not text.startswith(b'{"id":'):
                    out.append((text, tail, raw))
                else:
                    out.append((self.records.text_of(txn, k, raw, value), tail, None))
        return out

    def _head_tail(self, txn: Any, value: bytes) -> HeadTail | None:
        """A checked head's labels and route as their tables pack them, and its fields after them."""
        try:
            labels, at = _int_at(value, store_heads.HEAD_AT + 1)  # after the CRCs and the array's header
            route, at = _int_at(value, at)
            return self._packed(txn, "labels", labels), self._packed(txn, "routes", route), value[at:]
        except (ValueError, IndexError, KeyError):
            return None  # a set that does not check: the head is read from the text

    def _packed(self, txn: Any, kind: str, n: int) -> bytes:
        """Set `n` of `labels` or `routes` as packed (its CRC and shape checked; ValueError if not)."""
        got = self._packed_sets.get((kind, n))
        if got is None:
            got = bytes(self.records.packed_set(txn, kind, n))
            store_heads.SETS[kind].decode(got)
            if len(self._packed_sets) > 1 << 16:
                self._packed_sets.clear()
            self._packed_sets[(kind, n)] = got
        return got


Part = tuple[str | None, int | None] | None  # a request's or response's (body digest, recorded size)
Viewed = tuple[Identity, Part, Part, bool]
PLAN = 65  # bytes an exchange: 1 if merge copies its record as stored, its request's and response's digests (or zeros)
NO_BODY = bytes(32)


def _is_replay(text: bytes) -> bool:
    """Whether a record's text holds a replay object (one scan where, as in most, it has no "replay")."""
    return b'"replay":' in text and (b'"replay": {' in text or b'"replay":{' in text)


def _plan(found: Viewed) -> bytes:
    """An exchange's `PLAN` bytes."""
    req, resp = found[1], found[2]
    return (b"\x01" if found[3] else b"\x00") + (bytes.fromhex(req[0]) if req and req[0] else NO_BODY) + (
        bytes.fromhex(resp[0]) if resp and resp[0] else NO_BODY)


HeadTail = tuple[bytes, bytes, bytes]  # a head's labels and route, packed, and its fields after them
Copied = tuple[bytes | None, HeadTail | None, bytes | None]  # a record's text (None: planned), its head, its bytes as stored


def _int_at(buf: bytes, at: int) -> tuple[int, int]:
    """The msgpack unsigned integer at `at` and where the next value starts (ValueError if none)."""
    b = buf[at]
    if b < 0x80:
        return b, at + 1
    size = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}.get(b)
    if size is None:
        raise ValueError("not an unsigned integer")
    return int.from_bytes(buf[at + 1:at + 1 + size], "big"), at + 1 + size
