"""`nfproxy merge` copies each record as stored: its bytes
untouched (its id is its key, the fields its head holds are in the head alone), the shard's
record dictionary copied into OUT by its key, the head tied to its new id. What OUT reads back is
what the shards say, exactly as a merge that decoded, joined and re-encoded every record writes;
a replay record's source id is still mapped, a record stored whole (keys this version does not
know) still merged; a damaged head or a record that is not its head's is refused by name with
nothing merged. Real LMDB stores recorded through
the real recorder, real `nfproxy` processes."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import compact
from noisefloor.proxy.store.log import FORMAT, Store
from noisefloor.proxy.store.merge import scan as store_merge_scan
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import recorded_shards

NFPROXY = str(Path(sys.executable).with_name("nfproxy"))
_U64 = struct.Struct(">Q")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two /5 shards, compacted: each with its own record dictionary (a store trains one after
    1,000 records; compact on whatever it holds)."""
    paths = recorded_shards(tmp_path_factory.mktemp("v5"), 150)
    for p in paths:
        compact.rewrite(p)
        with Store.open(p, write=False) as s:
            assert s.format == FORMAT and (s.meta("dicts") or {}).get("record")
    return paths


def rows(path: Path, name: str) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(name.encode(), create=False)) as txn:
            return list(txn.cursor())
    finally:
        env.close()


def exchanges(path: Path) -> dict[tuple[str, int], dict]:
    """Every exchange as its record says, by (session, seq), without its id (ids change in a merge)."""
    with Store.open(path, write=False) as s:
        return {(ex.session, ex.seq): {**ex.to_json(), "id": None} for ex in s.exchanges()}


def heads(path: Path) -> dict[tuple[str, str, int], tuple]:
    with Store.open(path, write=False) as s:
        return {(h.session, h.key, h.occurrence): (h.time, h.status, h.usage, h.url, h.model) for h in s.walk.heads()}


def test_records_are_copied_byte_for_byte_and_read_back_as_the_shards_say(shards, tmp_path):
    out = tmp_path / "out.lmdb"
    merge(out, shards)
    copied = sorted(v for p in shards for _, v in rows(p, "exchanges"))
    assert sorted(v for _, v in rows(out, "exchanges")) == copied  # not one byte re-encoded
    keys = {codec.Codec(lambda k: None).dictionary_of(v) for v in copied}
    assert len(keys) == 2 and keys <= {k for k, _ in rows(out, "dicts")}  # each shard's record dictionary
    want = {**exchanges(shards[0]), **exchanges(shards[1])}
    assert exchanges(out) == want and len(want) == 300
    assert heads(out) == {**heads(shards[0]), **heads(shards[1])}
    r = subprocess.run([NFPROXY, "log", "--json", "--store", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 300, r.stderr


def test_as_stored_reads_back_what_a_merge_that_re_encodes_every_record_writes(shards, tmp_path):
    fast, slow = tmp_path / "fast.lmdb", tmp_path / "slow.lmdb"
    merge(fast, shards)
    with pytest.MonkeyPatch.context() as mp:  # no head trusted: every record decoded, joined, encoded again
        mp.setattr(store_merge_scan, "checked_value", lambda k, value, raw: False)
        merge(slow, shards)
    assert rows(fast, "exchanges") != rows(slow, "exchanges")  # two ways of writing them ...
    with Store.open(fast, write=False) as a, Store.open(slow, write=False) as b:
        assert [ex.to_json() for ex in a.exchanges()] == [ex.to_json() for ex in b.exchanges()]  # ... one store
        assert list(a.walk.heads()) == list(b.walk.heads())
    assert rows(fast, "recorded") == rows(slow, "recorded") and rows(fast, "lookups") == rows(slow, "lookups")


def test_a_replay_record_and_a_record_stored_whole_are_merged_with_their_ids_mapped(shards, tmp_path):
    shard = tmp_path / "mixed.lmdb"
    shutil.copytree(shards[1], shard)
    with Store.open(shard, write=True) as s:
        first = s.exchange(1)
        base = {k: v for k, v in first.to_json().items() if k != "id"}
        s.append({**base, "session": "rp", "seq": 0, "mode": "replay", "replay": {"result": "hit", "source_id": 1}},
                 {}, None)
        whole = s.append({**base, "session": "odd", "seq": 0, "from_a_newer_writer": [1, 2]}, {}, None)
    stored = rows(shard, "exchanges")[whole - 1][1]
    with Store.open(shard, write=False) as s:  # the unknown key: its head says NOT_LISTED, the record is whole
        assert b'"id":%d' % whole in s.codec.decode(stored, 1 << 20)
    out = tmp_path / "out.lmdb"
    merge(out, [shards[0], shard])
    with Store.open(out, write=False) as s:
        by_session = {ex.session: ex for ex in s.exchanges()}
        source = s.exchange(by_session["rp"].replay["source_id"])
        assert (source.session, source.seq, source.key) == (first.session, first.seq, first.key)
        assert by_session["odd"].unknown == {"from_a_newer_writer": [1, 2]}
        assert len(s) == 302


def _poke(path: Path, table: str, exchange_id: int, fn) -> None:
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(table.encode(), txn=txn)
        txn.put(_U64.pack(exchange_id), fn(txn.get(_U64.pack(exchange_id), db=db)), db=db)
    env.close()


@pytest.mark.parametrize("how, said", [
    ("head", "the head of exchange 7 is damaged (its checksum does not match)"),
    ("record", "exchange 7's head and record do not match"),
    ("bytes", "exchange 7 is damaged")])
def test_a_damaged_head_or_record_of_a_v5_shard_is_refused_by_name_nothing_merged(shards, tmp_path, how, said):
    shard = tmp_path / "damaged.lmdb"
    shutil.copytree(shards[1], shard)
    if how == "head":  # the head holds fields no record has: a damaged head is not read from the record
        _poke(shard, "heads", 7, lambda v: v[:-1] + bytes([v[-1] ^ 0xFF]))
    elif how == "record":  # another valid record's bytes under exchange 7
        other = rows(shard, "exchanges")[8][1]
        _poke(shard, "exchanges", 7, lambda v: other)
    else:
        _poke(shard, "exchanges", 7, lambda v: bytes([codec.FRAME]) + b"\x28\xb5\x2f\xfd no")
    out = tmp_path / "out.lmdb"
    merge(out, [shards[0]])
    before = {name: rows(out, name) for name in ("exchanges", "heads", "recorded", "bodies")}
    r = subprocess.run([NFPROXY, "merge", str(out), str(shard)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 5 and said in r.stderr and "nothing was merged" in r.stderr, r.stderr
    assert str(shard) in r.stderr and len(r.stderr.strip().splitlines()) == 2  # progress, the error
    assert {name: rows(out, name) for name in before} == before
