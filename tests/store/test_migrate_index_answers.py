"""A store of the replay index's first layout (tests/data/store-index-v1, made by
tests/data/make_index_v1_store.py) brought to today's layout by `nfproxy migrate`, answering every
lookup exactly as main's index did (tests/data/store-index-v1.json) and replaying strictly; a
migrate stopped before it swaps its result in leaves the store as it was, and running it again
finishes. Real LMDB files, real nfproxy processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.store_traffic import REQUEST_HEADERS
from noisefloor.proxy.store.log import FORMAT, Store
from noisefloor.proxy.store.merge.run import merge
from noisefloor.proxy.store.migrate import migrate
from noisefloor.proxy.store.replay_index import VERSION
from tests import loopback
from tests.conftest import DATA, START_TIMEOUT
from tests.data.make_index_v1_store import answered, changed, layout
from tests.store.store_fixtures import fixture_copy, nfproxy

EXPECTED = json.loads((DATA / "store-index-v1.json").read_text())


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return fixture_copy(tmp_path, "store-index-v1", "v1.lmdb")


def test_a_store_of_layout_1_answers_as_main_did_and_replays_strictly_once_migrated(v1, proxies):
    from noisefloor.proxy.launch import start

    assert layout(v1) == ("noisefloor-log/2", 1)
    migrate(v1)
    with Store.open(v1, write=False) as s:
        asked = [(i, s.bodies.of_part(s.exchange(i).request, i, "request"), s.bodies.of_part(s.exchange(i).response, i,
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
    assert layout(v1) == (FORMAT, VERSION) and answered(v1) == EXPECTED  # replay wrote nothing


def test_migrate_brings_it_to_todays_layout_with_the_same_answers(v1):
    r = nfproxy("migrate", "--store", str(v1))
    assert r.returncode == 0, r.stderr
    assert f"from noisefloor-log/2 to {FORMAT}" in r.stdout
    assert layout(v1) == (FORMAT, VERSION)
    assert answered(v1) == EXPECTED
    with Store.open(v1, write=False) as s:
        assert len(list(s.tables.rows("lookups"))) > 60 * 18


def test_merge_of_the_migrated_store_keeps_its_answers(v1, tmp_path):
    out = tmp_path / "merged.lmdb"
    migrate(v1)
    assert merge(out, [v1]).exchanges_added == 60
    assert layout(out) == (FORMAT, VERSION)
    assert answered(out) == EXPECTED  # one shard: its sessions keep their order, so their ids


def test_a_migrate_stopped_before_its_swap_leaves_the_store_as_it_was_and_the_next_one_finishes(v1, monkeypatch):
    from noisefloor.proxy.store import compact

    before = {f.name: f.read_bytes() for f in v1.iterdir() if f.name == "data.mdb"}

    def stopped(*args: object) -> None:
        raise SystemExit("stopped before the swap")

    with monkeypatch.context() as mp:
        mp.setattr(compact, "swap_in", stopped)
        with pytest.raises(SystemExit):
            migrate(v1)
    assert {f.name: f.read_bytes() for f in v1.iterdir() if f.name == "data.mdb"} == before
    assert layout(v1) == ("noisefloor-log/2", 1)
    r = nfproxy("migrate", "--store", str(v1))
    assert r.returncode == 0, r.stderr
    assert layout(v1) == (FORMAT, VERSION) and not (v1.parent / f".{v1.name}.migrate").exists()
    assert answered(v1) == EXPECTED
