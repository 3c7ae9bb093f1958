"""Nothing unverified is ever served or used: a store damaged from outside (a body whose bytes do
not match their hash, a body gone, a zstd bomb planted as a body, a record that is not an exchange
record) is, in a strict replay, an error answer and exit 3, and in every other command one line
naming the store and the exchange. Real nfproxy processes, a real aiohttp upstream, real LMDB."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
import zstandard

from noisefloor.proxy.store import _codec as codec
from tests import loopback
from tests.conftest import SHARED_DATA, START_TIMEOUT, nfproxy_argv
from tests.fake_upstream import FakeUpstream

QUESTIONS = 4


def chat(i: int) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"question {i}: what is {i} + {i}?"}]}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """One store of QUESTIONS exchanges, recorded through a real nfproxy."""
    from noisefloor.proxy.launch import start

    store = tmp_path_factory.mktemp("verified") / "log.lmdb"
    up = FakeUpstream().start()
    try:
        rec = start("--mode", "record", "--store", str(store), "--upstream", up.url, timeout=START_TIMEOUT)
        try:
            for i in range(QUESTIONS):
                assert loopback.post(rec.url + "/v1/chat/completions", json=chat(i), timeout=20,
                                  headers={"x-nf-task": "multiple_0"}).status_code == 200  # graded by nfverify
        finally:
            assert rec.stop() == 0
    finally:
        up.stop()
    return store


def _record(env: lmdb.Environment, exchange_id: int) -> dict:
    with env.begin() as txn:
        raw = txn.get(struct.pack(">Q", exchange_id), db=env.open_db(b"exchanges", txn=txn))
        return json.loads(codec.Codec(lambda k: txn.get(k, db=env.open_db(b"dicts", txn=txn))).decode(raw, 1 << 24))


@functools.cache
def _zeros_frame(sized: bool) -> bytes:
    """A zstd frame of 1 GiB of zeros (with its size declared, or not), compressed from 64 MiB pieces
    once per process: compressing the GiB whole cost 1.5 CPU-s at each damage."""
    chunk = b"\0" * (64 << 20)
    cobj = zstandard.ZstdCompressor(level=1).compressobj(**({"size": 1 << 30} if sized else {}))
    return b"".join(cobj.compress(chunk) for _ in range(16)) + cobj.flush()


def damage(store: Path, how: str, exchange_id: int = 2) -> None:
    """Change the store from outside, as a careless tool or an attacker could."""
    env = lmdb.open(str(store), max_dbs=8)
    try:
        original = _record(env, exchange_id)
        digest = bytes.fromhex(original["response"]["body"])
        with env.begin(write=True) as txn:
            bodies = env.open_db(b"bodies", txn=txn)
            if how == "tampered":  # other bytes under the same hash
                txn.put(digest, codec.Codec(lambda k: None).encode(b'{"choices": [{"message": {"content": "forged"}}]}'
                                                                  + b" " * 40), db=bodies)
            elif how == "missing":
                assert txn.delete(digest, db=bodies)
            elif how == "bomb":  # 1 GiB of zeros in about 32 kB, as a tagged and as a legacy (v1) frame
                txn.put(digest, bytes([codec.FRAME]) + _zeros_frame(sized=True), db=bodies)
            elif how == "bomb-unsized":  # no declared size: only a bounded stream read stops it
                txn.put(digest, _zeros_frame(sized=False), db=bodies)
            elif how == "wrong-type":  # valid JSON, not an exchange record
                doc = {**original, "request": "POST /v1/chat/completions", "response": [200]}
                txn.put(struct.pack(">Q", exchange_id), codec.Codec(lambda k: None).encode(json.dumps(doc).encode()),
                        db=env.open_db(b"exchanges", txn=txn))
            else:
                raise AssertionError(how)
    finally:
        env.close()


def _copy(recorded: Path, tmp_path: Path, how: str, exchange_id: int = 2) -> Path:
    store = tmp_path / f"log-{exchange_id}.lmdb"
    shutil.copytree(recorded, store)
    damage(store, how, exchange_id)
    return store


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("how", ["tampered", "missing", "bomb", "bomb-unsized", "wrong-type"])
def test_a_damaged_exchange_is_never_served_and_fails_the_strict_replay(recorded, tmp_path, how, proxies):
    from noisefloor.proxy.launch import start

    store = _copy(recorded, tmp_path, how)
    rep = start("--mode", "replay", "--strict", "--store", str(store), timeout=START_TIMEOUT)
    proxies.append(rep)
    answers = [loopback.post(rep.url + "/v1/chat/completions", json=chat(i), timeout=30) for i in range(QUESTIONS)]
    damaged = answers[1]  # exchange 2 is question 1
    assert damaged.status_code == 500 and damaged.headers["x-nf-replay"] == "error", (damaged.status_code,
                                                                                        damaged.text[:300])
    assert "forged" not in damaged.text and str(store) in damaged.json()["error"]["message"]
    assert [a.status_code for i, a in enumerate(answers) if i != 1] == [200] * (QUESTIONS - 1)  # the others hit
    peak = _peak_rss_mb(rep.proc.pid)
    assert peak < 1024, f"replay peaked at {peak:.0f} MB"
    assert rep.stop() == 3
    (summary,) = [line for line in rep.output.splitlines() if line.startswith("nfproxy replay: ")]
    assert "1 errors" in summary, rep.output[-500:]


def _one_line(r: subprocess.CompletedProcess[str], store: Path, exchange_id: int = 2) -> str:
    assert r.returncode not in (0, -7, 135), (r.returncode, r.stdout[-300:], r.stderr[-500:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("nfproxy merge: ")]
    assert len(lines) == 1, r.stderr
    assert str(store) in lines[0] and f"exchange {exchange_id}" in lines[0], lines[0]
    return lines[0]


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.mark.parametrize("how", ["tampered", "missing", "bomb", "wrong-type"])
def test_every_other_command_says_it_in_one_line_naming_store_and_exchange(recorded, tmp_path, how):
    store = _copy(recorded, tmp_path, how)
    run = lambda *argv: subprocess.run(list(argv), capture_output=True, text=True, timeout=120)  # noqa: E731
    line = _one_line(run(*nfproxy_argv(), "show", "2", "--store", str(store)), store)
    assert ("sha256" in line) if how == "tampered" else True
    _one_line(run(*nfproxy_argv(), "merge", str(tmp_path / "out.lmdb"), str(store)), store)
    assert not (tmp_path / "out.lmdb" / "data.mdb").exists() or _count(tmp_path / "out.lmdb") == 0
    if (SHARED_DATA / "bfcl").is_dir():  # nfverify grades a session's final answer
        final = _copy(recorded, tmp_path, how, QUESTIONS)
        _one_line(run(_bin("nfverify"), "bfcl", str(final), "--outcomes", str(tmp_path / "o.jsonl")), final, QUESTIONS)
    if how == "wrong-type":  # the listing readers read records, not bodies
        line = _one_line(run(*nfproxy_argv(), "log", "--store", str(store)), store)
        assert "got `str` - at `$.request`" in line, line
        _one_line(run(*nfproxy_argv(), "log", "--json", "--store", str(store)), store)
        _one_line(run(_bin("nfanalyze"), str(store)), store)


def _count(store: Path) -> int:
    from noisefloor.proxy.store.log import Store

    with Store.open(store, write=False) as s:
        return len(s)


def test_a_body_is_verified_and_bounded_in_the_library_too(recorded, tmp_path):
    from noisefloor.proxy.store.log import Store, StoreError

    store = _copy(recorded, tmp_path, "bomb")
    with Store.open(store, write=False) as s:
        ex = s.exchange(2)
        with pytest.raises(StoreError, match=r"exchange 2 response body .* decompresses past its recorded size"):
            s.bodies.of_part(ex.response, ex.id, "response")
        with pytest.raises(StoreError, match="decompresses past --max-body-mb 64"):
            s.bodies.get(ex.response["body"])  # no recorded size given: the store's bound
        good = s.exchange(1)
        data = s.bodies.of_part(good.response, good.id, "response")
        assert hashlib.sha256(data).hexdigest() == good.response["body"]


def test_an_id_no_store_can_hold_is_absent_not_damage(recorded):
    """An id below 0 or past 8 bytes (typed by a user, or in nfview's URL) names no exchange: the
    store is not called damaged, `show` says there is no such exchange and nfview answers 404."""
    from noisefloor.proxy.store.log import Store

    huge = 10 ** 30
    with Store.open(recorded, write=False) as s:
        assert s.exchange(-1) is None and s.exchange(huge) is None and s.exchange(1 << 64) is None
        assert list(s.exchanges(huge)) == [] and [e.id for e in s.exchanges(-3)][:1] == [1]
        assert list(s.records.texts(huge)) == []
    shown = subprocess.run([*nfproxy_argv(), "show", str(huge), "--store", str(recorded)], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode != 0 and "damaged" not in shown.stderr and str(huge) in shown.stderr, shown.stderr
    proc = subprocess.Popen([sys.executable, "-m", "noisefloor.viewer.cli", str(recorded), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[1].rstrip("/")
        for target in (f"/api/exchange/{huge}", "/api/exchange/-1"):
            got = loopback.get(url + target)
            assert got.status_code == 404 and "damaged" not in got.text, (target, got.status_code, got.text)
        got = loopback.get(url + f"/api/exchanges?after={huge}")
        assert got.status_code == 200 and got.json()["items"] == [], got.text
    finally:
        proc.terminate()
        proc.wait(10)
