"""The versioned store format: a store written by main before it (tests/data/v1_store.lmdb, format
noisefloor-log/1, made by tests/data/make_v1_store.py at commit 1704f55) is read as it is, replays
strictly through a real nfproxy, and `nfproxy migrate` / `nfproxy compact` rewrite it in today's
format with every exchange, body and outcome row intact."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from tests import loopback
from tests.conftest import DATA, START_TIMEOUT, nfproxy_argv

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
    with Store.open(store, write=False) as s:
        return s.format


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


def test_an_old_store_is_read_as_it_is(v1):
    assert listed(v1) == EXPECTED
    assert fmt(v1) == "noisefloor-log/1"  # reading changes nothing
    with Store.open(v1, write=False) as s:
        assert len(list(s.bodies())) == 10  # verified against their hashes
        assert s.outcome_rows() == [{"task_id": "t1", "condition": "live", "replicate": "0", "outcome": 1}]


def test_an_old_store_replays_strictly_and_is_marked_when_written(v1, proxies):
    before = {f.name: f.read_bytes() for f in v1.iterdir() if f.name != "lock.mdb"}
    replay(v1, proxies)  # replay opens the recording read-only: an old fixture stays as it was
    assert fmt(v1) == "noisefloor-log/1"
    assert {f.name: f.read_bytes() for f in v1.iterdir() if f.name != "lock.mdb"} == before
    replay(v1, proxies, "--replay-log-in-store")  # asked to write into it: marked as the format it now is
    assert fmt(v1) == "noisefloor-log/2"  # tagged values, written in the replay index layout it has
    assert listed(v1)[: len(EXPECTED)] == EXPECTED and len(listed(v1)) == len(EXPECTED) + 2  # replay's own records


@pytest.mark.parametrize("command", ["migrate", "compact"])
def test_migrate_rewrites_an_old_store_in_todays_format_with_nothing_lost(v1, proxies, command):
    r = subprocess.run([*nfproxy_argv(), command, "--store", str(v1)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "from noisefloor-log/1 to " + FORMAT in r.stdout
    assert fmt(v1) == FORMAT and listed(v1) == EXPECTED
    assert (v1 / "data.mdb").stat().st_size <= 72 * 1024  # cut to its pages, no reserved map
    with Store.open(v1, write=False) as s:
        assert len(list(s.bodies())) == 10
        assert s.outcome_rows()[0]["task_id"] == "t1" and s.meta("migrated_from") == "noisefloor-log/1"
    replay(v1, proxies)


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
