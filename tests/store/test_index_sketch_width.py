"""The replay index's layout 4 (noisefloor-log/7): each entry's sketch kept at 16 bits a minimum,
its bands taken from the full 32-bit minima when recorded and kept only in `lookups`.

A /6 store made by main (tests/data/store-main-0ba4151, `make_main_store.py`, layout 3: 32-bit
sketches) brought to today's by `nfproxy migrate` keeps its lookups row for row and shortens its
entries' sketches. Real LMDB files, `nfproxy` run as a process."""

from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path

import lmdb
import pytest

from bench.store_traffic import REQUEST_HEADERS
from noisefloor.proxy.request.keys import CanonicalRequest, Rules
from noisefloor.proxy.request.traffic import RequestData
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import FORMAT, Store
from noisefloor.proxy.store.replay_index import RecordedEntry
from tests.conftest import DATA
from tests.data.make_index_v1_store import changed, layout
from tests.store.store_fixtures import nfproxy as _nfproxy

MAIN_V6 = DATA / "store-main-0ba4151"
V6 = ("noisefloor-log/6", 3)


def _copy(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(MAIN_V6, out)
    return out


def _sketches(path: Path) -> dict[int, tuple[bytes, bytes]]:
    """Each entry's (bucket, sketch) as stored, read from the table (any layout from 3 on)."""
    import msgspec

    out = {}
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin(buffers=False) as txn:
            routes = dict(txn.cursor(db=env.open_db(b"index_routes", txn=txn, create=False)))
            for k, v in txn.cursor(db=env.open_db(b"recorded", txn=txn, create=False)):
                e = msgspec.msgpack.decode(v, type=replay_index.StoredEntry)
                bucket = e.bucket if not isinstance(e.route, int) else routes[struct.pack(">I", e.route)][:8]
                if e.sketch is not None and bucket is not None:
                    out[struct.unpack(">Q", k)[0]] = (bucket, e.sketch)
    finally:
        env.close()
    return out


def _rows(path: Path, table: str) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin(buffers=False) as txn:
            return list(txn.cursor(db=env.open_db(table.encode(), txn=txn, create=False, dupsort=table == "lookups")))
    finally:
        env.close()


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
    body = store.bodies.of_part(store.exchange(exchange_id).request, exchange_id, "request")
    return RequestData("POST", "https://api.openai.com/v1/chat/completions", "api.openai.com",
                       "/v1/chat/completions", REQUEST_HEADERS, changed(body)).canonical(Rules())


def test_migrate_keeps_every_lookup_and_shortens_each_entry_by_its_sketchs_high_halves(tmp_path):
    old = _copy(tmp_path, "old.lmdb")
    assert layout(old) == V6
    sketches, bands, lookups = _sketches(old), _bands_by_id(old), _rows(old, "lookups")
    assert len(sketches) == 8 and {len(sk) for _, sk in sketches.values()} == {128}
    entries = sum(len(v) for _, v in _rows(old, "recorded"))
    r = _nfproxy("migrate", "--store", str(old))
    assert r.returncode == 0 and f"from noisefloor-log/6 to {FORMAT}" in r.stdout, r.stdout + r.stderr
    assert layout(old) == (FORMAT, replay_index.VERSION)
    assert _rows(old, "lookups") == lookups  # row for row: bands are not computed again
    assert _sketches(old) == {i: (b, replay_index.short(sk)) for i, (b, sk) in sketches.items()}
    assert _bands_by_id(old) == bands
    with Store.open(old, write=False) as s:
        assert [e.id for e in s.index.entries()] == list(range(1, 9))
    assert sum(len(v) for _, v in _rows(old, "recorded")) == entries - 8 * 64  # each sketch's high halves


def test_16_bit_minima_are_compared_at_their_width():
    rng = random.Random(7)
    full = [rng.randrange(1 << 31) for _ in range(32)]
    mine = struct.pack("<32I", *full)
    same_low = struct.pack("<32I", *[(v ^ (1 << 20)) for v in full])  # only the high halves differ
    eight_off = struct.pack("<32I", *[v ^ 1 if i < 8 else v for i, v in enumerate(full)])
    assert replay_index.short(mine) == struct.pack("<32H", *(v & 0xFFFF for v in full))
    shorts = [replay_index.short(x) for x in (mine, same_low, eight_off)]
    assert {len(x) for x in shorts} == {replay_index.SHORT}
    # what 16 bits give up: minima alike in their low halves agree (1 in 65,536 by chance)
    assert replay_index.agreement(mine, shorts) == [1.0, 1.0, 0.75]


def test_an_entry_keeps_the_sketchs_low_halves_and_one_holding_32_bits_is_refused():
    import msgspec

    sig = struct.pack("<32I", *range(1 << 20, (1 << 20) + 32))
    e = RecordedEntry(5, "ab" * 32, "session", 0, 3, "POST h /p", 1.5, 2.5, (1,), (b"b" * 8, (), sig))
    four = replay_index.entry_bytes(e, b"\x00\x00\x00\x07")
    got = replay_index.entry_sketch(four, lambda ref: ("POST h /p", b"b" * 8))
    assert got == (b"b" * 8, replay_index.short(sig))
    assert replay_index.entry(four, 5, lambda ref: ("POST h /p", b"b" * 8)) == RecordedEntry(
        5, "ab" * 32, "session", 0, 3, "POST h /p", 1.5, 2.5, (1,))
    stored = msgspec.msgpack.decode(four, type=replay_index.StoredEntry)
    stored.sketch = sig
    damaged = msgspec.msgpack.encode(stored)  # an entry holding a 32-bit sketch
    with pytest.raises(ValueError, match="sketch of 128 bytes"):
        replay_index.entry_sketch(damaged, lambda ref: ("POST h /p", b"b" * 8))
    stored.version, stored.sketch = 3, replay_index.short(sig)
    with pytest.raises(ValueError, match="layout 3"):  # an earlier layout's: migrate's to read
        replay_index.entry(msgspec.msgpack.encode(stored), 5, lambda ref: ("POST h /p", b"b" * 8))
