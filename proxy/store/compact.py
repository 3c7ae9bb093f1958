"""`nfproxy compact` and `nfproxy migrate`: rewrite a store whole, in today's format and encoding.

Every value is read verified (a damaged store is refused by name before anything is replaced),
dictionaries are trained again on a sample spread over the whole store, every body and record is
encoded with them, and the result is written to a new file of exactly the pages it uses, which
then replaces the store's data file in one rename. A store of an earlier format comes out in
today's (its replay index in layout 4); a store of today's format comes out smaller
(dictionaries trained on all of it, pages full, no reserved map beyond its data). Killed at any
point, the store is as it was (the rewrite happens beside it), and running it again starts over.
Readers that had the store open keep reading the old file until they close it.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.record import interrupted
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _outcome_values as outcome_values
from noisefloor.proxy.store import _records as store_records
from noisefloor.proxy.store import _repack as store_repack
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store._index import put_entry
from noisefloor.proxy.store.env import DAMAGE
from noisefloor.proxy.store.log import FORMAT, Store, StoreError

_SAMPLES = 4000  # values of each kind sampled for training
_BATCH = 5000  # values per write transaction
# Offline, so compact spends CPU the record path cannot: higher zstd levels (decoding is as fast)
# and dictionaries of up to 256 kB, at most about 1/500 of the kind's bytes (a larger one costs
# more than it saves on a small store). Per kind, on a 100k store's values with a 256 kB dictionary
# (bytes / raw, compression CPU per value): bodies 0.183 at level 3 (5 us), 0.175 at 12 (68 us),
# 0.159 at 16 (225 us), 0.157 at 19 (524 us); records 0.189 at 3, 0.183 at 12 (39 us), 0.181 at 16
# (97 us), 0.174 at 19 (664 us). Each kind at the level past which it gains little.
LEVELS = {"body": 16, "record": 12}
_DICT_MAX, _DICT_SHARE = 4 * codec.DICT_SIZE, 500
_U64 = struct.Struct(">Q")


@dataclass(frozen=True)
class Rewritten:
    exchanges: int
    bodies: int
    before_bytes: int  # the data file before
    after_bytes: int
    from_format: str | None


def _every(n: int, want: int) -> int:
    return max(1, n // want)


def rewrite(path: Path, progress: Callable[[str], None] = lambda s: None) -> Rewritten:
    path = Path(path)
    before = (path / "data.mdb").stat().st_size if (path / "data.mdb").exists() else 0
    with Store.open(path, write=True) as src:
        src.lock_for_recording()  # no proxy records into it while it is rewritten
        interrupted.finish(src, progress)  # what a killed proxy or merge left: the rewritten store replays whole
        fmt = src.meta("migrated_from") or src.format
        n_ex, n_bodies = len(src), src.body_count()
        samples = _samples(src, n_ex, n_bodies, progress)
        steps = (_every(n_bodies, _SAMPLES), _every(n_ex, _SAMPLES))
        work = path.parent / f".{path.name}.rewrite"
        final = path.parent / f".{path.name}.compact"
        for p in (work, final):
            shutil.rmtree(p, ignore_errors=True)
        work.mkdir()
        final.mkdir()
        env = lmdb.open(str(work), map_size=max(1 << 30, 2 * before), max_dbs=12, sync=False, metasync=False)
        try:
            dbs = {name: env.open_db(name.encode()) for name in ("meta", "bodies", "exchanges", "recorded", "outcomes",
                                                                 "dicts", "heads", "index_routes", *store_heads.SETS)}
            dbs["lookups"] = env.open_db(b"lookups", dupsort=True, dupfixed=True)
            keys: dict[str, bytes] = {}
            dicts: dict[bytes, bytes] = {}
            with env.begin(write=True) as txn:
                for kind, kind_samples, step in zip(("body", "record"), samples, steps):
                    trained = codec.train(kind_samples, _dict_size(kind_samples, step))
                    if trained is not None:
                        keys[kind] = codec.dict_key(trained)
                        dicts[keys[kind]] = trained
                        txn.put(keys[kind], trained, db=dbs["dicts"])
            _copy_bodies(src, env, dbs["bodies"], codec.Codec(dicts.get, LEVELS["body"]), keys.get("body"), progress)
            _copy_records(src, env, dbs, codec.Codec(dicts.get, LEVELS["record"]), keys.get("record"), progress)
            # the replay index, in layout 4 (a compacted store replays without loading it)
            indexed = _copy_index(src, env, dbs, progress)
            with env.begin(write=True) as txn:
                for db_name, items in (("outcomes", _outcomes(src)), ("meta", src.raw_table("meta"))):
                    for k, v in items:
                        txn.put(k, v, db=dbs[db_name])
                if indexed:
                    txn.put(b"replay_index", json.dumps(replay_index.VERSION).encode(), db=dbs["meta"])
                txn.put(b"format", json.dumps(FORMAT).encode(), db=dbs["meta"])
                txn.put(b"dicts", json.dumps({k: v.hex() for k, v in keys.items()}).encode(), db=dbs["meta"])
                txn.delete(b"migrated_from", db=dbs["meta"])
                if fmt != FORMAT:
                    txn.put(b"migrated_from", json.dumps(fmt).encode(), db=dbs["meta"])
            # written in order, so it holds few free pages; LMDB's compacting copy cannot walk tables
            # of fixed-size duplicates (it crashes), so the copy is a plain one
            env.copy(str(final))
        finally:
            env.close()
            shutil.rmtree(work, ignore_errors=True)
        store_repack.swap_in(final, path)
        shutil.rmtree(final, ignore_errors=True)
    with Store.open(path, write=False) as check:  # the result reads back whole
        if len(check) != n_ex:
            raise StoreError(f"rewriting {path} lost exchanges ({len(check)} of {n_ex})")
    return Rewritten(n_ex, n_bodies, before, (path / "data.mdb").stat().st_size, fmt)


def _copy_bodies(src: Store, env: lmdb.Environment, db: object, out: codec.Codec, key: bytes | None,
                 progress: Callable[[str], None]) -> None:
    # compressed against other bodies: kept as it is (they are all copied); else encoded again;
    # either behind its CRC (noisefloor-log/6)
    items = ((digest, codec.checked(codec.unchecked(stored) if codec.Codec.refs_of(stored) else out.encode(data, key)))
             for digest, data, stored in src.stored_bodies(encoded=True))
    _append_batched(env, db, items, progress, "bodies")  # in digest order, appended: pages filled whole


def _copy_records(src: Store, env: lmdb.Environment, dbs: dict[str, object], out: codec.Codec, key: bytes | None,
                  progress: Callable[[str], None]) -> None:
    """The records encoded again, each with its head (written from the record, tied to its new
    bytes), stripped of the head's fields where the head can stand for them (noisefloor-log/5)."""
    def items() -> Iterator[tuple[bytes, Any]]:
        # parsed: a record that is not an exchange record stops the rewrite, by name
        for ex, (i, text) in zip(src.exchanges(), src.record_texts()):
            if ex.id != i:
                raise StoreError(f"store {src.path}: exchange {i} is listed out of order; restore it from a copy")
            stored, r = store_records.encoded(out, key, text, src.checked_head(text, i), True)
            yield _U64.pack(i), stored
            yield _U64.pack(i), r

    names = store_heads.Sets(dbs["labels"], dbs["routes"])

    def head(txn: lmdb.Transaction, k: bytes, r: store_heads.Row | None) -> None:
        txn.put(k, names.sealed(txn, k, r), db=dbs["heads"], append=True)

    _append_batched(env, dbs["exchanges"], items(), progress, "exchanges", also=head, settle=names.settle)


def _dict_size(samples: list[bytes], step: int) -> int:
    """A dictionary's size for a kind whose values are about `step` times the samples' bytes."""
    return max(codec.DICT_SIZE, min(_DICT_MAX, sum(map(len, samples)) * step // _DICT_SHARE))


def _samples(src: Store, n_ex: int, n_bodies: int, progress: Callable[[str], None]) -> tuple[list[bytes], list[bytes]]:
    """Bodies and record texts spread evenly over the store, to train its new dictionaries on."""
    progress(f"sampling {n_ex} exchanges and {n_bodies} bodies")
    step_b, step_r = _every(n_bodies, _SAMPLES), _every(n_ex, _SAMPLES)
    bodies = [b for i, (_, b) in enumerate(src.stored_bodies()) if i % step_b == 0 and len(b) < 1 << 16]
    return bodies, [_as_stored(t) for i, t in src.record_texts() if i % step_r == 0]


def _as_stored(text: bytes) -> bytes:
    """A record's text as the rewrite stores it, for training on (most are stored stripped)."""
    try:
        return store_records.stripped(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return text


def _copy_index(src: Store, env: lmdb.Environment, dbs: dict[str, object], progress: Callable[[str], None]) -> bool:
    """The replay index in today's layout (4), whatever the source's: its entries in id order (pages
    full) and its lookups in key order (a source of layout 3 keeps its lookups, its entries' sketches
    shortened; one of layout 1 or 2 is converted: entries with their sketches, lookups gathered
    unsorted in a scratch file, then copied in order). False: the store has no lookups to carry
    (recorded before them), and its entries are copied as they are."""
    indexed, layout = src.has_replay_index(), src.meta("replay_index")
    if not indexed or layout in replay_index.ROUTED:  # entries as they are (and these lookups, already sorted)
        entries = _verified_entries(src)
        if indexed:
            entries = ((k, replay_index.as_current(raw)) for k, raw in entries)
        _append_batched(env, dbs["recorded"], entries, progress, "index entries")
        _append_batched(env, dbs["index_routes"], src.raw_table("index_routes"), progress, "index routes")
        if indexed:
            _append_batched(env, dbs["lookups"], src.raw_table("lookups"), progress, "index lookups", append=False)
        return indexed
    with tempfile.TemporaryDirectory(dir=Path(env.path())) as tmp:
        spill = lmdb.open(tmp, map_size=1 << 40, max_dbs=2, sync=False, metasync=False, writemap=False)
        try:
            unsorted = spill.open_db(b"lookups", dupsort=True, dupfixed=True)
            entries = src.recorded_entries()
            while batch := list(islice(entries, _BATCH)):
                with env.begin(write=True) as txn, spill.begin(write=True, db=unsorted) as spilled:
                    for e, near in zip(batch, replay_index.stored_near(src, [e.id for e in batch])):
                        e = replace(e, near=near)
                        put_entry(txn, dbs["recorded"], dbs["index_routes"], e.id, e, replay_index.VERSION)
                        spilled.cursor().putmulti(replay_index.lookup_rows(e.id, e, replay_index.VERSION))
                progress(f"{batch[-1].id} index entries converted")
            with spill.begin(buffers=False, db=unsorted) as txn:
                _append_batched(env, dbs["lookups"], iter(txn.cursor()), progress, "index lookups", append=False)
        finally:
            spill.close()
    return True


def _outcomes(src: Store) -> Iterator[tuple[bytes, bytes]]:
    """The graded rows as today's format keeps them (`outcome_values`), each read first: one whose
    key is not its own stops the rewrite, by name."""
    for k, v in src.raw_table("outcomes"):
        try:
            row = outcome_values.row(k, v)
            ok = outcome_values.key(row) == k
        except DAMAGE as exc:
            raise StoreError(f"store {src.path}: an outcome row is damaged ({exc.__class__.__name__}); restore the "
                             "store from a copy") from None
        if not ok:
            raise StoreError(f"store {src.path}: an outcome row is stored under another row's key; restore the "
                             "store from a copy")
        yield k, outcome_values.value(row, keyed=True)


def _verified_entries(src: Store) -> Iterator[tuple[bytes, bytes]]:
    """The replay index's entries as stored, each decoded first: a damaged one stops the rewrite, by name."""
    for k, raw in src.raw_table("recorded"):
        exchange_id = _U64.unpack(k)[0]
        try:
            ok = replay_index.entry(raw, exchange_id, src.route_of).id == exchange_id
        except DAMAGE as exc:
            raise StoreError(f"store {src.path}: the replay index entry of exchange {exchange_id} is damaged "
                             f"({exc.__class__.__name__}); restore the store from a copy") from None
        if not ok:
            raise StoreError(f"store {src.path}: the replay index entry of exchange {exchange_id} names another "
                             "exchange; restore the store from a copy")
        yield k, raw


def _append_batched(env: lmdb.Environment, db: object, items: Iterator[tuple[bytes, Any]],
                    progress: Callable[[str], None], what: str, append: bool = True,
                    also: Callable[[lmdb.Transaction, bytes, Any], None] | None = None,
                    settle: Callable[[bool], None] = lambda ok: None) -> None:
    """Append `items` (in key order) in transactions of _BATCH puts, saying how far it got after
    each. `append=False` for a table of sorted duplicates: LMDB fills its pages whole all the same.
    `also`: each item of `db` followed by one it writes (a record, then its head row); `settle`
    told after each transaction."""
    done = 0
    while True:
        with env.begin(write=True) as txn:
            n = 0
            for k, v in items:
                txn.put(k, v, db=db, append=append)
                if also is not None:
                    also(txn, *next(items))
                n += 1
                if n >= _BATCH:
                    break
        settle(True)
        done += n
        if n < _BATCH:
            return
        progress(f"{done} {what} rewritten")
