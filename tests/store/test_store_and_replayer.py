"""The store and the replay rules, without a proxy: real LMDB files in a temp folder."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.proxy.record.recorder import Recorder
from noisefloor.proxy.replay.log import DeferredLog
from noisefloor.proxy.replay.replayer import Replayer
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store import env as store_env
from noisefloor.proxy.store._index import Index
from noisefloor.proxy.store.log import Store, StoreError
from tests.conftest import nfproxy_argv


def chat(content: str) -> RequestData:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()
    return RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions", (), body)


def answer(text: str) -> ResponseData:
    return ResponseData(200, (("content-type", "application/json"),), json.dumps({"text": text}).encode())


def record_sequence(path: Path, session: str, calls: list[tuple[str, str]]) -> None:
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for prompt, text in calls:
            p = rec.begin(chat(prompt), Labels(session))
            rec.finish(p, answer(text))


def served(rep: Replayer, prompt: str, session: str) -> tuple[str, str | None]:
    a = rep.answer(chat(prompt), Labels(session))
    body = json.loads(a.response.raw_body)
    return a.result, body.get("text")


def test_happens_before_orders_only_requests_that_did_not_overlap(tmp_path):
    """A and B overlapped when recorded (both asked before either was answered); C came after
    both answers. Replay may ask A and B in any order; C needs both asked first."""
    path = tmp_path / "s.lmdb"
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        pa, pb = rec.begin(chat("a"), Labels("S")), rec.begin(chat("b"), Labels("S"))
        rec.finish(pb, answer("B"))
        rec.finish(pa, answer("A"))
        rec.finish(rec.begin(chat("c"), Labels("S")), answer("C"))
        entries = sorted(s.index.entries(), key=lambda e: e.seq)
        assert all(e.start is not None and e.end is not None and e.start < e.end for e in entries)
    with Store.open(path, write=True) as s:
        content = Replayer(s, Rules())  # c carries neither answer: asked early it is a hit and an order note
        assert served(content, "c", "r0") == ("hit", "C")
        assert content.stats.order_notes == 1 and "asked before exchange" in content.order_notes[0]
        rep = Replayer(s, Rules(), order="recorded")
        assert [served(rep, x, "r1") for x in ("b", "a", "c")] == [("hit", "B"), ("hit", "A"), ("hit", "C")]
        assert served(rep, "a", "r2") == ("hit", "A")
        m = rep.match(chat("c"), Labels("r2"))  # b not asked yet in r2: c must wait for it
        assert rep.blocker(m) is not None and rep.blocker(m).route.endswith("/v1/chat/completions")
        assert rep.settle(m).result == "order_violation"
        late = rep.match(chat("c"), Labels("r3"))
        rep.match(chat("a"), Labels("r3"))
        assert rep.blocker(late) is not None  # still b
        rep.match(chat("b"), Labels("r3"))
        assert rep.blocker(late) is None and rep.settle(late).result == "hit"  # answered once both were asked


def test_occurrences_sessions_and_order(tmp_path):
    path = tmp_path / "s.lmdb"
    record_sequence(path, "A", [("p", "a0"), ("q", "a1"), ("p", "a2")])
    record_sequence(path, "B", [("p", "b0")])
    with Store.open(path, write=True) as s:
        rep = Replayer(s, Rules())
        assert [served(rep, x, "r1") for x in ("p", "q", "p", "p")] == [
            ("hit", "a0"),
            ("hit", "a1"),
            ("hit", "a2"),
            ("hit", "b0"),  # occurrence 3 falls through to the next recorded session
        ]
        assert served(rep, "p", "r1")[0] == "miss"
        assert served(rep, "p", "r2") == ("hit", "a0")  # a new session starts again
        assert rep.stats.hits == 5 and rep.stats.misses == 1
        # A recorded p, q, p: asking q first departs from the recorded order but changes no answer
        assert served(rep, "q", "r3") == ("hit", "a1") and rep.stats.order_notes == 1
        strict_order = Replayer(s, Rules(), order="recorded")
        assert served(strict_order, "q", "r3")[0] == "order_violation"
        only_b = Replayer(s, Rules(), sources=["B"])
        assert served(only_b, "p", "x") == ("hit", "b0")
        assert served(only_b, "p", "x")[0] == "miss"
        reuse = Replayer(s, Rules(), sources=["B"], allow_reuse=True)
        assert [served(reuse, "p", "y") for _ in range(3)] == [("hit", "b0")] * 3
        with pytest.raises(ValueError, match="no recorded session"):
            Replayer(s, Rules(), sources=["nope"])


def test_recording_continues_occurrence_numbering_of_an_existing_session(tmp_path):
    path = tmp_path / "s.lmdb"
    record_sequence(path, "A", [("p", "first")])
    record_sequence(path, "A", [("p", "second")])
    with Store.open(path, write=False) as s:
        assert [(e.occurrence, e.seq) for e in s.index.entries()] == [(0, 0), (1, 1)]


def test_a_recorder_reads_only_the_sessions_that_come_back(tmp_path, monkeypatch):
    """Start-up reads no entries (a million-exchange store opens as fast as an empty one); a session
    that reappears continues its numbering from its own entries, a new one starts at 0, and
    another session whose tag is checked against its entries never lends it numbers."""
    path = tmp_path / "s.lmdb"
    record_sequence(path, "A", [("p", "1"), ("q", "2"), ("p", "3")])
    record_sequence(path, "B", [("p", "1")])
    read: list[str] = []
    monkeypatch.setattr(Index, "entries", lambda self: iter(read.append("all") or ()))
    with Store.open(path, write=True) as s:
        real = s.index.session_ids
        monkeypatch.setattr(s.index, "session_ids", lambda name: read.append(name) or real(name))
        rec = Recorder(s, Rules())
        assert read == []
        for session in ("A", "C", "A", "B"):
            rec.finish(rec.begin(chat("p"), Labels(session)), answer("x"))
        assert read == ["A", "C", "B"]  # once per session, on its first request of this run
    monkeypatch.undo()
    with Store.open(path, write=False) as s:
        got = [(e.session, e.occurrence, e.seq) for e in s.index.entries()][4:]
    assert got == [("A", 2, 3), ("C", 0, 0), ("A", 3, 4), ("B", 1, 1)]


def test_rules_are_bound_to_the_store(tmp_path):
    path = tmp_path / "s.lmdb"
    record_sequence(path, "A", [("p", "x")])
    with Store.open(path, write=True) as s:
        with pytest.raises(StoreError, match="normalization rules"):
            Replayer(s, Rules(ignore_fields=("/model",)))
        with pytest.raises(StoreError, match="--ignore-field"):
            Recorder(s, Rules(ignore_fields=("/model",)))


def test_map_grows_instead_of_failing(tmp_path, monkeypatch):
    monkeypatch.setattr(store_env, "_INITIAL_MAP", 64 * 1024)
    path = tmp_path / "small.lmdb"
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        for i in range(50):
            p = rec.begin(chat(f"prompt {i}"), Labels("A"))
            rec.finish(p, ResponseData(200, (), os.urandom(20_000)))  # incompressible
    data = (path / "data.mdb").stat()
    assert data.st_size >= 1 << 20  # grew from 64 kB
    assert data.st_blocks * 512 >= data.st_size  # every page of the map has its disk blocks (no SIGBUS)
    with Store.open(path, write=False) as s:
        assert len(s) == 50


def test_opening_bad_paths_gives_clear_errors(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        Store.open(a_file, write=True, create=True)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "other.txt").write_text("x")
    with pytest.raises(StoreError, match="non-empty directory"):
        Store.open(busy, write=True, create=True)
    with pytest.raises(StoreError, match="no nfproxy store"):
        Store.open(tmp_path / "absent", write=False)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(b"\0not lmdb" * 100)
    with pytest.raises(StoreError, match="not a readable LMDB store"):
        Store.open(garbage, write=False)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=60)


def test_cli_refuses_bad_stores_with_one_line_and_changes_nothing(tmp_path):
    path = tmp_path / "s.lmdb"
    record_sequence(path, "A", [("p", "x")])
    before = (path / "data.mdb").read_bytes()  # lock.mdb is LMDB's reader table, not data

    r = run_cli("run", "--mode", "replay", "--store", str(path), "--ignore-field", "/model", "--listen", "127.0.0.1:0")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "normalization rules" in err[0] and "--ignore-field" in err[0]

    r = run_cli("run", "--mode", "replay", "--store", str(tmp_path / "none.lmdb"), "--listen", "127.0.0.1:0")
    assert r.returncode != 0 and "record one first" in r.stderr

    r = run_cli("run", "--mode", "record", "--store", str(tmp_path / "s.lmdb" / "data.mdb"))
    assert r.returncode != 0 and "is a file" in r.stderr

    r = run_cli("run", "--listen", "nonsense")
    assert r.returncode != 0 and "HOST:PORT" in r.stderr

    r = run_cli("run", "--ignore-field", "model", "--store", str(tmp_path / "x.lmdb"))
    assert r.returncode != 0 and "must start with '/'" in r.stderr

    os.chmod(path, 0o555)
    os.chmod(path / "data.mdb", 0o444)
    try:
        r = run_cli("run", "--mode", "record", "--store", str(path), "--listen", "127.0.0.1:0")
        assert r.returncode != 0 and "read-only" in r.stderr
    finally:
        os.chmod(path, 0o755)
        os.chmod(path / "data.mdb", 0o644)
    assert (path / "data.mdb").read_bytes() == before


def test_deferred_replay_log_writes_in_batches_on_the_loop_and_on_close(tmp_path):
    record_sequence(tmp_path / "s", "A", [("q1", "a1"), ("q2", "a2")])
    with Store.open(tmp_path / "s", write=True) as s:
        recorded = len(s)
        writer = DeferredLog(s, delay=0.05, max_batch=3)
        rep = Replayer(s, Rules(), log=writer.submit)

        async def serve() -> list[int]:
            seen = []
            for prompt in ("q1", "q2"):
                assert rep.answer(chat(prompt), Labels("R")).result == "hit"
                seen.append(len(s))  # nothing written yet: the answer did not wait for the log
            await asyncio.sleep(0.2)
            seen.append(len(s))  # the timer wrote both in one batch
            for prompt in ("q1", "q2", "q1"):  # the third fills a batch: written at once
                rep.answer(chat(prompt), Labels("R2"))
            seen.append(len(s))
            rep.answer(chat("q2"), Labels("R2"))
            return seen

        assert asyncio.run(serve()) == [recorded, recorded, recorded + 2, recorded + 5]
        writer.close()  # the last one, still pending when the loop ended
        results = [ex.replay_result for ex in s.exchanges() if ex.mode == "replay"]
        assert results == ["hit", "hit", "hit", "hit", "miss", "miss"]


def test_deferred_log_survives_one_bad_record_and_reports_a_broken_store(tmp_path, monkeypatch):
    """A record that cannot be built is that request's loss only; a store that cannot be written
    fails every later submit and the close, never silently."""
    record_sequence(tmp_path / "s", "A", [("q1", "a1")])
    with Store.open(tmp_path / "s", write=True) as s:
        lost: list[Exception] = []
        writer = DeferredLog(s, on_error=lost.append)
        rep = Replayer(s, Rules(), log=writer.submit)
        rep.answer(chat("q1"), Labels("R"))  # no loop: written at once
        assert len(s) == 2

        def broken() -> tuple[dict, dict]:
            raise UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed")

        writer.submit(broken)
        assert [type(e) for e in lost] == [UnicodeEncodeError]
        rep.answer(chat("q1"), Labels("R2"))  # the next request's record is written as usual
        assert len(s) == 3

        def disk_gone(items: list) -> None:
            raise OSError("disk gone")

        monkeypatch.setattr(s, "append_many", disk_gone)
        rep.answer(chat("q1"), Labels("R3"))
        with pytest.raises(StoreError, match="disk gone"):
            rep.answer(chat("q1"), Labels("R4"))
        with pytest.raises(StoreError, match="disk gone"):
            writer.close()


def test_the_minhash_pairs_are_the_seeded_draw_every_stored_sketch_was_made_with():
    import numpy as np

    from noisefloor.proxy.store import replay_index as ri

    rng = np.random.default_rng(20261201)
    assert ri._A == tuple(rng.integers(1, ri._PRIME, ri._HASHES, dtype=np.uint64).tolist())
    assert ri._B == tuple(rng.integers(0, ri._PRIME, ri._HASHES, dtype=np.uint64).tolist())


@pytest.mark.parametrize("n", [1, 7, 16, 17, 300])
def test_a_signature_is_the_minhash_in_python_for_few_features_and_in_numpy_for_many(n):
    """Both sides of `SMALL` give numpy's exact uint64 values (a sketch read by another process must match)."""
    import random

    import numpy as np

    from noisefloor.proxy.store import replay_index as ri

    feats = random.Random(n).sample(range(1 << 32), n)
    a, b, x = (np.array(v, dtype=np.uint64) for v in (ri._A, ri._B, feats))
    want = ((a[:, None] * x[None, :] + b[:, None]) % ri._PRIME).min(axis=1)
    assert ri._signature(feats) == ri._signature_python(feats) == ri._signature_numpy(feats) == tuple(want.tolist())
    others = [ri.short(s) for s in (want.astype("<u4").tobytes(), ri._SIG.pack(*want[::-1].tolist()),
                                    bytes(4 * ri._HASHES))]  # as stored: 16 bits a minimum
    expected = [float((np.frombuffer(o, dtype="<u2") == (want & 0xFFFF)).mean()) for o in others]
    assert ri.agreement(want.astype("<u4").tobytes(), others) == pytest.approx(expected, abs=0)  # numpy loaded
    numpy = sys.modules.pop("numpy")
    try:  # the plain-Python count, as a process without numpy makes it
        assert ri.agreement(want.astype("<u4").tobytes(), others) == pytest.approx(expected, abs=0)
    finally:
        sys.modules["numpy"] = numpy
