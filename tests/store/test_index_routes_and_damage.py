"""A store written by main in the replay index's layout 2 (tests/data/store-index-v2, made by
tests/data/make_index_v2_store.py) brought by `nfproxy migrate` to today's layout (entries without
ids, their route a reference, 6-byte lookup keys, sketches at 16 bits a minimum), answering every
lookup as main's index did (tests/data/store-index-v2.json); today's layout's damage refused by
name. Real LMDB files, the real recorder, real nfproxy processes."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import pytest

from bench.store_traffic import REQUEST_HEADERS, record
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.traffic import RequestData
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import DATA
from tests.data.make_index_v1_store import answered, changed, layout
from tests.store.store_fixtures import fixture_copy, nfproxy, table_bytes

EXPECTED = json.loads((DATA / "store-index-v2.json").read_text())


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    return fixture_copy(tmp_path, "store-index-v2", "v2.lmdb")


def test_migrate_brings_it_to_todays_layout_with_the_same_answers(v2):
    entries = table_bytes(v2, "recorded")
    r = nfproxy("migrate", "--store", str(v2))
    assert r.returncode == 0, r.stderr
    assert f"from noisefloor-log/4 to {FORMAT}" in r.stdout
    assert layout(v2) == (FORMAT, replay_index.VERSION)
    assert answered(v2) == EXPECTED
    with Store.open(v2, write=False) as s:
        rows = list(s.tables.rows("lookups"))
        sketches = s.index.stored_sketches(list(range(1, 61)))
        routes = list(s.tables.rows("index_routes"))
    assert len(rows) == 60 * 19 and {len(k) for k, _ in rows} == {6}
    assert all(got is not None and len(got[1]) == replay_index.SHORT == 64 for got in sketches)
    assert len(routes) == 1 and routes[0][1][:8] == sketches[0][0]  # type: ignore[index]  # one route and model
    assert table_bytes(v2, "recorded") < entries


def test_merge_of_the_migrated_store_copies_it_with_the_same_answers(v2, tmp_path):
    assert nfproxy("migrate", "--store", str(v2)).returncode == 0  # entries and lookups copied as stored
    out = tmp_path / "merged.lmdb"
    assert merge(out, [v2]).exchanges_added == 60
    assert layout(out) == (FORMAT, replay_index.VERSION)
    assert answered(out) == EXPECTED


def test_a_damaged_entry_is_refused_by_name(v2, tmp_path):
    out = tmp_path / "merged.lmdb"
    assert nfproxy("migrate", "--store", str(v2)).returncode == 0
    merge(out, [v2])
    env = lmdb.open(str(out), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"recorded", txn=txn)
        raw = bytearray(txn.get((5).to_bytes(8, "big"), db=db))
        txn.put((5).to_bytes(8, "big"), bytes(raw[:-1]), db=db)  # its sketch cut short by one byte
    env.close()
    with Store.open(out, write=False) as s, pytest.raises(StoreError, match=r"store .* is damaged"):
        s.index.entries_by_id([4, 5])
    r = nfproxy("compact", "--store", str(out))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "entry of exchange 5 is damaged" in r.stderr.strip().splitlines()[-1]
    r = nfproxy("merge", str(tmp_path / "again.lmdb"), str(out))
    assert r.returncode != 0 and "Traceback" not in r.stderr and "exchange 5" in r.stderr.strip().splitlines()[-1]


def test_a_replay_miss_names_the_nearest(v2):
    assert nfproxy("migrate", "--store", str(v2)).returncode == 0
    with Store.open(v2, write=False) as s:
        index = replay_index.LmdbIndex(s)
        body = s.bodies.of_part(s.exchange(9).request, 9, "request")
        canonical = RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                                "/v1/chat/completions", REQUEST_HEADERS, changed(body)).canonical(Rules())
        near = index.near(canonical, "POST api.openai.com /v1/chat/completions")
    assert [[n.id, n.score, n.same_route_model] for n in near] == EXPECTED["9"]["near"]


def test_a_damaged_route_row_is_refused_by_name(v2, tmp_path):
    assert nfproxy("migrate", "--store", str(v2)).returncode == 0
    env = lmdb.open(str(v2), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"index_routes", txn=txn)
        key, value = next(iter(txn.cursor(db=db)))
        txn.put(key, value[:-1] + b"X", db=db)  # the route's last byte changed
    env.close()
    with Store.open(v2, write=False) as s, pytest.raises(StoreError, match=r"store .* is damaged.*route row"):
        s.index.entries_by_id([4])
    r = nfproxy("merge", str(tmp_path / "out.lmdb"), str(v2))
    assert r.returncode != 0 and "Traceback" not in r.stderr and "route row" in r.stderr.strip().splitlines()[-1]


def test_a_route_whose_row_key_is_taken_is_kept_inline(tmp_path):
    store = tmp_path / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        record(s, 3, seed=1, prefix="a")
        (bucket, _), route = s.index.stored_sketches([1])[0], s.index.entry(1).route  # type: ignore[misc, union-attr]
        key, _ = replay_index.route_row(route, bucket)
    env = lmdb.open(str(store), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"index_routes", txn=txn)
        txn.delete(key, db=db)
        txn.put(key, b"\0" * 8 + b"GET other /", db=db)  # another route's row under this key
    env.close()
    with Store.open(store, write=True) as s:
        record(s, 20, seed=2, prefix="b")
        late = s.index.entries_by_id(list(range(4, 24)))
        assert {e.route for e in late} == {route} and all(got[0] == bucket for got in s.index.stored_sketches(list(range(4, 24))))


def test_merge_refuses_a_shard_whose_entry_names_a_route_row_it_lacks(v2, tmp_path):
    assert nfproxy("migrate", "--store", str(v2)).returncode == 0
    env = lmdb.open(str(v2), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"index_routes", txn=txn)
        txn.drop(db, delete=False)
    env.close()
    r = nfproxy("merge", str(tmp_path / "out.lmdb"), str(v2))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "route row" in r.stderr.strip().splitlines()[-1] and "exchange 1" in r.stderr
