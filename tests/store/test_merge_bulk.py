"""`nfproxy merge`'s bulk path between layout-2 stores: replay entries copied as stored and the
lookups table copied whole with ids mapped write exactly the tables the per-exchange path wrote
(rows recomputed from each entry), whatever the chunking; a shard whose entries or lookups are
damaged is refused by name before anything is written; a merge stopped between a shard's records
and its lookups leaves OUT refused by replay until the next merge repairs it. Real LMDB stores
recorded through the real recorder."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import lmdb
import pytest

from noisefloor.proxy.store import compact, replay_index
from noisefloor.proxy.store._index import Index
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge import _copying as merge_copy
from noisefloor.proxy.store.merge import run as merge_mod
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import recorded_shards
from tests.data.make_index_v1_store import answers

TABLES = ("exchanges", "recorded", "lookups", "bodies", "outcomes")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two shards recorded through the recorder (different sessions), only read by the tests."""
    return recorded_shards(tmp_path_factory.mktemp("bulk"), 160)


@pytest.fixture(scope="module")
def per_exchange(shards: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards merged the way merge did before the bulk path: every entry's lookups recomputed."""
    out = tmp_path_factory.mktemp("slow") / "out.lmdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Index, "adopt_routes", lambda self, source: False)
        merge(out, shards)
    return out


def tables(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    with Store.open(path, write=False) as s, s.tables.env.begin(buffers=False) as txn:  # every row, as stored
        return {name: list(txn.cursor(db=s.tables.env.open_db(name.encode(), txn=txn, create=False)).iternext())
                for name in TABLES}


def test_the_bulk_path_writes_the_tables_the_per_exchange_path_wrote(shards, per_exchange, tmp_path, monkeypatch):
    with Store.open(shards[0], write=False) as s:
        assert any(n > 1 for n in _ids_per_key(s).values())  # keys shared by exchanges
    expected = tables(per_exchange)
    assert len(expected["lookups"]) > 19 * 160
    out = tmp_path / "out.lmdb"
    merge(out, shards)  # the second shard goes into a non-empty lookups table
    assert tables(out) == expected
    monkeypatch.setattr(merge_copy, "LOOKUP_CHUNK", 7)  # a key's ids split across reads
    one_by_one = tmp_path / "one-by-one.lmdb"
    for shard in shards:
        merge(one_by_one, [shard])
    assert tables(one_by_one) == expected
    with Store.open(out, write=False) as a, Store.open(per_exchange, write=False) as b:
        assert answers(a, range(1, 321, 9)) == answers(b, range(1, 321, 9))


def _ids_per_key(s: Store) -> dict[bytes, int]:
    found: dict[bytes, int] = {}
    for keys, _ in s.index.lookup_chunks(1 << 16):
        for i in range(0, len(keys), 9):
            found[keys[i:i + 9]] = found.get(keys[i:i + 9], 0) + 1
    return found


def _damaged(shard: Path, where: Path, change) -> Path:
    copy = where / "damaged.lmdb"
    shutil.copytree(shard, copy)
    env = lmdb.open(str(copy), max_dbs=12)
    with env.begin(write=True) as txn:
        change(txn, env)
    env.close()
    return copy


def _drop_a_band(txn: lmdb.Transaction, env: lmdb.Environment) -> None:
    db = env.open_db(b"lookups", txn=txn, dupsort=True, dupfixed=True)
    cur = txn.cursor(db=db)
    assert cur.set_range(replay_index.BAND)
    assert cur.delete()


def _garble_an_entry(txn: lmdb.Transaction, env: lmdb.Environment) -> None:
    txn.put(struct.pack(">Q", 5), b"\xc1 not an entry", db=env.open_db(b"recorded", txn=txn))


def _name_no_exchange(txn: lmdb.Transaction, env: lmdb.Environment) -> None:
    db = env.open_db(b"lookups", txn=txn, dupsort=True, dupfixed=True)
    txn.put(replay_index.BAND + bytes(8), struct.pack(">I", 99999), db=db)


@pytest.mark.parametrize(("change", "says"), [
    (_drop_a_band, "replay lookups where its entry implies 19"),
    (_garble_an_entry, "exchange 5's replay-index entry is damaged"),
    (_name_no_exchange, "names no exchange of the store"),
])
def test_damaged_lookups_or_entries_are_refused_before_anything_is_written(shards, tmp_path, change, says):
    damaged = _damaged(shards[1], tmp_path, change)
    out = tmp_path / "out.lmdb"
    with pytest.raises(StoreError, match=says) as err:
        merge(out, [shards[0], damaged])
    assert str(damaged) in str(err.value) and "nothing was merged" in str(err.value)
    assert not out.exists()


def test_a_merge_stopped_before_a_shards_lookups_is_refused_by_replay_and_repaired_by_the_next(
        shards, per_exchange, tmp_path, monkeypatch):
    out = tmp_path / "out.lmdb"

    def killed(*args: object) -> None:
        raise SystemExit("killed between the records and the lookups")

    with monkeypatch.context() as mp:
        mp.setattr(merge_mod, "_REFILL", 0)  # no refill: each shard's lookups copied after its records
        mp.setattr(merge_copy, "copy_lookups", killed)
        with pytest.raises(SystemExit):
            merge(out, shards)
    with Store.open(out, write=False) as s:
        assert 0 < len(s) < 320 and s.meta(replay_index.MERGING) == 1
        with pytest.raises(StoreError, match="run the same nfproxy merge again"):
            replay_index.open_index(s)
    again = merge(out, shards)
    assert again.sessions_present > 0 and again.exchanges_added == 320 - 160
    assert tables(out) == tables(per_exchange)
    with Store.open(out, write=False) as s:
        assert s.meta(replay_index.MERGING) is None
        assert isinstance(replay_index.open_index(s), replay_index.LmdbIndex)


def test_a_merge_stopped_in_its_refill_before_the_lookups_are_in_is_refused_by_replay_and_repaired_by_the_next(
        shards, per_exchange, tmp_path, monkeypatch):
    """Into a fresh OUT the shards' lookups are written once, by the refill: killed there, OUT holds
    every record, is marked, and the next merge writes the lookups from the entries."""
    out = tmp_path / "out.lmdb"

    def killed(*args: object) -> None:
        raise SystemExit("killed in the refill, before the lookups")

    with monkeypatch.context() as mp:
        mp.setattr(merge_copy, "_merged_ahead", killed)  # a fresh OUT's: appended, no refill
        with pytest.raises(SystemExit):
            merge(out, shards)
    with Store.open(out, write=False) as s:
        assert len(s) == 320 and s.meta(replay_index.MERGING) == 1 and s.tables.count("lookups") == 0
        with pytest.raises(StoreError, match="run the same nfproxy merge again"):
            replay_index.open_index(s)
    again = merge(out, shards)
    assert again.sessions_present > 0 and again.exchanges_added == 0
    assert tables(out) == tables(per_exchange)
    with Store.open(out, write=False) as s:
        assert s.meta(replay_index.MERGING) is None
        assert isinstance(replay_index.open_index(s), replay_index.LmdbIndex)


@pytest.mark.parametrize("ending", ["dies", "refuses"])
def test_the_process_merging_the_lookups_failing_fails_the_merge_and_the_next_one_repairs(
        shards, per_exchange, tmp_path, monkeypatch, ending):
    """The lookups of a fresh OUT are read and merged by a forked process: if it dies, or finds a
    shard damaged since its check, the merge fails in one line (the damage named), OUT is marked,
    and the next merge writes the lookups from the entries."""
    import os

    def dies(sending: object, deferred: object, parent: int) -> None:
        os._exit(3)

    def refuses(deferred: object) -> None:
        raise StoreError("store a.lmdb: a replay lookup is damaged; restore the store from a copy")
        yield

    out = tmp_path / "out.lmdb"
    with monkeypatch.context() as mp:  # forked after the patch: the child runs it
        if ending == "dies":
            mp.setattr(merge_copy, "_send_merged", dies)
        else:
            mp.setattr(merge_copy, "merged_lookups", lambda dest, deferred: refuses(deferred))
        with pytest.raises(StoreError, match="ended without a word" if ending == "dies" else "a.lmdb: a replay lookup"):
            merge(out, shards)
    with Store.open(out, write=False) as s:
        assert len(s) == 320 and s.meta(replay_index.MERGING) == 1 and s.tables.count("lookups") == 0
    merge(out, shards)
    assert tables(out) == tables(per_exchange)


def test_a_failed_refill_leaves_the_lookups_copied_into_out(shards, per_exchange, tmp_path, monkeypatch):
    """A refill that fails (a full disk, say) leaves OUT as it was: the deferred lookups are then
    copied into it, so it replays whole all the same."""
    from noisefloor.proxy.store import compact as store_repack

    def full(*args: object) -> None:
        raise OSError("no space left on device")

    out = tmp_path / "out.lmdb"
    with monkeypatch.context() as mp:
        mp.setattr(store_repack, "_refilled", full)
        mp.setattr(merge_mod, "_bodies_first", lambda *a: None)  # a fresh OUT is not refilled: its tables went in in order
        merge(out, shards)
    assert tables(out) == tables(per_exchange)
    with Store.open(out, write=False) as s:
        assert s.meta(replay_index.MERGING) is None


def test_compacting_a_store_a_merge_left_unindexed_indexes_it_first(shards, per_exchange, tmp_path, monkeypatch):
    """compact copies a store's lookups as they are: a merge's unfinished ones are finished first
    (computed from the entries, as the next merge would), so the compacted store replays whole."""
    out = tmp_path / "out.lmdb"
    with monkeypatch.context() as mp:
        mp.setattr(merge_mod, "_REFILL", 0)  # no refill: each shard's lookups copied after its records
        mp.setattr(merge_copy, "copy_lookups", lambda *a: (_ for _ in ()).throw(SystemExit("killed")))
        with pytest.raises(SystemExit):
            merge(out, shards)
    with Store.open(out, write=False) as s:
        present = len(s)
    assert 0 < present < 320
    compact.rewrite(out)
    with Store.open(out, write=False) as s:
        assert len(s) == present and s.meta(replay_index.MERGING) is None
        assert isinstance(replay_index.open_index(s), replay_index.LmdbIndex)
    want = [(k, v) for k, v in tables(per_exchange)["lookups"] if replay_index.ID.unpack(v)[0] <= present]
    assert tables(out)["lookups"] == want


def test_the_lookups_process_frames_its_messages_whatever_bytes_a_chunk_holds(monkeypatch):
    """A chunk whose key bytes spell the end or failure of the stream (a forged shard's keys are
    its own) comes through as a chunk: every message says what it is in its first byte."""
    import numpy as np

    keys = np.array([int.from_bytes(b"error x.", "little"), int.from_bytes(b".!end!!!", "little")], dtype=np.uint64)
    ids = np.array([1, 2], dtype=">u4").view("V4")
    monkeypatch.setattr(merge_copy, "merged_lookups", lambda dest, deferred: iter([(keys, ids), (keys[:1], ids[:1])]))
    got = list(merge_copy._merged_ahead([]))  # forked after the patch: the child sends these
    assert [len(k) for k, _ in got] == [2, 1]
    assert got[0][0].tolist() == keys.tolist() and got[0][1].tobytes() == ids.tobytes()
