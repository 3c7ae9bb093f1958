"""Records stored without their id (the exchanges table's key is the id) and without the fields
their head carries, joined with their head when read (a part of Store).

So a record is not stored twice over with its head, and `nfproxy merge` copies it as stored
under a new id without decompressing it. A record whose head was written from a record checked
against the record type (its `left_out` is not NOT_LISTED) keeps only the rest (`stripped`). A
record no head can stand for (a string msgpack cannot hold: no head; keys this version does not
know or another layout: NOT_LISTED) is stored whole, id included; its head says which. Reading
joins the two (`joined`) after both are verified: the head's CRC over its exchange's key, its CRC of the record as stored, the
record's own decoding; a record without its head is a StoreError naming the exchange.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import msgspec

from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store._tables import Tables
from noisefloor.proxy.store.env import DAMAGE, StoreError
from noisefloor.proxy.store.exchange import NOT_LISTED, Exchange, Head, checked_head, parse, record_checker

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
ID_END = 1 << 64  # ids are 8-byte keys: an id below 0 or from here on names no exchange (absent, not damage)
# the record's top-level fields its head holds (method, URL, status and the replay's result stay
# in the record's request, response and replay objects)
HEAD_FIELDS = ("id", "time", "key", "occurrence", "usage", "truncated", "error", "notes", "session", "task",
               "replicate", "condition", "mode", "model", "fingerprint")
_DROP = frozenset(HEAD_FIELDS)
_FIELDS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ENCODE = msgspec.json.Encoder().encode
_STORED = msgspec.msgpack.Decoder(store_heads.Stored)
RESTORE = "restore the store from a copy (a head holds fields its record does not)"


def stripped(doc: bytes) -> bytes:
    """A record's JSON text without the fields its head holds (their values' bytes untouched)."""
    return _ENCODE({k: v for k, v in _FIELDS.decode(doc).items() if k not in _DROP})


def renumbered(doc: bytes, exchange_id: int) -> bytes:
    """A record's JSON text under another id, the id first (its other values' bytes untouched);
    msgspec's DecodeError for a text whose keys it cannot read."""
    return _ENCODE({"id": exchange_id, **{k: v for k, v in _FIELDS.decode(doc).items() if k != "id"}})


@functools.cache
def _bits() -> dict[str, int]:
    """Each field's bit in a head's `left_out` (`exchange_record._listable`'s numbering)."""
    return {n: 1 << i for i, n in enumerate(record_checker()[1])}


_OWN = ("id", "time", "key", "occurrence", "usage", "truncated", "error", "notes")  # the head's own fields


@functools.cache
def _own_mask() -> int:
    return sum(_bits().get(k, 0) for k in _OWN)


def shared_text(left: int, labels: tuple[Any, ...], route: tuple[Any, ...]) -> bytes:
    """The text of a record's labels and route fields as `joined` puts them back (after a comma),
    those the record left out (`left`) left out: the same for every record of a session."""
    bits = _bits()
    values = {"session": labels[0], "task": labels[1], "replicate": labels[2], "condition": labels[3],
              "mode": route[0], "model": route[3], "fingerprint": route[4]}
    return b"," + _ENCODE({k: v for k, v in values.items() if not left & bits[k]})[1:-1]


def joined(exchange_id: int, rest: bytes, s: store_heads.Stored, common: bytes) -> bytes:
    """The whole record's JSON text (the id first, as a record stored whole has it): `rest` (`stripped`) with its
    head's fields put back (`common`: its labels and route's, `shared_text`), those the record
    left out (its `left_out`) left out again."""
    own: Any = _own(exchange_id, s)
    if s.left_out & _own_mask():
        bits = _bits()
        own = {k: getattr(own, k) for k in _OWN if not s.left_out & bits.get(k, 0)}
    head = _ENCODE(own)[:-1] + common
    return head + b"," + rest[1:] if len(rest) > 2 else head + b"}"


class _Own(msgspec.Struct, gc=False):
    """A record's own head fields in its order, id first (a Struct encodes as the dict would, faster)."""

    id: int
    time: Any
    key: Any
    occurrence: Any
    usage: Any
    truncated: Any
    error: Any
    notes: Any


def _own(exchange_id: int, s: store_heads.Stored) -> _Own:
    return _Own(exchange_id, s.time, s.key.hex() if s.other_key is None else s.other_key, s.occurrence,
                store_heads.usage_dict(s.usage), s.truncated, s.error, s.notes)


def encoded(codec: Any, key: bytes | None, doc: bytes,
            checked: tuple[Head, int] | None) -> tuple[bytes, store_heads.Row | None]:
    """A record's JSON text (`doc`, id included) as a store stores it, and its head's row:
    stripped where its head can stand for the rest (`checked`: the head and the fields it leaves
    out; None: the text's head cannot be held, the record is kept whole)."""
    r = store_heads.row(*checked, b"") if checked is not None else None
    whole = r is None or checked is None or checked[1] == NOT_LISTED
    text = doc
    if not whole:
        try:
            text = stripped(doc)
        except msgspec.DecodeError:  # a lone surrogate (a header byte not UTF-8), which json reads: kept whole,
            assert checked is not None
            r = store_heads.row(checked[0], NOT_LISTED, b"")  # listed by the full parse, as checked_head's None
    stored = codec.encode(text, key)
    return stored, None if r is None else tied(r, stored)


def tied(r: store_heads.Row, stored: bytes) -> store_heads.Row:
    """Head row `r` tied to a record's bytes as stored (its record CRC)."""
    return r[0], r[1], _U32.pack(zlib.crc32(stored)) + r[2][4:]


_ENCODE_INTO = msgspec.json.Encoder().encode_into


def _damaged_text(path: Any, exchange_id: int, text: bytes) -> None:
    """StoreError naming what is wrong with a record's text where it is not an exchange record."""
    try:
        parse(text)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"store {path}: exchange {exchange_id} is damaged ({exc.__class__.__name__}: {exc}); "
                         "restore the store from a copy or record it again") from None


class Records:
    """The records and their heads, read joined and verified (a part of Store)."""

    def __init__(self, tables: Tables, codec: Any, max_body: int) -> None:
        self.tables, self.codec, self.path, self.max_body = tables, codec, tables.path, max_body
        self._exchanges, self._heads = tables.db["exchanges"], tables.db["heads"]
        self._sets: dict[str, Any] = {kind: tables.db[kind] for kind in store_heads.SETS}
        self._joined_sets: dict[tuple[str, int], tuple[Any, ...]] = {}  # labels / routes joins read (`set`)
        self._shared_text: dict[tuple[int, int, int], bytes] = {}  # their fields' text, as `joined` puts it back

    def decode(self, exchange_id: int, raw: bytes, value: Any = False, txn: Any = None) -> Exchange:
        """A stored record, or StoreError naming the store and the exchange: a record that does not
        decode or does not have the record type's fields and types is never used (joined with its
        head `value`, read here unless given, in `txn` or a read of its own)."""
        try:
            if txn is not None:
                ex = parse(self.text_of(txn, _U64.pack(exchange_id), raw, value))
            else:
                with self.tables.begin() as own:
                    ex = parse(self.text_of(own, _U64.pack(exchange_id), raw, value))
        except StoreError:
            raise
        except DAMAGE as exc:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is damaged ({exc.__class__.__name__}: "
                             f"{exc}); restore the store from a copy or record it again") from None
        if ex.id != exchange_id:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is damaged (its record says id {ex.id}); "
                             "restore the store from a copy or record it again")
        return ex

    def sets_of(self, kind: str) -> dict[int, tuple[Any, ...]]:
        """The heads' labels or routes, read whole (an entry per distinct set: labels grow with sessions)."""
        db = self._sets.get(kind)
        if db is None:
            return {}
        with self.tables.reading(kind), self.tables.begin(db=db, buffers=True) as txn:
            try:
                return store_heads.read_sets(kind, txn.cursor())
            except ValueError as exc:
                raise StoreError(f"store {self.path}: {exc}; {RESTORE}") from None

    def checked_head(self, record: bytes, exchange_id: int) -> tuple[Head, int] | None:
        """A record's JSON text's head and the fields it leaves out (`exchange_record.checked_head`),
        or StoreError naming this store and the exchange where the text is not an exchange record."""
        try:
            return checked_head(record)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is not an exchange record ({exc}); "
                             "restore the store from a copy or record it again") from None

    def texts_of(self, ids: list[int]) -> list[bytes]:
        """The stored records' JSON bytes of these exchanges, decoded but not parsed, in one read."""
        with self.tables.reading("exchanges"), self.tables.begin(db=self._exchanges) as txn:
            out = []
            for i in ids:
                raw = txn.get(_U64.pack(i))
                if raw is None:
                    raise StoreError(f"store {self.path}: exchange {i} is missing; restore it from a copy")
                out.append(self.text_of(txn, _U64.pack(i), raw))
            return out

    def texts(self, start: int = 1) -> Iterator[tuple[int, bytes]]:
        """(id, the stored record's JSON bytes) in write order, decoded but not parsed: for copying."""
        with self.tables.reading("exchanges"), self.tables.begin(db=self._exchanges, buffers=True) as txn:
            cur = txn.cursor()
            if start >= ID_END or not cur.set_range(_U64.pack(max(start, 0))):
                return
            for k, raw in cur:
                yield _U64.unpack(k)[0], self.text_of(txn, k, raw)

    def text_of(self, txn: Any, k: bytes, raw: Any, value: Any = False) -> bytes:
        """A record's whole JSON text, id first: decoded (zstd's errors as raised) and joined with
        its head (read here unless given: None, no head row), both checked; StoreError naming the
        exchange where the head is missing, damaged or not the record's."""
        text = self.codec.decode(raw, self.max_body)
        if value is False:
            value = txn.get(k, db=self._heads)
        exchange_id = _U64.unpack(k)[0]
        if value is None:
            raise StoreError(f"store {self.path}: exchange {exchange_id} has no head (the heads table and the "
                             f"records differ); {RESTORE}")
        if not value:
            return text
        wrong = store_heads.check(k, value, raw)
        if wrong == "head":
            raise StoreError(f"store {self.path}: the head of exchange {exchange_id} is damaged (its checksum does "
                             f"not match); {RESTORE}")
        if wrong == "record":
            try:  # a damaged record says what is wrong with it, read with its head's fields
                whole = self.join(txn, exchange_id, value, text)
            except StoreError:
                whole = text
            _damaged_text(self.path, exchange_id, whole)
            raise StoreError(f"store {self.path}: exchange {exchange_id}'s head and record do not match (one was "
                             f"changed after the other was written); {RESTORE}")
        return self.join(txn, exchange_id, value, text)

    def join(self, txn: Any, exchange_id: int, value: Any, text: bytes) -> bytes:
        """`text` joined with its checked head `value` (as it is where the record is stored whole)."""
        s = self.stored(exchange_id, value)
        if s.left_out == NOT_LISTED or text.startswith(b'{"id":'):  # stored whole (a stripped one has no id)
            return text
        return joined(exchange_id, text, s, self.common(txn, s))

    def join_into(self, out: bytearray, txn: Any, exchange_id: int, text: bytes, s: store_heads.Stored) -> bool:
        """`joined`'s text less its closing brace appended to `out`, for a listing that writes lines
        straight into one buffer; False (nothing written) where `joined` must build it: a record
        stored whole, or one that leaves out some of its head's own fields."""
        if s.left_out == NOT_LISTED or s.left_out & _own_mask() or text.startswith(b'{"id":'):
            return False
        _ENCODE_INTO(_own(exchange_id, s), out, -1)
        out[-1:] = self.common(txn, s)
        if len(text) > 2:
            out += b","
            out += memoryview(text)[1:-1]
        return True

    def stored(self, exchange_id: int, value: Any) -> store_heads.Stored:
        """A checked head's value decoded, or StoreError naming the exchange."""
        try:
            return _STORED.decode(value[store_heads.HEAD_AT:])
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise StoreError(f"store {self.path}: the head of exchange {exchange_id} is damaged ({exc}); "
                             f"{RESTORE}") from None

    def common(self, txn: Any, s: store_heads.Stored) -> bytes:
        """The text of head `s`'s labels and route fields (`shared_text`), kept per set."""
        at = (s.labels, s.route, s.left_out)
        common = self._shared_text.get(at)
        if common is None:
            common = shared_text(s.left_out, self.set(txn, "labels", s.labels), self.set(txn, "routes", s.route))
            if len(self._shared_text) > 1 << 16:
                self._shared_text.clear()
            self._shared_text[at] = common
        return common

    def set(self, txn: Any, kind: str, n: int) -> tuple[Any, ...]:
        """Labels or route `n`, checked (its CRC, its shape) and kept (a set per session at most)."""
        got = self._joined_sets.get((kind, n))
        if got is not None:
            return got
        try:
            got = store_heads.SETS[kind].decode(self.packed_set(txn, kind, n))
        except ValueError as exc:  # msgspec's errors among them
            raise StoreError(f"store {self.path}: {kind} entry {n} is damaged ({exc}); {RESTORE}") from None
        if len(self._joined_sets) > 1 << 16:
            self._joined_sets.clear()
        self._joined_sets[(kind, n)] = got
        return got

    def packed_set(self, txn: Any, kind: str, n: int) -> Any:
        """Labels or route `n` as its table packs it, its CRC checked (ValueError if it fails)."""
        key = _U32.pack(n)
        v = txn.get(key, db=self._sets[kind]) if self._sets.get(kind) is not None else None
        if v is None or len(v) < 4 or _U32.unpack_from(v)[0] != zlib.crc32(v[4:], zlib.crc32(key)):
            raise ValueError("missing, or its checksum does not match")
        return v[4:]
