"""Each body stored behind a CRC-32 of its value (`codec.checked`), so that merge checks a shard's
bodies without decompressing them; every read still hashes and bounds each body. A store made by
main before the CRC (tests/data/store-main-0497a29, `make_main_store.py`) migrates with every body
behind its CRC and every head and body the same.
Real LMDB files, the real recorder, `nfproxy` run as a process."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import lmdb
import pytest

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import DATA, nfproxy_argv
from tests.store.store_fixtures import all_bodies_read_back, conversation, run

MAIN_V5 = DATA / "store-main-0497a29"


def body_values(path: Path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(buffers=False) as txn:
            return dict(txn.cursor(db=env.open_db(b"bodies", txn=txn, create=False)))
    finally:
        env.close()


def put_body(path: Path, digest: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            txn.put(digest, value, db=env.open_db(b"bodies", txn=txn))
    finally:
        env.close()


def recorded(path: Path, session: str = "A", turns: int = 4, seed: int = 1) -> list[tuple[bytes, bytes]]:
    with Store.open(path, write=True, create=True) as s:
        return conversation(Recorder(s, Rules()), session, turns, seed)


def test_bodies_are_stored_behind_their_crc_and_read_back_verified(tmp_path):
    path = tmp_path / "s.lmdb"
    sent = recorded(path)
    values = body_values(path)
    assert len(values) == 8
    for v in values.values():
        assert v[0] == codec.CHECKED and codec.crc_matches(v)
        assert zlib.crc32(v[5:]).to_bytes(4, "big") == v[1:5]
        assert codec.unchecked(v)[0] in (codec.PLAIN, codec.DICT, codec.REF)
    assert sum(codec.unchecked(v)[0] == codec.REF for v in values.values()) == 3  # each turn against the last
    all_bodies_read_back(path, sent)
    with Store.open(path, write=False) as s:
        assert s.format == FORMAT == "noisefloor-log/7"


def _damaged(tmp_path: Path, how: str) -> tuple[Path, Path, int, str]:
    """A shard whose exchange 3's response body is changed as `how` says, and a good second shard."""
    a, b = tmp_path / "a.lmdb", tmp_path / "b.lmdb"
    recorded(a, "A", 4, 1)
    recorded(b, "B", 3, 2)
    with Store.open(a, write=False) as s:
        digest = s.exchange(3).response["body"]
        size = s.exchange(3).response["body_size"]
    value = bytearray(body_values(a)[bytes.fromhex(digest)])
    if how == "byte":  # damage: one byte of the frame, the CRC left as it was
        value[-2] ^= 0x40
    elif how == "forged":  # a consistent CRC over another body's frame
        inner = codec.Codec(lambda k: None).encode(b'{"choices": "not what was recorded"}' * 4)
        value = bytearray(codec.checked(inner))
    elif how == "bomb":  # a consistent CRC over a frame declaring more than the recorded size
        inner = codec.Codec(lambda k: None).encode(b"x" * (size + 4096))
        value = bytearray(codec.checked(inner))
    put_body(a, bytes.fromhex(digest), bytes(value))
    return a, b, 3, digest


@pytest.mark.parametrize("how", ["byte", "bomb"])
def test_a_damaged_or_oversized_body_is_refused_by_merge_by_name(tmp_path, how):
    a, b, exchange_id, digest = _damaged(tmp_path, how)
    out = tmp_path / "out.lmdb"
    with pytest.raises(StoreError) as exc:
        merge(out, [b, a])
    message = str(exc.value)
    assert f"exchange {exchange_id} response body {digest[:16]}" in message and "nothing was merged" in message
    assert "\n" not in message
    assert not out.exists() or len(Store.open(out, write=False)) == 0
    with Store.open(a, write=False) as s, pytest.raises(StoreError, match=f"exchange {exchange_id} response body"):
        s.bodies.of_part(s.exchange(exchange_id).response, exchange_id, "response")


def test_a_body_forged_with_a_matching_crc_is_refused_by_merge_and_every_reader(tmp_path):
    """The content address is merge's check as it is every reader's: a forged body behind a valid
    CRC is refused by name, in the shard and by merge, before OUT is made."""
    a, b, exchange_id, digest = _damaged(tmp_path, "forged")
    out = tmp_path / "out.lmdb"
    with pytest.raises(StoreError, match="does not match its sha256.*nothing was merged"):
        merge(out, [a, b])
    assert not out.exists()
    with Store.open(a, write=False) as s, pytest.raises(StoreError, match="does not match its sha256"):
        s.bodies.of_part(s.exchange(exchange_id).response, exchange_id, "response")
    shown = run([*nfproxy_argv(), "show", str(exchange_id), "--store", str(a)])
    assert shown.returncode != 0 and "does not match its sha256" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1


def test_a_v5_store_of_main_migrates_with_every_body_behind_its_crc(tmp_path):
    old = tmp_path / "old.lmdb"
    shutil.copytree(MAIN_V5, old)
    assert all(v[0] != codec.CHECKED for v in body_values(old).values())
    r = run([*nfproxy_argv(), "migrate", "--store", str(old)])
    assert r.returncode == 0 and "from noisefloor-log/5 to noisefloor-log/7" in r.stdout, r.stdout + r.stderr
    assert all(v[0] in (codec.CHECKED, codec.RAW) and (v[0] == codec.RAW or codec.crc_matches(v))
               for v in body_values(old).values())
    stored = body_values(old)
    with Store.open(old, write=False) as s:  # what each body was: tests/store/test_migrate.py
        assert s.format == FORMAT and len(list(s.bodies.all())) == len(stored)
