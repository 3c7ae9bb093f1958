"""The store's side of `nfproxy merge`: a shard read checked whole, and another store's exchanges
absorbed with their bodies and compression dictionaries as stored (a part of Store).

Reading: a body is checked as a reader checks it (it decodes within its recorded size and hashes
to its digest), the decoded bodies of the last exchanges kept, since a session's next request is
compressed against its previous request and answer and replicates repeat bodies (the records are
read by `store_merge_scan`); a store's outcome rows one at a time. Writing: one transaction per batch
that merge prepared (`Batch`): records appended in id order, replay entries and their lookups as
recording writes them (or, between stores of one packed layout, entries as stored, the lookups copied after
the shard's records: `put_lookups`, with a mark that `repair_lookups` finishes from if the merge
is killed between), bodies copied as stored (never recompressed) when this store lacks them, and
the batch's sessions added to the sessions table (`_known`) where it is complete up to the batch.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

import lmdb
import msgspec

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.env import StoreError
from noisefloor.proxy.store.merge import _known as known
from noisefloor.proxy.store.replay_index import RecordedEntry

if TYPE_CHECKING:
    from noisefloor.proxy.store.log import Store

_U64 = struct.Struct(">Q")
Near = tuple[bytes, tuple[bytes, ...], bytes] | None  # a recorded request's (bucket, bands, sketch)
UNINDEXED = replay_index.MERGING
_COUNTED = 1 << 16  # lookup ids counted at a time (each a Python object while read: a bounded peak)
_KINDS = list(replay_index.KEY + replay_index.SESSION + replay_index.BUCKET + replay_index.BAND)


class MergeIO:
    """Merge's reads and writes of one store, over its parts."""

    def __init__(self, store: Store) -> None:
        self.store, self.tables, self.path = store, store.tables, store.path
        self._db = store.tables.db
        self._known: Any = None  # the sessions table, opened on use

    def _known_db(self, create: bool = False) -> Any:
        """OUT's sessions table (`_known`), None where it has none (created only to be written)."""
        db = self._known
        if db is None:
            try:
                db = self.tables.env.open_db(known.TABLE, create=create)
                with self.tables.begin() as txn:
                    kind = db.flags(txn)
            except lmdb.NotFoundError:
                return None
            except lmdb.Error as exc:  # a main-table entry of that name that is no table
                kind = {exc.__class__.__name__: True}
            if any(kind.values()):  # or a table of another kind (duplicates, integer keys, ...)
                raise StoreError(f"store {self.path}: its {known.TABLE.decode()} entry is not the table merge "
                                 f"writes ({', '.join(k for k, v in kind.items() if v)}); `nfproxy compact "
                                 f"{self.path}` rewrites the store without it, then merge again")
            self._known = db
        return db

    def known_covered(self) -> int | None:
        """Through which exchange id the sessions table is complete (None: no table, or one to
        write again: its mark does not check or is past the last exchange)."""
        db = self._known_db()
        if db is None:
            return None
        with self.tables.reading("merge sessions"), self.tables.begin() as txn:
            covered = known.covered_in(txn, db)
        return None if covered is None or covered > self.store.last_id() else covered

    def known_rows(self, keys: Iterable[bytes], covered: int) -> dict[bytes, known.Row]:
        """The sessions table's rows of these session keys (those it has), point reads in one
        transaction; `known.Damaged` where one does not check."""
        db = self._known_db()
        out: dict[bytes, known.Row] = {}
        if db is None:
            return out
        with self.tables.reading("merge sessions"), self.tables.begin(db=db, buffers=True) as txn:
            for key in keys:
                value = txn.get(key)
                if value is not None:
                    out[key] = known.unpack(key, value, covered)
        return out

    def add_known(self, rows: list[tuple[bytes, bytes]], covered: int, again: bool) -> None:
        """Sessions' rows of the exchanges after the table's mark, the mark moved to `covered`, in
        one transaction; `again`: the table emptied first (written again from every exchange)."""
        db = self._known_db(create=True)

        def write(txn: lmdb.Transaction) -> None:
            if again:
                txn.drop(db, delete=False)
            known.put_rows(txn, db, rows, covered)

        self.tables.write(write)

    def checked_lookups(self) -> None:
        """A layout-2 or -3 store's replay index checked as merge copies it (rows as they are, ids
        mapped): every entry decodes as the entry type and its exchange has exactly the lookups
        its entry implies, none naming an exchange that is not recorded (StoreError naming the
        exchange otherwise). Replay checks each row's entry for the full key and session name, so
        what this cannot see (a row moved under another band or bucket) costs a miss a
        near candidate, never a wrong answer."""
        import numpy as np

        last, width = self.store.last_id(), replay_index.LOOKUP_KEY
        expected = np.zeros(last + 1, dtype=np.int32)  # 8 bytes an exchange for both
        with self.tables.reading("replay index routes"):
            routes = self.store.index.read_routes()  # each row checked against its key
        for k, raw in self.tables.rows("recorded", "replay index"):
            exchange_id = _U64.unpack(k)[0]
            try:
                if exchange_id > last:
                    raise ValueError(f"no exchange {exchange_id} in a store of {last}")
                expected[exchange_id], ref = replay_index.entry_shape(raw)
                if ref is not None and ref not in routes:
                    raise ValueError(f"it names route row {ref}, which the store does not hold")
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                raise StoreError(f"store {self.path}: exchange {exchange_id}'s replay-index entry is damaged "
                                 f"({exc}); restore the store from a copy") from None
        counted = np.zeros(last + 1, dtype=np.int32)
        for keys, ids in self.store.index.lookup_chunks(_COUNTED):
            got = np.frombuffer(ids, dtype=">u4") if len(ids) % 4 == 0 else None
            if got is None or len(keys) != len(got) * width or int(got.max()) > last or not np.isin(
                    np.frombuffer(keys, dtype=np.uint8)[::width], _KINDS).all():
                raise StoreError(f"store {self.path}: a replay lookup is not one of its kinds or names no exchange "
                                 "of the store (damaged); restore the store from a copy")
            found, times = np.unique(got.astype(np.uint32), return_counts=True)  # O(chunk), not O(store)
            counted[found] += times.astype(np.int32)
        wrong = np.flatnonzero(counted != expected)
        if wrong.size:
            i = int(wrong[0])
            raise StoreError(f"store {self.path}: exchange {i} has {counted[i]} replay lookups where its entry "
                             f"implies {expected[i]} (damaged); restore the store from a copy")

    def put_lookups(self, going_on: list[tuple[bytes, bytes]], rows: list[tuple[bytes, bytes]], *, append: bool,
                    last: bool) -> None:
        """Layout-2 lookups copied from another store, in key order: `going_on`, more ids under the
        last key written before (put where they sort), then `rows` (`append`: this store had no
        lookups, so each lands after the last); `last`: the copy is complete, its mark is cleared."""
        def write(txn: lmdb.Transaction) -> None:
            with txn.cursor(db=self._db["lookups"]) as cur:
                cur.putmulti(going_on)
                if cur.putmulti(rows, append=append)[1] != len(rows) and append:
                    raise StoreError(f"store {self.path} was written by another process during the merge; "
                                     "merge again")
            if last:
                txn.delete(UNINDEXED.encode(), db=self._db["meta"])

        self.tables.write(write)

    def append_rows(self, table: str, chunks: Callable[[], Iterable[Iterable[tuple[bytes, bytes]]]], *,
                    indexed: bool = False) -> int:
        """Rows appended after every row of `table` ("bodies" or "lookups": a merge into a fresh
        OUT writes them in key order), the rows of `chunks()` in one transaction (called again if
        it is retried); `indexed`: the mark `mark_unindexed` set is cleared with them. Every row
        must land (append refuses one out of key order). Returns how many rows."""
        db = self._db[table]

        def write(txn: lmdb.Transaction) -> int:
            added = 0
            with txn.cursor(db=db) as cur:
                for chunk in chunks():
                    consumed, landed = cur.putmulti(chunk, append=True)
                    if landed != consumed:
                        raise StoreError(f"store {self.path}: merged {table} came out of key order; run the same "
                                         "nfproxy merge again")
                    added += landed
            if indexed:
                txn.delete(UNINDEXED.encode(), db=self._db["meta"])
            return added

        return int(self.tables.write(write))

    def mark_unindexed(self, first: int) -> None:
        """Before records are copied without their lookups: where a later merge repairs from."""
        if self.store.meta(UNINDEXED) is None:
            self.tables.write(lambda txn: txn.put(UNINDEXED.encode(), json.dumps(first).encode(), db=self._db["meta"]))

    def repair_lookups(self, chunk: int = 20000) -> int:
        """After a merge killed between copying records and their lookups: each recorded exchange
        from the mark on gets its lookups again, computed from its entry (rows present are kept
        once; a layout-4 entry's bands from its stored request, `near_again`). Returns how many
        exchanges were indexed."""
        first = self.store.meta(UNINDEXED)
        if first is None:
            return 0
        done = 0
        while True:
            with self.tables.begin(db=self._db["recorded"], buffers=False) as txn, txn.cursor() as cur:
                found = [_U64.unpack(k)[0] for k in islice(cur.iternext(values=False), chunk)
                         ] if cur.set_range(_U64.pack(first + done)) else []
            if not found:
                break
            near = self.near_again(found)
            rows = sorted(r for e, n in zip(self.store.index.entries_by_id(found), near)
                          for r in replay_index.lookup_rows(e.id, RecordedEntry(
                              e.id, e.key, e.session, e.occurrence, e.seq, e.route, near=n)))
            self.tables.write(lambda txn, rows=rows: txn.cursor(db=self._db["lookups"]).putmulti(rows))
            done = found[-1] + 1 - first
        self.tables.write(lambda txn: txn.delete(UNINDEXED.encode(), db=self._db["meta"]))
        return done

    def near_again(self, ids: list[int]) -> list[Near]:
        """The nearest-request entries of recorded exchanges, to write their lookups again (a stored
        sketch keeps 16 bits a minimum: its bands cannot be computed from it): each stored request
        canonicalized again under this store's rules (the recorder's sketch but where a secret in a
        body was erased before it was stored; no bands where the rules are not ones this version
        rebuilds)."""
        from noisefloor.proxy.request.keys import Rules

        rules = Rules.described(self.store.meta("rules"))
        return [None if ex is None else stored_request_near(rules, ex.request, self.store.bodies.get(ex.request.get("body")))
                for ex in map(self.store.exchange, ids)]

    def adopt_dictionaries(self, source: Any) -> None:
        """New values of a kind this store has no dictionary for use the one `source` uses (merge:
        the shard's records are encoded again, and its bodies arrive compressed with it)."""
        for kind, key in (source.meta("dicts") or {}).items():
            if self.store.dictionaries.keys.get(kind) is None and key and (data := source.dictionaries.dictionary(bytes.fromhex(key))) is not None:
                self.store.dictionaries.add(data, kind)

    def absorb(self, batch: Batch, source: Any) -> int:
        """Merge: one batch of another store's exchanges (`Batch`), with the encoded bodies they need
        and those bodies' dictionaries, from `source`, and its sessions' rows in the sessions table
        where the table is complete through the exchange before the batch (else they are left for
        the next merge to read), in one transaction. Returns how many bodies were new here."""
        dicts = {}
        of = self.store.codec.dictionary_of
        wanted = {k for raw in batch.bodies.values() if raw and (k := of(raw))}
        wanted.update(k for k in {of(raw) for _, raw in batch.records} if k and self.store.dictionaries.dictionary(k) is None)
        for key in wanted:  # the records' are a /5 shard's, copied as stored
            data = source.dictionaries.dictionary(key)
            if data is None:
                raise StoreError(f"store {source.path}: compression dictionary {key.hex()} is missing; restore "
                                 "the store from a copy")
            dicts[key] = data

        numbering = self.store.numbering

        def write(txn: lmdb.Transaction) -> int:
            with txn.cursor(db=self._db["exchanges"]) as cur:
                last = _U64.unpack(cur.key())[0] if cur.last() else 0
            if batch.records and _U64.unpack(batch.records[0][0])[0] != last + 1:
                raise StoreError(f"store {self.path} was written by another process during the merge; merge again")
            for key, data in dicts.items():
                txn.put(key, data, db=self._db["dicts"], overwrite=False)
            fresh = self._put_bodies(txn, batch.bodies, source)
            with txn.cursor(db=self._db["exchanges"]) as cur:
                cur.putmulti(batch.records, append=True)
            if numbering is not None:
                with txn.cursor(db=self._db["heads"]) as cur:
                    cur.putmulti([(k, numbering.sealed(txn, k, r))
                                  for (k, _), r in zip(batch.records, batch.heads, strict=True)], append=True)
            for new_id, entry in batch.entries:
                self.store.index.put(txn, new_id, entry)
            if batch.moved:  # entries as stored, their lookups copied after the shard's records
                with txn.cursor(db=self._db["recorded"]) as cur:
                    cur.putmulti(batch.moved, append=True)
            covered = known.covered_in(txn, sessions) if sessions is not None else -1
            if batch.records and (covered == last or (covered is None and last == 0)):
                # the table complete through the exchange before this batch: it takes the batch's sessions
                known.put_rows(txn, sessions, batch.sessions, _U64.unpack(batch.records[-1][0])[0])
            return fresh

        sessions = self._known_db(create=True) if batch.sessions else None
        return self.tables.write(write)

    def _put_bodies(self, txn: lmdb.Transaction, raw_bodies: Mapping[bytes, bytes | None], source: Any) -> int:
        """The bodies this store lacks, as stored; a body compressed against others brings them too."""
        fresh = 0
        todo = sorted(raw_bodies.items(), reverse=True)
        while todo:
            digest, raw = todo.pop()
            if not raw or not txn.put(digest, raw, db=self._db["bodies"], overwrite=False):  # False: held already
                continue
            fresh += 1
            for ref in codec.Codec.refs_of(raw):  # another session's, maybe
                if ref not in raw_bodies and txn.get(ref, db=self._db["bodies"]) is None:
                    if (ref_raw := source.bodies.raw(ref.hex())) is None:
                        raise StoreError(f"store {source.path}: body {ref.hex()[:16]}, which another body is "
                                         "compressed against, is missing")
                    for key in filter(None, [self.store.codec.dictionary_of(ref_raw)]):
                        if txn.get(key, db=self._db["dicts"]) is None and source.dictionaries.dictionary(key):
                            txn.put(key, source.dictionaries.dictionary(key), db=self._db["dicts"])
                    todo.append((ref, ref_raw))
        return fresh


@dataclass
class Batch:
    """Exchanges ready to be written: records as they will be stored (id -> encoded record, the ids
    consecutive from the store's next), the recorded ones' replay entries under their new ids (the
    store writes their lookups in its layout), and the bodies they name as their store holds them
    (digest -> encoded value)."""

    records: list[tuple[bytes, bytes]]
    entries: list[tuple[int, RecordedEntry]] = field(default_factory=list)
    bodies: dict[bytes, bytes | None] = field(default_factory=dict)  # by 32-byte digest
    moved: list[tuple[bytes, bytes]] = field(default_factory=list)  # or: layout-2 or -3 entries as OUT stores them
    heads: list[Any] = field(default_factory=list)  # the records' head rows (`store_heads.row`), in their order
    sessions: list[tuple[bytes, bytes]] = field(default_factory=list)  # their sessions' rows for OUT's table (`_known.rows_of`)


def stored_request_near(rules: Any, request: dict[str, Any], body: bytes | None) -> Near:
    """A stored request's nearest-request sketch, canonicalized again under `rules` (None where the
    rules are not ones this version rebuilds, or the body is not JSON): the recorder's sketch but
    where a secret in a body was erased before it was stored."""
    from noisefloor.proxy.request.traffic import RequestData

    if rules is None:
        return None
    c = RequestData.from_record(request, body).canonical(rules)
    return replay_index.sketch(c, replay_index.indexed_route(c)) if c.body_kind == "json" else None
