"""A merge into a fresh OUT writes every shard's bodies once, in key order, before any record
(`merge_copy.copy_bodies`): the store it makes is the one the batches' own bodies made, a
damaged body no record names is still refused, and a merge killed after the bodies finishes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge import _copying as merge_copy
from noisefloor.proxy.store.merge import run as merge_mod
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import recorded_shards

TABLES = ("bodies", "exchanges", "heads", "lookups", "recorded", "meta", "outcomes", "dicts", "index_routes")


def _tables(path: Path) -> dict[str, str]:
    with Store.open(path, write=False) as s, s.tables.env.begin() as txn:
        out = {}
        for t in TABLES:
            db, h = s.tables.db.get(t), hashlib.sha256()
            for k, v in txn.cursor(db=db) if db is not None else ():
                h.update(k + b"\0" + v)
            out[t] = h.hexdigest()
        return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return recorded_shards(tmp_path_factory.mktemp("bodies_first"), 300)


def test_bodies_written_first_make_the_store_the_batches_made(shards, tmp_path, monkeypatch):
    said: list[str] = []
    first = merge(tmp_path / "first.lmdb", shards, said.append)
    assert any("bodies, in key order" in line for line in said)
    monkeypatch.setattr(merge_mod, "_bodies_first", lambda *a: None)
    old = merge(tmp_path / "old.lmdb", shards)
    assert (first.bodies_added, first.bodies_shared, first.exchanges_added) == \
        (old.bodies_added, old.bodies_shared, old.exchanges_added)
    assert _tables(tmp_path / "first.lmdb") == _tables(tmp_path / "old.lmdb")


def test_a_merge_killed_after_the_bodies_finishes_when_run_again(shards, tmp_path):
    """Killed between the bodies and the first batch: OUT holds bodies no record names; the next
    merge (OUT no longer fresh) writes the records and leaves the store a clean merge leaves."""
    killed = tmp_path / "killed.lmdb"
    with Store.open(killed, write=True, create=True) as dest:
        assert merge_copy.copy_bodies(dest, shards) > 0
    merge(killed, shards)
    merge(tmp_path / "clean.lmdb", shards)
    assert _tables(killed)["bodies"] == _tables(tmp_path / "clean.lmdb")["bodies"]
    with Store.open(killed, write=False) as a, Store.open(tmp_path / "clean.lmdb", write=False) as b:
        assert [e.json_bytes() for e in a.exchanges()] == [e.json_bytes() for e in b.exchanges()]


def test_a_damaged_body_that_no_record_names_is_refused_and_nothing_is_merged(shards, tmp_path):
    bad = tmp_path / "bad.lmdb"
    bad.mkdir()
    with Store.open(shards[0], write=False) as s:
        s.tables.copy_to(bad)
    with Store.open(bad, write=True) as s, s.tables.env.begin(write=True, db=s.tables.db["bodies"]) as txn:
        txn.put(b"\xff" * 32, bytes([codec.FRAME]) + b"\x28\xb5\x2f\xfd" + b"\0" * 8)  # not a frame
    with pytest.raises(StoreError, match="ffffffffffffffff.*nothing was merged"):
        merge(tmp_path / "out.lmdb", [bad, shards[1]])
    assert not (tmp_path / "out.lmdb").exists()  # every body is hashed before OUT is made
