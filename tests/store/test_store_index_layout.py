"""The replay index's layout 2 against layout 1: a store written by main before layout 2
(tests/data/store-index-v1, made by tests/data/make_index_v1_store.py) keeps replaying as it is,
is recorded into in its own layout, and `nfproxy migrate` / `compact` / `merge` bring it to layout
2, answering every lookup exactly as main's index did (tests/data/store-index-v1.json); a migrate
killed with SIGKILL leaves the store as it was, and running it again finishes. Real LMDB files,
the real recorder, real nfproxy processes."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from bench.store_traffic import REQUEST_HEADERS, record
from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from noisefloor.proxy.store.replay_index import VERSION
from tests import loopback
from tests.conftest import DATA, START_TIMEOUT, nfproxy_argv, wait_until
from tests.data.make_index_v1_store import answered, changed, layout

EXPECTED = json.loads((DATA / "store-index-v1.json").read_text())


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    store = tmp_path / "v1.lmdb"
    shutil.copytree(DATA / "store-index-v1", store)
    return store


def nfproxy(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=timeout)


def test_a_store_of_layout_1_answers_as_main_did_and_replays_strictly(v1, proxies):
    from noisefloor.proxy.launch import start

    assert layout(v1) == ("noisefloor-log/2", 1)
    assert answered(v1) == EXPECTED
    with Store.open(v1, write=False) as s:
        asked = [(i, s.part_body(s.exchange(i).request, i, "request"), s.part_body(s.exchange(i).response, i,
                                                                                   "response")) for i in (1, 2, 3)]
    rep = start("--mode", "replay", "--strict", "--store", str(v1), "--upstream", "https://api.openai.com",
                timeout=START_TIMEOUT)
    proxies.append(rep)
    headers = dict(REQUEST_HEADERS[1:3])
    for i, body, answer in asked:
        r = loopback.post(rep.url + "/v1/chat/completions", content=body, headers=headers, timeout=20)
        assert r.status_code == 200 and r.content == answer, (i, r.text[:300])
    r = loopback.post(rep.url + "/v1/chat/completions", content=changed(asked[2][1]), headers=headers, timeout=20)
    nearest = r.json()["error"]["nearest"]
    assert r.status_code == 404 and nearest["exchange_id"] in [n[0] for n in EXPECTED["3"]["near"]]
    assert rep.stop() == 3
    assert layout(v1) == ("noisefloor-log/2", 1)  # replay wrote nothing


@pytest.mark.parametrize("command", ["migrate", "compact"])
def test_migrate_and_compact_bring_it_to_todays_layout_with_the_same_answers(v1, command):
    r = nfproxy(command, "--store", str(v1))
    assert r.returncode == 0, r.stderr
    assert f"from noisefloor-log/2 to {FORMAT}" in r.stdout
    assert layout(v1) == (FORMAT, VERSION)
    assert answered(v1) == EXPECTED
    with Store.open(v1, write=False) as s:
        assert list(s.raw_table("rindex")) == [] and len(list(s.raw_table("lookups"))) > 60 * 18


def test_merge_writes_todays_layout_with_the_same_answers(v1, tmp_path):
    out = tmp_path / "merged.lmdb"
    assert merge(out, [v1]).exchanges_added == 60
    assert layout(out) == (FORMAT, VERSION)
    assert answered(out) == EXPECTED  # one shard: its sessions keep their order, so their ids


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """The layout-1 store recorded into by today's recorder (2,000 more exchanges, in layout 1),
    and what its index answers for queries over all of it."""
    store = tmp_path_factory.mktemp("grown") / "v1.lmdb"
    shutil.copytree(DATA / "store-index-v1", store)
    with Store.open(store, write=True) as s:
        record(s, 2000, seed=5, prefix="later")
    assert layout(store) == ("noisefloor-log/2", 1)
    return store, answered(store, range(1, 2061, 37))


def test_a_layout_1_store_recorded_into_keeps_its_layout_and_the_new_exchanges_are_found(grown):
    store, before = grown
    late = [i for i in map(int, before) if i > 60]  # recorded by today's code, in layout 1
    assert late and all(i in before[str(i)]["candidates"] and i in before[str(i)]["session"] for i in late)
    assert sum(before[str(i)]["near"][0][0] == i for i in late) > len(late) // 2
    assert answered(store, range(1, 61, 2)) != EXPECTED  # the new exchanges are among the nearest


def test_a_migrate_killed_mid_way_leaves_the_store_as_it_was_and_the_next_one_finishes(grown, tmp_path):
    source, before = grown
    store = tmp_path / "s.lmdb"
    shutil.copytree(source, store)
    work = store.parent / f".{store.name}.rewrite" / "data.mdb"
    proc = subprocess.Popen([*nfproxy_argv(), "migrate", "--store", str(store)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        # killed while it writes the rewritten store beside the old one
        wait_until(lambda: work.exists() and work.stat().st_size > 256 << 10 or proc.poll() is not None,
                   "the migrate to write its copy")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the migrate finished before it was killed"
    assert layout(store) == ("noisefloor-log/2", 1)
    assert answered(store, range(1, 2061, 37)) == before
    r = nfproxy("migrate", "--store", str(store))
    assert r.returncode == 0, r.stderr
    assert layout(store) == (FORMAT, VERSION) and not work.parent.exists()
    assert answered(store, range(1, 2061, 37)) == before
    copy = tmp_path / "shipped.lmdb"
    copy.mkdir()
    with Store.open(store, write=False) as s:
        assert len(s) == 2060
        s.copy_to(copy)  # one route and model: 2,060 ids under its bucket, a table of its own in LMDB
    assert answered(copy, range(1, 2061, 37)) == before


def test_a_damaged_layout_2_entry_is_refused_by_name(v1, tmp_path):
    import lmdb

    out = tmp_path / "merged.lmdb"
    merge(out, [v1])
    env = lmdb.open(str(out), max_dbs=12)
    with env.begin(write=True) as txn:
        txn.put((5).to_bytes(8, "big"), b"\x9c\xa3bad", db=env.open_db(b"recorded", txn=txn))
    env.close()
    with Store.open(out, write=False) as s, pytest.raises(StoreError, match=r"store .* is damaged"):
        s.recorded_entries_by_id([4, 5])
    r = nfproxy("compact", "--store", str(out))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "entry of exchange 5 is damaged" in r.stderr.strip().splitlines()[-1]
    with Store.open(out, write=False) as s:  # refused before anything was replaced
        assert len(s) == 60 and s.recorded_entries_by_id([4])[0].id == 4
