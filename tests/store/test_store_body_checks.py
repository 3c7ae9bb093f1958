"""Each value a zstd frame carrying its content checksum and naming its dictionary by zstd's own
id; every read hashes and bounds each body, and merge refuses a damaged, forged or oversized body
by name, and shards whose dictionary ids name different dictionaries. A store made by main with
8-byte dictionary keys and CRC-wrapped bodies (tests/data/store-main-ac2f828-dicts,
`make_main_store.py`) migrates with every value in today's encoding.
Real LMDB files, the real recorder, `nfproxy` run as a process."""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import pytest
import zstandard

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _dicts as store_dicts
from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import DATA, nfproxy_argv
from tests.store.store_fixtures import all_bodies_read_back, conversation, run

MAIN_V7 = DATA / "store-main-ac2f828-dicts"


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


def frame_of(value: bytes) -> bytes:
    return value[2 + 32 * value[1]:] if value[0] == codec.REF else value[1:]


def test_bodies_are_frames_with_their_checksum_and_read_back_verified(tmp_path):
    path = tmp_path / "s.lmdb"
    sent = recorded(path)
    values = body_values(path)
    assert len(values) == 8 and {v[0] for v in values.values()} == {codec.FRAME, codec.REF}
    assert all(zstandard.get_frame_parameters(frame_of(v)).has_checksum for v in values.values())
    assert sum(v[0] == codec.REF for v in values.values()) == 3  # each turn against the last
    all_bodies_read_back(path, sent)
    with Store.open(path, write=False) as s:
        assert s.format == FORMAT == "noisefloor-log/8"


def _damaged(tmp_path: Path, how: str) -> tuple[Path, Path, int, str]:
    """A shard whose exchange 3's response body is changed as `how` says, and a good second shard."""
    a, b = tmp_path / "a.lmdb", tmp_path / "b.lmdb"
    recorded(a, "A", 4, 1)
    recorded(b, "B", 3, 2)
    with Store.open(a, write=False) as s:
        digest = s.exchange(3).response["body"]
        size = s.exchange(3).response["body_size"]
    value = bytearray(body_values(a)[bytes.fromhex(digest)])
    if how == "byte":  # damage: one byte of the frame
        value[-6] ^= 0x40
    elif how == "checksum":  # damage: one byte of its checksum
        value[-2] ^= 0x40
    elif how == "forged":  # another body's frame, its checksum its own
        value = bytearray(codec.Codec(lambda k: None).encode(b'{"choices": "not what was recorded"}' * 4))
    elif how == "bomb":  # a frame declaring more than the recorded size
        value = bytearray(codec.Codec(lambda k: None).encode(b"x" * (size + 4096)))
    put_body(a, bytes.fromhex(digest), bytes(value))
    return a, b, 3, digest


@pytest.mark.parametrize("how", ["byte", "checksum", "bomb"])
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


def test_a_body_forged_with_a_sound_frame_is_refused_by_merge_and_every_reader(tmp_path):
    """The content address is merge's check as it is every reader's: a forged body in a sound
    frame is refused by name, in the shard and by merge, before OUT is made."""
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


def test_a_v7_store_of_main_migrates_with_every_value_in_todays_encoding(tmp_path):
    old = tmp_path / "old.lmdb"
    shutil.copytree(MAIN_V7, old)
    assert {v[0] for v in body_values(old).values()} == {4}  # behind a CRC-32, with 8-byte dictionary keys
    r = run([*nfproxy_argv(), "migrate", "--store", str(old)])
    assert r.returncode == 0 and f"from noisefloor-log/7 to {FORMAT}" in r.stdout, r.stdout + r.stderr
    stored = body_values(old)
    assert {v[0] for v in stored.values()} <= {codec.RAW, codec.FRAME, codec.REF}
    named = {zstandard.get_frame_parameters(frame_of(v)).dict_id for v in stored.values() if v[0] != codec.RAW}
    with Store.open(old, write=False) as s:  # what each body was: tests/store/test_migrate.py
        assert s.format == FORMAT and len(list(s.bodies.all())) == len(stored)
        held = {int.from_bytes(k, "big") for k, _ in s.tables.rows("dicts")}
        assert named - {0} <= held and named - {0}  # frames name the dictionaries stored under their ids


def dictionary_store(path: Path, session: str, seed: int) -> list[tuple[bytes, bytes]]:
    """A store whose bodies and records are compressed with dictionaries it trained."""
    sent = []
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(120):
            sent += conversation(rec, f"{session}{i}", 2, seed + i)
        assert set(s.meta("dicts")) == {"body", "record"}
    return sent


def test_shards_whose_dictionary_ids_name_different_dictionaries_are_refused_until_compacted(tmp_path, monkeypatch):
    """A dictionary id is 32 bits, chosen by the trainer: two shards can hold different
    dictionaries under one (a hostile one on purpose). Values are copied as stored, so merge
    refuses that by name before writing anything, into a fresh OUT as into a used one;
    `nfproxy compact` trains the shard new dictionaries, under new ids, and the merge goes through."""
    monkeypatch.setattr(store_dicts, "TRAIN_AFTER", 150)
    monkeypatch.setattr(codec.secrets, "randbelow", lambda n: 12345)  # every dictionary trained gets one id
    a, b, out = tmp_path / "a.lmdb", tmp_path / "b.lmdb", tmp_path / "out.lmdb"
    sent = dictionary_store(a, "A", 1) + dictionary_store(b, "B", 1000)
    with Store.open(a, write=False) as sa, Store.open(b, write=False) as sb:
        assert sa.meta("dicts")["body"] == sb.meta("dicts")["body"]  # one id, two dictionaries
        assert sa.dictionaries.dictionary(bytes.fromhex(sa.meta("dicts")["body"])) != sb.dictionaries.dictionary(bytes.fromhex(sb.meta("dicts")["body"]))
    for into in ([a, b], [b]):  # fresh, then OUT holding a's
        with pytest.raises(StoreError, match=f"store {b}: compression dictionary .* has the id of another .*"
                                             f"nfproxy compact --store {b}.*nothing was merged"):
            merge(out, into)
        if into == [a, b]:
            assert not out.exists()  # refused before OUT was made
            merge(out, [a])
    monkeypatch.undo()
    assert run([*nfproxy_argv(), "compact", "--store", str(b)]).returncode == 0
    merge(out, [b])
    all_bodies_read_back(out, sent)
