"""nfanalyze's per-condition counts of a store's heads, summed per batch in numpy
(`analyzer/head_counts.py`), against the same counts made independently from the records, one
exchange at a time: heads of every shape a record can give (errors, 5xx, truncated, usage missing,
empty, with a missing count, as a dict of more keys, past 32 bits), replay misses and order
violations, sessions shared by two stores, and batches of either kind in one store. Real stores
written through `Store.append`, as the recorder and import write them."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest

from noisefloor.analyzer import head_counts, logstats
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store.log import Store, StoreError

_U64 = struct.Struct(">Q")
ODD_USAGE: dict[int, Any] = {300: {"input": None, "output": 3}, 610: {"input": 2 ** 40, "output": 1},
                             620: {"input": 4, "output": 5, "cached": 2}, 630: {"output": 7}}


def record(i: int, shard: str) -> dict[str, Any]:
    """Exchange `i` of a study: 40 sessions, three conditions (one unlabeled), two models."""
    status = 503 if i % 97 == 5 else 200
    usage: Any = ODD_USAGE.get(i, None if i % 13 == 0 else {} if i % 17 == 0 else {"input": i % 50, "output": i % 7})
    doc: dict[str, Any] = {
        "time": 1.7e9 + i, "mode": "replay" if i % 11 == 0 else "record", "session": f"s{(i * 7) % 40}",
        "key": f"{i:064x}", "occurrence": 0, "seq": i, "rules_id": Rules().id,
        "request": {"method": "POST", "url": "http://up/v1/chat/completions", "headers": []},
        "response": {"status": status, "headers": []}, "task": f"t{i % 9}", "replicate": str(i % 3),
        "condition": [None, "warm", "cold"][(i * 7) % 40 % 3], "model": ["m-a", "m-b"][i % 2],
        "fingerprint": f"fp{i % 3}" if i % 5 else None, "usage": usage, "truncated": i % 23 == 0,
        "error": "upstream reset" if i % 31 == 1 else None}
    if i % 11 == 0:
        doc["replay"] = {"result": "miss" if i % 2 else "order_violation"}
    if shard == "b":
        doc["session"] = f"s{(i * 3) % 50}"  # sessions s0..s39 shared with the first shard
    return doc


def build(path: Path, shard: str, n: int) -> Path:
    with Store.open(path, write=True, create=True) as s:
        s.append_many([(record(i, shard), {}, None) for i in range(n)])
    return path


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    base = tmp_path_factory.mktemp("counts")
    return [build(base / "a.lmdb", "a", 700), build(base / "b.lmdb", "b", 300)]


def expected(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The counts, from every exchange's whole record (not the heads table), in plain Python."""
    acc: dict[str, dict[str, Any]] = {}
    for path in paths:
        with Store.open(path, write=False) as s:
            heads = [exchange_record.head_of(ex) for ex in s.exchanges()]
        for h in heads:
            c = acc.setdefault(h.condition or "(unlabeled)", {
                "exchanges": 0, "sessions": set(), "misses": 0, "order_violations": 0, "errors": 0,
                "truncated": 0, "input_tokens": 0, "output_tokens": 0, "models": set(), "fingerprints": set(),
                "modes": set()})
            c["exchanges"] += 1
            c["sessions"].add(h.session)
            c["misses"] += h.replay_result == "miss"
            c["order_violations"] += h.replay_result == "order_violation"
            c["errors"] += h.error is not None or (h.status or 0) >= 500
            c["truncated"] += bool(h.truncated)
            c["input_tokens"] += (h.usage or {}).get("input") or 0
            c["output_tokens"] += (h.usage or {}).get("output") or 0
            c["modes"].add(h.mode)
            c["models"] |= {h.model} - {None}
            c["fingerprints"] |= {h.fingerprint} - {None}
    for c in acc.values():
        c["sessions"] = len(c["sessions"])
        for k in ("models", "fingerprints", "modes"):
            c[k] = sorted(c[k])
    return acc


@pytest.mark.parametrize("pending", [head_counts._PENDING, 100, 7])
def test_the_counts_are_those_of_the_records_in_the_order_conditions_first_appear(shards, pending, monkeypatch):
    monkeypatch.setattr(head_counts, "_PENDING", pending)  # summed every batch (chunks merged), or at the end
    for paths in ([shards[0]], [shards[1]], shards, shards[::-1]):
        got = logstats.from_store(paths)["conditions"]
        want = expected(paths)
        assert got == want
        assert list(got) == list(want)  # the conditions' order: that of their first exchange
    whole = logstats.from_store(shards)["conditions"]
    assert whole["warm"]["sessions"] < 40 + 50  # a session in both shards counted once
    assert sum(c["input_tokens"] for c in whole.values()) > 2 ** 40  # past 32 bits: counted exactly


def test_batches_counted_in_numpy_and_head_by_head_agree(shards):
    """The first shard's second and third batches hold a usage numpy does not take (counted head by
    head), its first batch and the second shard's do not: the same totals as `summarize` over
    the heads one at a time."""
    with Store.open(shards[0], write=False) as s:
        labels, routes = s.walk.head_sets()
        kinds = ["numpy" if stored and head_counts.columns(stored, 0) is not None else "by head"
                 for stored, _ in s.walk.stored_head_batches(labels, routes)]
        one_by_one = logstats.summarize(p for _, p in s.walk.head_parts())
    assert kinds == ["numpy", "by head", "by head"]
    assert logstats.from_store(shards[0])["conditions"] == one_by_one["conditions"]


def test_a_head_whose_labels_the_store_lacks_is_one_error_naming_the_exchange(shards, tmp_path):
    """A head rewritten with its checksum recomputed but a labels number the store never gave."""
    store = tmp_path / "s.lmdb"
    shutil.copytree(shards[0], store)
    env = lmdb.open(str(store), max_dbs=16)
    try:
        with env.begin(write=True, db=env.open_db(b"heads")) as txn:
            key = _U64.pack(400)
            value = txn.get(key)
            head = msgspec.msgpack.decode(value[8:])
            head[0] = 99_999  # its labels' number
            rest = value[4:8] + msgspec.msgpack.encode(head)
            txn.put(key, struct.pack(">I", zlib.crc32(rest, zlib.crc32(key))) + rest)
    finally:
        env.close()
    with pytest.raises(StoreError, match=rf"store {store}: the head of exchange 400 is damaged \(its labels"):
        logstats.from_store(store)
    r = subprocess.run([str(Path(sys.executable).with_name("nfanalyze")), str(store)], capture_output=True,
                       text=True, timeout=120)
    line = r.stderr.strip()
    assert r.returncode != 0 and "\n" not in line and "Traceback" not in line, r.stderr
    assert str(store) in line and "exchange 400" in line, line
