"""`nfproxy merge`: shards recorded by separate nfproxy processes become one store that replays strictly."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import lmdb
import pytest

from noisefloor.errors import NoisefloorError
from noisefloor.proxy.store.log import Store, StoreError
from noisefloor.proxy.store.merge.run import merge
from noisefloor.proxy.store.replay_index import RecordedEntry
from tests import loopback
from tests.conftest import ProxyProcess, start_nfproxy
from tests.fake_upstream import FakeUpstream
from tests.store.store_fixtures import killed_after_first_batch

NFPROXY = str(Path(sys.executable).with_name("nfproxy"))
SHARED = "the same long system prompt in every shard " * 40


def ask(proxy: ProxyProcess, labels: str, text: str) -> httpx.Response:
    body = {"model": "m", "temperature": 0, "messages": [{"role": "system", "content": SHARED},
                                                         {"role": "user", "content": text}]}
    return loopback.post(f"{proxy.url}/_nf/{labels}/v1/chat/completions", json=body, timeout=20)


def record_shard(path: Path, upstream: FakeUpstream, proxies: list[ProxyProcess], prefix: str, *extra: str) -> None:
    rec = start_nfproxy("--mode", "record", "--store", str(path), "--upstream", upstream.url, *extra)
    proxies.append(rec)
    for s in range(3):
        for turn in range(2):
            assert ask(rec, f"session={prefix}-{s}", f"{prefix} question {s} turn {turn}").status_code == 200
    assert ask(rec, f"session={prefix}-w", "the same question in every shard").status_code == 200
    assert rec.stop() == 0


def snapshot(path: Path) -> list[tuple]:
    with Store.open(path, write=False) as s:
        exs = [(e.id, e.session, e.key, e.occurrence, e.seq, e.mode, e.request.get("body")) for e in s.exchanges()]
        entries = sorted((e.id, e.session, e.key, e.occurrence, e.seq) for e in s.index.entries())
        return [*exs, *entries, *sorted(json.dumps(r, sort_keys=True) for r in s.outcome_rows())]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two recorded shards, shared: the tests only read them (merges write elsewhere, damage goes
    to a copy)."""
    where = tmp_path_factory.mktemp("shards")
    paths = [where / "a.lmdb", where / "b.lmdb"]
    up, started = FakeUpstream().start(), []
    try:
        for p, prefix in zip(paths, ("a", "b")):
            record_shard(p, up, started, prefix)
    finally:
        up.stop()
        for proc in started:
            proc.stop(signal.SIGKILL, timeout=5)
    with Store.open(paths[1], write=True) as s:
        s.outcomes.put([{"task_id": "T1", "condition": "live", "replicate": 0, "outcome": 1}])
    return paths


def test_merged_shards_replay_strictly_with_shared_bodies_stored_once(tmp_path, shards, upstream, proxies):
    out = tmp_path / "merged.lmdb"
    r = subprocess.run([NFPROXY, "merge", str(out), *map(str, shards)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "8 sessions and 14 exchanges added" in r.stdout and "1 outcome rows added" in r.stdout
    with Store.open(out, write=False) as s:
        assert len(s) == 14 and len(list(s.index.entries())) == 14
        assert s.outcome_rows() == [{"task_id": "T1", "condition": "live", "replicate": 0, "outcome": 1}]
        merged_bodies = list(s.bodies.all())
    bodies = []
    for p in shards:
        with Store.open(p, write=False) as s:
            bodies += list(s.bodies.all())
    assert len(merged_bodies) == len(set(bodies)) == len(bodies) - 1  # the shared request body is stored once
    before = upstream.connections
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(out), "--replay-log-in-store")
    proxies.append(rep)
    for prefix in ("b", "a"):
        for s in range(3):
            for turn in range(2):
                got = ask(rep, f"session=rp-{prefix}-{s},replay_from={prefix}-{s}", f"{prefix} question {s} turn {turn}")
                assert got.status_code == 200 and got.headers.get("x-nf-replay") == "hit", got.text
    assert rep.stop() == 0 and upstream.connections == before
    # idempotent: a second merge changes nothing
    again = merge(out, shards)
    assert again.exchanges_added == 0 and again.sessions_present == 8
    with Store.open(out, write=False) as s:
        assert len(s) == 14 + 12  # the replay log above, nothing else


def test_clashing_sessions_different_rules_and_damaged_shards_are_refused_before_writing(tmp_path, shards, upstream,
                                                                                          proxies):
    out = tmp_path / "merged.lmdb"
    merge(out, shards[:1])
    kept = snapshot(out)
    clash = tmp_path / "clash.lmdb"
    record_shard(clash, upstream, proxies, "a")  # the same session names, other exchanges (other times)
    with pytest.raises(StoreError, match="session 'a-0' is in .* with different exchanges"):
        merge(out, [shards[1], clash])
    other_rules = tmp_path / "rules.lmdb"
    record_shard(other_rules, upstream, proxies, "c", "--ignore-field", "/temperature")
    with pytest.raises(StoreError, match="normalization rules"):
        merge(out, [other_rules])
    damaged = tmp_path / "damaged.lmdb"
    shutil.copytree(shards[1], damaged)
    env = lmdb.open(str(damaged), max_dbs=8)
    with env.begin(write=True) as txn:  # one body rewritten under its old hash, as a bad disk could
        db = env.open_db(b"bodies", txn=txn)
        key = next(iter(txn.cursor(db=db)))[0]
        import zstandard

        from noisefloor.proxy.store import _codec as codec

        frame = bytes([codec.FRAME]) + zstandard.ZstdCompressor().compress(b"not the original body" * 4)
        txn.put(key, frame, db=db)
    env.close()
    r = subprocess.run([NFPROXY, "merge", str(out), str(damaged)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 5 and "does not match its sha256" in r.stderr and "nothing was merged" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 2  # the progress line and the error, no traceback
    assert snapshot(out) == kept


def test_an_interrupted_merge_finishes_when_run_again(tmp_path):
    big = tmp_path / "big.lmdb"
    with Store.open(big, write=True, create=True) as s:  # enough sessions for several write transactions
        items = []
        for i in range(6000):
            record = {"time": 1000.0 + i, "mode": "record", "session": f"s{i // 3}", "key": f"{i % 7:064x}",
                      "occurrence": i // 21, "seq": i % 3, "rules_id": "r", "request": {"method": "POST", "url": "u",
                      "headers": [], "body": None}, "response": None}
            items.append((record, {}, RecordedEntry(0, record["key"], record["session"], record["occurrence"],
                                                     record["seq"], "POST h /p", record["time"], record["time"] + 1)))
        s.append_many(items)
    clean = tmp_path / "clean.lmdb"
    merge(clean, [big])
    out = tmp_path / "out.lmdb"
    killed_after_first_batch([NFPROXY, "merge", str(out), str(big)])
    with Store.open(out, write=False) as s:
        partial = len(s)
    assert 0 < partial < 6000 and partial % 3 == 0  # whole sessions only
    r = merge(out, [big])
    assert r.exchanges_added == 6000 - partial and r.sessions_present == partial // 3
    assert sorted(snapshot(out)[6000:]) == sorted(snapshot(clean)[6000:])  # the same replay index
    assert sorted(x[1:] for x in snapshot(out)[:6000]) == sorted(x[1:] for x in snapshot(clean)[:6000])


def test_shards_analyzed_and_graded_together_match_their_merge(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        exe = str(Path(sys.executable).with_name(args[0]))
        r = subprocess.run([exe, *args[1:]], capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        return r

    common = ["--tasks", "3", "-R", "2", "-j", "2", "--bootstrap", "200", "--seed", "2"]  # 6 runs a shard
    run("nfladder", "run", *common, "--conditions", "live", "--out", "a")
    run("nfladder", "run", *common, "--conditions", "t0", "--out", "b")
    shards = [str(tmp_path / "a" / "log.lmdb"), str(tmp_path / "b" / "log.lmdb")]
    apart = json.loads(run("nfanalyze", *shards, "--json", "-", "--bootstrap", "200").stdout)
    merge(tmp_path / "m.lmdb", [Path(x) for x in shards])  # the same as `nfproxy merge`, tested above, in process
    merged = json.loads(run("nfanalyze", "m.lmdb", "--json", "-", "--bootstrap", "200").stdout)
    assert set(apart["conditions"]) == {"live", "t0"}
    assert apart["conditions"] == merged["conditions"] and apart["contrasts"] == merged["contrasts"]
    assert apart["log"]["conditions"] == merged["log"]["conditions"]
    run("nfverify", "humaneval+", *shards, "--dataset", "a/suite.jsonl.gz", "--outcomes", "again.jsonl",
        "--isolation", "process")
    key = lambda r: (r["condition"], r["task_id"], r["replicate"], r["outcome"])  # noqa: E731
    regraded = sorted(key(json.loads(x)) for x in (tmp_path / "again.jsonl").read_text().splitlines())
    ladder = sorted(key(json.loads(x)) for d in ("a", "b") for x in (tmp_path / d / "outcomes.jsonl").read_text().splitlines())
    assert regraded == ladder and len(regraded) == 12


def test_a_row_graded_differently_in_two_shards_is_refused_by_merge_and_by_nfanalyze(tmp_path):
    paths = []
    for name, outcome in (("x", 1), ("y", 0)):
        path = tmp_path / f"{name}.lmdb"
        with Store.open(path, write=True, create=True) as s:
            s.outcomes.put([{"task_id": "T1", "condition": "live", "replicate": 0, "outcome": outcome}])
        paths.append(path)
    with pytest.raises(NoisefloorError, match=r"\('live', 'T1', 0\) is in .* with different grades"):
        merge(tmp_path / "m.lmdb", paths)
    with Store.open(tmp_path / "m.lmdb", write=False) as s:
        assert s.outcome_rows() == []  # refused before anything was written
    nfanalyze = str(Path(sys.executable).with_name("nfanalyze"))
    r = subprocess.run([nfanalyze, *map(str, paths)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 5 and r.stderr.count("\n") == 1 and "with different grades" in r.stderr


def _index_rows(path: Path) -> dict[tuple[str, int], set[bytes]]:
    """(session, seq) -> that exchange's replay-index rows (lookup keys; its bucket and sketch), its
    id taken out (ids differ after merge)."""
    from noisefloor.proxy.store import replay_index

    with Store.open(path, write=False) as s:
        where = {e.id: (e.session, e.seq) for e in s.index.entries()}
        rows: dict[tuple[str, int], set[bytes]] = {}
        for k, v in s.tables.rows("lookups"):  # the raw table: what merge must carry is the rows themselves
            rows.setdefault(where[int.from_bytes(v, "big")], set()).add(k)
        for k, raw in s.tables.rows("recorded"):
            bucket, sketch = replay_index.entry_sketch(raw, s.index.route_of) or (b"", b"")
            rows[where[int.from_bytes(k, "big")]].add(b"g" + bucket + sketch)
        return rows


def test_merge_carries_the_miss_index_and_accepts_the_earlier_rules_id(tmp_path):
    from noisefloor.proxy.record.recorder import Recorder
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.labels import Labels
    from noisefloor.proxy.request.traffic import RequestData, ResponseData

    legacy = Rules().legacy_ids
    assert legacy, "these rules have an earlier id scheme"
    paths = [tmp_path / "a.lmdb", tmp_path / "b.lmdb"]
    for n, p in enumerate(paths):
        with Store.open(p, write=True, create=True) as s:
            rec = Recorder(s, Rules())
            for i in range(6):
                body = json.dumps({"model": "m" if i % 2 else "other", "messages": [
                    {"role": "system", "content": SHARED}, {"role": "user", "content": f"shard {n} question {i} " * 9}]})
                req = RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions", (),
                                  body.encode())
                rec.finish(rec.begin(req, Labels(f"s{n}-{i // 2}")), ResponseData(200, (), b'{"text": "ok"}'))
    with Store.open(paths[1], write=True) as s:  # recorded before today's id scheme: same keys, older id
        s.set_meta("rules_id", legacy[0])
    out = tmp_path / "out.lmdb"
    assert merge(out, paths).exchanges_added == 12
    with Store.open(out, write=False) as s:
        assert s.meta("rules_id") == Rules().id
    merged, sources = _index_rows(out), {**_index_rows(paths[0]), **_index_rows(paths[1])}
    assert merged == sources and len(merged) == 12
    assert all(sum(r[:1] == b"n" for r in rows) == 16 and any(r[:1] == b"b" for r in rows) for rows in merged.values())
    other = tmp_path / "c.lmdb"
    shutil.copytree(paths[0], other)
    with Store.open(other, write=True) as s:
        s.set_meta("rules_id", "0123456789abcdef")
    with pytest.raises(StoreError, match="normalization rules 0123456789abcdef"):
        merge(tmp_path / "refused.lmdb", [paths[0], other])


def _forge_body(path: Path, key: bytes | None = None, under: bytes | None = None) -> bytes:
    """Rewrite one body of the store at `path` (`key`; None: the first compressed one) as other
    content under the same digest, in the store's own framing (a frame that decodes), as a hostile
    shard's author would; with `under`, add it as a body no exchange names, under that digest.
    Returns the digest."""
    import zstandard

    from noisefloor.proxy.store._codec import FRAME

    forged = bytes([FRAME]) + zstandard.ZstdCompressor().compress(b'{"forged": "other content"}')
    env = lmdb.open(str(path), max_dbs=16)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"bodies", txn=txn)
            key = under or key or next(k for k, v in txn.cursor(db=db) if v[:1] == bytes([FRAME]))
            txn.put(key, forged, db=db)
    finally:
        env.close()
    return key


def _body_keys(path: Path) -> set[bytes]:
    with Store.open(path, write=False) as s:
        return {k for k, _ in s.tables.rows("bodies")}


def _merge(out: Path, *paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([NFPROXY, "merge", str(out), *map(str, paths)], capture_output=True, text=True, timeout=120)


def test_a_body_forged_under_a_good_digest_is_refused_in_either_order(tmp_path, shards):
    """A shard holding another content under the digest of a body the other shard shares, with a
    valid CRC: merged first it used to win, and the good shard's exchanges read as damaged in OUT.
    Refused by name, whatever the order, into a fresh OUT (which is then not made) or a used one
    (left byte-identical); a forged body that no exchange names, too."""
    shared = _body_keys(shards[0]) & _body_keys(shards[1])
    assert len(shared) == 1
    forged = tmp_path / "forged.lmdb"
    shutil.copytree(shards[1], forged)
    _forge_body(forged, next(iter(shared)))
    for order in ([forged, shards[0]], [shards[0], forged]):
        out = tmp_path / f"fresh-{len(list(tmp_path.iterdir()))}.lmdb"
        r = _merge(out, *order)
        assert r.returncode == 5 and f"{forged}" in r.stderr and "does not match its sha256" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not out.exists()
    used = tmp_path / "used.lmdb"
    assert _merge(used, shards[0]).returncode == 0
    before = {p.name: p.read_bytes() for p in used.iterdir() if p.name != "lock.mdb"}
    r = _merge(used, forged)
    assert r.returncode == 5 and f"{forged}" in r.stderr and "does not match its sha256" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in used.iterdir() if p.name != "lock.mdb"} == before
    orphan = tmp_path / "orphan.lmdb"
    shutil.copytree(shards[1], orphan)
    _forge_body(orphan, under=next(iter(_body_keys(shards[0]) - shared)))  # named by no exchange of its own
    out = tmp_path / "fresh-orphan.lmdb"
    r = _merge(out, orphan, shards[0])
    assert r.returncode == 5 and f"{orphan}" in r.stderr and "does not match its sha256" in r.stderr, r.stderr
    assert not out.exists()  # refused before OUT was made


def test_a_dictionary_forged_under_another_ones_key_is_refused_before_writing(tmp_path, shards):
    """A shard's compression dictionary stored under an id its header does not carry (it would win
    that id in a fresh OUT, and another shard's bodies compressed with the real one would not decode)."""
    forged = tmp_path / "forged.lmdb"
    shutil.copytree(shards[1], forged)
    env = lmdb.open(str(forged), max_dbs=16)
    try:
        with env.begin(write=True) as txn:  # a zstd dictionary's magic and id (7) in front
            planted = bytes.fromhex("37a430ec") + (7).to_bytes(4, "little") + b"another dictionary"
            txn.put((8).to_bytes(4, "big"), planted, db=env.open_db(b"dicts", txn=txn))
    finally:
        env.close()
    out = tmp_path / "fresh.lmdb"
    r = _merge(out, forged, shards[0])
    assert r.returncode == 5 and f"{forged}" in r.stderr and "dictionary" in r.stderr, r.stderr
    assert not out.exists()  # refused before OUT was made
