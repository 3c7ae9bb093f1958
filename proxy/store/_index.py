"""The store's replay-index tables: the `recorded` entries and the lookups of either layout
(`lookups`, layouts 2 and 3; `rindex`, layout 1), read and written. `replay_index.py` owns their layout
and what replay asks of them; every read here answers the same whichever layout the store has."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from itertools import islice
from typing import Any

import lmdb

from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.replay_index import RecordedEntry

_U64 = struct.Struct(">Q")
_V1 = 1  # the layout of `rindex`


def put_entry(txn: lmdb.Transaction, recorded: Any, routes: Any, new_id: int, e: RecordedEntry,
              version: int | None) -> None:
    """An entry appended to a `recorded` table in this layout; layouts 3 and 4: its route and bucket as
    a reference to their `index_routes` row, put there unless it is (kept inline where the row's
    key is another route's)."""
    ref = None
    if version in replay_index.ROUTED and routes is not None and e.near is not None:
        key, value = replay_index.route_row(e.route, e.near[0])
        if txn.put(key, value, db=routes, overwrite=False) or bytes(txn.get(key, db=routes)) == value:
            ref = key
    txn.put(_U64.pack(new_id), replay_index.entry_bytes(new_id, e, version, ref), db=recorded, append=True)


class IndexLookups:
    """Reads of the `recorded` and `rindex` tables (a part of Store)."""

    _env: Any
    _recorded: Any
    _rindex: Any
    _lookups: Any
    _index_routes: Any  # layout 3's routes and buckets, each once (`replay_index.route_row`)
    _routes_known: dict[int, tuple[str, bytes]]
    _index_v: int | None  # meta "replay_index": the layout this store's index has
    _reading: Any
    meta: Any

    def _put_index(self, txn: lmdb.Transaction, new_id: int, recorded: RecordedEntry) -> None:
        """A recorded exchange's entry and lookups, in the layout of the store's index."""
        packed = self.lookup_layout()
        put_entry(txn, self._recorded, self._index_routes, new_id, recorded, packed or _V1)
        if packed:
            with txn.cursor(db=self._lookups) as cur:
                cur.putmulti(replay_index.lookup_rows(new_id, recorded, packed))
        elif self._rindex is not None:
            for k, v in replay_index.rows_v1(new_id, recorded):
                txn.put(k, v, db=self._rindex)

    def _layout2(self) -> bool:
        """Whether the lookups are `lookups`' sorted duplicates (layouts 2 and 3)."""
        return self._index_v in replay_index.PACKED

    def lookup_layout(self) -> int | None:
        """The layout of this store's `lookups` rows (2, 3 or 4), None where it has none."""
        return self._index_v if self._layout2() and self._lookups is not None else None

    def route_of(self, ref: int) -> tuple[str, bytes]:
        """Layout 3: the route and bucket of an `index_routes` row (the table read again for one
        not seen: a recorder may have added it); ValueError if the store has none such."""
        got = self._routes_known.get(ref)
        if got is None:
            self._routes_known = self._read_index_routes()
            got = self._routes_known.get(ref)
            if got is None:
                raise ValueError(f"a replay-index entry names route row {ref}, which the store does not hold")
        return got

    def _read_index_routes(self) -> dict[int, tuple[str, bytes]]:
        if self._index_routes is None:
            return {}
        with self._env.begin(db=self._index_routes, buffers=False) as txn:
            rows = {replay_index.ID.unpack(k)[0]: (k, v) for k, v in txn.cursor()}
        for k, v in rows.values():  # each row's key is its value's hash: a damaged one is named
            if replay_index.route_row(*replay_index.route_value(v))[0] != k:
                raise ValueError(f"replay-index route row {k.hex()} is damaged")
        return {n: replay_index.route_value(v) for n, (_, v) in rows.items()}

    def adopt_index_routes(self, source: Any) -> bool:
        """Merge: `source`'s `index_routes` rows put here, so that its layout-3 entries are copied
        as stored; False if one of its keys holds another route here (they are written again)."""
        with source._reading("replay index routes"):
            source._read_index_routes()  # each row checked against its key
        rows = list(source.raw_table("index_routes"))

        def put(txn: lmdb.Transaction) -> bool:
            return all(txn.put(k, v, db=self._index_routes, overwrite=False)
                       or bytes(txn.get(k, db=self._index_routes)) == v for k, v in rows)

        return bool(self._write(put)) if rows else True

    def recorded_entries(self) -> Iterator[RecordedEntry]:
        with self._reading("replay index"), self._env.begin(db=self._recorded) as txn:
            for k, raw in txn.cursor():
                yield replay_index.entry(raw, _U64.unpack(k)[0], self.route_of)

    def has_replay_index(self) -> bool:
        """Whether every recorded exchange has its lookup rows (stores made since they exist)."""
        if self._index_v == _V1:
            return self._rindex is not None
        return self._layout2() and self._lookups is not None

    # -- what replay asks, in either layout (ids oldest first unless said) -------------------------

    def key_ids(self, key: str) -> list[int]:
        """Exchanges whose request key is `key` (layouts 2, 3: or shares its tag; check the entries)."""
        if self._layout2():
            return self._dups(replay_index.key_tag(key, self._index_v))
        return [_U64.unpack(s)[0] for s in self.index_scan(replay_index.KEY + bytes.fromhex(key))]

    def session_ids(self, name: str) -> list[int]:
        """Exchanges of session `name` (and of any whose hash shares its tag: check the entries)."""
        if self._layout2():
            return self._dups(replay_index.session_key(name, self._index_v))
        return [_U64.unpack(s)[0] for s in self.index_scan(replay_index.SESSION + replay_index.session_tag(name))]

    def session_entries(self, name: str) -> list[RecordedEntry]:
        """Session `name`'s recorded entries, oldest first (its lookups, the entries checked for the name)."""
        return [e for e in self.recorded_entries_by_id(self.session_ids(name)) if e.session == name]

    def session_first(self, name: str) -> int | None:
        """The first exchange of session `name`."""
        if not self._layout2():
            got = self.index_scan(replay_index.SESSION + replay_index.session_tag(name), oldest=1)
            return _U64.unpack(got[0])[0] if got else None
        ids = self._dups(replay_index.session_key(name, self._index_v), first=1)
        if ids and any(e.session == name for e in self.recorded_entries_by_id(ids)):
            return ids[0]
        return next((e.id for e in self.session_entries(name)), None)

    def bucket_newest(self, bucket: bytes, n: int) -> list[int]:
        """The newest `n` exchanges asked on this route and model, oldest first."""
        if self._layout2():
            return self._newest([replay_index.BUCKET + bucket[:replay_index.tag(self._index_v)]], n)[0][::-1]
        return [_U64.unpack(s)[0] for s in self.index_scan(replay_index.BUCKET + bucket, newest=n)]

    def bands_newest(self, bands: tuple[bytes, ...], n: int) -> list[list[int]]:
        """Per band, the newest `n` exchanges whose sketch has it, newest first."""
        if self._layout2():
            width = replay_index.tag(self._index_v)
            return self._newest([replay_index.BAND + band[:width] for band in bands], n)
        prefixed = [replay_index.BAND + band for band in bands]
        return [[_U64.unpack(s)[0] for s in found] for found in self.index_scan_newest(prefixed, n)]

    def sketches_for(self, ids: list[int], bucket: bytes) -> list[tuple[bytes | None, bool]]:
        """Per exchange: its sketch (None without one) and whether it was asked on `bucket`."""
        if self._layout2():
            return [(None, False) if got is None else (got[1], got[0] == bucket) for got in self.stored_sketches(ids)]
        got = self.index_get_many([replay_index.SKETCH + _U64.pack(i) for i in ids]
                                  + [replay_index.BUCKET + bucket + _U64.pack(i) for i in ids])
        return [(s, b is not None) for s, b in zip(got[:len(ids)], got[len(ids):])]

    def stored_sketches(self, ids: list[int]) -> list[tuple[bytes, bytes] | None]:
        """Per exchange: (bucket, sketch) as stored, or None (a request that had none)."""
        if self._layout2():
            with self._reading("replay index"), self._env.begin(db=self._recorded, buffers=False) as txn:
                raws = [txn.get(_U64.pack(i)) for i in ids]
                return [None if raw is None else replay_index.entry_sketch(raw, self.route_of) for raw in raws]
        buckets = self.index_distinct(replay_index.BUCKET, 8)
        sketches = self.index_get_many([replay_index.SKETCH + _U64.pack(i) for i in ids])
        probes = [replay_index.BUCKET + b + _U64.pack(i) for i, sk in zip(ids, sketches) if sk for b in buckets]
        present = iter(self.index_get_many(probes))
        out: list[tuple[bytes, bytes] | None] = []
        for sk in sketches:
            found = [b for b in buckets if next(present) is not None] if sk else []
            out.append((found[0], sk) if found and sk else None)
        return out

    def _dups(self, key: bytes, first: int | None = None) -> list[int]:
        """The ids under `key` in `lookups`, oldest first (with `first`: only that many)."""
        with self._reading(), self._env.begin(db=self._lookups, buffers=False) as txn, txn.cursor() as cur:
            if not cur.set_key(key):
                return []
            vals = list(islice(cur.iternext_dup(keys=False), first))
        return list(struct.unpack(f">{len(vals)}I", b"".join(vals)))

    def _newest(self, keys: list[bytes], n: int) -> list[list[int]]:
        """Per key, the newest `n` ids under it in `lookups`, newest first, in one read."""
        out = []
        with self._reading(), self._env.begin(db=self._lookups, buffers=False) as txn, txn.cursor() as cur:
            for key in keys:
                vals = list(islice(cur.iterprev_dup(keys=False), n)) if cur.set_key(key) and cur.last_dup() else []
                out.append(list(struct.unpack(f">{len(vals)}I", b"".join(vals))))
        return out

    # -- for copying the tables whole (merge) ------------------------------------------------------


    def copies_lookups(self) -> bool:
        """Whether this store's lookups are layout 2's or 3's, which merge copies as they are (ids
        mapped) into a store of the same layout."""
        return self.lookup_layout() is not None

    def lookup_rows_count(self) -> int:
        with self._reading(), self._env.begin(db=self._lookups) as txn:
            return txn.stat(self._lookups)["entries"]

    def lookup_chunks(self, size: int) -> Iterator[tuple[bytes, bytes]]:
        """Every layout-2 or -3 lookup in key order (ids oldest first under each key), `size` rows at a
        time as two blobs: their keys, and their 4-byte ids, concatenated (a million rows are
        read without a Python step per row)."""
        width = replay_index.lookup_key_bytes(self.lookup_layout())
        with self._reading("replay index"), self._env.begin(db=self._lookups, buffers=False) as txn:
            keys, cur = txn.cursor().iternext_nodup(values=False), txn.cursor()
            while batch := list(islice(keys, max(1, size // 2))):  # about `size` rows: 2 a key, most
                key_blob, id_blob = _rows_of(cur, batch, width)
                for at in range(0, len(id_blob), 4 * size):  # a key under every exchange: in pieces
                    yield key_blob[at // 4 * width:(at // 4 + size) * width], id_blob[at:at + 4 * size]

    def recorded_table(self) -> Iterator[tuple[bytes, bytes]]:
        """Every `recorded` entry as stored: (u64 id, value), in id order."""
        with self._reading("replay index"), self._env.begin(db=self._recorded, buffers=False) as txn:
            yield from txn.cursor().iternext()

    def recorded_raw(self, ids: list[int]) -> list[bytes | None]:
        """The `recorded` values of these exchanges as stored (None: not recorded), in one read."""
        with self._reading("replay index"), self._env.begin(db=self._recorded, buffers=False) as txn:
            return [txn.get(_U64.pack(i)) for i in ids]

    def recorded_count(self) -> int:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            return txn.stat(self._recorded)["entries"]

    def recorded_entry(self, exchange_id: int) -> RecordedEntry | None:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else replay_index.entry(raw, exchange_id, self.route_of)

    def index_scan(self, prefix: bytes, *, newest: int | None = None, oldest: int | None = None) -> list[bytes]:
        """The index keys under `prefix` (their suffixes), oldest first; with `newest` (`oldest`),
        only the last (first) that many."""
        out: list[bytes] = []
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn, txn.cursor() as cur:
            if newest is None:
                if cur.set_range(prefix):
                    for k in cur.iternext(values=False):
                        if not k.startswith(prefix) or (oldest is not None and len(out) >= oldest):
                            break
                        out.append(k[len(prefix):])
                return out
            out = _newest_under(cur, prefix, newest)
        return out[::-1]

    def index_scan_newest(self, prefixes: list[bytes], newest: int) -> list[list[bytes]]:
        """`index_scan(prefix, newest=n)` for several prefixes in one read transaction."""
        out = []
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn, txn.cursor() as cur:
            for prefix in prefixes:
                out.append(_newest_under(cur, prefix, newest))
        return out

    def index_distinct(self, prefix: bytes, width: int) -> list[bytes]:
        """The distinct `width` bytes that follow `prefix` in index keys: one seek each."""
        found: list[bytes] = []
        if self._rindex is None:
            return found
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn, txn.cursor() as cur:
            at: bytes | None = prefix
            while at is not None and cur.set_range(at):
                k = cur.key()
                if not k.startswith(prefix) or len(k) < len(prefix) + width:
                    break
                found.append(k[len(prefix):len(prefix) + width])
                at = replay_index.after(k[:len(prefix) + width])
        return found

    def index_get_many(self, keys: list[bytes]) -> list[bytes | None]:
        with self._reading(), self._env.begin(db=self._rindex, buffers=False) as txn:
            return [txn.get(k) for k in keys]

    def latest_recorded_ids(self, n: int) -> list[int]:
        """The ids of the last `n` recorded exchanges, newest first."""
        out: list[int] = []
        with self._reading(), self._env.begin(db=self._recorded) as txn, txn.cursor() as cur:
            more = cur.last()
            while more and len(out) < n:
                out.append(_U64.unpack(cur.key())[0])
                more = cur.prev()
        return out

    def recorded_entries_by_id(self, ids: list[int]) -> list[RecordedEntry]:
        with self._reading(), self._env.begin(db=self._recorded) as txn:
            out = []
            for i in ids:
                raw = txn.get(_U64.pack(i))
                if raw is not None:
                    out.append(replay_index.entry(raw, i, self.route_of))
            return out


def _newest_under(cur: lmdb.Cursor, prefix: bytes, newest: int) -> list[bytes]:
    """The last `newest` keys under `prefix` (newest first), with the prefix cut off."""
    found: list[bytes] = []
    end = replay_index.after(prefix)
    more = cur.prev() if end is not None and cur.set_range(end) else cur.last()
    while more and len(found) < newest:
        k = cur.key()
        if not k.startswith(prefix):
            break
        found.append(k[len(prefix):])
        more = cur.prev()
    return found


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
