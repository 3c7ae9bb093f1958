"""A store's pages refilled: every table copied in key order into a new file, values as stored.

Bodies are keyed by their sha256, so whoever writes them (the recorder, `nfproxy merge`) puts
them in random key order: LMDB splits pages as they fill, and a store written that way holds its
bodies in pages about two thirds full, with free pages between (measured: 0.40x of the raw bytes
as merged at 100k where the same values, refilled, take 0.29x). Copied in key order, LMDB fills
each page whole. Nothing is decoded or encoded again: the bytes are those that were checked when
written, and every later read checks them as before. The copy is written beside the store and
swapped in with one rename (as `compact` does): killed midway, the store is as it was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb

from noisefloor.proxy.store.env import StoreError

_BATCH, _BATCH_BYTES = 20000, 64 << 20  # rows and bytes per write transaction: memory bounded, few commits
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
            flags = db.flags(txn)
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
        _rewrite(env, path, work, progress, replaced or {}, dropped)
    except (lmdb.Error, OSError) as exc:  # a full disk, say: the store stays as it was
        raise StoreError(f"refilling the pages of store {path} failed ({exc}); the store is as it was") from None
    return before, (path / "data.mdb").stat().st_size


def _rewrite(env: lmdb.Environment, path: Path, work: Path, progress: Callable[[str], None],
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
                out_db = out.open_db(name, **flags)
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
    """One table's rows in key order (duplicates in theirs), `_BATCH` a transaction; the copy
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
    if want > _BATCH:  # a large table: say how far it got
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
    if rows > _BATCH:
        progress(f"table {name}: {rows} rows refilled")


def _put(out: lmdb.Environment, out_db: Any, rows: Iterable[tuple[bytes, bytes]]) -> int:
    """Rows appended in key order in one write transaction; how many there were."""
    with out.begin(write=True, db=out_db) as w, w.cursor() as cur:
        return cur.putmulti(rows, append=True)[0]


def _chunks(rows: Iterator[tuple[bytes, bytes]]) -> Iterator[list[tuple[bytes, bytes]]]:
    """`rows` in lists of at most `_BATCH` rows and about `_BATCH_BYTES` (large bodies: few a list)."""
    chunk: list[tuple[bytes, bytes]] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += len(row[0]) + len(row[1])
        if len(chunk) >= _BATCH or size >= _BATCH_BYTES:
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
