"""A merge that brought most of OUT's exchanges ends with OUT's pages refilled (`store_repack`):
every table holds exactly the rows, in the same order, that the merge wrote, in fewer pages and a
file no larger than them; replay, listings and verification answer as before; a refill stopped
midway leaves the store as it was; a merge that adds nothing leaves the file alone. Real LMDB
stores recorded through the real recorder, merged by the real merge. And compact, at its higher
levels: fewer bytes than at the record path's, the same answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from bench.store_traffic import record
from noisefloor.proxy.store import compact as store_repack
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge import run as merge_mod
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import recorded_shards
from tests.data.make_index_v1_store import answers


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return recorded_shards(tmp_path_factory.mktemp("refill"), 200)


@pytest.fixture(scope="module")
def unfilled(shards: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards merged as before this: no refill."""
    out = tmp_path_factory.mktemp("unfilled") / "out.lmdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(merge_mod, "_REFILL", 0)
        merge(out, shards)
    return out


def rows(path: Path) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Every table's rows as stored, in order (the main table lists the tables)."""
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        return {name: _all(env, db) for name, db, _ in store_repack.tables(env)}
    finally:
        env.close()


def _all(env: lmdb.Environment, db: object) -> list[tuple[bytes, bytes]]:
    with env.begin(db=db, buffers=False) as txn:
        return list(txn.cursor())


def used(path: Path) -> int:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        return store_repack.used_bytes(env)
    finally:
        env.close()


def log(path: Path, *flags: str) -> str:
    done = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "log", "--store", str(path), *flags],
                          capture_output=True, text=True, check=True)
    return done.stdout.replace(str(path), "STORE")


@pytest.mark.parametrize("way", ["fresh", "refilled"])
def test_a_merge_refills_its_pages_and_keeps_every_row(shards, unfilled, tmp_path, monkeypatch, way):
    """Into a fresh OUT every table goes in in key order (bodies first, lookups appended last) and
    the file is cut to its pages; otherwise the pages are refilled: the same rows either way."""
    out = tmp_path / "out.lmdb"
    said: list[str] = []
    if way == "refilled":
        monkeypatch.setattr(merge_mod, "_bodies_first", lambda *a: None)
    merge(out, shards, said.append)
    assert any("pages refilled" in s for s in said) == (way == "refilled")
    got, before = rows(out), rows(unfilled)
    assert b"lookups" in got and b"heads" in got and len(got[b"exchanges"]) == 400
    assert got == before  # every table, every row, in order: values as stored
    assert used(out) < used(unfilled) * 0.9  # bodies went in by hash: pages were a third empty
    assert (out / "data.mdb").stat().st_size == used(out)  # the file is what it uses
    assert log(out) == log(unfilled) and log(out, "--json") == log(unfilled, "--json")
    with Store.open(out, write=False) as a, Store.open(unfilled, write=False) as b:
        assert answers(a, range(1, 401, 7)) == answers(b, range(1, 401, 7))
    with Store.open(out, write=True) as s:  # recorded into afterwards: the map grows from the file
        record(s, 5, seed=9, prefix="later")
    assert len(rows(out)[b"exchanges"]) == 405


def test_a_merge_that_adds_nothing_leaves_the_file(shards, tmp_path):
    out = tmp_path / "out.lmdb"
    merge(out, shards)
    inode = (out / "data.mdb").stat().st_ino
    merge(out, shards)  # everything is there already
    assert (out / "data.mdb").stat().st_ino == inode


def test_a_refill_stopped_midway_leaves_the_store_as_it_was(unfilled, tmp_path, monkeypatch):
    store = tmp_path / "s.lmdb"
    store.mkdir()
    (store / "data.mdb").write_bytes((unfilled / "data.mdb").read_bytes())
    before, data = rows(store), (store / "data.mdb").read_bytes()

    def killed(file: Path) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(store_repack, "_fsync", killed)
    with Store.open(store, write=True) as s, pytest.raises(KeyboardInterrupt):
        s.lock_for_recording()
        s.refill_pages()
    assert (store / "data.mdb").read_bytes() == data and rows(store) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.lmdb"]  # nothing left beside it


def test_refilling_or_cutting_the_file_needs_the_recording_lock(unfilled, tmp_path):
    store = tmp_path / "s.lmdb"
    store.mkdir()
    (store / "data.mdb").write_bytes((unfilled / "data.mdb").read_bytes())
    with Store.open(store, write=True) as s, pytest.raises(StoreError, match="recording lock"):
        s.refill_pages()
    with Store.open(store, write=True) as s, pytest.raises(StoreError, match="recording lock"):
        s.trim_on_close()
    with Store.open(store, write=True) as s:  # a recorder's: cut to its pages on close, every row kept
        s.lock_for_recording()
        s.trim_on_close()
    assert (store / "data.mdb").stat().st_size == used(store) and rows(store) == rows(unfilled)


def test_compact_compresses_harder_than_the_record_path_and_reads_the_same(unfilled, tmp_path, monkeypatch):
    """compact's levels (`compact.LEVELS`) against the record path's (level 3) on the same store:
    fewer bytes for bodies and records, every listing and replay answer the same."""
    from noisefloor.proxy.store import _codec as codec
    from noisefloor.proxy.store import compact

    copies = {}
    for name, levels in (("record-path", {"body": codec.LEVEL, "record": codec.LEVEL}), ("compact", compact.LEVELS)):
        copies[name] = tmp_path / f"{name}.lmdb"
        copies[name].mkdir()
        (copies[name] / "data.mdb").write_bytes((unfilled / "data.mdb").read_bytes())
        monkeypatch.setattr(compact, "LEVELS", levels)
        compact.rewrite(copies[name])
    sizes = {name: {t: sum(len(k) + len(v) for k, v in r) for t, r in rows(p).items()} for name, p in copies.items()}
    assert sizes["compact"][b"bodies"] < sizes["record-path"][b"bodies"] * 0.97
    # records gain from level 12 on a large store (100k: 0.063 -> 0.058x); on 400 of them it is a wash
    assert sum(sizes["compact"].values()) < sum(sizes["record-path"].values())
    assert log(copies["compact"], "--json") == log(copies["record-path"], "--json") == log(unfilled, "--json")
    with Store.open(copies["compact"], write=False) as a, Store.open(unfilled, write=False) as b:
        assert answers(a, range(1, 401, 7)) == answers(b, range(1, 401, 7))
        assert [d for d, _ in a.bodies.stored()] == [d for d, _ in b.bodies.stored()]


def test_a_refill_copies_in_bounded_chunks(unfilled, tmp_path, monkeypatch):
    """Rows are copied a bounded number (and bytes) at a time: with chunks of 7 rows or 3 kB (the
    lookups' fixed-size rows streamed 5 at a time) the copy holds every row all the same."""
    monkeypatch.setattr(store_repack, "_REFILL_BATCH", 7)
    monkeypatch.setattr(store_repack, "_FIXED_BATCH", 5)
    monkeypatch.setattr(store_repack, "_REFILL_BYTES", 3000)
    chunks = store_repack._chunks(iter([(b"k", b"v" * 5000)] * 3 + [(b"k", b"v")] * 20))
    assert [len(c) for c in chunks] == [1, 1, 1, 7, 7, 6]  # a large row alone, small ones 7 at a time
    store = tmp_path / "s.lmdb"
    store.mkdir()
    (store / "data.mdb").write_bytes((unfilled / "data.mdb").read_bytes())
    before = rows(store)
    with Store.open(store, write=True) as s:
        s.lock_for_recording()
        s.refill_pages()
    assert rows(store) == before and used(store) < used(unfilled)
    assert len(before[b"lookups"]) > 5 * 10  # streamed in many transactions


def test_a_merge_whose_refill_fails_is_merged_whole(shards, unfilled, tmp_path, monkeypatch):
    """A full disk while refilling: the merge still succeeds, says so, and OUT is as merged."""
    def full(file: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_repack, "_fsync", full)
    monkeypatch.setattr(merge_mod, "_bodies_first", lambda *a: None)  # the way that refills
    said: list[str] = []
    out = tmp_path / "out.lmdb"
    merge(out, shards, said.append)
    assert any("refilling the pages of store" in s and "No space left" in s for s in said)
    assert rows(out) == rows(unfilled) and log(out, "--json") == log(unfilled, "--json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.lmdb"]
