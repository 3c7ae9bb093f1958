"""The record path's work done ahead or after the answer (round 6): a request body compressed while
the upstream works, dependency marks registered once the answer is out, header erasure remembered
per value. Each must leave the store as it was without it: real nfproxy processes on loopback, a
real aiohttp upstream, real LMDB stores, concurrent clients."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import signal
from dataclasses import replace
from pathlib import Path

import httpx

from noisefloor.proxy.record.recorder import Recorder, Writer
from noisefloor.proxy.request import secrets
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store import _codec as codec
from noisefloor.proxy.store import _dicts as store_dicts
from noisefloor.proxy.store import replay_index
from noisefloor.proxy.store.log import Store
from tests.conftest import start_nfproxy

SYSTEM = "You are a careful assistant. " * 20


async def _conversation(client: httpx.AsyncClient, url: str, i: int, turns: int, rng: random.Random) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"conversation {i} begins"}]
    pause = [rng.uniform(0, 0.02) for _ in range(turns)]
    for t in range(turns):
        await asyncio.sleep(pause[t])
        r = await client.post(url + "/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": messages})
        assert r.status_code == 200, r.text
        answer = r.json()["choices"][0]["message"]["content"]
        messages = [*messages, {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"conversation {i} turn {t + 1}"}]


async def _talk(url: str, n: int, turns: int) -> None:
    rng = random.Random(7)
    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(_conversation(client, url, i, turns, rng) for i in range(n)))


def test_concurrent_conversations_record_each_turn_depending_on_its_own_earlier_answers(store, upstream, proxies):
    """Each turn carries every earlier answer of its own conversation, sent the moment the answer
    arrived, while other conversations of the session are answered in between: its recorded
    dependencies are exactly its conversation's earlier turns, none of another's (the marks are
    registered after the answer is released, and before any later request is keyed)."""
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, "--session", "s")
    proxies.append(rec)
    asyncio.run(_talk(rec.url, n=6, turns=4))
    rec.stop(signal.SIGKILL)  # every answered exchange's row was committed before its answer went out
    with Store.open(store, write=True) as s:
        Writer(s).finish_unwritten()  # what `nfproxy repair` does with the rows the kill left
    with Store.open(store, write=False) as s:
        entries = {e.seq: e for e in s.index.entries()}
        turns: dict[int, list[int]] = {}
        for ex in s.exchanges():
            doc = json.loads(s.bodies.get(ex.request["body"]) or b"{}")
            if "messages" in doc:
                turns.setdefault(int(doc["messages"][1]["content"].split()[1]), []).append(ex.seq)
    assert sorted(map(len, turns.values())) == [4] * 6
    for seqs in turns.values():
        for t, seq in enumerate(sorted(seqs)):
            assert entries[seq].deps == tuple(sorted(seqs)[:t]), (seq, entries[seq].deps, seqs)


def _chat(text: str) -> RequestData:
    body = json.dumps({"model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                                  {"role": "user", "content": text}]}).encode()
    return RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions",
                       (("content-type", "application/json"),), body)


def _answer(text: str) -> ResponseData:
    doc = {"choices": [{"message": {"role": "assistant", "content": f"answer to {text} " * 10}}]}
    return ResponseData(200, (("content-type", "application/json"),), json.dumps(doc).encode())


def _record_overlapping(path: Path, prepare: bool = True) -> list[tuple[bytes, bytes]]:
    """One session's requests begun before the previous one finished (its chain link changes
    between the compressor's preparation and the body's write), and some that do not overlap."""
    with Store.open(path, write=True, create=True) as s:
        if not prepare:
            s.ahead.prepare_chain = lambda *a: None  # type: ignore[method-assign]
        rec = Recorder(s, Rules())
        texts = [f"question {i}" for i in range(12)]
        waiting = []
        for i, text in enumerate(texts):
            waiting.append((rec.begin(_chat(text), Labels("a" if i % 3 else "b")), text))
            if i % 2:  # two at a time: the second was compressed ahead against a link the first replaces
                for p, t in waiting:
                    rec.finish(p, _answer(t))
                waiting = []
        with s.tables.env.begin(db=s.tables.db["bodies"]) as txn:
            return list(txn.cursor())


def test_a_body_compressed_with_a_prepared_compressor_is_stored_as_without_one(tmp_path, monkeypatch):
    """With the compressor made after the session's last exchange (round 7) or not: the bodies
    table is the same byte for byte, and the prepared compressors were used."""
    warmed: set[int] = set()
    used: list[int] = []
    made, encode = codec.Against.warmed, codec.Against.encode
    monkeypatch.setattr(codec.Against, "warmed", lambda self: warmed.add(id(self)) or made(self))
    monkeypatch.setattr(codec.Against, "encode", lambda self, data: used.append(id(self)) or encode(self, data))
    prepared = _record_overlapping(tmp_path / "prepared.lmdb")
    assert warmed and len([u for u in used if u in warmed]) >= 4
    assert prepared == _record_overlapping(tmp_path / "plain.lmdb", prepare=False)


class _AtOnce:
    """A thread that has run its target by the time `start` returns."""

    def __init__(self, target, **_: object) -> None:
        self.target = target

    def start(self) -> None:
        self.target()

    def is_alive(self) -> bool:
        return False

    def join(self) -> None:
        pass


def test_work_left_for_after_the_answer_leaves_the_store_as_doing_it_in_the_write(tmp_path, monkeypatch):
    """Dictionary samples and next-request compressors left for `catch_up` (round 7): the same
    dictionaries are trained from the same samples, and every table holds the same bytes (the
    training made synchronous: in a thread, which write first uses a dictionary depends on timing;
    and their ids, drawn at random, fixed)."""
    monkeypatch.setattr(store_dicts, "TRAIN_AFTER", 120)
    monkeypatch.setattr(codec.secrets, "randbelow", lambda n: 4242)
    monkeypatch.setattr(store_dicts.threading, "Thread", _AtOnce)

    def record(path: Path, later: bool) -> tuple[object, dict[str, list[tuple[bytes, bytes]]]]:
        with Store.open(path, write=True, create=True) as s:
            if not later:
                s.append = lambda *a, later=False, **k: Store.append(s, *a, **k)  # type: ignore[method-assign]
            rec = Recorder(s, Rules())
            for i in range(150):
                p = rec.begin(replace(_chat(f"question {i}"), arrived=500.0 + i), Labels(f"s{i % 4}"))
                rec.finish(p, _answer(f"question {i}"), defer_tracking=True, end=1000.0 + i)
                rec.track_answers()
        with Store.open(path, write=False) as s, s.tables.env.begin() as txn:
            return s.meta("dicts"), {t: list(txn.cursor(db=s.tables.db[t]))
                                     for t in ("bodies", "exchanges", "heads", "lookups", "recorded")}

    dicts, tables = record(tmp_path / "later.lmdb", True)
    assert set(dicts) == {"body", "record"}  # type: ignore[arg-type]
    assert (dicts, tables) == record(tmp_path / "now.lmdb", False)


def test_a_warmed_compressor_writes_the_bytes_a_fresh_one_writes():
    """Its set-up frame leaves no state behind: sizes across zstd's parameter tiers."""
    refs = [(bytes(32), SYSTEM.encode()), (b"\x01" * 32, b'{"choices": []}' * 40)]
    for size in (30, 700, 20_000, 300_000):
        data = (SYSTEM + "x" * size)[:size].encode()
        assert codec.Against(refs).warmed().encode(data) == codec.Against(refs).encode(data)


def test_remembered_header_erasure_still_erases_each_requests_own_secret():
    """The same header text is erased for the secrets of the request it came with, not those of
    the request that first had it erased."""
    one, two = secrets.secret_values("http://x/", [("authorization", "Bearer sk-first-key-0000000001")]), \
        secrets.secret_values("http://x/", [("authorization", "Bearer sk-second-key-000000002")])
    echoed = (("x-echo", "seen sk-first-key-0000000001 and sk-second-key-000000002"),)
    first = dict(secrets.erase_header_values(echoed, one))["x-echo"]
    assert "sk-first-key" not in first and "sk-second-key-000000002" in first
    second = dict(secrets.erase_header_values(echoed, two))["x-echo"]
    assert "sk-second-key" not in second and "sk-first-key-0000000001" in second
    assert secrets.erase_header_values(echoed, secrets.secret_values("http://x/", [])) is echoed


def test_a_cookie_the_upstream_echoes_is_erased_from_every_exchange_not_only_the_first(store, upstream, proxies):
    """The fake upstream sets a cookie the client then sends with each request and the upstream
    sets again with each answer: no stored exchange holds it, however many repeat it."""
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    with httpx.Client(timeout=30) as client:
        for i in range(8):
            r = client.post(rec.url + "/v1/chat/completions", json={"model": "gpt-4o-mini",
                                                                    "messages": [{"role": "user", "content": f"q{i}"}]})
            assert r.status_code == 200
    assert rec.stop() == 0
    with Store.open(store, write=False) as s:
        texts = [ex.json_bytes().decode() for ex in s.exchanges()]
    assert len(texts) == 8
    assert sum("cookie" in t.lower() for t in texts) >= 7  # the header is there, its value is not
    assert not [t for t in texts if "cookie-secret" in t]


def test_bands_hashed_from_the_buckets_state_are_the_one_shot_hashes():
    """`replay_index.bands` continues one hash of the bucket for each band (round 7): every band
    is still blake2b-64 of bucket + band number + its two minima, as stored lookups name it."""
    rng = random.Random(3)
    for _ in range(50):
        buck, sig = rng.randbytes(8), rng.randbytes(128)
        assert replay_index.bands(buck, sig) == tuple(
            hashlib.blake2b(buck + bytes([i]) + sig[8 * i:8 * i + 8], digest_size=8).digest() for i in range(16))


def test_a_request_asked_again_is_stored_with_the_sketch_computed_afresh(tmp_path, monkeypatch):
    """The recorder remembers recent requests' sketches by key and stored body: requests asked
    again (the same bytes, and the same fields in another order, which the key does not tell
    apart) leave every table as computing each sketch afresh does, and the remembered ones were
    used."""
    from noisefloor.proxy.record import recorder as recorder_mod

    def variants(i: int) -> RequestData:
        # more leaves than a sketch takes (the first 2048, in the body's order)
        doc = {"a": list(range(1500)), "model": "m", "messages": [{"role": "user", "content": f"question {i % 5}"}],
               "temperature": 0.5, "z": list(range(1500, 3000))}
        if i % 3 == 0:  # the same canonical form (and key), its fields in another order: another sketch
            doc = dict(reversed(list(doc.items())))
        return replace(_chat(""), raw_body=json.dumps(doc).encode(), arrived=500.0 + i)

    computed: list[int] = []
    sketch = replay_index.sketch
    monkeypatch.setattr(replay_index, "sketch", lambda c, route: computed.append(1) or sketch(c, route))

    def record(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
        with Store.open(path, write=True, create=True) as s:
            rec = Recorder(s, Rules())
            for i in range(40):
                p = rec.begin(variants(i), Labels(f"s{i % 2}"))
                rec.finish(p, _answer(f"q{i}"), defer_tracking=True, end=1000.0 + i)
                rec.track_answers()
        with Store.open(path, write=False) as s, s.tables.env.begin() as txn:
            return {t: list(txn.cursor(db=s.tables.db[t])) for t in ("exchanges", "heads", "lookups", "recorded")}

    remembered = record(tmp_path / "remembered.lmdb")
    assert len(computed) == 10  # 5 questions x 2 byte orders
    monkeypatch.setattr(recorder_mod, "_SKETCHES", 0)
    computed.clear()
    assert record(tmp_path / "afresh.lmdb") == remembered and len(computed) == 40
