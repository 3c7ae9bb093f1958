"""noisefloor-log/5 records (`proxy/store/_records.py`): stored without their id and their head's
fields, read back joined with their head. Checked against the text each writer gave, captured
as it was appended (not read back through the heads, which would be circular): the recorder's
records, whose heads the recorder builds itself, and appended records of every odd shape a head
must carry exactly (an integer time, a key that is not a digest, usage of another shape or none,
fields left out, an error and notes) or cannot carry (a lone surrogate, a key this version does
not know: stored whole, id included). Real LMDB stores, the real recorder."""

from __future__ import annotations

import json
import sys

import pytest

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store.log import FORMAT, Store
from tests.conftest import DATA

sys.path.insert(0, str(DATA))
from make_main_store import answer, chat  # noqa: E402 - the fixture's own traffic


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every record text a writer hands the store (`Store._append`'s record), in id order."""
    texts: list[str] = []
    real = Store._append

    def spy(self, txn, record, *a, **kw):  # type: ignore[no-untyped-def]
        texts.append(record if isinstance(record, str) else json.dumps(record))
        return real(self, txn, record, *a, **kw)

    monkeypatch.setattr(Store, "_append", spy)
    return texts


def given(text: str, exchange_id: int) -> dict:
    return exchange_record.parse(exchange_record.with_id(text, exchange_id).encode()).to_json()


BASE = {"mode": "record", "session": "s", "seq": 0, "rules_id": Rules().id, "occurrence": 0, "key": "ab" * 32,
        "request": {"method": "POST", "url": "http://up/v1", "headers": [], "body": None},
        "response": {"status": 200, "headers": []}, "time": 1.7e9}
ODD = [{}, {"time": 1700000000}, {"key": "not a digest"}, {"usage": {"input": 3, "output": None, "cached": 1}},
       {"usage": None}, {"usage": {"output": 2, "input": 1}}, {"task": "t", "replicate": "2", "condition": "c"},
       {"error": "refused", "notes": ["a", "b"], "truncated": None}, {"model": "m", "fingerprint": "fp"},
       {"session": "lone \udc80 surrogate"}, {"from_a_newer_writer": {"x": 1}}, {"response": None}]


def test_every_record_reads_back_as_its_writer_gave_it(tmp_path, captured):
    store = tmp_path / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        assert s.format == FORMAT
        rec = Recorder(s, Rules())
        for i in range(6):
            rec.finish(rec.begin(chat([{"role": "user", "content": f"q {i}"}]), Labels(f"r{i % 2}", task=f"t{i}")),
                       answer(f"a {i}", i) if i != 3 else None, error=None if i != 3 else "upstream refused")
        for i, odd in enumerate(ODD):
            s.append({**BASE, "seq": i, **odd}, {}, None)
    assert len(captured) == 6 + len(ODD)
    with Store.open(store, write=False) as s:
        got = {ex.id: ex.to_json() for ex in s.exchanges()}
        lines = [json.loads(line) for chunk in s.walk.listed_chunks() for line in chunk.splitlines()]
        texts = dict(s.records.texts())
    want = {i: given(text, i) for i, text in enumerate(captured, 1)}
    assert got == want
    assert lines == [printed(text, i) for i, text in enumerate(captured, 1)]  # `log --json`'s objects
    assert all(json.loads(texts[i])["id"] == i for i in texts)
    assert got[8]["time"] == 1700000000 and got[9]["key"] == "not a digest"


def printed(text: str, exchange_id: int) -> dict:
    """What `log --json` prints of the record its writer gave (`Exchange.json_bytes`)."""
    return json.loads(exchange_record.parse(exchange_record.with_id(text, exchange_id).encode()).json_bytes())


def test_records_are_stored_without_their_heads_fields_unless_no_head_can_hold_them(tmp_path):
    store = tmp_path / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        ids = [s.append({**BASE, "seq": i, **odd}, {}, None) for i, odd in enumerate(ODD)]
    with Store.open(store, write=False) as s, s.tables.env.begin() as txn:
        stored = {i: s.codec.decode(txn.get(i.to_bytes(8, "big"), db=s.tables.db["exchanges"]), 1 << 20) for i in ids}
    whole = {ids[ODD.index(o)] for o in ODD if "from_a_newer_writer" in o or "session" in o}
    for i, text in stored.items():
        doc = json.loads(text)
        if i in whole:  # kept whole, id first, as /4 stored it
            assert text.startswith(b'{"id":%d,' % i) and "session" in doc
        else:
            assert not {"id", "time", "key", "session", "mode", "occurrence"} & doc.keys(), doc
            assert doc["request"]["url"] == "http://up/v1" and doc["seq"] == ids.index(i)


_BASE = {"id": 1, "time": 1.0, "mode": "record", "session": "s", "key": "k" * 64, "occurrence": 0, "seq": 0,
         "rules_id": "r", "request": {"method": "GET", "url": "http://up/", "headers": []}, "response": None}


@pytest.mark.parametrize("wrong", [{"notes": [1]}, {"occurrence": True}, {"time": "now"},
                                   {"request": {"method": "GET", "url": 5, "headers": []}},
                                   {"response": {"status": "200", "headers": []}}])
@pytest.mark.parametrize("extra", [{}, {"a_key_from_a_newer_version": 1}, {"note": "\ud800"}],
                         ids=["typed", "unknown-key", "lone-surrogate"])
def test_a_mistyped_record_is_refused_alike_whichever_way_it_is_read(wrong, extra):
    """A record with keys this version does not know, or JSON only json reads, goes the slow way
    (`Exchange.from_json`): it checks the same types as the typed decoder."""
    good = json.dumps({**_BASE, **extra}).encode()
    ex = exchange_record.parse(good)
    assert ex.id == 1 and ex.unknown == extra
    with pytest.raises(TypeError):
        exchange_record.parse(json.dumps({**_BASE, **extra, **wrong}).encode())
