"""How the store encodes what it keeps: requests compressed against their session's previous
exchange, dictionaries trained on the store's own traffic, both carried through merge and
compact, every read still verified. Real LMDB files, the real recorder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lmdb
import pytest

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _dicts as store_dicts
from noisefloor.proxy.store import env as store_env
from noisefloor.proxy.store import log as store_mod
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.compact import rewrite
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from tests.store.store_fixtures import SYSTEM, all_bodies_read_back, conversation


def tags(path: Path) -> dict[str, int]:
    """How many bodies are stored each way: raw, frame, dict (a frame naming a dictionary), ref."""
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    named = codec.Codec(lambda key: None).dictionary_of
    try:
        with env.begin(buffers=False) as txn:
            counts: dict[str, int] = {}
            for _, v in txn.cursor(db=env.open_db(b"bodies", txn=txn)):
                tag = {codec.RAW: "raw", codec.REF: "ref"}.get(v[0]) or ("dict" if named(v) else "frame")
                counts[tag] = counts.get(tag, 0) + 1
            return counts
    finally:
        env.close()


def test_requests_are_compressed_against_their_session_and_read_back_verified(tmp_path):
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        sent = conversation(rec, "A", 10, 1) + conversation(rec, "B", 3, 2)
    all_bodies_read_back(path, sent)
    counts = tags(path)
    # every request after a session's first, except where a chain CHAIN_DEPTH (6) deep starts again
    assert counts.get("ref", 0) == (9 - 1) + 2
    raw = sum(len(b) for b, _ in sent)
    with Store.open(path, write=False) as s:
        chained = [len(s.bodies.raw(s.exchange(i).request["body"])) for i in (2, 3, 4, 5, 6, 7, 9, 10)]
        assert max(chained) < 400 < raw / len(sent)  # a turn costs its new text, not the conversation
        # a chain is cut at CHAIN_DEPTH: depth never exceeds it (the 8th request starts a new chain)
        first_of_chain = s.bodies.raw(s.exchange(store_mod.CHAIN_DEPTH + 2).request["body"])
        assert first_of_chain[0] != codec.REF


def test_a_damaged_body_another_is_compressed_against_fails_both_by_name(tmp_path):
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        conversation(Recorder(s, Rules()), "A", 3, 1)
        first = s.exchange(1)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.delete(bytes.fromhex(first.response["body"]), db=env.open_db(b"bodies", txn=txn))
    env.close()
    with Store.open(path, write=False) as s:
        second = s.exchange(2)
        with pytest.raises(StoreError, match=r"exchange 2 referenced body .* is missing"):
            s.bodies.of_part(second.request, 2, "request")
        assert s.bodies.of_part(s.exchange(3).response, 3, "response") is not None  # answers stand alone


def test_dictionaries_are_trained_used_and_carried_through_merge_and_compact(tmp_path, monkeypatch):
    monkeypatch.setattr(store_dicts, "TRAIN_AFTER", 150)
    path = tmp_path / "s.lmdb"
    sent = []
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(120):
            sent += conversation(rec, f"s{i}", 2, i)
        keys = s.meta("dicts")
    assert set(keys) == {"body", "record"}
    assert tags(path).get("dict", 0) > 50
    all_bodies_read_back(path, sent)
    out = tmp_path / "merged.lmdb"
    merge(out, [path])
    all_bodies_read_back(out, sent)
    copy = tmp_path / "copy.lmdb"
    shutil.copytree(path, copy)
    before = (copy / "data.mdb").stat().st_size
    r = rewrite(copy)
    assert r.exchanges == 240 and (copy / "data.mdb").stat().st_size < before
    all_bodies_read_back(copy, sent)
    assert tags(copy).get("ref", 0) == tags(path).get("ref", 0)  # chains kept as they were
    with Store.open(path, write=False) as a, Store.open(copy, write=False) as b:  # replay still opens lazily
        assert b.meta("replay_index") == a.meta("replay_index") == replay_index.VERSION
        assert list(b.tables.rows("lookups")) == list(a.tables.rows("lookups")) != []
        assert list(b.tables.rows("recorded")) == list(a.tables.rows("recorded"))


def test_the_map_grows_in_steps_so_the_file_stays_near_what_is_used(tmp_path, monkeypatch):
    monkeypatch.setattr(store_env, "_INITIAL_MAP", 1 << 20)
    monkeypatch.setattr(store_env, "_MIN_STEP", 1 << 20)
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(40):
            p = rec.begin(RequestData("POST", "http://up/x", "up", "/x", (), f"q{i}".encode()), Labels("A"))
            rec.finish(p, ResponseData(200, (), bytes(range(256)) * 400 + str(i).encode()))
        used, size = s.tables.usage()["used"], (path / "data.mdb").stat().st_size
    assert size < used * 1.25 + (1 << 20), (used, size)  # doubling would leave up to 2x


def test_a_batch_that_fails_leaves_no_request_compressed_against_its_bodies(tmp_path, monkeypatch):
    """A batch's transaction extends its sessions' chains as it goes; when it fails, those links
    are undone, so the next request is compressed against bodies that were committed."""
    path = tmp_path / "s.lmdb"

    def ask(rec: Recorder, session: str, text: str) -> tuple[bytes, bytes]:
        body = json.dumps({"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                                      {"role": "user", "content": text}]}).encode()
        answer = json.dumps({"choices": [{"message": {"content": f"answer to {text} " * 20}}]}).encode()
        p = rec.begin(RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions", (), body),
                      Labels(session))
        rec.finish(p, ResponseData(200, (("content-type", "application/json"),), answer))
        return body, answer

    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        kept = [ask(rec, "A", "first question"), ask(rec, "A", "second question")]
        real = s.codec.encode

        def fails_on_b(data: bytes, key: bytes | None = None) -> bytes:
            if b"session B" in data:
                raise OSError("the disk went away")
            return real(data, key)

        with pytest.raises(OSError, match="disk went away"):
            with s.batch():
                ask(rec, "A", "third question, lost with its batch")  # chained against the second: a new link
                monkeypatch.setattr(s.codec, "encode", fails_on_b)
                ask(rec, "B", "session B")
        monkeypatch.setattr(s.codec, "encode", real)
        assert len(s) == 2
        kept.append(ask(rec, "A", "third question, again"))  # must chain to the second, which is stored
    assert tags(path).get("ref", 0) >= 2
    all_bodies_read_back(path, kept)
