"""The heads table: every writer fills it in the record's transaction, listings and nfanalyze read
it instead of the records and print what the records say; a store made by main before it
(tests/data/store-main-0410ae8) and one whose records held their heads' fields
(tests/data/store-main-05ff371) migrate with heads that list what their records say (the records
themselves: tests/store/test_migrate.py); a damaged head is one line naming the store and the
exchange. Real LMDB files, the real recorder, real nfproxy / nfanalyze processes."""

from __future__ import annotations

import shutil
import struct
import sys
import zlib
from pathlib import Path

import lmdb
import msgspec
import pytest

from noisefloor.analyzer import logstats
from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store import heads as store_heads
from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from tests.conftest import DATA, nfproxy_argv
from tests.store.store_fixtures import listings, run

sys.path.insert(0, str(DATA))
from make_main_store import answer, chat  # noqa: E402 - the fixture's own traffic

_U64 = struct.Struct(">Q")
NFANALYZE = [str(Path(sys.executable).with_name("nfanalyze"))]


def from_records(store: Path) -> list[exchange_record.Head]:
    """Each exchange's head as its whole record gives it (the independent reading)."""
    with Store.open(store, write=False) as s:
        return [exchange_record.head_of(ex) for ex in s.exchanges()]


def table(store: Path, name: str = "heads") -> dict[int, bytes]:
    env = lmdb.open(str(store), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(name.encode(), create=False)) as txn:
            return {_U64.unpack(k)[0]: bytes(v) for k, v in txn.cursor()}
    finally:
        env.close()


def record_more(store: Path, n: int, session: str) -> None:
    with Store.open(store, write=True) as s:
        rec = Recorder(s, Rules())
        for i in range(n):
            rec.finish(rec.begin(chat([{"role": "user", "content": f"{session} asks {i}"}]),
                                 Labels(session, condition=f"c{i % 2}")), answer(f"answer {i}", i))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("heads")
    old, new = base / "old.lmdb", base / "new.lmdb"
    shutil.copytree(DATA / "store-main-0410ae8", old)
    shutil.copytree(old, new)
    r = run([*nfproxy_argv(), "migrate", "--store", str(new)])
    assert r.returncode == 0, r.stderr
    return {"old": old, "new": new, "base": base}


def test_a_store_of_main_is_listed_from_its_records_and_migrated_with_heads_that_list_the_same(stores):
    new = stores["new"]
    with Store.open(new, write=False) as s:
        assert s.format == FORMAT and s.meta("migrated_from") == "noisefloor-log/3"
        new_heads = list(s.walk.heads())
    assert new_heads == from_records(new)
    assert len(table(new)) == len(new_heads) == 8
    summary = logstats.from_store(new)
    assert summary["conditions"]["(unlabeled)"]["exchanges"] == 8
    assert summary["conditions"]["(unlabeled)"]["input_tokens"] == 40  # 5 each, as the fixture answered


def test_a_v4_store_of_main_migrates_with_every_record_the_same(tmp_path):
    """tests/data/store-main-05ff371: made by main at 05ff371 (noisefloor-log/4: records whole, id
    in them) with make_main_store.py; migrated, each record is stored without its head's fields
    and its head lists what the record says."""
    new = tmp_path / "new.lmdb"
    shutil.copytree(DATA / "store-main-05ff371", new)
    r = run([*nfproxy_argv(), "migrate", "--store", str(new)])
    assert r.returncode == 0 and "from noisefloor-log/4 to " + FORMAT in r.stdout, r.stdout + r.stderr
    with Store.open(new, write=False) as b:
        assert (b.format, b.meta("migrated_from")) == (FORMAT, "noisefloor-log/4")
        heads, whole = list(b.walk.heads()), dict(b.records.texts())
    assert heads == from_records(new) and len(heads) == 8
    rest = table(new, "exchanges")
    assert all(t.startswith(b'{"id":') for t in whole.values())
    assert all(b'"key"' not in b.replace(b" ", b"") for b in _decoded(new, rest).values())


def _decoded(store: Path, rows: dict[int, bytes]) -> dict[int, bytes]:
    with Store.open(store, write=False) as s:
        return {i: s.codec.decode(v, 1 << 24) for i, v in rows.items()}


def test_every_writer_fills_the_heads_table(stores, tmp_path):
    new = tmp_path / "new.lmdb"
    shutil.copytree(stores["new"], new)
    record_more(new, 5, "recorded")  # the recorder (and import, which records through it)
    shard = tmp_path / "shard.lmdb"
    with Store.open(shard, write=True, create=True) as s:
        s.append({"time": 1.7e9, "mode": "replay", "session": "replayed", "key": "ab" * 32, "occurrence": 0,
                  "seq": 1, "rules_id": Rules().id, "request": {"method": "POST", "url": "http://up/v1", "headers": []},
                  "response": {"status": 412, "headers": []}, "replay": {"result": "miss"}}, {}, None)
    record_more(shard, 4, "sharded")
    out = tmp_path / "merged.lmdb"
    merge(out, [new, shard])  # merge, its replay records moved to the new ids too
    for store, n in ((new, 13), (out, 18)):
        heads = from_records(store)
        assert len(heads) == n and len(table(store)) == n
        with Store.open(store, write=False) as s:
            listed = list(s.walk.heads())
        assert listed == heads
    merged = logstats.from_store(out)["conditions"]
    assert merged["c0"]["exchanges"] == 5 and merged["c1"]["exchanges"] == 4
    assert merged["(unlabeled)"]["misses"] == 1 and merged["(unlabeled)"]["sessions"] == 2


def damage(store: Path, how: str) -> None:
    env = lmdb.open(str(store), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(b"heads")) as txn:
            three, four = txn.get(_U64.pack(3)), txn.get(_U64.pack(4))
            if how == "flipped":
                txn.put(_U64.pack(3), three[:20] + bytes([three[20] ^ 1]) + three[21:])
            elif how == "moved":  # a well-formed head, of another exchange: its CRC covers its exchange's id
                txn.put(_U64.pack(3), four)
            elif how in ("typed", "forged"):  # checksum recomputed: the status no longer a number, or another one
                head = msgspec.msgpack.decode(three[8:])  # after its CRC and its record's CRC
                head[7] = "two hundred" if how == "typed" else 500  # after labels, route, left out, time, keys, occurrence
                rest = three[4:8] + msgspec.msgpack.encode(head)
                txn.put(_U64.pack(3), struct.pack(">I", zlib.crc32(rest, zlib.crc32(_U64.pack(3)))) + rest)
            elif how == "dropped":
                txn.delete(_U64.pack(3))
            elif how == "record":  # the record rewritten, valid, after its head was written: it says 503
                records, dicts = env.open_db(b"exchanges", txn=txn), env.open_db(b"dicts", txn=txn)
                text = codec.Codec(lambda k: txn.get(k, db=dicts)).decode(txn.get(_U64.pack(3), db=records), 1 << 24)
                assert b'"status": 200' in text
                txn.put(_U64.pack(3), codec.Codec(lambda k: None).encode(text.replace(b'"status": 200', b'"status": 503')),
                        db=records)
            elif how == "cut":  # the record's stored bytes cut short
                records = env.open_db(b"exchanges", txn=txn)
                txn.put(_U64.pack(3), txn.get(_U64.pack(3), db=records)[:-1], db=records)
    finally:
        env.close()


@pytest.mark.parametrize("how, said", [("flipped", "exchange 3 is damaged (its checksum"),
                                       ("moved", "exchange 3 is damaged (its checksum"),
                                       ("typed", "exchange 3 is damaged (Expected `int | null`"),
                                       ("dropped", "exchange 3 has no head"),
                                       ("record", "exchange 3's head and record do not match"),
                                       ("cut", "exchange 3 is damaged")])
def test_a_damaged_head_is_one_line_naming_the_store_and_the_exchange(stores, tmp_path, how, said):
    """The head is the one copy of its fields: everything refuses by name, compact too, and the
    store is left as it was."""
    store = tmp_path / "s.lmdb"
    shutil.copytree(stores["new"], store)
    damage(store, how)
    for argv in ([*nfproxy_argv(), "log", "--store", str(store)], [*NFANALYZE, str(store)]):
        r = run(argv)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        line = r.stderr.strip()
        assert "\n" not in line and str(store) in line and said in line, line
        assert "restore the store from a copy" in line or how == "cut"  # a damaged record: restored, not rewritten
    with pytest.raises(StoreError, match=said.replace("(", r"\(")):
        logstats.from_store(store)
    before = table(store), table(store, "exchanges")
    r = run([*nfproxy_argv(), "compact", "--store", str(store)])
    assert r.returncode != 0 and (said if how != "cut" else "is damaged") in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 2  # progress, then the error
    assert (table(store), table(store, "exchanges")) == before  # nothing rewritten, nothing lost


def test_a_forged_head_with_its_checksum_recomputed_lists_what_it_says(stores, tmp_path):
    """The limit of a checksum: a head rewritten whole, its CRC recomputed and still tied to its
    record, is listed as it says (the record is not read); `log --json` prints the record."""
    store = tmp_path / "s.lmdb"
    shutil.copytree(stores["new"], store)
    damage(store, "forged")
    with Store.open(store, write=False) as s:
        statuses = [h.status for h in s.walk.heads()]
    assert statuses[2] == 500 and [h.status for h in from_records(store)][2] == 200


def test_log_json_passes_records_through_as_their_heads_say_and_parses_the_rest(stores, tmp_path):
    """A record checked when written is printed from its stored text with what it leaves out added;
    one with a key this version does not know (its head says so) is printed by the full parse."""
    store = tmp_path / "s.lmdb"
    shutil.copytree(stores["new"], store)
    with Store.open(store, write=True) as s:
        s.append({"time": 1.7e9, "mode": "record", "session": "odd", "key": "cd" * 32, "occurrence": 0, "seq": 1,
                  "rules_id": "r", "request": {"method": "POST", "url": "http://up/", "headers": []},
                  "response": None, "from_the_future": [1, 2]}, {}, None)
        values = dict(s.tables.rows("heads"))
        assert [store_heads.left_out(v) for v in values.values()].count(exchange_record.NOT_LISTED) == 1
        whole = [msgspec.json.decode(ex.json_bytes()) for ex in s.exchanges()]
    printed = [msgspec.json.decode(line) for line in listings(store)[1].splitlines()]
    assert printed == whole and printed[-1]["from_the_future"] == [1, 2] and printed[-1]["replay"] is None
    assert len(printed) == 9 and all(p["version"] == 1 and "usage" in p for p in printed)


def test_the_recorders_heads_are_those_its_records_texts_give(tmp_path):
    """The recorder builds each head from the values it built the record of (no parse of its own
    text): the head, and what the record leaves out, are what reading the stored text gives, for an
    answer, an answer without a response (a connection error) and a label msgpack cannot hold."""
    store = tmp_path / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        rec.finish(rec.begin(chat([{"role": "user", "content": "hi"}]), Labels("a", task="t", condition="c")),
                   answer("hello", 0))
        rec.finish(rec.begin(chat([{"role": "user", "content": "again"}]), Labels("a", replicate="r1")), None,
                   error="connection refused", notes=["upstream gone"])
        rec.finish(rec.begin(chat([{"role": "user", "content": "odd"}]), Labels("b\udc80")), answer("x", 1))
        rec.finish(rec.begin(chat([{"role": "user", "content": "more"}]), Labels("a", task="t", condition="c")),
                   answer("hello again", 2))
        values = dict(s.tables.rows("heads"))
        texts = dict(s.records.texts())
        assert len(values) == len(texts) == 4 and len(list(s.tables.rows("labels"))) == 2
        for i, text in texts.items():
            checked = exchange_record.checked_head(text)
            value = values[_U64.pack(i)]
            if checked is None:  # the lone surrogate: JSON msgspec refuses, so the record is read instead
                assert i == 3 and value == b""
                continue
            assert store_heads.left_out(value) == checked[1] != exchange_record.NOT_LISTED
            numbered = msgspec.msgpack.decode(value[8:])[:2]  # the first two: a new label set and route each
            assert numbered == ([i, i] if i < 3 else [1, 1])  # the fourth: the first's again
        listed = list(s.walk.heads())
        assert listed == [exchange_record.head_of(ex) for ex in s.exchanges()]
        assert [h.status for h in listed] == [200, None, 200, 200] and listed[1].error == "connection refused"
        assert listed[0].usage == {"input": 5, "output": 3} and listed[1].usage == {} and listed[0].model == "gpt-4o-mini-2024-07-18"


def test_a_listing_from_the_tables_parts_prints_what_one_from_heads_prints(tmp_path):
    """`nfproxy log` without a filter formats the heads as the store keeps them (shared label and
    route tuples, the key's digest); with a filter, whole Heads: the lines are the same, for an
    answer, a connection error, a replay miss, a key that is not a digest and a label msgpack
    cannot hold (listed from its record)."""
    from noisefloor.display import Visible
    from noisefloor.proxy.cli._listing_cmds import _Line

    store = tmp_path / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        rec.finish(rec.begin(chat([{"role": "user", "content": "hi"}]), Labels("a", condition="c")), answer("x", 0))
        rec.finish(rec.begin(chat([{"role": "user", "content": "no"}]), Labels("a", condition="c")), None,
                   error="refused")
        rec.finish(rec.begin(chat([{"role": "user", "content": "odd"}]), Labels("b\udc80\x1b[2J")), answer("y", 1))
        s.append({"time": 1.7e9, "mode": "replay", "session": "r", "key": "not a digest\x07", "occurrence": 2,
                  "seq": 1, "rules_id": Rules().id, "request": {"method": "POST", "url": "http://up/v1", "headers": []},
                  "response": {"status": 412, "headers": []}, "replay": {"result": "miss"}}, {}, None)
        from_parts = list(_Line(Visible()).of_parts(s.walk.head_parts(), True))
        from_heads = list(_Line(Visible()).of_heads(s.walk.heads(), True))
    assert from_parts == from_heads and len(from_parts) == 4
    assert "ERR error" in from_parts[1][3] and "412 miss" in from_parts[3][3] and "\x1b" not in from_parts[2][3]
    assert "\x07" not in from_parts[3][3] and from_parts[3][:3] == ("r", "replay", None)


def test_a_transaction_undone_by_an_error_takes_its_label_numbers_with_it(tmp_path):
    """A batch that fails on its second exchange (a text that is not an exchange record) writes
    nothing, its first exchange's new label and route sets included: the writer must not reuse
    their numbers, or the next exchange of that session would name sets the store does not hold."""
    source = tmp_path / "a.lmdb"
    with Store.open(source, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        rec.finish(rec.begin(chat([{"role": "user", "content": "hi"}]), Labels("fresh", condition="c")), answer("x", 0))
        (text,) = dict(s.records.texts()).values()
    record = '{' + text.decode().split(",", 1)[1]  # the record without its id, as a writer appends it
    store = tmp_path / "b.lmdb"
    with Store.open(store, write=True, create=True) as s:
        with pytest.raises(StoreError, match="is not an exchange record"):
            s.append_many([(record, {}, None), ('{"x": 1}', {}, None)])
        assert s.last_id() == 0 and list(s.tables.rows("labels")) == []
        s.append_many([(record, {}, None)])
        (head,) = list(s.walk.heads())
        assert (head.session, head.condition, head.url) == ("fresh", "c", "http://127.0.0.1:9/v1/chat/completions")


def test_a_head_read_back_from_its_table_value_has_every_field_where_it_was():
    """Each field holds a value no other field holds, so a set's strings handed to the wrong field
    (a reordered Head or route) would show as a difference here."""
    h = exchange_record.Head(
        id=7, time=1.25, key="k-not-hex", occurrence=3, status=201, usage={"input": 5, "output": 6},
        truncated=True, error="err", notes=["n"], session="sess", task="task", replicate="rep",
        condition="cond", mode="record", method="POST", url="https://x.test/v1", model="model",
        fingerprint="fp", replay_result="hit")
    r = store_heads.row(h, 0, b"stored")
    assert r is not None
    value = store_heads.seal(_U64.pack(7), 1, 2, r[2])
    labels = {1: store_heads.SETS["labels"].decode(r[0])}
    routes = {2: store_heads.SETS["routes"].decode(r[1])}
    back = store_heads.head(7, store_heads.parts(value, labels, routes))
    assert {f: getattr(back, f) for f in h.__struct_fields__} == {f: getattr(h, f) for f in h.__struct_fields__}
