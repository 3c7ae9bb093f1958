"""Walking the heads table and the records together, a batch at a time.

A listing of a million exchanges is a million steps of Python; a step per exchange per layer
(cursor, check, decode, format) was most of its cost. So the walk takes `BATCH` entries from
each cursor in C (`islice` into a list, the values as bytes), checks the whole batch in one
comprehension and hands it on whole: `head_part_batches` decodes its heads, `listed_chunks`
decompresses its records in one call (`Codec.decode_many`) and joins their lines.

Every head and record is checked as before, one by one, in write order: the head's CRC (over its
exchange's key and the rest), the record's CRC against the one its head was written for, and the
pairing of the two tables. A batch is handed on only up to its first entry that fails; that
entry's error (one StoreError naming the store and the exchange) is raised when the next batch is
asked for, so a reader has used everything before the damage, as it did one at a time.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store._records import RESTORE, Records
from noisefloor.proxy.store._tables import Tables
from noisefloor.proxy.store.env import DAMAGE, StoreError

BATCH = 256  # entries read from each table at once
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
Batch = tuple[Sequence[int], Sequence[bytes], Sequence[bytes]]  # ids, heads, records as stored


def _good(heads: list[Any], records: list[Any]) -> int:
    """How many entries of a batch pass from its start: same key in both tables, head's CRC, record's CRC."""
    crc, u32 = zlib.crc32, _U32.unpack_from
    n = min(len(heads), len(records))
    bad = [i for i, (k, v), (rk, raw) in zip(range(n), heads, records)
           if k != rk or (v and not (len(v) >= 8 and u32(v)[0] == crc(v[4:], crc(k)) and u32(v, 4)[0] == crc(raw)))]
    return bad[0] if bad else n


def _ids(keys: Sequence[bytes]) -> Sequence[int]:
    joined = b"".join(keys)
    if len(joined) == 8 * len(keys):
        return struct.unpack(f">{len(keys)}Q", joined)
    return [_U64.unpack(k)[0] for k in keys]  # a key that is not a u64: struct.error, as one at a time


class Walk:
    """The paired walk of heads and records and the readers built on it (a part of Store)."""

    def __init__(self, tables: Tables, records: Records) -> None:
        self.tables, self.records, self.path = tables, records, tables.path
        self._codec, self.max_body = records.codec, records.max_body
        self._heads, self._exchanges = tables.db["heads"], tables.db["exchanges"]

    def _paired_batches(self, what: str, size: int = BATCH) -> Iterator[Batch]:
        """(ids, heads, records as stored) in write order, up to `size` of each at a time, in one
        read: every head's CRC checked and its record's bytes those the head was written for (a
        CRC, nothing decompressed); the first that fails raises after the batch before it."""
        with self.tables.reading(what), self.tables.begin() as txn:
            heads, records = iter(txn.cursor(db=self._heads)), iter(txn.cursor(db=self._exchanges))
            while True:
                hb, rb = list(islice(heads, size)), list(islice(records, size))
                if not hb and not rb:
                    return
                good = _good(hb, rb)
                if good:
                    keys, values = zip(*hb[:good])
                    yield _ids(keys), values, [raw for _, raw in rb[:good]]
                if good < max(len(hb), len(rb)):
                    self._refuse(hb[good] if good < len(hb) else (None, None),
                                 rb[good] if good < len(rb) else (None, None))

    def _refuse(self, head: tuple[Any, Any], record: tuple[Any, Any]) -> None:
        """The StoreError of an entry `_good` stopped at: unpaired, a damaged head, or a record
        that is not the one its head was written for (the record's own error where it is damaged)."""
        (k, value), (rk, raw) = head, record
        if k is None or rk is None or k != rk:
            self._unpaired(k, rk)
        exchange_id = _U64.unpack(k)[0]
        wrong = store_heads.check(k, value, raw)
        if wrong == "record":
            self.records.decode(exchange_id, raw)  # a damaged record says what is wrong with it
            raise StoreError(f"store {self.path}: exchange {exchange_id}'s head and record do not match (one "
                             f"was changed after the other was written); {RESTORE}")
        raise StoreError(f"store {self.path}: the head of exchange {exchange_id} is damaged (its "
                         f"checksum does not match); {RESTORE}")

    def _unpaired(self, head_key: bytes | None, record_key: bytes | None) -> None:
        """A head without its record or a record without its head: the first such exchange, named."""
        keys = [k for k in (head_key, record_key) if k is not None]
        exchange_id = _U64.unpack(bytes(min(keys, key=bytes)))[0]
        which = "record" if record_key is None or (head_key is not None and bytes(head_key) < bytes(record_key)) \
            else "head"
        raise StoreError(f"store {self.path}: exchange {exchange_id} has no {which} (the heads table and the records "
                         f"differ); {RESTORE}")

    # -- heads ---------------------------------------------------------------------------------

    def head_part_batches(self) -> Iterator[tuple[Sequence[int], Sequence[store_heads.Parts]]]:
        """Every exchange's head in write order as the heads table keeps it (`store_heads.parts`:
        the labels and route as tuples shared by every head with the same, so that a reader can
        group by them), a batch at a time; checked as `heads`. A batch with a head that does not
        decode is handed on one head at a time, up to that head's StoreError."""
        labels, routes = self.records.sets_of("labels"), self.records.sets_of("routes")
        for ids, values, raws in self._paired_batches("heads"):
            parts = store_heads.parts_many(values, labels, routes)
            if parts is not None:
                yield ids, parts
                continue
            for exchange_id, value, raw in zip(ids, values, raws):
                yield (exchange_id,), (self._head_part(exchange_id, value, raw, labels, routes),)

    def head_sets(self) -> tuple[dict[int, tuple[Any, ...]], dict[int, tuple[Any, ...]]]:
        """The heads' labels and routes by number, each table checked and read whole."""
        return self.records.sets_of("labels"), self.records.sets_of("routes")

    def stored_head_batches(self, labels: dict[int, tuple[Any, ...]], routes: dict[int, tuple[Any, ...]]
                            ) -> Iterator[tuple[Sequence[store_heads.Stored], Sequence[store_heads.Parts]]]:
        """Every exchange's head in write order, a batch at a time, for a reader that counts heads
        by their sets' numbers (nfanalyze) instead of building a tuple per head: (the batch's heads
        as stored, ()) where each decodes as `head_part_batches` decodes it and its sets are in
        `labels` / `routes` (from `head_sets`), else ((), its parts) one head at a time up to that
        head's StoreError; the walk checked as `head_part_batches`."""
        for ids, values, raws in self._paired_batches("heads"):
            stored = store_heads.stored_many(values, labels, routes)
            if stored is not None:
                yield stored, ()
                continue
            for exchange_id, value, raw in zip(ids, values, raws):
                yield (), (self._head_part(exchange_id, value, raw, labels, routes),)

    def heads(self) -> Iterator[exchange_record.Head]:
        """Every exchange's head in write order: what `nfproxy log` and nfanalyze read, from the
        heads table (each head checked, and its tie to its record). Damage is a StoreError naming
        the exchange."""
        head = store_heads.head
        for exchange_id, p in self.head_parts():
            yield head(exchange_id, p)

    def head_parts(self) -> Iterator[tuple[int, store_heads.Parts]]:
        """`head_part_batches` one exchange at a time (nfanalyze's counts, `heads`)."""
        for ids, parts in self.head_part_batches():
            yield from zip(ids, parts)

    def _head_part(self, exchange_id: int, value: bytes, raw: bytes, labels: dict[int, tuple[Any, ...]],
                   routes: dict[int, tuple[Any, ...]]) -> store_heads.Parts:
        if not value:  # left to the record
            return store_heads.parts_of(exchange_record.head_of(self.records.decode(exchange_id, raw)))
        try:
            return store_heads.parts(value, labels, routes)
        except ValueError as exc:
            raise self._damaged_head(exchange_id, exc) from None

    # -- records, listed -----------------------------------------------------------------------

    def listed_records(self) -> Iterator[bytes]:
        """Every exchange record in write order as one line of JSON with every field (the object
        `Exchange.json_bytes` gives), for `nfproxy log --json --limit`: the stored text passed
        through, checked against the record type when it was written (its head says what it
        leaves out, and is tied to its bytes); a record only
        `exchange()` can read is read by it (so a damaged one is the same StoreError). One record
        decompressed at a time: a listing that stops early reads no further."""
        decode, limit = self._codec.decode, self.max_body
        for exchange_id, value, raw in self.pairs("exchanges"):
            try:
                text = decode(raw, limit)
            except DAMAGE:
                text = None
            text = self._joined((exchange_id,), (value,), [text])[0]
            left = self._left_out(exchange_id, value) if value else exchange_record.NOT_LISTED
            yield self._listed(exchange_id, text, left, raw)

    def listed_chunks(self) -> Iterator[bytes]:
        """`listed_records`' lines, each ended by a newline, a batch of them joined at a time: the
        records of a batch decompressed in one call (`Codec.decode_many`); each line written
        straight from its record and its head, decoded once (`Records.join_into`). Where one
        cannot be listed, the lines before it are yielded first, then its StoreError raised. Not in
        a thread: a worker decompressing the next batch while this one is listed saves no wall
        time on a loaded machine and costs CPU."""
        tails: dict[int, bytes] = {}  # the end of a line whose record leaves out these fields (b"": none)
        decode_many, limit = self._codec.decode_many, self.max_body
        for ids, values, raws in self._walk_batches("exchanges"):
            texts = decode_many(raws, limit)
            out = bytearray()
            try:
                self._joined_chunk(ids, values, raws, texts, tails, out)
            except StoreError:
                if out:
                    yield bytes(out)
                raise
            yield bytes(out)

    def _joined_chunk(self, ids: Sequence[int], values: Sequence[Any], raws: Sequence[Any],
                      texts: list[bytes | None], tails: dict[int, bytes], out: bytearray) -> None:
        """A batch's lines onto `out`: a stripped record joined with its head as it is written; a
        record stored whole, or one whose head does not decode, read as `listed_records` reads it."""
        stored, join_into = self.records.stored, self.records.join_into
        with self.tables.begin() as txn:
            for exchange_id, value, raw, text in zip(ids, values, raws, texts):
                if text is not None and value:
                    try:
                        s = stored(exchange_id, value)
                    except StoreError:
                        s = None
                    if s is not None and join_into(out, txn, exchange_id, text, s):
                        out += self._tail(tails, s.left_out)
                        continue
                    text = self._joined((exchange_id,), (value,), [text])[0]
                self._line_into(out, tails, exchange_id, value, raw, text)

    @staticmethod
    def _tail(tails: dict[int, bytes], left: int) -> bytes:
        """What ends the line of a record that leaves out the fields `left` says: those fields' implicit
        values, its closing brace and a newline."""
        tail = tails.get(left)
        if tail is None:
            tail = tails[left] = exchange_record.with_implicit(b"}", left) + b"\n"
        return tail

    def _line_into(self, out: bytearray, tails: dict[int, bytes], exchange_id: int, value: Any, raw: Any,
                   text: bytes | None) -> None:
        """One record's line onto `out` (its StoreError where it cannot be listed)."""
        left = self._left_out(exchange_id, value) if value else exchange_record.NOT_LISTED
        if text is None or left == exchange_record.NOT_LISTED or not text.startswith(b'{"id":%d,' % exchange_id):
            out += self._listed(exchange_id, text, left, raw) + b"\n"
            return
        out += memoryview(text)[:-1]
        out += self._tail(tails, left)

    def _joined(self, ids: Sequence[int], values: Sequence[Any], texts: list[bytes | None]) -> list[bytes | None]:
        """A batch's decoded records joined with their checked heads (`Records.join`); None where
        one cannot be: its own read (`_listed`) then says why, after the lines before it."""
        out: list[bytes | None] = []
        with self.tables.begin() as txn:
            for exchange_id, value, text in zip(ids, values, texts):
                try:
                    out.append(text if text is None or not value else self.records.join(txn, exchange_id, value, text))
                except StoreError:
                    out.append(None)
        return out

    def _left_out(self, exchange_id: int, value: bytes) -> int:
        """The fields a checked head's record leaves out (`store_heads.left_out`), or StoreError
        naming the exchange where the head, its CRC right, is not a head's shape."""
        try:
            return store_heads.left_out(value)
        except DAMAGE as exc:
            raise self._damaged_head(exchange_id, exc) from None

    def _damaged_head(self, exchange_id: int, exc: BaseException) -> StoreError:
        return StoreError(f"store {self.path}: the head of exchange {exchange_id} is damaged ({exc}); {RESTORE}")

    def _listed(self, exchange_id: int, text: bytes | None, left: int, raw: bytes) -> bytes:
        """One record's line (`listed_records`): passed through where its head allows, else checked now."""
        if text is not None and left != exchange_record.NOT_LISTED and text.startswith(b'{"id":%d,' % exchange_id):
            return exchange_record.with_implicit(text, left)
        line = exchange_record.listed(text, exchange_id) if text is not None else None
        return line if line is not None else self.records.decode(exchange_id, raw).json_bytes()

    def pairs(self, what: str) -> Iterator[tuple[int, Any, Any]]:
        for ids, values, raws in self._walk_batches(what):
            yield from zip(ids, values, raws)

    def _walk_batches(self, what: str) -> Iterator[tuple[Sequence[int], Sequence[Any], Sequence[Any]]]:
        """`_paired_batches`, or in a store without heads the records alone (no head: None)."""
        if self._heads is not None:
            yield from self._paired_batches(what)
            return
        with self.tables.reading(what), self.tables.begin() as txn:
            records = iter(txn.cursor(db=self._exchanges))
            while batch := list(islice(records, BATCH)):
                keys, raws = zip(*batch)
                yield _ids(keys), [None] * len(raws), raws
