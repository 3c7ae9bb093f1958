"""Outcome rows in noisefloor-log/7 (`outcome_values`): kept without the three fields their key
holds, read back as exactly the row and the JSON text that was graded; a /6 store's rows read as
they are, merge and compact write them in the new form; a damaged one is refused by name. Real
LMDB files, `nfanalyze` run as a process."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import lmdb
import pytest

from noisefloor.proxy.store import _outcome_values as outcome_values
from noisefloor.proxy.store.compact import rewrite
from noisefloor.proxy.store.log import FORMAT, Store, StoreError
from noisefloor.proxy.store.merge.run import merge

ROWS = [
    {"task_id": "t1", "condition": "live", "replicate": 0, "outcome": 1},
    {"task_id": "t1", "condition": "live", "replicate": 1, "outcome": 0, "judge": {"votes": [1, 0]}, "note": "é ☃"},
    {"task_id": "t\u00e9\"2", "condition": None, "replicate": 3, "outcome": 1},
    {"task_id": "t3", "condition": "replay", "replicate": 2},  # nothing but the key's fields
    {"task_id": "t4", "condition": "live", "replicate": 0, "score": math.nan},  # NaN, which json writes
    {"condition": "live", "task_id": "t5", "replicate": 0, "outcome": 1},  # another order: kept whole
    {"task_id": "t6", "replicate": 0, "outcome": 1},  # no condition: kept whole
]


def _same(a: object, b: object) -> bool:
    return json.dumps(a) == json.dumps(b)  # NaN != NaN; their texts are equal


@pytest.mark.parametrize("row", ROWS, ids=range(len(ROWS)))
def test_a_row_reads_back_as_its_whole_json_text(row):
    k, v = outcome_values.key(row), outcome_values.value(row, keyed=True)
    assert outcome_values.text(k, v) == json.dumps(row).encode()
    assert _same(outcome_values.row(k, v), row) and list(outcome_values.row(k, v)) == list(row)
    leads = list(row)[:3] == ["task_id", "condition", "replicate"]
    assert v.startswith(outcome_values.KEYED) == leads
    if leads:
        assert len(v) < len(json.dumps(row)) - 40
    assert outcome_values.value(row, keyed=False) == json.dumps(row).encode()  # a store before /7


def _rows_of(path):
    with Store.open(path, write=False) as s:
        return s.outcome_rows()


def _values(path):
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin(buffers=False) as txn:
            return dict(txn.cursor(db=env.open_db(b"outcomes", txn=txn, create=False)))
    finally:
        env.close()


def _v6(path, rows=ROWS):
    with Store.open(path, write=True, create=True) as s:
        s.set_meta("format", "noisefloor-log/6")
        s.set_meta("replay_index", 3)
    with Store.open(path, write=True) as s:
        assert s.format == "noisefloor-log/6" and not s.keys_outcomes
        s.put_outcomes(rows)
    return path


def test_a_v6_stores_rows_read_as_they_are_and_merge_and_compact_key_them(tmp_path):
    old = _v6(tmp_path / "old.lmdb")
    whole = _values(old)
    assert all(v[:1] == b"{" for v in whole.values())
    expected = _rows_of(old)
    assert _same(sorted(expected, key=json.dumps), sorted(ROWS, key=json.dumps))
    out = tmp_path / "out.lmdb"
    merge(out, [old])
    keyed = _values(out)
    assert sum(v[:1] == outcome_values.KEYED for v in keyed.values()) == 5 and keyed.keys() == whole.keys()
    assert _same(_rows_of(out), expected)
    rewrite(old)
    assert _values(old) == keyed and _same(_rows_of(old), expected)
    with Store.open(old, write=False) as s:
        assert s.format == FORMAT and s.keys_outcomes


def test_nfanalyze_reads_keyed_rows_as_it_read_whole_ones(tmp_path):
    rows = [{"task_id": f"t{t}", "condition": c, "replicate": r, "outcome": int((t * 7 + r * 3 + len(c)) % 5 < 3)}
            for t in range(40) for c in ("live", "replay") for r in range(4)]
    got = []
    for name in ("v6", "v7"):
        path = tmp_path / f"{name}.lmdb"
        if name == "v6":
            _v6(path, rows)
        else:
            with Store.open(path, write=True, create=True) as s:
                s.put_outcomes(rows)
            assert all(v[:1] == outcome_values.KEYED for v in _values(path).values())
        r = subprocess.run([sys.executable, "-m", "noisefloor.analyzer.cli", str(path), "--json", "-",
                            "--bootstrap", "2000"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        got.append(json.loads(r.stdout))
    assert got[0]["conditions"] == got[1]["conditions"]


def test_a_keyed_row_under_a_damaged_key_is_refused_by_name(tmp_path):
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        s.put_outcomes(ROWS[:2])
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"outcomes", txn=txn)
        k, v = next(iter(txn.cursor(db=db)))
        txn.delete(k, db=db)
        txn.put(b'["live", "t1"]', v, db=db)  # a key of two fields
    env.close()
    with Store.open(path, write=False) as s, pytest.raises(StoreError, match="is damaged.*outcome rows"):
        s.outcome_rows()
    r = subprocess.run([sys.executable, "-m", "noisefloor.analyzer.cli", str(path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "damaged" in r.stderr.strip().splitlines()[-1]
