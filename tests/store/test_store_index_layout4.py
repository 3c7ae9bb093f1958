"""The replay index's layout 4 (noisefloor-log/7): each entry's sketch kept at 16 bits a minimum,
its bands taken from the full 32-bit minima when recorded and kept only in `lookups`.

A /6 store made by main (tests/data/store-main-0ba4151, `make_main_store.py`) reads and records as
it is; `nfproxy migrate` keeps its lookups row for row and shortens its entries; the same traffic
recorded in layout 3 and in layout 4 finds the same nearest requests; merge copies a /6 shard's
entries as stored into a /7 store and puts a /7 shard into a /6 store with its 32-bit sketches
computed again from its requests (the recorder's own, bands and all). Real LMDB files, the real
recorder, `nfproxy` run as a process."""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

import lmdb
import pytest

from bench.store_traffic import REQUEST_HEADERS, record
from noisefloor.proxy.request.keys import CanonicalRequest, Rules
from noisefloor.proxy.request.traffic import RequestData
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import FORMAT, Store
from noisefloor.proxy.store.merge.run import merge
from noisefloor.proxy.store.replay_index import RecordedEntry
from tests.conftest import DATA
from tests.data.make_index_v1_store import answered, changed, layout
from tests.store.store_fixtures import nfproxy as _nfproxy
from tests.store.store_fixtures import table_bytes as _table_bytes

MAIN_V6 = DATA / "store-main-0ba4151"
V6 = ("noisefloor-log/6", 3)


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(MAIN_V6, out)
    return out


def _sketches(path: Path) -> dict[int, tuple[bytes, bytes]]:
    with Store.open(path, write=False) as s:
        ids = list(range(1, s.last_id() + 1))
        return {i: got for i, got in zip(ids, s.stored_sketches(ids)) if got is not None}


def _bands_by_id(path: Path) -> dict[int, set[bytes]]:
    """Each exchange's band rows as its store's `lookups` table holds them."""
    out: dict[int, set[bytes]] = {}
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin(buffers=False) as txn:
            for k, v in txn.cursor(db=env.open_db(b"lookups", txn=txn, create=False)):
                if k[:1] == replay_index.BAND:
                    out.setdefault(struct.unpack(">I", v)[0], set()).add(k)
    finally:
        env.close()
    return out


def _changed(store: Store, exchange_id: int) -> CanonicalRequest:
    """The canonical form of a recorded request with its last message changed (a miss)."""
    body = store.part_body(store.exchange(exchange_id).request, exchange_id, "request")
    return RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                       "/v1/chat/completions", REQUEST_HEADERS, changed(body)).canonical(Rules())


def test_a_v6_store_of_main_reads_and_is_recorded_into_in_its_own_layout(tmp_path):
    old = _copy(tmp_path, "old.lmdb")
    assert layout(old) == V6
    assert {len(sk) for _, sk in _sketches(old).values()} == {128}
    with Store.open(old, write=True) as s:
        record(s, 120, seed=4, prefix="later")
    assert layout(old) == V6
    assert {len(sk) for _, sk in _sketches(old).values()} == {128}  # layout 3's, new ones too


def test_migrate_keeps_every_lookup_and_shortens_each_entry_by_its_sketchs_high_halves(tmp_path):
    old = _copy(tmp_path, "old.lmdb")
    with Store.open(old, write=True) as s:
        record(s, 400, seed=4, prefix="later")
    queries = range(9, 409, 9)
    before, sketches, bands = answered(old, queries), _sketches(old), _bands_by_id(old)
    with Store.open(old, write=False) as s:
        lookups = list(s.raw_table("lookups"))
    entries = _table_bytes(old, "recorded")
    r = _nfproxy("migrate", "--store", str(old))
    assert r.returncode == 0 and f"from noisefloor-log/6 to {FORMAT}" in r.stdout, r.stdout + r.stderr
    assert layout(old) == (FORMAT, replay_index.VERSION)
    with Store.open(old, write=False) as s:
        assert list(s.raw_table("lookups")) == lookups  # row for row: bands are not computed again
    assert _sketches(old) == {i: (b, replay_index.short(sk)) for i, (b, sk) in sketches.items()}
    assert _bands_by_id(old) == bands
    assert answered(old, queries) == before
    assert _table_bytes(old, "recorded") < entries * 0.8  # 64 of each entry's ~215 bytes


def test_the_same_traffic_in_layout_3_and_4_finds_the_same_nearest_requests(tmp_path):
    """One traffic recorded into a store of each layout (ids alike): a miss on each of 150 changed
    requests ranks the same nearest recorded requests, with the same scores, in both."""
    stores = []
    for fmt, version in (("noisefloor-log/6", 3), (FORMAT, replay_index.VERSION)):
        path = tmp_path / f"{version}.lmdb"
        with Store.open(path, write=True, create=True) as s:
            s.set_meta("format", fmt)
            s.set_meta("replay_index", version)
        with Store.open(path, write=True) as s:
            record(s, 1500, seed=11, prefix="same")
        assert layout(path) == (fmt, version)
        stores.append(path)
    queries = range(1, 1501, 10)
    three, four = (answered(p, queries) for p in stores)
    assert {len(sk) for _, sk in _sketches(stores[1]).values()} == {replay_index.SHORT}
    assert [a["near"][0] for a in three.values()] == [a["near"][0] for a in four.values()]
    assert three == four
    assert _bands_by_id(stores[0]) == _bands_by_id(stores[1])  # bands from the full minima in both
    assert _table_bytes(stores[1], "recorded") < _table_bytes(stores[0], "recorded") * 0.8


def test_merge_copies_a_v6_shard_as_stored_and_puts_a_v7_shard_into_a_v6_store_with_its_sketches_again(tmp_path):
    v6 = _copy(tmp_path, "v6.lmdb")
    with Store.open(v6, write=True) as s:
        record(s, 150, seed=5, prefix="old")
    v7 = tmp_path / "v7.lmdb"
    with Store.open(v7, write=True, create=True) as s:
        record(s, 150, seed=6, prefix="new")
    # both into a new (/7) store: the /6 shard's entries as stored (32-bit sketches), the other's 16-bit
    out = tmp_path / "out.lmdb"
    merge(out, [v6, v7])
    assert layout(out) == (FORMAT, replay_index.VERSION)
    widths = [len(sk) for _, sk in _sketches(out).values()]
    assert widths.count(128) == len(_sketches(v6)) and widths.count(replay_index.SHORT) == len(_sketches(v7))
    stored, scored = _sketches(out), set()
    with Store.open(out, write=False) as s:
        index = replay_index.LmdbIndex(s)
        for i in range(1, len(widths) + 1, 5):  # each candidate's score at its own width
            c = _changed(s, i)
            mine = replay_index.sketch(c, replay_index.indexed_route(c))[2]
            for n in index.near(c, replay_index.indexed_route(c)):
                if n.score is not None:
                    assert n.score == round(replay_index.agreement(mine, [stored[n.id][1]])[0], 4)
                    scored.add(len(stored[n.id][1]))
    assert scored == {128, replay_index.SHORT}
    # the /7 shard into the /6 store: it stays /6 and layout 3, the shard's sketches computed again
    into = tmp_path / "into.lmdb"
    shutil.copytree(v6, into)
    first = len(_sketches(v6)) + 1
    merge(into, [v7])
    assert layout(into) == V6
    theirs, ours = _sketches(v7), _sketches(into)
    theirs_bands, our_bands = _bands_by_id(v7), _bands_by_id(into)
    with Store.open(v7, write=False) as s, Store.open(into, write=False) as t:
        moved = {e.id: t.session_entries(e.session) for e in s.recorded_entries()}
        pairs = [(e.id, next(x.id for x in moved[e.id] if x.seq == e.seq)) for e in s.recorded_entries()]
    assert len(pairs) == len(theirs) and min(new for _, new in pairs) >= first
    for old_id, new_id in pairs:
        bucket, sig = ours[new_id]
        assert len(sig) == 128 and (bucket, replay_index.short(sig)) == theirs[old_id]
        want = {replay_index.BAND + b[:replay_index.TAG3] for b in replay_index.bands(bucket, sig)}
        assert our_bands[new_id] == want == theirs_bands[old_id]  # the recorder's bands, from its request again


def test_16_bit_minima_are_compared_at_their_width():
    rng = random.Random(7)
    full = [rng.randrange(1 << 31) for _ in range(32)]
    mine = struct.pack("<32I", *full)
    same_low = struct.pack("<32I", *[(v ^ (1 << 20)) for v in full])  # only the high halves differ
    eight_off = struct.pack("<32I", *[v ^ 1 if i < 8 else v for i, v in enumerate(full)])
    assert replay_index.agreement(mine, [mine, same_low, eight_off]) == [1.0, 0.0, 0.75]
    assert replay_index.short(mine) == struct.pack("<32H", *(v & 0xFFFF for v in full))
    shorts = [replay_index.short(x) for x in (mine, same_low, eight_off)]
    assert {len(x) for x in shorts} == {replay_index.SHORT}
    # what 16 bits give up: minima alike in their low halves agree (1 in 65,536 by chance)
    assert replay_index.agreement(mine, shorts) == [1.0, 1.0, 0.75]
    assert replay_index.agreement(mine, [mine, shorts[2]]) == [1.0, 0.75]  # a store holding both widths


def test_a_layout_4_entry_is_its_layout_3_entry_less_the_sketchs_high_halves():
    sig = struct.pack("<32I", *range(1 << 20, (1 << 20) + 32))
    e = RecordedEntry(5, "ab" * 32, "session", 0, 3, "POST h /p", 1.5, 2.5, (1,), (b"b" * 8, (), sig))
    three, four = (replay_index.entry_bytes(5, e, v, b"\x00\x00\x00\x07") for v in (3, 4))
    assert len(three) - len(four) == 64
    assert replay_index.as_current(three) == four
    assert replay_index.as_current(four) == four
    got = replay_index.entry_sketch(four, lambda ref: ("POST h /p", b"b" * 8))
    assert got == (b"b" * 8, replay_index.short(sig))
    damaged = three[:1] + b"\x04" + three[2:]  # a layout-4 entry holding a 32-bit sketch
    with pytest.raises(ValueError, match="sketch of 128 bytes"):
        replay_index.entry_sketch(damaged, lambda ref: ("POST h /p", b"b" * 8))
