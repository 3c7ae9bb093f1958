"""The store's replay-index tables, read and written (a part of Store): the `recorded` entries,
their `index_routes` rows and the `lookups`; `replay_index.py` owns their layout and what replay
asks of them."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from itertools import islice
from typing import Any

import lmdb

from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store._tables import Tables
from noisefloor.proxy.store.replay_index import RecordedEntry

_U64 = struct.Struct(">Q")
_BATCH = 5000  # entries per write transaction (`put_entries`)


def put_entry(txn: lmdb.Transaction, recorded: Any, routes: Any, new_id: int, e: RecordedEntry) -> None:
    """An entry appended to a `recorded` table, its route and bucket as a reference to their
    `index_routes` row, put there unless it is (kept inline where the row's key is another route's)."""
    ref = None
    if e.near is not None:
        key, value = replay_index.route_row(e.route, e.near[0])
        if txn.put(key, value, db=routes, overwrite=False) or txn.get(key, db=routes) == value:
            ref = key
    txn.put(_U64.pack(new_id), replay_index.entry_bytes(e, ref), db=recorded, append=True)


class Index:
    """Reads and writes of the `recorded`, `index_routes` and `lookups` tables (a part of Store)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self._recorded, self._lookups = tables.db["recorded"], tables.db["lookups"]
        self._routes = tables.db["index_routes"]  # the routes and buckets, each once (`replay_index.route_row`)
        self._routes_known: dict[int, tuple[str, bytes]] = {}

    def put(self, txn: lmdb.Transaction, new_id: int, recorded: RecordedEntry) -> None:
        """A recorded exchange's entry and lookups."""
        put_entry(txn, self._recorded, self._routes, new_id, recorded)
        with txn.cursor(db=self._lookups) as cur:
            cur.putmulti(replay_index.lookup_rows(new_id, recorded))

    def put_entries(self, entries: Iterator[RecordedEntry]) -> None:
        """Entries and lookups of exchanges already stored, in id order (`migrate` rebuilds an
        earlier layout's index with it)."""
        def put(txn: lmdb.Transaction, batch: list[RecordedEntry]) -> None:
            for e in batch:
                self.put(txn, e.id, e)

        while batch := list(islice(entries, _BATCH)):
            self.tables.write(lambda txn, batch=batch: put(txn, batch))

    def route_of(self, ref: int) -> tuple[str, bytes]:
        """Layout 3: the route and bucket of an `index_routes` row (the table read again for one
        not seen: a recorder may have added it); ValueError if the store has none such."""
        got = self._routes_known.get(ref)
        if got is None:
            self._routes_known = self.read_routes()
            got = self._routes_known.get(ref)
            if got is None:
                raise ValueError(f"a replay-index entry names route row {ref}, which the store does not hold")
        return got

    def read_routes(self) -> dict[int, tuple[str, bytes]]:
        """Every `index_routes` row, each checked against its key (ValueError naming a damaged one)."""
        if self._routes is None:
            return {}
        with self.tables.begin(db=self._routes, buffers=False) as txn:
            rows = {replay_index.ID.unpack(k)[0]: (k, v) for k, v in txn.cursor()}
        for k, v in rows.values():  # each row's key is its value's hash: a damaged one is named
            if replay_index.route_row(*replay_index.route_value(v))[0] != k:
                raise ValueError(f"replay-index route row {k.hex()} is damaged")
        return {n: replay_index.route_value(v) for n, (_, v) in rows.items()}

    def adopt_routes(self, source: Index) -> bool:
        """Merge: `source`'s `index_routes` rows put here, so that its entries are copied
        as stored; False if one of its keys holds another route here (they are written again)."""
        with source.tables.reading("replay index routes"):
            source.read_routes()  # each row checked against its key
        rows = list(source.tables.rows("index_routes"))

        def put(txn: lmdb.Transaction) -> bool:
            return all(txn.put(k, v, db=self._routes, overwrite=False)
                       or txn.get(k, db=self._routes) == v for k, v in rows)

        return bool(self.tables.write(put)) if rows else True

    def entries(self) -> Iterator[RecordedEntry]:
        with self.tables.reading("replay index"), self.tables.begin(db=self._recorded) as txn:
            for k, raw in txn.cursor():
                yield replay_index.entry(raw, _U64.unpack(k)[0], self.route_of)

    # -- what replay asks (ids oldest first unless said) ----------------------------------------

    def key_ids(self, key: str) -> list[int]:
        """Exchanges whose request key is `key` or shares its tag (check the entries)."""
        return self._dups(replay_index.key_tag(key))

    def session_ids(self, name: str) -> list[int]:
        """Exchanges of session `name` (and of any whose hash shares its tag: check the entries)."""
        return self._dups(replay_index.session_key(name))

    def session_entries(self, name: str) -> list[RecordedEntry]:
        """Session `name`'s recorded entries, oldest first (its lookups, the entries checked for the name)."""
        return [e for e in self.entries_by_id(self.session_ids(name)) if e.session == name]

    def session_first(self, name: str) -> int | None:
        """The first exchange of session `name`."""
        ids = self._dups(replay_index.session_key(name), first=1)
        if ids and any(e.session == name for e in self.entries_by_id(ids)):
            return ids[0]
        return next((e.id for e in self.session_entries(name)), None)

    def bucket_newest(self, bucket: bytes, n: int) -> list[int]:
        """The newest `n` exchanges asked on this route and model, oldest first."""
        return self._newest([replay_index.BUCKET + bucket[:replay_index.TAG]], n)[0][::-1]

    def bands_newest(self, bands: tuple[bytes, ...], n: int) -> list[list[int]]:
        """Per band, the newest `n` exchanges whose sketch has it, newest first."""
        return self._newest([replay_index.BAND + band[:replay_index.TAG] for band in bands], n)

    def sketches_for(self, ids: list[int], bucket: bytes) -> list[tuple[bytes | None, bool]]:
        """Per exchange: its sketch (None without one) and whether it was asked on `bucket`."""
        return [(None, False) if got is None else (got[1], got[0] == bucket) for got in self.stored_sketches(ids)]

    def stored_sketches(self, ids: list[int]) -> list[tuple[bytes, bytes] | None]:
        """Per exchange: (bucket, sketch) as stored, or None (a request that had none)."""
        with self.tables.reading("replay index"), self.tables.begin(db=self._recorded, buffers=False) as txn:
            raws = [txn.get(_U64.pack(i)) for i in ids]
            return [None if raw is None else replay_index.entry_sketch(raw, self.route_of) for raw in raws]

    def _dups(self, key: bytes, first: int | None = None) -> list[int]:
        """The ids under `key` in `lookups`, oldest first (with `first`: only that many)."""
        with self.tables.reading(), self.tables.begin(db=self._lookups, buffers=False) as txn, txn.cursor() as cur:
            if not cur.set_key(key):
                return []
            vals = list(islice(cur.iternext_dup(keys=False), first))
        return list(struct.unpack(f">{len(vals)}I", b"".join(vals)))

    def _newest(self, keys: list[bytes], n: int) -> list[list[int]]:
        """Per key, the newest `n` ids under it in `lookups`, newest first, in one read."""
        out = []
        with self.tables.reading(), self.tables.begin(db=self._lookups, buffers=False) as txn, txn.cursor() as cur:
            for key in keys:
                vals = list(islice(cur.iterprev_dup(keys=False), n)) if cur.set_key(key) and cur.last_dup() else []
                out.append(list(struct.unpack(f">{len(vals)}I", b"".join(vals))))
        return out

    # -- for copying the tables whole (merge) ------------------------------------------------------

    def lookup_chunks(self, size: int) -> Iterator[tuple[bytes, bytes]]:
        """Every lookup in key order (ids oldest first under each key), `size` rows at a time as two
        blobs: their keys, and their 4-byte ids, concatenated (a million rows are read without a
        Python step per row)."""
        width = replay_index.LOOKUP_KEY
        with self.tables.reading("replay index"), self.tables.begin(db=self._lookups, buffers=False) as txn:
            keys, cur = txn.cursor().iternext_nodup(values=False), txn.cursor()
            while batch := list(islice(keys, max(1, size // 2))):  # about `size` rows: 2 a key, most
                key_blob, id_blob = _rows_of(cur, batch, width)
                for at in range(0, len(id_blob), 4 * size):  # a key under every exchange: in pieces
                    yield key_blob[at // 4 * width:(at // 4 + size) * width], id_blob[at:at + 4 * size]

    def raw_entries(self, ids: list[int]) -> list[bytes | None]:
        """The `recorded` values of these exchanges as stored (None: not recorded), in one read."""
        with self.tables.reading("replay index"), self.tables.begin(db=self._recorded, buffers=False) as txn:
            return [txn.get(_U64.pack(i)) for i in ids]

    def entry(self, exchange_id: int) -> RecordedEntry | None:
        with self.tables.reading(), self.tables.begin(db=self._recorded) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else replay_index.entry(raw, exchange_id, self.route_of)

    def latest_ids(self, n: int) -> list[int]:
        """The ids of the last `n` recorded exchanges, newest first."""
        out: list[int] = []
        with self.tables.reading(), self.tables.begin(db=self._recorded) as txn, txn.cursor() as cur:
            more = cur.last()
            while more and len(out) < n:
                out.append(_U64.unpack(cur.key())[0])
                more = cur.prev()
        return out

    def entries_by_id(self, ids: list[int]) -> list[RecordedEntry]:
        with self.tables.reading(), self.tables.begin(db=self._recorded) as txn:
            out = []
            for i in ids:
                raw = txn.get(_U64.pack(i))
                if raw is not None:
                    out.append(replay_index.entry(raw, i, self.route_of))
            return out


def _rows_of(cur: lmdb.Cursor, keys: list[bytes], width: int) -> tuple[bytes, bytes]:
    """Every (key, 4-byte id) row under these keys, as the two blobs of `lookup_chunks`: read a
    page of ids at a time (LMDB's GET_MULTIPLE), not a Python step per row. A key not `width`
    bytes long (damage) is left for the caller's checks to find: its rows are read one by one."""
    import numpy as np

    if set(map(len, keys)) != {width}:
        pairs = [(k, v) for k in keys if cur.set_key(k) for v in cur.iternext_dup(keys=False)]
        return b"".join(k for k, _ in pairs), b"".join(v for _, v in pairs)
    rows = np.frombuffer(cur.getmulti(keys, True, 4, True), dtype=np.uint8).reshape(-1, width + 4)
    return rows[:, :width].tobytes(), rows[:, width:].tobytes()
