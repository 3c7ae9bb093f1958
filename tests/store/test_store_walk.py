"""The batched walk of heads and records (`store_walk`): `nfproxy log` and `log --json` read a
batch of `BATCH` exchanges at a time and print what reading them one at a time prints (`--limit`
still reads one at a time), byte for byte; a damaged head or record on either side of a batch
boundary is one line naming the store and the exchange, after every record before it (`--json`);
and `Codec.decode_many` decodes what `decode` does, each value alone where it must. A store
written by the real recorder (its records compressed with and without the trained dictionary),
damaged with LMDB directly, read by real nfproxy processes."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import lmdb
import msgspec
import pytest
import zstandard

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store._dicts import TRAIN_AFTER
from noisefloor.proxy.store._walk import BATCH
from noisefloor.proxy.store.log import Store
from tests.conftest import DATA, nfproxy_argv

sys.path.insert(0, str(DATA))
from make_main_store import answer, chat  # noqa: E402 - the fixture's own traffic

_U64 = struct.Struct(">Q")
N = TRAIN_AFTER + BATCH + 40  # past the records' dictionary, and a few batches
MODES = {"plain": [], "json": ["--json"]}


def log(store: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*nfproxy_argv(), "log", "--store", str(store), *args], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("walk") / "s.lmdb"
    with Store.open(path, write=True, create=True) as s, s.batch(200):
        rec = Recorder(s, Rules())
        for i in range(N):
            labels = Labels(f"s{i // 3}", task=f"t{i % 7}", condition=f"c{i % 2}")
            rec.finish(rec.begin(chat([{"role": "user", "content": f"question {i}?"}]), labels),
                       answer(f"answer {i}", i) if i % 11 else None, error=None if i % 11 else "refused")
    with Store.open(path, write=False) as s:
        kinds = {(raw[0], s.codec.dictionary_of(raw) is not None) for _, _, raw in s.walk.pairs("check")}
    assert kinds == {(codec.FRAME, False), (codec.FRAME, True)}  # frames with and without a dictionary
    return path


def test_a_listing_read_in_batches_is_the_listing_read_one_at_a_time(store):
    """Without --limit a batch at a time; with a --limit past the end one at a time: the same bytes."""
    for args in ([], ["--json"], ["--sessions-only"]):
        batched, single = log(store, *args), log(store, *args, "--limit", str(N + 1))
        assert batched.returncode == single.returncode == 0, batched.stderr + single.stderr
        assert batched.stdout == single.stdout and batched.stdout
    lines = log(store, "--json").stdout.split(b"\n")
    with Store.open(store, write=False) as s:
        whole = [json.loads(ex.json_bytes()) for ex in s.exchanges()]
    assert lines[-1] == b"" and [json.loads(x) for x in lines[:-1]] == whole and len(whole) == N
    plain = log(store).stdout.decode().splitlines()
    assert plain[0].startswith(f"{(N + 2) // 3} sessions in ") and len(plain) == 1 + (N + 2) // 3 + N
    assert sum(" ERR error " in x for x in plain) == len(range(0, N, 11))


def damage_one(store: Path, how: str, at: int) -> None:
    """Exchange `at` damaged: its head's bytes flipped, dropped, or of the wrong type (its CRC
    right), its record cut short or rewritten (valid, saying 503) after its head was written."""
    env = lmdb.open(str(store), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            heads, records, dicts = (env.open_db(name, txn=txn) for name in (b"heads", b"exchanges", b"dicts"))
            key = _U64.pack(at)
            head, raw = txn.get(key, db=heads), txn.get(key, db=records)
            if how == "flipped":
                txn.put(key, head[:20] + bytes([head[20] ^ 1]) + head[21:], db=heads)
            elif how == "dropped":
                txn.delete(key, db=heads)
            elif how == "cut":
                txn.put(key, raw[:-1], db=records)
            elif how == "typed":  # its CRC recomputed: the walk passes it, its decoding refuses it
                doc = msgspec.msgpack.decode(head[8:])
                doc[7] = "two hundred"  # the status, after labels, route, left out, time, keys, occurrence
                rest = head[4:8] + msgspec.msgpack.encode(doc)
                txn.put(key, struct.pack(">I", zlib.crc32(rest, zlib.crc32(key))) + rest, db=heads)
            elif how == "record":
                text = codec.Codec(lambda k: txn.get(k, db=dicts)).decode(raw, 1 << 24)
                assert b'"status": 200' in text
                txn.put(key, codec.Codec(lambda k: None).encode(text.replace(b'"status": 200', b'"status": 503')),
                        db=records)
    finally:
        env.close()


@pytest.mark.parametrize("at", [BATCH, BATCH + 1, 2 * BATCH])
@pytest.mark.parametrize("how, said", [("cut", "exchange {} is damaged"), ("flipped", "head of exchange {} is damaged"),
                                       ("dropped", "exchange {} has no head"),
                                       ("typed", "head of exchange {} is damaged (Expected `int | null`"),
                                       ("record", "exchange {}'s head and record do not match")])
def test_damage_at_a_batch_boundary_is_one_line_after_every_record_before_it(store, tmp_path, at, how, said):
    good = log(store, "--json").stdout.split(b"\n")
    copy = tmp_path / "s.lmdb"
    shutil.copytree(store, copy)
    damage_one(copy, how, at)
    for mode, args in MODES.items():
        r = log(copy, *args)
        line = r.stderr.decode().strip()
        assert r.returncode != 0 and "Traceback" not in line and "\n" not in line, line
        assert str(copy) in line and said.format(at) in line, line
        # --json prints every record before the damaged one; the plain listing (sessions first) nothing
        assert r.stdout == (b"\n".join(good[:at - 1]) + b"\n" if mode == "json" else b"")
        stopped = log(copy, *args, "--limit", str(at - 1))  # one at a time: it stops before the damage
        assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == b"\n".join(good[:at - 1]) + b"\n"


def test_decode_many_is_decode_of_each_and_none_where_decode_refuses():
    c = codec.Codec(lambda key: None)
    texts = [b'{"id":%d,"text":"%s"}' % (i, b"many words repeat " * (i % 5 + 4)) for i in range(40)]
    plain = [c.encode(t) for t in texts]
    assert {v[0] for v in plain} == {codec.FRAME}
    limit = 1 << 20
    assert c.decode_many(plain, limit) == texts  # all alike: one call
    assert c.decode_many([c.encode(b"tiny"), *plain[:5]], limit) == [b"tiny", *texts[:5]]  # grouped, one call
    bomb = b"\x01" + zstandard.ZstdCompressor().compress(b"x" * 5000)  # declares more than the limit below
    broken = plain[3][:12] + bytes(b ^ 0x55 for b in plain[3][12:])
    mixed = [plain[0], c.encode(b"tiny"), bomb, broken, b"\x09what", b"", *plain[5:9]]
    got = c.decode_many(mixed, 4000)
    assert got == [texts[0], b"tiny", None, None, None, None, *texts[5:9]]
    for value, text in zip(mixed, got, strict=True):  # None exactly where decode raises
        try:
            assert c.decode(value, 4000) == text
        except (zstandard.ZstdError, ValueError, IndexError):
            assert text is None
    alike = [*plain[:3], broken, *plain[4:]]  # one frame of an alike batch damaged: read alone, the rest kept
    assert c.decode_many(alike, limit) == [*texts[:3], None, *texts[4:]]


def _put_labels(store: Path, entries: dict[int, bytes]) -> dict[int, bytes]:
    """Label-set entries written as given; what they were before."""
    env = lmdb.open(str(store), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(b"labels")) as txn:
            before = {n: txn.get(struct.pack(">I", n)) for n in entries}
            for n, value in entries.items():
                txn.put(struct.pack(">I", n), value)
    finally:
        env.close()
    return before


def test_a_damaged_label_set_is_named_the_first_in_key_order(store, tmp_path):
    """The label sets are checked and decoded in one pass; where any fails they are read again
    one at a time, so the line names the first damaged one, whichever way it is damaged."""
    copy = tmp_path / "s.lmdb"
    shutil.copytree(store, copy)
    key, rest = struct.pack(">I", 3), msgspec.msgpack.encode([1, None, None, None])  # a session not a string
    typed = struct.pack(">I", zlib.crc32(rest, zlib.crc32(key))) + rest  # its CRC right
    env = lmdb.open(str(copy), max_dbs=16, readonly=True, lock=False)
    with env.begin(db=env.open_db(b"labels", create=False)) as txn:
        nine = txn.get(struct.pack(">I", 9))
    env.close()
    flipped = nine[:6] + bytes([nine[6] ^ 1]) + nine[7:]
    original = _put_labels(copy, {3: typed, 9: flipped})
    for expected in ("labels entry 3 is damaged (Expected", "labels entry 9 is damaged (its checksum"):
        r = log(copy)
        line = r.stderr.decode().strip()
        assert r.returncode != 0 and "\n" not in line and str(copy) in line and expected in line, line
        _put_labels(copy, {3: original[3]})  # the first put right: the next is named
    r = log(copy, "--json")  # a noisefloor-log/5 record is printed with its head's labels put back
    assert r.returncode != 0 and b"labels entry 9 is damaged" in r.stderr and str(copy).encode() in r.stderr, r.stderr
    _put_labels(copy, {9: nine})
    assert log(copy).stdout == log(store).stdout.replace(str(store).encode(), str(copy).encode())
