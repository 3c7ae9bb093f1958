"""Outcome rows (`outcome_values`): kept without the three fields their key holds, read back as
exactly the row and the JSON text that was graded; a damaged one is refused by name. Real
LMDB files, `nfanalyze` run as a process."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import lmdb
import pytest

from noisefloor.proxy.store import _outcome_values as outcome_values
from noisefloor.proxy.store.log import Store, StoreError

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
    k, v = outcome_values.key(row), outcome_values.value(row)
    assert outcome_values.text(k, v) == json.dumps(row).encode()
    assert _same(outcome_values.row(k, v), row) and list(outcome_values.row(k, v)) == list(row)
    leads = list(row)[:3] == ["task_id", "condition", "replicate"]
    assert v.startswith(outcome_values.KEYED) == leads
    if leads:
        assert len(v) < len(json.dumps(row)) - 40


def test_a_keyed_row_under_a_damaged_key_is_refused_by_name(tmp_path):
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        s.outcomes.put(ROWS[:2])
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
