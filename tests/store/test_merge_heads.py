"""`nfproxy merge` reads a shard through its heads: a record whose stored bytes match its checked
head is read narrowly (not parsed whole) and its head copied, and anything else takes the full
parse. So a merge writes exactly the tables a merge that parsed every record writes; a record
damaged under an intact head, or a body, is refused by name with nothing merged. Real LMDB stores recorded through the real recorder; the
sessions plan (which shard brings a session, which OUT holds, which clash) on its own arrays.
A /5 shard, whose records are copied as stored, is tests/store/test_merge_as_stored.py's."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest

from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store.log import Store
from noisefloor.proxy.store.merge import scan as store_merge_scan
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import recorded_shards

NFPROXY = str(Path(sys.executable).with_name("nfproxy"))
TABLES = ("exchanges", "heads", "labels", "routes", "recorded", "lookups", "bodies", "outcomes", "dicts")


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return recorded_shards(tmp_path_factory.mktemp("heads"), 120)


def tables(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    with Store.open(path, write=False) as s, s.tables.env.begin(buffers=False) as txn:
        return {name: list(txn.cursor(db=s.tables.env.open_db(name.encode(), txn=txn, create=False)).iternext())
                for name in TABLES}


@pytest.fixture(scope="module")
def parsed(shards: list[Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[bytes, bytes]]]:
    """The shards merged with no head trusted: every record parsed, every head read from its text."""
    out = tmp_path_factory.mktemp("parsed") / "out.lmdb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_merge_scan, "checked_value", lambda k, value, raw: False)
        merge(out, shards)
    return tables(out)


def test_the_heads_path_writes_the_tables_a_full_parse_writes(shards, parsed, tmp_path):
    calls = []
    real = store_merge_scan.checked_value
    store_merge_scan.checked_value = lambda *a: calls.append(real(*a)) or calls[-1]  # type: ignore[assignment]
    try:
        merge(tmp_path / "out.lmdb", shards)
    finally:
        store_merge_scan.checked_value = real  # type: ignore[assignment]
    assert calls.count(True) >= 2 * 240  # every record vouched for by its head, checked and copied
    assert tables(tmp_path / "out.lmdb") == parsed
    assert len(parsed["heads"]) == 240 and len(parsed["labels"]) > 2


def _rewrite(path: Path, exchange_id: int, fn) -> None:
    """Exchange `exchange_id`'s stored record replaced by fn(its JSON) (None: leave it) or raw bytes."""
    with Store.open(path, write=False) as s:
        text = s.records.texts_of([exchange_id])[0]
        key = (s.meta("dicts") or {}).get("record")
        c = codec.Codec(s.dictionaries.dictionary)
        new = fn(text)
        stored = new if isinstance(new, tuple) else c.encode(new, bytes.fromhex(key) if key else None)
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(struct.pack(">Q", exchange_id), stored[0] if isinstance(stored, tuple) else stored,
                db=env.open_db(b"exchanges", txn=txn))
    env.close()


def _mistyped(text: bytes) -> bytes:
    """A record's JSON with a field merge does not read of the wrong type (only a full parse sees it)."""
    doc = json.loads(text)
    doc["model"] = 5
    return b'{"id":%d,' % doc.pop("id") + json.dumps(doc)[1:].encode()


@pytest.mark.parametrize("how", ["bytes", "type"])
def test_a_damaged_record_under_an_intact_head_is_refused_by_name_nothing_merged(shards, tmp_path, how):
    shard = tmp_path / "damaged.lmdb"
    shutil.copytree(shards[1], shard)
    _rewrite(shard, 7, _mistyped if how == "type" else lambda text: (bytes([codec.FRAME]) + b"\x28\xb5\x2f\xfd no",))
    out = tmp_path / "out.lmdb"
    merge(out, [shards[0]])
    before = tables(out)
    r = subprocess.run([NFPROXY, "merge", str(out), str(shard)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 5 and "exchange 7 is damaged" in r.stderr and "nothing was merged" in r.stderr, r.stderr
    assert str(shard) in r.stderr and len(r.stderr.strip().splitlines()) == 2  # progress, the error
    assert tables(out) == before


def _sessions_of(path: str, exchanges: list[tuple[int, str, int]]):
    """A store's sessions from (id, session, seq) triples, through the same arrays a merge builds."""
    from noisefloor.proxy.store.merge import _sessions as merge_sessions

    scanned = merge_sessions.scan((i, (name, "record", f"k{seq}", 0, seq, 1.5)) for i, name, seq in exchanges)
    return merge_sessions.sessions(Path(path), scanned)


def test_sessions_plan_brings_each_session_once_keeps_outs_and_refuses_a_clash():
    from noisefloor.proxy.store.merge import _sessions as merge_sessions

    out = _sessions_of("OUT", [(1, "a", 0), (2, "a", 1)])
    one = _sessions_of("one", [(1, "b", 0), (2, "a", 0), (3, "b", 1), (4, "a", 1)])
    two = _sessions_of("two", [(1, "c", 0), (2, "b", 0), (3, "b", 1)])
    assert [one.ids(s).tolist() for s in range(len(one))] == [[1, 3], [2, 4]]  # first appearance, write order
    p = merge_sessions.plan(out, [one, two], lambda s, i: "?")
    assert p.present == 1  # "a": OUT holds it, and shard one has the same exchanges
    assert p.brings[0].tolist() == [True, False] and p.in_out[0].tolist() == [-1, 0]
    assert p.brings[1].tolist() == [True, False] and p.in_out[1].tolist() == [-1, -1]  # "b" came with shard one
    assert [(ids.tolist(), s.tolist()) for ids, s in merge_sessions.batches(one, p.brings[0], 1)] == [([1, 3], [0])]
    clash = _sessions_of("three", [(1, "b", 0), (2, "b", 7)])  # "b" with other exchanges
    names = {("one", 0): "b", ("three", 0): "b"}
    with pytest.raises(ValueError, match="session 'b' is in three and in one with different exchanges"):
        merge_sessions.plan(out, [one, clash], lambda s, i: names[(str(s.path), i)])
