"""One store format at run time: a store of an earlier one (tests/data/v1_store.lmdb, made by
tests/data/make_v1_store.py at commit 1704f55) is refused by every command with one line naming
`nfproxy migrate`, changing nothing; `nfproxy migrate` rewrites it in today's format with every
exchange, body and outcome row intact, and it then replays strictly through a real nfproxy; every
store an earlier main made (tests/data) migrates and replays every recorded request byte-identical."""

from __future__ import annotations

import base64
import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from tests import loopback
from tests.conftest import DATA, START_TIMEOUT, nfproxy_argv
from tests.store.store_fixtures import fixture_copy

# main's listing of the fixture, plus the record layout version its records leave implicit (1)
EXPECTED = [{**json.loads(line), "version": 1} for line in (DATA / "v1_store.exchanges.jsonl").read_text().splitlines()]


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    store = tmp_path / "old.lmdb"
    shutil.copytree(DATA / "v1_store.lmdb", store, ignore=shutil.ignore_patterns("lock.mdb"))
    return store


def listed(store: Path) -> list[dict]:
    r = subprocess.run([*nfproxy_argv(), "log", "--json", "--store", str(store)], capture_output=True, text=True,
                       timeout=60, check=True)
    return [json.loads(line) for line in r.stdout.splitlines()]


def fmt(store: Path) -> str:
    import lmdb

    env = lmdb.open(str(store), max_dbs=16, readonly=True, lock=False)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            return json.loads(txn.get(b"format"))
    finally:
        env.close()


def files(store: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in store.iterdir() if f.name != "lock.mdb"}


def chat(content: str, stream: bool = False) -> dict:
    return {"model": "gpt-4o-mini", "stream": stream, "messages": [{"role": "user", "content": content}]}


def replay(store: Path, proxies, *extra: str) -> None:
    from noisefloor.proxy.launch import start

    rep = start("--mode", "replay", "--strict", "--store", str(store), "--upstream", "http://up", *extra,
                timeout=START_TIMEOUT)
    proxies.append(rep)
    r = loopback.post(rep.url + "/v1/chat/completions", json=chat("what is 2+2 (sA)"), timeout=20)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "4"
    r = loopback.post(rep.url + "/v1/chat/completions", json=chat("say hello", stream=True), timeout=20)
    assert r.status_code == 200 and b"friend" in r.content
    assert rep.stop() == 0, rep.output[-800:]


@pytest.mark.parametrize("write", [False, True])
def test_an_old_store_is_refused_by_name_and_left_as_it_was(v1, write):
    before = files(v1)
    with pytest.raises(StoreError, match=r"format noisefloor-log/1, older than .*run `nfproxy migrate "):
        Store.open(v1, write=write)
    assert files(v1) == before and fmt(v1) == "noisefloor-log/1"


@pytest.mark.parametrize("command", [["log", "--json"], ["compact"], ["repair"]])
def test_every_command_on_an_old_store_says_one_line_naming_migrate(v1, command):
    before = files(v1)
    r = subprocess.run([*nfproxy_argv(), *command, "--store", str(v1)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"nfproxy migrate {v1}" in r.stderr and "Traceback" not in r.stderr
    assert files(v1) == before


def test_migrate_rewrites_an_old_store_in_todays_format_with_nothing_lost(v1, proxies):
    r = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(v1)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "from noisefloor-log/1 to " + FORMAT in r.stdout
    assert fmt(v1) == FORMAT and listed(v1) == EXPECTED
    assert (v1 / "data.mdb").stat().st_size <= 72 * 1024  # cut to its pages, no reserved map
    with Store.open(v1, write=False) as s:
        assert len(list(s.bodies.all())) == 10  # verified against their hashes
        assert s.outcome_rows() == [{"task_id": "t1", "condition": "live", "replicate": "0", "outcome": 1}]
        assert s.meta("migrated_from") == "noisefloor-log/1"
    replay(v1, proxies)
    again = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(v1)], capture_output=True, text=True,
                           timeout=60)  # a store in today's format: compacted, still whole
    assert again.returncode == 0 and listed(v1) == EXPECTED, again.stderr


FIXTURES = ["v1_store.lmdb", "store-index-v1", "store-index-v2", "store-main-0410ae8", "store-main-0497a29",
            "store-main-05ff371", "store-main-0ba4151", "store-main-1704f55", "store-main-ac2f828",
            "store-main-ac2f828-dicts"]  # stores made by earlier mains
_HOP = {"host", "content-length", "transfer-encoding", "connection"}


def golden(name: str) -> dict:
    """What main's reader read from a fixture store before migrate owned the earlier formats
    (tests/data/recorded, written by main 048e17e): every record, every recorded exchange's request
    and answer bodies, the outcome rows."""
    return json.loads(gzip.decompress((DATA / "recorded" / f"{name}.json.gz").read_bytes()))


def _b64(data: bytes | None) -> str:
    return base64.b64encode(data or b"").decode()


@pytest.mark.parametrize("name", FIXTURES)
def test_every_fixture_migrates_to_what_mains_reader_read_from_it(tmp_path, name):
    want = golden(name)
    store = fixture_copy(tmp_path, name)
    assert fmt(store) == want["format"]
    r = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(store)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"from {want['format']} to {FORMAT}" in r.stdout, r.stderr
    with Store.open(store, write=False) as s:
        assert [json.loads(ex.json_bytes()) for ex in s.exchanges()] == want["records"]
        assert [{"request": ex.request, "body": _b64(s.bodies.of_part(ex.request, ex.id, "request")),
                 "status": ex.response["status"], "answer": _b64(s.bodies.of_part(ex.response, ex.id, "response"))}
                for ex in s.exchanges() if ex.mode == "record" and ex.response is not None] == want["recorded"]
        assert s.outcome_rows() == want["outcomes"] and len(s) == want["exchanges"]
        entries = list(s.index.entries())
        assert [e.id for e in entries] == [ex.id for ex in s.exchanges() if ex.mode == "record"]
        assert all(got is not None for got in s.index.stored_sketches([e.id for e in entries]))  # each JSON request's
        assert s.meta("migrated_from") == want["format"]


def test_a_v7_store_whose_two_dictionaries_share_a_zstd_id_migrates_to_what_it_read_as(tmp_path):
    """Today's store keys a dictionary by its 32-bit zstd id: where two of a /7 store share one, the
    values of the one not keyed by it are decompressed with their own and stored without one."""
    import hashlib
    import zlib

    import lmdb
    import zstandard

    name = "store-main-ac2f828-dicts"
    store = fixture_copy(tmp_path, name)
    env = lmdb.open(str(store), max_dbs=16)
    with env.begin(write=True) as txn:
        dicts, exchanges, heads = (env.open_db(t, txn=txn, create=False) for t in (b"dicts", b"exchanges", b"heads"))
        key = bytes.fromhex(json.loads(txn.get(b"dicts", db=env.open_db(b"meta", txn=txn)))["record"])
        data = txn.get(key, db=dicts)
        twin = data[:-64] + bytes(64)  # its header (and id), other content
        twin_key = hashlib.sha256(twin).digest()[:8]
        txn.put(twin_key, twin, db=dicts)
        records = list(txn.cursor(db=exchanges))[::2]  # every other record compressed with the twin, its head tied to it
        for k, v in records:
            text = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(data)).decompress(v[9:])
            value = b"\x02" + twin_key + zstandard.ZstdCompressor(dict_data=zstandard.ZstdCompressionDict(twin)).compress(text)
            rest = zlib.crc32(value).to_bytes(4, "big") + txn.get(k, db=heads)[8:]
            txn.put(k, value, db=exchanges)
            txn.put(k, zlib.crc32(rest, zlib.crc32(k)).to_bytes(4, "big") + rest, db=heads)
    env.close()
    r = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(store)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    with Store.open(store, write=False) as s:
        assert [json.loads(ex.json_bytes()) for ex in s.exchanges()] == golden(name)["records"]


def recorded(name: str) -> list[tuple[dict, bytes, int, bytes]]:
    """(request, its body, the answer's status and body) of every recorded exchange, in id order, as
    main's reader read the fixture."""
    return [(r["request"], base64.b64decode(r["body"]), r["status"], base64.b64decode(r["answer"]))
            for r in golden(name)["recorded"]]


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_a_store_of_an_earlier_main_migrates_and_replays_every_request_byte_identical(tmp_path, proxies, name):
    from urllib.parse import urlsplit

    from noisefloor.proxy.launch import start

    store = tmp_path / "old.lmdb"
    shutil.copytree(DATA / name, store, ignore=shutil.ignore_patterns("lock.mdb"))
    asked = recorded(name)
    assert len(asked) >= 6
    r = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(store)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"to {FORMAT}" in r.stdout, r.stderr
    where = urlsplit(asked[0][0]["url"])
    rep = start("--mode", "replay", "--strict", "--store", str(store), "--upstream", f"{where.scheme}://{where.netloc}",
                timeout=START_TIMEOUT)  # strict: a request it cannot answer from the store is an error, never sent
    proxies.append(rep)
    with loopback.client(timeout=20) as c:
        for request, body, status, answer in asked:
            url = urlsplit(request["url"])
            headers = [(k, v) for k, v in request["headers"] if k.lower() not in _HOP]
            got = c.request(request["method"], rep.url + url.path + (f"?{url.query}" if url.query else ""),
                            content=body, headers=headers)
            assert (got.status_code, got.content) == (status, answer), (name, got.text[:300])
    assert rep.stop() == 0, rep.output[-800:]
    with Store.open(store, write=False) as s:  # replay opened it read-only: nothing written
        assert len(s) == golden(name)["exchanges"]


def test_a_store_killed_before_its_format_was_marked_is_marked_by_its_next_writer(tmp_path):
    import lmdb

    store = tmp_path / "s.lmdb"
    lmdb.open(str(store), max_dbs=16).close()  # the environment made, nothing written yet
    with pytest.raises(StoreError, match="not an nfproxy store"):
        Store.open(store, write=False)
    with Store.open(store, write=True) as s:
        assert s.format == FORMAT
    assert fmt(store) == FORMAT


def test_a_newer_format_is_refused_by_name(v1):
    import lmdb

    env = lmdb.open(str(v1), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"format", json.dumps("noisefloor-log/9").encode(), db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(StoreError, match="format noisefloor-log/9, newer than this nfproxy reads"):
        Store.open(v1, write=False)


def test_a_record_with_unknown_keys_keeps_them_and_a_newer_layout_is_refused(tmp_path):
    """Keys this version does not know are round-tripped as data (never dropped); a record of a
    layout newer than this version reads is one line naming the store, the exchange and the fix."""
    base = {"time": 1.0, "mode": "record", "session": "s", "key": "k" * 64, "occurrence": 0, "seq": 0,
            "rules_id": "r", "request": {"method": "GET", "url": "http://up/", "headers": []}, "response": None}
    store = tmp_path / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        s.append({**base, "added_later": {"nested": [1, "two", None]}, "another": "x"}, {}, None)
        s.append({**base, "version": 2, "seq": 1}, {}, None)
    with Store.open(store, write=False) as s:
        ex = s.exchange(1)
        assert ex.unknown == {"added_later": {"nested": [1, "two", None]}, "another": "x"}
        written = json.loads(ex.json_bytes())
        assert {k: written[k] for k in base} == base and written["another"] == "x"
        assert json.loads(ex.json_bytes())["added_later"] == {"nested": [1, "two", None]}
        with pytest.raises(StoreError, match=r"exchange 2 is damaged .*layout version 2, newer than this noisefloor"):
            s.exchange(2)
    r = subprocess.run([*nfproxy_argv(), "log", "--json", "--store", str(store)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "layout version 2" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _damaged_copy(tmp_path: Path, fixture: str, table: str, how) -> Path:
    import lmdb

    store = fixture_copy(tmp_path, fixture)
    env = lmdb.open(str(store), max_dbs=32)
    with env.begin(write=True) as txn:
        db = env.open_db(table.encode(), txn=txn, create=False)
        k, v = list(txn.cursor(db=db))[2]
        txn.put(k, how(v), db=db)
    env.close()
    return store


@pytest.mark.parametrize(("fixture", "table", "how", "said"), [
    ("store-main-1704f55", "exchanges", lambda v: v[:-5] + b"xxxxx", "exchange 3 is damaged"),  # format 1
    ("store-main-05ff371", "exchanges", lambda v: v[:10], "exchange 3 is damaged"),  # format 4
    ("store-main-0497a29", "bodies", lambda v: v[:-3] + b"zzz", "is damaged (bodies)"),  # format 5
    ("store-index-v1", "recorded", lambda v: b"{bad", "is damaged (JSONDecodeError"),  # index layout 1
    ("store-main-0ba4151", "heads", lambda v: v[:-1] + b"\x00", "head of exchange 3 is damaged"),  # format 6
    ("store-index-v2", "outcomes", lambda v: b"[1,2", "is damaged (JSONDecodeError"),
], ids=["record-v1", "record-v4", "body-v5", "entry-layout1", "head-v6", "outcome-row"])
def test_a_damaged_old_store_is_refused_by_one_line_naming_it_and_left_as_it_was(tmp_path, fixture, table, how, said):
    store = _damaged_copy(tmp_path, fixture, table, how)
    before = (store / "data.mdb").read_bytes()
    r = subprocess.run([*nfproxy_argv(), "migrate", "--store", str(store)], capture_output=True, text=True, timeout=120)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert last.startswith(f"Error: store {store}") and said in last and "from a copy" in last
    assert [line for line in r.stderr.strip().splitlines() if not line.startswith("nfproxy: ")] == [last]  # progress
    assert (store / "data.mdb").read_bytes() == before and not (tmp_path / ".old.lmdb.migrate").exists()
