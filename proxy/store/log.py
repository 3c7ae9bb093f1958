"""The log: one LMDB environment holding exchanges, bodies and the replay index.

Layout (named databases; values encoded as `codec` says: tagged, zstd with a trained dictionary):
  meta      name -> JSON           format version, normalization rules and their id, dictionaries
  bodies    sha256 -> value        every request/response body, stored once
  exchanges u64 id -> value(JSON)  one record per request the proxy saw, in write order, without
                                   its id and the fields its head holds (`_records`)
  dicts     key -> bytes           zstd dictionaries trained on this store's bodies and records
  recorded  u64 id -> entry        the compact replay index of record-mode exchanges
  outcomes  condition, task, replicate -> JSON   graded outcome rows (nfverify, nfladder), so
                                   that the log is the one artifact a user keeps
  lookups   key -> sorted 4-byte ids: the replay index's lookups (see `replay_index.py`), so
                                   that replay reads what a request needs instead of loading the
                                   whole index
  index_routes u32 -> bucket + route  the routes and models, each once, that index entries
                                   name by a 4-byte hash instead of carrying them
  heads     u64 id -> head         each exchange's head (`exchange_record.Head`: labels, route,
                                   status, identity; CRC-checked), written in the record's
                                   transaction, so that listings never decompress records
  merge_sessions session hash -> ids  each session's identity sums and ids, written by merge
                                   (`merge._known`), so that a merge reads only the sessions it brings

Each exchange is written in one transaction together with its bodies, so a reader (or a proxy
killed with SIGKILL) sees either the whole exchange or none of it (bulk writers may put a batch in
one). `Store` is the only way any part of noisefloor reads the log, made of one part per job: the
environment (`store_env`: opening, disk reservation, map growth), the body table (`store_bodies`),
the dictionaries (`store_dicts`), the replay-index tables (`store_index`), merge's reads and
writes (`store_merge`, its check `store_merge_scan`), the walk of heads and records together
(`store_walk`: listings), and here the records, meta and outcome rows; the record's type is
`exchange_record`'s. Every read is verified: a body must hash to the digest it is
stored under and decompress within its recorded size (and the --max-body-mb bound), a record must
parse as the exchange record; anything else is a StoreError naming the store and the exchange.

The store is of one format (`format.FORMAT`); one of an earlier format is refused by one line
naming `nfproxy migrate`, which alone reads it (`migrate`).
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.record.answered_rows import AnsweredRows
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _outcome_values as outcome_values
from noisefloor.proxy.store import _records as store_records
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store._ahead import CHAIN_DEPTH, AheadBodies
from noisefloor.proxy.store._bodies import Bodies
from noisefloor.proxy.store._bodies import BodyOverLimit as BodyOverLimit
from noisefloor.proxy.store._dicts import Dictionaries
from noisefloor.proxy.store._index import IndexLookups
from noisefloor.proxy.store._records import Joins
from noisefloor.proxy.store._walk import Walks
from noisefloor.proxy.store.env import DAMAGE, FORMAT, StoreError, check_path, grow, open_env, refusal
from noisefloor.proxy.store.exchange import Exchange, Head
from noisefloor.proxy.store.merge.scan import MergeScan
from noisefloor.proxy.store.merge.shard import MergeIO
from noisefloor.proxy.store.replay_index import RecordedEntry

DEFAULT_MAX_BODY = 64 << 20  # --max-body-mb's default: the most a stored body may decompress to
_U64 = struct.Struct(">Q")
_ID_END = 1 << 64  # ids are 8-byte keys: an id below 0 or from here on names no exchange (absent, not damage)
_CHAINS = 4096  # sessions whose last exchange's bodies are kept for that (an LRU)


class Store(AheadBodies, AnsweredRows, Bodies, Dictionaries, IndexLookups, Joins, MergeIO, MergeScan, Walks):
    """An open log. Use `Store.open(path, write=...)`; close it (or use `with`) when done."""

    def __init__(self, env: lmdb.Environment, path: Path, writable: bool, needed: int = 0,
                 max_body: int = DEFAULT_MAX_BODY) -> None:
        self._env = env
        self.path = path
        self.writable = writable
        self.max_body = max_body  # no stored body decompresses to more (a bomb costs what it would on the wire)
        self._fd = os.open(path / "data.mdb", os.O_RDONLY)
        self._needed = needed  # bytes the data file must keep: reading past its end is a SIGBUS
        self._record_lock: Any = None
        self._trim = False  # `trim_on_close`
        self._meta = env.open_db(b"meta", create=writable)
        self._bodies = env.open_db(b"bodies", create=writable)
        self._exchanges = env.open_db(b"exchanges", create=writable)
        self._recorded = env.open_db(b"recorded", create=writable)
        self._outcomes: Any = self._optional_db(b"outcomes")  # created by the first outcome row
        self._dicts: Any = self._optional_db(b"dicts")  # and before dictionaries
        self._lookups: Any = self._optional_db(b"lookups", dupsort=True, dupfixed=True)
        self._index_routes: Any = self._optional_db(b"index_routes")
        self._answered: Any = None  # answers released before their full write (`answered_rows`): opened on use
        self._routes_known: dict[int, tuple[str, bytes]] = {}
        self._heads: Any = self._optional_db(b"heads")
        self._sets: dict[str, Any] = {kind: self._optional_db(kind.encode()) for kind in store_heads.SETS}
        self._numbering = store_heads.Sets(self._sets["labels"], self._sets["routes"]) if writable else None
        self._joined_sets: dict[tuple[str, int], tuple[Any, ...]] = {}  # labels / routes joins read (`_set`)
        self._shared_text: dict[tuple[int, int, int], bytes] = {}  # their fields' text, as `joined` puts it back
        self._packed_sets: dict[tuple[str, int], bytes] = {}  # checked labels / routes merge copies (`copied_records`)
        self._codec = codec.Codec(self._load_dict)
        self._keys: dict[str, bytes] = {}  # kind (body, record) -> the dictionary new values use
        self._samples: dict[str, list[bytes]] = {"body": [], "record": []}
        # session -> (request sha256, request, response sha256, response, depth) of its last exchange
        self._chains: OrderedDict[str, tuple[bytes, bytes, bytes, bytes, int]] = OrderedDict()
        self._chain_next: tuple[str, tuple[bytes, bytes, bytes, bytes, int]] | None = None
        self._refs: OrderedDict[bytes, bytes] = OrderedDict()  # verified bodies others refer to (an LRU)
        self._prepared: OrderedDict[str, tuple[Any, codec.Against]] = OrderedDict()  # `store_ahead`
        self._later: deque[tuple[str, Mapping[str, bytes], str]] = deque()  # appended, left for `catch_up`
        self._training: dict[str, tuple[threading.Thread, list[bytes | None]]] = {}
        self._batch: list[_Item] | None = None
        self._batch_size = self._batch_base = 0

    def _optional_db(self, name: bytes, **flags: bool) -> Any:
        try:
            return self._env.open_db(name, create=self.writable, **flags)
        except lmdb.NotFoundError:
            return None

    # -- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, write: bool, create: bool = False,
             max_body: int = DEFAULT_MAX_BODY) -> Store:
        """The store at `path`, read-only or for writing (`create`: a new one where there is none);
        how a store is opened (`noisefloor.open_store` for a Python user). Close it, or use `with`."""
        p = Path(path)
        check_path(p, write, create)
        if write and (p / "data.mdb").exists():  # a store of another format is refused before anything is written
            _refuse_other_format(p)
        env, needed = open_env(p, write)
        try:
            store = cls(env, p, write, needed, max_body)
        except lmdb.Error as exc:
            env.close()
            raise StoreError(f"{p} is an LMDB environment but not an nfproxy store ({exc})") from exc
        try:
            store._adopt_format()
            store._keys = {k: bytes.fromhex(v) for k, v in (store.meta("dicts") or {}).items()}
        except BaseException:
            store.close()
            raise
        return store

    def _adopt_format(self) -> None:
        """A new store marked with today's format; one of another format refused by one line."""
        fmt = self.meta("format")
        if fmt is None and self.writable:
            self.set_meta("format", FORMAT)
            self.set_meta("replay_index", replay_index.VERSION)
            return
        why = refusal(self.path, fmt)
        if why is not None:
            raise StoreError(why)

    @property
    def format(self) -> str | None:
        return self.meta("format")

    def lock_for_recording(self) -> None:
        """One recording proxy per store: two would number the same sessions twice and make the
        replay order ambiguous. The lock lives as long as this handle (or the process)."""
        fh = open(self.path / "nfproxy-record.lock", "a+")  # noqa: SIM115 - kept open: the lock lives with it
        try:
            _locked(fh)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise StoreError(f"store {self.path} is being recorded by another nfproxy ({holder}); stop it, or "
                             "record into another --store and combine them later") from None
        fh.truncate(0)
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        self._record_lock = fh

    def close(self) -> None:
        if self._batch:
            self._flush()
        self.catch_up()  # the last samples (a dictionary's training may start here, as it would have)
        if self._training:  # a dictionary trained on this run's traffic is kept for the next one
            try:
                self._trained(wait=True)
            except StoreError:
                pass  # a store that cannot take it now is reported by the writes that follow
        if self.writable:
            self._env.sync(True)
        used = (self._env.info()["last_pgno"] + 1) * self._env.stat()["psize"] if self._trim else 0
        self._env.close()
        os.close(self._fd)
        if self._trim:
            _cut(self.path / "data.mdb", used)
        if self._record_lock is not None:
            self._record_lock.close()

    def trim_on_close(self) -> None:
        """On close, the data file cut to the pages in use (with writemap it holds the whole map:
        up to an eighth more). Only under the recording lock, on a store written in key order
        (merge into a fresh OUT: no page to refill): no other process writes into it meanwhile,
        and a reader never reads past the last page its snapshot knows."""
        if self._record_lock is None:
            raise StoreError(f"store {self.path}: cutting its file to its pages needs the recording lock")
        self._trim = True

    def _check_intact(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._needed:
            raise StoreError(f"store {self.path} was truncated while in use ({size} of {self._needed} bytes); "
                             "restore it from a copy or record it again")

    @contextmanager
    def _reading(self, what: str = "") -> Iterator[None]:
        """Every read: refuse a file cut short under us (reading past its end would be a SIGBUS),
        and turn damage into one StoreError that names the store, what was read, and what to do."""
        self._check_intact()
        try:
            yield
        except StoreError:
            raise
        except DAMAGE as exc:
            raise StoreError(f"store {self.path} is damaged{' (' + what + ')' if what else ''}: "
                             f"{exc.__class__.__name__}: {exc}; restore it from a copy or record it again") from None

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta ----------------------------------------------------------------------------------

    def meta(self, name: str) -> Any:
        with self._reading(), self._env.begin(db=self._meta) as txn:
            raw = txn.get(name.encode())
            return None if raw is None else json.loads(raw)

    def set_meta(self, name: str, value: Any) -> None:
        self._write(lambda txn: txn.put(name.encode(), json.dumps(value).encode(), db=self._meta))

    def bind_rules(self, rules_id: str, described: dict[str, Any], also: tuple[str, ...] = ()) -> None:
        """Store the rule set on first use; refuse a different one afterwards (`also`: earlier ids
        of the same keying, which a store recorded before may carry)."""
        have = self.meta("rules_id")
        if have is None:
            if not self.writable:
                return
            self.set_meta("rules_id", rules_id)
            self.set_meta("rules", described)
            return
        if have != rules_id and have not in also:
            raise StoreError(
                f"store {self.path} was recorded with normalization rules {have} "
                f"({json.dumps(self.meta('rules'), sort_keys=True)}) but this run uses {rules_id}; "
                "pass the same --ignore-field flags as the recording, or use a new --store"
            )

    # -- exchanges -----------------------------------------------------------------------------

    def append(
        self,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
        head: tuple[Head, int] | None = None,
        later: bool = False,
        done: int | bytes | None = None,
    ) -> int:
        """Write one exchange atomically; returns the new id.

        `record` is a dict or its JSON text (a non-empty object, without "id"); `bodies` maps sha256
        hex to bytes. `head`: the record's head (its id left 0) and the fields it leaves out, from a
        writer that built the record (else they are read from the text). Inside `batch()`, the
        exchange is committed with the batch (the id is known now). `later`: what the write itself
        does not need (its samples for the dictionaries, the compressor its session's next request
        will use) waits for `catch_up`, which a proxy calls once the answer is released. `done`: the
        answered row (`keep_answered`) this exchange was written from, deleted in the same transaction.
        """
        text = record if isinstance(record, str) else json.dumps(record)
        self._learn(text, bodies, recorded.session if later and recorded is not None else None)
        if self._batch is None:
            return self._commit([(text, bodies, recorded, head, done)])[0]
        self._batch.append((text, bodies, recorded, head, done))
        new_id = self._batch_base + len(self._batch)
        if len(self._batch) >= self._batch_size:
            self._flush()
        return new_id

    @contextmanager
    def batch(self, size: int = 100) -> Iterator[None]:
        """Appends inside commit `size` at a time, in one transaction each, rather than one each:
        for bulk writers (import, benchmarks), never for a proxy, which commits an exchange before
        its answer is released. What was appended is committed when the block ends, even by an error."""
        if self._batch is not None:
            yield
            return
        self._batch, self._batch_size = [], size
        self._batch_base = self.last_id()
        try:
            yield
        finally:
            try:
                self._flush()
            finally:
                self._batch = None

    def _flush(self) -> None:
        if self._batch:
            items, self._batch = self._batch, []
            ids = self._commit(items)
            if ids[0] != self._batch_base + 1:
                raise StoreError(f"store {self.path} was written by another process during a batch; record it again")
            self._batch_base = ids[-1]

    def _commit(self, items: list[_Item]) -> list[int]:
        """Exchanges in one transaction. A session's next request is compressed against bodies
        committed before it, so the chain links this transaction set are undone if it is not."""
        undo: list[tuple[str, Any]] = []

        def rollback() -> None:
            for session, old in reversed(undo):
                if old is None:
                    self._chains.pop(session, None)
                else:
                    self._chains[session] = old
            undo.clear()

        def write(txn: lmdb.Transaction) -> list[int]:
            rollback()  # a retry after the map grew starts again
            ids = []
            for text, bodies, recorded, head, done in items:
                self._chain_next = None
                ids.append(self._append(txn, text, bodies, recorded, chain=True, head=head))
                if done is not None:
                    self.drop_answered(txn, done)
                if self._chain_next is not None:
                    session, link = self._chain_next
                    undo.append((session, self._chains.get(session)))
                    self._chains[session] = link
                    self._chains.move_to_end(session)
                    if len(self._chains) > _CHAINS:
                        self._chains.popitem(last=False)  # a lost link costs compression only
            return ids

        try:
            return self._write(write)
        except BaseException:
            rollback()
            raise

    def append_many(self, items: list[tuple[dict[str, Any], Mapping[str, bytes], RecordedEntry | None]]) -> None:
        """Several exchanges in one transaction."""
        texts = [(r if isinstance(r, str) else json.dumps(r), b, e) for r, b, e in items]
        for text, bodies, _ in texts:
            self._learn(text, bodies)
        self._write(lambda txn: [self._append(txn, *item) for item in texts])

    def _learn(self, text: str, bodies: Mapping[str, bytes], later: str | None = None) -> None:
        """Install the dictionaries trained meanwhile, sample an exchange for those still to train
        (now, or with `later`, its session's name, in `catch_up`: samples are taken in append order
        either way)."""
        if self._training:
            self._trained()
        if later is not None:
            self._later.append((text, bodies, later))
        else:
            self._sampled(text, bodies)

    def _sampled(self, text: str, bodies: Mapping[str, bytes]) -> None:
        if len(self._keys) < 2 and self.writable:
            self._sample("record", self._as_stored(text.encode()))
            for data in bodies.values():
                self._sample("body", data)

    def catch_up(self) -> None:
        """The work `append(later=True)` left for after the answer's release, in append order."""
        while self._later:
            text, bodies, session = self._later.popleft()
            self._sampled(text, bodies)
            self.prepare_chain(session)

    def _append(
        self,
        txn: lmdb.Transaction,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
        chain: bool = False,
        head: tuple[Head, int] | None = None,
    ) -> int:
        body_key = self._keys.get("body") or None
        request = None
        if chain and recorded is not None and bodies:
            request = exchange_record.request_body(record if isinstance(record, str) else json.dumps(record))
            request = request if request in bodies else None  # chained only against a body written here
        link = self._chains.get(recorded.session) if request is not None and recorded is not None else None
        depth = -1  # the request's depth in its chain; -1: already stored, depth unknown
        for hexdigest, data in bodies.items():
            if not data:
                continue
            digest = bytes.fromhex(hexdigest)
            if txn.get(digest, db=self._bodies) is not None:  # stored once: skip compressing a known body
                continue
            if hexdigest == request:  # against its session's previous exchange
                value = self.encoded(data, link, body_key)
                depth = link[4] + 1 if link is not None and link[4] < CHAIN_DEPTH else 0
            else:
                value = self._codec.encode(data, body_key)
            txn.put(digest, value, db=self._bodies)
        if request is not None and recorded is not None:
            response = next((h for h in bodies if h != request), None)
            if response is not None and bodies[response]:
                self._chain_next = (recorded.session, (bytes.fromhex(request), bytes(bodies[request]),
                                                       bytes.fromhex(response), bytes(bodies[response]),
                                                       depth if depth >= 0 else CHAIN_DEPTH))
        with txn.cursor(db=self._exchanges) as cur:
            new_id = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
        doc = exchange_record.with_id(record if isinstance(record, str) else json.dumps(record), new_id).encode()
        checked = head if head is not None else self.checked_head(doc, new_id)
        stored, r = store_records.encoded(self._codec, self._keys.get("record") or None, doc, checked)
        packed = _U64.pack(new_id)
        txn.put(packed, stored, db=self._exchanges, append=True)
        assert self._numbering is not None  # a writer's
        txn.put(packed, self._numbering.sealed(txn, packed, r), db=self._heads, append=True)
        if recorded is not None:
            self._put_index(txn, new_id, recorded)
        return new_id

    def _as_stored(self, text: bytes) -> bytes:
        """A record's text as most are stored here, for the record dictionary to be trained on."""
        try:
            return store_records.stripped(text)
        except (msgspec.ValidationError, msgspec.DecodeError):
            return text

    def _decode_record(self, exchange_id: int, raw: bytes, value: Any = False, txn: Any = None) -> Exchange:
        """A stored record, or StoreError naming the store and the exchange: a record that does not
        decode or does not have the record type's fields and types is never used (joined with its
        head `value`, read here unless given, in `txn` or a read of its own)."""
        try:
            if txn is not None:
                ex = exchange_record.parse(self._text_of(txn, _U64.pack(exchange_id), raw, value))
            else:
                with self._env.begin() as own:
                    ex = exchange_record.parse(self._text_of(own, _U64.pack(exchange_id), raw, value))
        except StoreError:
            raise
        except DAMAGE as exc:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is damaged ({exc.__class__.__name__}: "
                             f"{exc}); restore the store from a copy or record it again") from None
        if ex.id != exchange_id:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is damaged (its record says id {ex.id}); "
                             "restore the store from a copy or record it again")
        return ex

    def exchange(self, exchange_id: int) -> Exchange | None:
        if not 0 <= exchange_id < _ID_END:
            return None
        with self._reading(f"exchange {exchange_id}"), self._env.begin(db=self._exchanges) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else self._decode_record(exchange_id, raw, txn=txn)

    def exchanges(self, start: int = 1) -> Iterator[Exchange]:
        """Every exchange in write order (a consistent snapshot), from id `start` on."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges, buffers=True) as txn:
            cur = txn.cursor()
            if start >= _ID_END or not cur.set_range(_U64.pack(max(start, 0))):
                return
            for k, raw in cur:
                yield self._decode_record(_U64.unpack(k)[0], raw, txn=txn)

    def heads(self) -> Iterator[Head]:
        """Every exchange's head in write order: what `nfproxy log` and nfanalyze read, from the
        heads table (`_paired_batches`: each head checked, and its tie to its record). Damage is a
        StoreError naming the exchange."""
        head = store_heads.head
        for exchange_id, p in self.head_parts():
            yield head(exchange_id, p)

    def _sets_of(self, kind: str) -> dict[int, tuple[Any, ...]]:
        """The heads' labels or routes, read whole (an entry per distinct set: labels grow with sessions)."""
        db = self._sets.get(kind)
        if db is None:
            return {}
        with self._reading(kind), self._env.begin(db=db, buffers=True) as txn:
            try:
                return store_heads.read_sets(kind, txn.cursor())
            except ValueError as exc:
                raise StoreError(f"store {self.path}: {exc}; {store_records.RESTORE}") from None

    def checked_head(self, record: bytes, exchange_id: int) -> tuple[Head, int] | None:
        """A record's JSON text's head and the fields it leaves out (`exchange_record.checked_head`),
        or StoreError naming this store and the exchange where the text is not an exchange record."""
        try:
            return exchange_record.checked_head(record)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"store {self.path}: exchange {exchange_id} is not an exchange record ({exc}); "
                             "restore the store from a copy or record it again") from None

    def record_texts_of(self, ids: list[int]) -> list[bytes]:
        """The stored records' JSON bytes of these exchanges, decoded but not parsed, in one read."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges) as txn:
            out = []
            for i in ids:
                raw = txn.get(_U64.pack(i))
                if raw is None:
                    raise StoreError(f"store {self.path}: exchange {i} is missing; restore it from a copy")
                out.append(self._text_of(txn, _U64.pack(i), raw))
            return out

    def record_texts(self, start: int = 1) -> Iterator[tuple[int, bytes]]:
        """(id, the stored record's JSON bytes) in write order, decoded but not parsed: for copying."""
        with self._reading("exchanges"), self._env.begin(db=self._exchanges, buffers=True) as txn:
            cur = txn.cursor()
            if start >= _ID_END or not cur.set_range(_U64.pack(max(start, 0))):
                return
            for k, raw in cur:
                yield _U64.unpack(k)[0], self._text_of(txn, k, raw)

    def exchanges_after(self, after: int = 0) -> Iterator[Exchange]:
        """Exchanges with an id above `after`, in id order: a cursor, so a reader takes one page of
        a large store without touching the rest (nfview). Stop iterating to end the read."""
        yield from self.exchanges(start=after + 1)

    # -- outcome rows --------------------------------------------------------------------------

    def put_outcomes(self, rows: list[Mapping[str, Any]]) -> None:
        """Graded rows, one per (condition, task, replicate); grading again replaces a row."""
        def put(txn: lmdb.Transaction) -> None:
            for r in rows:
                txn.put(outcome_values.key(r), outcome_values.value(r), db=self._outcomes)

        self._write(put)

    def outcome_rows(self) -> list[dict[str, Any]]:
        if self._outcomes is None:
            return []
        with self._reading("outcome rows"), self._env.begin(db=self._outcomes) as txn:
            return [outcome_values.row(k, v) for k, v in txn.cursor()]

    def outcome_texts(self, size: int = 10_000) -> Iterator[list[bytes]]:
        """The stored outcome rows' texts in key order (`outcome_rows`' order), `size` at a time,
        in one read: a reader holds one list of them, not a study's rows."""
        if self._outcomes is None:
            return
        with self._reading("outcome rows"), self._env.begin(db=self._outcomes) as txn:
            items = txn.cursor().iternext()
            while chunk := list(islice(items, size)):
                yield [outcome_values.text(k, v) for k, v in chunk]

    def raw_table(self, name: str) -> Iterator[tuple[bytes, bytes]]:
        """A table's keys and values as stored, in key order (compact copies them)."""
        db = {"meta": self._meta, "recorded": self._recorded, "outcomes": self._outcomes, "lookups": self._lookups, "index_routes": self._index_routes, "heads": self._heads,
              "bodies": self._bodies, "dicts": self._dicts, **self._sets}[name]
        if db is None:
            return
        with self._reading(name), self._env.begin(db=db, buffers=False) as txn:
            yield from txn.cursor()

    def copy_to(self, folder: Path) -> None:
        """A copy of this store (a consistent snapshot, no reserved map) in an empty folder: a shard to ship."""
        with self._reading():
            # LMDB's compacting copy cannot walk tables of fixed-size duplicates (it crashes): a
            # store with lookups is copied page for page
            self._env.copy(str(folder), compact=self._lookups is None or not self._has_rows(self._lookups))

    def refill_pages(self, progress: Any = lambda s: None, lookups: Any = None) -> tuple[int, int]:
        """This store rewritten with its pages full (`compact.refill`: tables in key order, values as
        stored), the data file swapped in one rename; used bytes before and after. The handle's
        last write: it is read-only afterwards (its map is the replaced file). `lookups`: a
        callable giving every replay lookup the new file holds, in key order (merge's, written
        once there rather than here and copied again); the copy leaves out the mark
        (`mark_unindexed`) that said they were still to come."""
        from noisefloor.proxy.store import compact
        from noisefloor.proxy.store.merge.shard import UNINDEXED

        if self._record_lock is None:
            raise StoreError(f"store {self.path}: refilling its pages needs the recording lock")
        replaced, dropped = ({b"lookups": lookups}, (b"meta", UNINDEXED.encode())) if lookups else (None, None)
        with self._reading("refilling pages"):
            done = compact.refill(self._env, self.path, progress, replaced, dropped)
        self.writable = False
        return done

    def _has_rows(self, db: Any) -> bool:
        with self._env.begin(db=db) as txn:
            return txn.stat(db)["entries"] > 0

    def __len__(self) -> int:
        with self._reading(), self._env.begin(db=self._exchanges) as txn:
            return txn.stat(self._exchanges)["entries"]

    def last_id(self) -> int:
        with self._reading(), self._env.begin(db=self._exchanges) as txn, txn.cursor() as cur:
            return _U64.unpack(cur.key())[0] if cur.last() else 0

    def usage(self) -> dict[str, int]:
        """Bytes: `used` by pages holding data, `file` on disk (the reserved map)."""
        info, st = self._env.info(), self._env.stat()
        return {"used": (info["last_pgno"] + 1) * st["psize"], "file": os.fstat(self._fd).st_size,
                "map": info["map_size"]}

    # -- internals -----------------------------------------------------------------------------

    def _write(self, fn: Any) -> Any:
        if not self.writable:
            raise StoreError(f"store {self.path} was opened read-only")
        while True:
            self._check_intact()
            try:
                with self._env.begin(write=True) as txn:
                    done = fn(txn)
            except BaseException as exc:  # whatever undid the transaction, its label numbers go with it
                self._settle(False)
                if isinstance(exc, lmdb.MapFullError):
                    grow(self._env, self.path)
                    continue
                if isinstance(exc, lmdb.Error):
                    raise StoreError(f"writing store {self.path} failed ({exc}); nothing of this exchange was kept") \
                        from exc
                raise
            self._settle(True)
            return done

    def _settle(self, committed: bool) -> None:
        if self._numbering is not None:
            self._numbering.settle(committed)


def _refuse_other_format(p: Path) -> None:
    """A StoreError where the store at `p` is marked with a format this runtime does not write
    (read before a writer touches it; a store not marked yet is a writer's to mark)."""
    env, _ = open_env(p, False)
    try:
        try:
            with env.begin(db=env.open_db(b"meta", create=False)) as txn:
                raw = txn.get(b"format")
        except lmdb.NotFoundError:
            return
        fmt = None if raw is None else json.loads(raw)
    except (lmdb.Error, ValueError) as exc:
        raise StoreError(f"{p} is an LMDB environment but not an nfproxy store ({exc})") from None
    finally:
        env.close()
    why = None if fmt is None else refusal(p, fmt)
    if why is not None:
        raise StoreError(why)


def _cut(data: Path, used: int) -> None:
    """A closed store's data file cut to its `used` bytes, on disk before the lock is let go."""
    fd = os.open(data, os.O_WRONLY)
    try:
        if os.fstat(fd).st_size > used:
            os.ftruncate(fd, used)
            os.fsync(fd)
    finally:
        os.close(fd)


def _locked(fh: Any, tries: int = 50) -> None:
    """The record lock taken, or OSError where another process holds it. A reader asking whether a
    recorder is live (`AnsweredRows.unfinished`) holds it shared for a moment: tried again for up
    to ~0.1 s, so that moment is not mistaken for a recorder."""
    for attempt in range(tries):
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if attempt == tries - 1:
                raise
            time.sleep(0.002)


# an exchange to append: its record's text, bodies, replay entry, head, and the answered row it is written from
_Item = tuple[str, Mapping[str, bytes], RecordedEntry | None, tuple[Head, int] | None, int | bytes | None]


