"""`nfproxy compact`: rewrite a store whole, smaller; and refill its pages.

Every value is read verified (a damaged store is refused by name before anything is replaced),
dictionaries are trained again on a sample spread over the whole store, every body and record is
encoded with them, and the result is written to a new file of exactly the pages it uses, which
then replaces the store's data file in one rename. The store comes out smaller (dictionaries
trained on all of it, pages full, no reserved map beyond its data). Killed at any
point, the store is as it was (the rewrite happens beside it), and running it again starts over.
Readers that had the store open keep reading the old file until they close it.

Refilling a store's pages (`refill`, after a merge) copies every table in key order into a new
file, values as stored: bodies are keyed by their sha256, so whoever writes them puts them in
random key order and LMDB leaves pages partly empty; copied in key order, LMDB fills each page
whole. Nothing is decoded or encoded again, and the copy is swapped in with one rename.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from noisefloor.proxy.record import interrupted
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _outcome_values as outcome_values
from noisefloor.proxy.store import _records as store_records
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store._tables import created
from noisefloor.proxy.store.env import DAMAGE, FORMAT
from noisefloor.proxy.store.log import DEFAULT_MAX_BODY, Store, StoreError

_SAMPLES = 4000  # values of each kind sampled for training
_BATCH = 5000  # values per write transaction
# Offline, so compact spends CPU the record path cannot: higher zstd levels (decoding is as fast)
# and dictionaries of up to 256 kB, at most about 1/500 of the kind's bytes (a larger one costs
# more than it saves on a small store). Each kind at the level past which it gains little
# (BENCHMARKS.md, "compact's zstd levels").
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


def rewrite(path: Path, progress: Callable[[str], None] = lambda s: None,
            max_body: int = DEFAULT_MAX_BODY) -> Rewritten:
    """The store at `path` (of today's format) rewritten whole; no body read decompresses past
    `max_body` (--max-body-mb: a store recorded under a higher limit is rewritten under it)."""
    path = Path(path)
    before = (path / "data.mdb").stat().st_size if (path / "data.mdb").exists() else 0
    with Store.open(path, write=True, max_body=max_body) as src:
        src.lock_for_recording()  # no proxy records into it while it is rewritten
        interrupted.finish(src, progress)  # what a killed proxy or merge left: the rewritten store replays whole
        fmt = src.meta("migrated_from") or src.format
        n_ex, n_bodies = len(src), src.tables.count("bodies")
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
            dbs = created(env)
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
            _copy_index(src, env, dbs, progress)
            with env.begin(write=True) as txn:
                for db_name, items in (("outcomes", keyed_outcomes(src.tables.rows("outcomes"), src.path)), ("meta", src.tables.rows("meta"))):
                    for k, v in items:
                        txn.put(k, v, db=dbs[db_name])
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
        swap_in(final, path)
        shutil.rmtree(final, ignore_errors=True)
    with Store.open(path, write=False, max_body=max_body) as check:  # the result reads back whole
        if len(check) != n_ex:
            raise StoreError(f"rewriting {path} lost exchanges ({len(check)} of {n_ex})")
    return Rewritten(n_ex, n_bodies, before, (path / "data.mdb").stat().st_size, fmt)


def _copy_bodies(src: Store, env: lmdb.Environment, db: Any, out: codec.Codec, key: bytes | None,
                 progress: Callable[[str], None]) -> None:
    # compressed against other bodies: kept as it is (they are all copied); else encoded again
    items = ((digest, stored if codec.Codec.refs_of(stored) else out.encode(data, key))
             for digest, data, stored in src.bodies.stored(encoded=True))
    _append_batched(env, db, items, progress, "bodies")  # in digest order, appended: pages filled whole


def _copy_records(src: Store, env: lmdb.Environment, dbs: dict[str, Any], out: codec.Codec, key: bytes | None,
                  progress: Callable[[str], None]) -> None:
    """The records encoded again, each with its head (written from the record, tied to its new
    bytes), stripped of the head's fields where the head can stand for them."""
    def items() -> Iterator[tuple[bytes, Any]]:
        # parsed: a record that is not an exchange record stops the rewrite, by name
        for ex, (i, text) in zip(src.exchanges(), src.records.texts()):
            if ex.id != i:
                raise StoreError(f"store {src.path}: exchange {i} is listed out of order; restore it from a copy")
            stored, r = store_records.encoded(out, key, text, src.records.checked_head(text, i))
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
    bodies = [b for i, (_, b) in enumerate(src.bodies.stored()) if i % step_b == 0 and len(b) < 1 << 16]
    return bodies, [_as_stored(t) for i, t in src.records.texts() if i % step_r == 0]


def _as_stored(text: bytes) -> bytes:
    """A record's text as the rewrite stores it, for training on (most are stored stripped)."""
    try:
        return store_records.stripped(text)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return text


def _copy_index(src: Store, env: lmdb.Environment, dbs: dict[str, Any], progress: Callable[[str], None]) -> None:
    """The replay index as stored: its entries in id order (pages full), each decoded first, and
    its routes and lookups in key order."""
    _append_batched(env, dbs["recorded"], _verified_entries(src), progress, "index entries")
    _append_batched(env, dbs["index_routes"], src.tables.rows("index_routes"), progress, "index routes")
    _append_batched(env, dbs["lookups"], src.tables.rows("lookups"), progress, "index lookups", append=False)


def keyed_outcomes(rows: Iterable[tuple[bytes, bytes]], path: Path) -> Iterator[tuple[bytes, bytes]]:
    """The graded rows of the store at `path` as today's format keeps them (`outcome_values`), each
    read first: one whose key is not its own stops the rewrite, by name."""
    for k, v in rows:
        try:
            row = outcome_values.row(k, v)
            ok = outcome_values.key(row) == k
        except DAMAGE as exc:
            raise StoreError(f"store {path}: an outcome row is damaged ({exc.__class__.__name__}); restore the "
                             "store from a copy") from None
        if not ok:
            raise StoreError(f"store {path}: an outcome row is stored under another row's key; restore the "
                             "store from a copy")
        yield k, outcome_values.value(row)


def _verified_entries(src: Store) -> Iterator[tuple[bytes, bytes]]:
    """The replay index's entries as stored, each decoded first: a damaged one stops the rewrite, by name."""
    for k, raw in src.tables.rows("recorded"):
        exchange_id = _U64.unpack(k)[0]
        try:
            ok = replay_index.entry(raw, exchange_id, src.index.route_of).id == exchange_id
        except DAMAGE as exc:
            raise StoreError(f"store {src.path}: the replay index entry of exchange {exchange_id} is damaged "
                             f"({exc.__class__.__name__}); restore the store from a copy") from None
        if not ok:
            raise StoreError(f"store {src.path}: the replay index entry of exchange {exchange_id} names another "
                             "exchange; restore the store from a copy")
        yield k, raw


def _append_batched(env: lmdb.Environment, db: Any, items: Iterator[tuple[bytes, Any]],
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


_REFILL_BATCH, _REFILL_BYTES = 20000, 64 << 20  # rows and bytes per write transaction: memory bounded, few commits
_FIXED_BATCH = 1 << 20  # rows per write transaction where each is a few bytes (a fixed-size duplicate)
_FLAGS = ("reverse_key", "dupsort", "integerkey", "integerdup", "dupfixed")


def tables(env: lmdb.Environment) -> list[tuple[bytes, Any, dict[str, bool]]]:
    """Every named table of `env`: its name, handle and the flags it was created with."""
    with env.begin() as txn:
        names = list(txn.cursor().iternext(values=False))
    out = []
    for name in names:
        try:
            db = env.open_db(name, create=False)
        except lmdb.Error as exc:  # a main-table key that is not a table: not a store this wrote
            raise StoreError(f"{name!r} in the store's main table is not a table ({exc})") from None
        with env.begin() as txn:
            flags = db.flags(txn)  # type: ignore[call-arg]  # py-lmdb takes the transaction; its stubs do not
        out.append((name, db, {f: bool(flags.get(f)) for f in _FLAGS}))
    return out


def used_bytes(env: lmdb.Environment) -> int:
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


Rows = Iterable[Iterable[tuple[bytes, bytes]]]  # a table's rows in key order, a transaction's worth each


def refill(env: lmdb.Environment, path: Path, progress: Callable[[str], None] = lambda s: None,
           replaced: dict[bytes, Callable[[], Rows]] | None = None,
           dropped: tuple[bytes, bytes] | None = None) -> tuple[int, int]:
    """Rewrite the store at `path` (whose open, locked environment is `env`) with its pages full;
    returns its used bytes before and after. The caller writes nothing to `env` afterwards: the
    file it maps has been replaced. `replaced`: tables whose rows come from elsewhere (merge's
    lookups, written once here instead of into `env` and copied again); `dropped`: (table, key)
    left out of the copy (the mark saying those lookups are still to come)."""
    before = used_bytes(env)
    work = path.parent / f".{path.name}.refill"
    try:
        _refilled(env, path, work, progress, replaced or {}, dropped)
    except (lmdb.Error, OSError) as exc:  # a full disk, say: the store stays as it was
        raise StoreError(f"refilling the pages of store {path} failed ({exc}); the store is as it was") from None
    return before, (path / "data.mdb").stat().st_size


def _refilled(env: lmdb.Environment, path: Path, work: Path, progress: Callable[[str], None],
             replaced: dict[bytes, Callable[[], Rows]], dropped: tuple[bytes, bytes] | None) -> None:
    """The tables copied into `work` and its file renamed over the store's. Written without
    writemap, in key order, the new file is its used pages and no more: it goes in as written
    (a copy of it, as `Environment.copy` makes, would be the same bytes written again)."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(path.parent / f".{path.name}.refilled", ignore_errors=True)  # an older version's leftover
    work.mkdir()
    try:
        out = lmdb.open(str(work), map_size=max(1 << 30, 2 * used_bytes(env)), max_dbs=16, sync=False, metasync=False)
        try:
            for name, db, flags in tables(env):
                out_db = out.open_db(name, **flags)  # type: ignore[arg-type]
                if name in replaced:
                    _write_rows(out, out_db, replaced[name](), name.decode(errors="replace"), progress)
                else:
                    _copy_table(env, db, flags, out, out_db, name.decode(errors="replace"), progress)
            if dropped is not None:
                with out.begin(write=True, db=out.open_db(dropped[0], create=False)) as w:
                    w.delete(dropped[1])
        finally:
            out.close()
        swap_in(work, path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _copy_table(env: lmdb.Environment, db: Any, flags: dict[str, bool], out: lmdb.Environment, out_db: Any, name: str,
                progress: Callable[[str], None]) -> None:
    """One table's rows in key order (duplicates in theirs), `_REFILL_BATCH` a transaction; the copy
    must hold as many rows as the source, or nothing is swapped in."""
    with env.begin(db=db, buffers=False) as txn:
        want = txn.stat(db)["entries"]
        rows = iter(txn.cursor())
        if flags["dupfixed"]:  # rows of a few bytes each (the replay lookups, most rows of a store):
            # streamed cursor to cursor, no Python step per row
            while want and (_put(out, out_db, islice(rows, _FIXED_BATCH)) == _FIXED_BATCH):
                pass
        for chunk in _chunks(rows):
            _put(out, out_db, chunk)
    with out.begin(db=out_db) as txn:
        got = txn.stat(out_db)["entries"]
    if got != want:
        raise StoreError(f"refilling table {name} copied {got} of its {want} rows; the store was left as it was")
    if want > _REFILL_BATCH:  # a large table: say how far it got
        progress(f"table {name}: {want} rows refilled")


def _write_rows(out: lmdb.Environment, out_db: Any, chunks: Rows, name: str, progress: Callable[[str], None]) -> None:
    """Rows from elsewhere appended in key order, a transaction a chunk; every row must land
    (append refuses one out of order), or nothing is swapped in."""
    rows = 0
    for chunk in chunks:
        with out.begin(write=True, db=out_db) as w, w.cursor() as cur:
            consumed, added = cur.putmulti(chunk, append=True)
        if added != consumed:
            raise StoreError(f"refilling table {name}: its rows came out of key order; the store was left as it was")
        rows += added
    if rows > _REFILL_BATCH:
        progress(f"table {name}: {rows} rows refilled")


def _put(out: lmdb.Environment, out_db: Any, rows: Iterable[tuple[bytes, bytes]]) -> int:
    """Rows appended in key order in one write transaction; how many there were."""
    with out.begin(write=True, db=out_db) as w, w.cursor() as cur:
        return cur.putmulti(rows, append=True)[0]


def _chunks(rows: Iterator[tuple[bytes, bytes]]) -> Iterator[list[tuple[bytes, bytes]]]:
    """`rows` in lists of at most `_REFILL_BATCH` rows and about `_REFILL_BYTES` (large bodies: few a list)."""
    chunk: list[tuple[bytes, bytes]] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += len(row[0]) + len(row[1])
        if len(chunk) >= _REFILL_BATCH or size >= _REFILL_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def swap_in(folder: Path, path: Path) -> None:
    """The data file written in `folder` becomes the store at `path`: on disk first, then one
    rename (the old file or the new, never half), also after a power loss (compact, refill)."""
    _fsync(folder / "data.mdb")
    os.replace(folder / "data.mdb", path / "data.mdb")


def _fsync(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
