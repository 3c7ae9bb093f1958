"""The log: one LMDB environment holding exchanges, bodies, the replay index and outcome rows.

Its tables are listed once, in `_tables.SCHEMA`. Each exchange is written in one transaction with
its bodies, head and replay entry, so a reader (or a proxy killed with SIGKILL) sees either the
whole exchange or none of it (bulk writers may put a batch in one). `Store` is the only way any
part of noisefloor reads the log: a handle over its parts (`_tables` the environment and its
disciplines, `_bodies`, `_dicts`, `_records`, `_walk`, `_index`, `_outcome_values`, and the
answered rows of `record.answered_rows`); merge works through them too (`merge.shard`,
`merge.scan`). Every read is verified: a body must hash to the digest it is stored under and
decompress within its recorded size (and the --max-body-mb bound), a record must parse as the
exchange record; anything else is a StoreError naming the store and the exchange.

The store is of one format (`env.FORMAT`); one of an earlier format is refused by one line
naming `nfproxy migrate`, which alone reads it (`migrate`).
"""

from __future__ import annotations

import fcntl
import json
import os
import struct
import time
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.record.answered_rows import AnsweredRows
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _records as store_records
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store._bodies import CHAIN_DEPTH, Ahead, Bodies, Link
from noisefloor.proxy.store._bodies import BodyOverLimit as BodyOverLimit
from noisefloor.proxy.store._dicts import Dictionaries
from noisefloor.proxy.store._index import Index
from noisefloor.proxy.store._outcome_values import Outcomes
from noisefloor.proxy.store._records import ID_END, Records
from noisefloor.proxy.store._tables import Tables
from noisefloor.proxy.store._walk import Walk
from noisefloor.proxy.store.env import FORMAT, StoreError, check_path, open_env, refusal
from noisefloor.proxy.store.exchange import Exchange, Head
from noisefloor.proxy.store.replay_index import RecordedEntry

DEFAULT_MAX_BODY = 64 << 20  # --max-body-mb's default: the most a stored body may decompress to
_U64 = struct.Struct(">Q")
_CHAINS = 4096  # sessions whose last exchange's bodies are kept for that (an LRU)


class Store:
    """An open log. Use `Store.open(path, write=...)`; close it (or use `with`) when done.

    Its parts, each over `tables`: `bodies`, `dictionaries` (and `codec`, their compression),
    `ahead` (the chain links a session's next request is compressed against), `records` (the
    records joined with their heads), `walk` (listings), `index` (replay's), `outcomes`,
    `answered` (rows a proxy keeps before an answer is released). The store itself opens and
    closes, holds the record lock and the meta, and appends an exchange across the parts."""

    def __init__(self, env: lmdb.Environment, path: Path, writable: bool, needed: int = 0,
                 max_body: int = DEFAULT_MAX_BODY) -> None:
        self.tables = tables = Tables(env, path, writable, needed)
        self.path = path
        self.max_body = max_body  # no stored body decompresses to more (a bomb costs what it would on the wire)
        self._record_lock: Any = None
        self._trim = False  # `trim_on_close`
        self.dictionaries = Dictionaries(tables)
        self.codec = codec.Codec(self.dictionaries.load)
        self.bodies = Bodies(tables, self.codec, max_body)
        self.ahead = Ahead(self.codec, tables)
        self.records = Records(tables, self.codec, max_body)
        self.walk = Walk(tables, self.records)
        self.index = Index(tables)
        self.outcomes = Outcomes(tables)
        self.answered = AnsweredRows(tables, lambda: self._record_lock is not None)
        self.numbering = store_heads.Sets(tables.db["labels"], tables.db["routes"]) if writable else None
        if self.numbering is not None:  # label numbers a write took go with it if it is undone
            tables.on_settle.append(self.numbering.settle)
        self._chain_next: tuple[str, Link] | None = None
        self._later: deque[tuple[str, Mapping[str, bytes], str]] = deque()  # appended, left for `catch_up`
        self._batch: list[_Item] | None = None
        self._batch_size = self._batch_base = 0

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
            _adopt_format(store)
            store.dictionaries.adopt_keys(store.meta("dicts"))
        except BaseException:
            store.close()
            raise
        return store

    @property
    def writable(self) -> bool:
        return self.tables.writable

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
        if self.dictionaries.training:  # a dictionary trained on this run's traffic is kept for the next one
            try:
                self.dictionaries.trained(wait=True)
            except StoreError:
                pass  # a store that cannot take it now is reported by the writes that follow
        used = self.tables.close()
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

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- meta ----------------------------------------------------------------------------------

    def meta(self, name: str) -> Any:
        with self.tables.reading(), self.tables.begin(db=self.tables.db["meta"]) as txn:
            raw = txn.get(name.encode())
            return None if raw is None else json.loads(raw)

    def set_meta(self, name: str, value: Any) -> None:
        self.tables.write(lambda txn: txn.put(name.encode(), json.dumps(value).encode(), db=self.tables.db["meta"]))

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
        chains = self.ahead.chains

        def rollback() -> None:
            for session, old in reversed(undo):
                if old is None:
                    chains.pop(session, None)
                else:
                    chains[session] = old
            undo.clear()

        def write(txn: lmdb.Transaction) -> list[int]:
            rollback()  # a retry after the map grew starts again
            ids = []
            for text, bodies, recorded, head, done in items:
                self._chain_next = None
                ids.append(self._append(txn, text, bodies, recorded, chain=True, head=head))
                if done is not None:
                    self.answered.drop(txn, done)
                if self._chain_next is not None:
                    session, link = self._chain_next
                    undo.append((session, chains.get(session)))
                    chains[session] = link
                    chains.move_to_end(session)
                    if len(chains) > _CHAINS:
                        chains.popitem(last=False)  # a lost link costs compression only
            return ids

        try:
            return self.tables.write(write)
        except BaseException:
            rollback()
            raise

    def append_many(self, items: list[tuple[dict[str, Any], Mapping[str, bytes], RecordedEntry | None]]) -> None:
        """Several exchanges in one transaction."""
        texts = [(r if isinstance(r, str) else json.dumps(r), b, e) for r, b, e in items]
        for text, bodies, _ in texts:
            self._learn(text, bodies)
        self.tables.write(lambda txn: [self._append(txn, *item) for item in texts])

    def _learn(self, text: str, bodies: Mapping[str, bytes], later: str | None = None) -> None:
        """Install the dictionaries trained meanwhile, sample an exchange for those still to train
        (now, or with `later`, its session's name, in `catch_up`: samples are taken in append order
        either way)."""
        if self.dictionaries.training:
            self.dictionaries.trained()
        if later is not None:
            self._later.append((text, bodies, later))
        else:
            self._sampled(text, bodies)

    def _sampled(self, text: str, bodies: Mapping[str, bytes]) -> None:
        if len(self.dictionaries.keys) < 2 and self.writable:
            self.dictionaries.sample("record", _as_stored(text.encode()))
            for data in bodies.values():
                self.dictionaries.sample("body", data)

    def catch_up(self) -> None:
        """The work `append(later=True)` left for after the answer's release, in append order."""
        while self._later:
            text, bodies, session = self._later.popleft()
            self._sampled(text, bodies)
            self.ahead.prepare_chain(session)

    def _append(
        self,
        txn: lmdb.Transaction,
        record: dict[str, Any] | str,
        bodies: Mapping[str, bytes],
        recorded: RecordedEntry | None,
        chain: bool = False,
        head: tuple[Head, int] | None = None,
    ) -> int:
        keys, db = self.dictionaries.keys, self.tables.db
        body_key, bodies_db = keys.get("body") or None, db["bodies"]
        request = None
        if chain and recorded is not None and bodies:
            request = exchange_record.request_body(record if isinstance(record, str) else json.dumps(record))
            request = request if request in bodies else None  # chained only against a body written here
        link = self.ahead.chains.get(recorded.session) if request is not None and recorded is not None else None
        depth = -1  # the request's depth in its chain; -1: already stored, depth unknown
        for hexdigest, data in bodies.items():
            if not data:
                continue
            digest = bytes.fromhex(hexdigest)
            if txn.get(digest, db=bodies_db) is not None:  # stored once: skip compressing a known body
                continue
            if hexdigest == request:  # against its session's previous exchange
                value = self.ahead.encoded(data, link, body_key)
                depth = link[4] + 1 if link is not None and link[4] < CHAIN_DEPTH else 0
            else:
                value = self.codec.encode(data, body_key)
            txn.put(digest, value, db=bodies_db)
        if request is not None and recorded is not None:
            response = next((h for h in bodies if h != request), None)
            if response is not None and bodies[response]:
                self._chain_next = (recorded.session, (bytes.fromhex(request), bytes(bodies[request]),
                                                       bytes.fromhex(response), bytes(bodies[response]),
                                                       depth if depth >= 0 else CHAIN_DEPTH))
        with txn.cursor(db=db["exchanges"]) as cur:
            new_id = _U64.unpack(cur.key())[0] + 1 if cur.last() else 1
        doc = exchange_record.with_id(record if isinstance(record, str) else json.dumps(record), new_id).encode()
        checked = head if head is not None else self.records.checked_head(doc, new_id)
        stored, r = store_records.encoded(self.codec, keys.get("record") or None, doc, checked)
        packed = _U64.pack(new_id)
        txn.put(packed, stored, db=db["exchanges"], append=True)
        assert self.numbering is not None  # a writer's
        txn.put(packed, self.numbering.sealed(txn, packed, r), db=db["heads"], append=True)
        if recorded is not None:
            self.index.put(txn, new_id, recorded)
        return new_id

    def exchange(self, exchange_id: int) -> Exchange | None:
        if not 0 <= exchange_id < ID_END:
            return None
        with self.tables.reading(f"exchange {exchange_id}"), self.tables.begin(db=self.tables.db["exchanges"]) as txn:
            raw = txn.get(_U64.pack(exchange_id))
            return None if raw is None else self.records.decode(exchange_id, raw, txn=txn)

    def exchanges(self, start: int = 1) -> Iterator[Exchange]:
        """Every exchange in write order (a consistent snapshot), from id `start` on."""
        with self.tables.reading("exchanges"), self.tables.begin(db=self.tables.db["exchanges"], buffers=True) as txn:
            cur = txn.cursor()
            if start >= ID_END or not cur.set_range(_U64.pack(max(start, 0))):
                return
            decode = self.records.decode
            for k, raw in cur:
                yield decode(_U64.unpack(k)[0], raw, txn=txn)

    def outcome_rows(self) -> list[dict[str, Any]]:
        """The graded outcome rows kept in this log (`outcomes`: the table's own reads and writes)."""
        return self.outcomes.rows()

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
        with self.tables.reading("refilling pages"):
            done = compact.refill(self.tables.env, self.path, progress, replaced, dropped)
        self.tables.writable = False
        return done

    def __len__(self) -> int:
        return self.tables.count("exchanges")

    def last_id(self) -> int:
        with self.tables.reading(), self.tables.begin(db=self.tables.db["exchanges"]) as txn, txn.cursor() as cur:
            return _U64.unpack(cur.key())[0] if cur.last() else 0


def _adopt_format(store: Store) -> None:
    """A new store marked with today's format; one of another format refused by one line."""
    fmt = store.meta("format")
    if fmt is None and store.writable:
        store.set_meta("format", FORMAT)
        store.set_meta("replay_index", replay_index.VERSION)
        return
    why = refusal(store.path, fmt)
    if why is not None:
        raise StoreError(why)


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


def _as_stored(text: bytes) -> bytes:
    """A record's text as most are stored here, for the record dictionary to be trained on."""
    try:
        return store_records.stripped(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return text


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


