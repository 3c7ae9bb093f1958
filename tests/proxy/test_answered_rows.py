"""Answered rows: a recording proxy commits each answer's row before releasing it and writes the
exchange in full right after (`proxy/record/answered_rows.py`). The full write must store what a
synchronous one stores; a row a killed proxy left must be written by `nfproxy repair` (or the next
recorder, compact, or merge into it) and refused, by name, where it would be missed or is damaged."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest

from noisefloor.proxy.record import answered_rows
from noisefloor.proxy.record.recorder import Recorder, Writer
from noisefloor.proxy.request.keys import Rules
from noisefloor.proxy.request.labels import Labels
from noisefloor.proxy.request.traffic import RequestData, ResponseData
from noisefloor.proxy.store.log import Store, StoreError
from tests.conftest import start_nfproxy

SECRET = "sk-answeredrowsecret0123456789abcdef"
COOKIE = "sid=answeredrowcookie77"  # a secret header's value: the record keeps its name only
TABLES = ("bodies", "exchanges", "heads", "lookups", "recorded")


def _chat(i: int) -> RequestData:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": f"question {i} " * 30}]}).encode()
    return RequestData("POST", "http://up/v1/chat/completions", "up", "/v1/chat/completions",
                       (("content-type", "application/json"), ("authorization", f"Bearer {SECRET}")), body,
                       arrived=100.0 + i)


def _answer(i: int) -> ResponseData:
    doc = {"model": "m-1", "choices": [{"message": {"role": "assistant", "content": f"answer {i} " * 20},
                                        "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 9, "completion_tokens": 7}, "echo": f"you sent {SECRET}"}
    return ResponseData(200, (("content-type", "application/json"), ("x-echo", SECRET), ("set-cookie", COOKIE)),
                        json.dumps(doc).encode())


def _record(path: Path, deferred: bool, n: int = 12, drain: bool = True) -> None:
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        if not drain:  # all in flight at once, all answered, none written in full: then the kill
            begun = [rec.begin(_chat(i), Labels(f"s{i % 3}", task=f"t{i % 4}")) for i in range(n)]
            for i, p in enumerate(begun):
                rec.finish(p, _answer(i), latency_ms=5.0, end=200.0 + i, defer_tracking=True)
            rec._unwritten.clear()  # what the killed process held in memory
            return
        for i in range(n):
            p = rec.begin(_chat(i), Labels(f"s{i % 3}", task=f"t{i % 4}"))
            rec.finish(p, _answer(i), latency_ms=5.0, end=200.0 + i, defer_tracking=deferred)
            if deferred:
                rec.track_answers()


def _tables(path: Path) -> dict[str, list[tuple[bytes, bytes]]]:
    with Store.open(path, write=False) as s, s.tables.env.begin() as txn:
        return {t: list(txn.cursor(db=s.tables.db[t])) for t in TABLES}


def _log_json(path: Path) -> list[dict]:
    with Store.open(path, write=False) as s:
        return [s.exchange(i).to_json() for i in range(1, len(s) + 1)]


def test_the_write_after_the_release_stores_what_the_write_before_it_stores(tmp_path):
    """Every table byte for byte, and no answered row is left once the exchanges are written."""
    _record(tmp_path / "after.lmdb", deferred=True)
    _record(tmp_path / "before.lmdb", deferred=False)
    assert _tables(tmp_path / "after.lmdb") == _tables(tmp_path / "before.lmdb")
    with Store.open(tmp_path / "after.lmdb", write=False) as s:
        assert s.answered.rows() == [] and s.answered.unfinished() == 0 and len(s) == 12


def test_rows_left_by_a_kill_are_refused_by_replay_and_written_by_repair(tmp_path):
    """The kill is the recorder closed with its rows still queued (what SIGKILL after the release
    leaves): replay and merge refuse the store by name; `nfproxy repair` writes the exchanges, which
    then read, replay and are indexed as the synchronous recorder's are, byte for byte (the
    nearest-request sketch rebuilt from the stored request)."""
    killed, whole = tmp_path / "killed.lmdb", tmp_path / "whole.lmdb"
    _record(killed, deferred=True, drain=False)
    _record(whole, deferred=False)
    with Store.open(killed, write=False) as s:
        assert len(s) == 0 and s.answered.unfinished() == 12
        raw = (killed / "data.mdb").read_bytes()
        assert SECRET.encode() not in raw and COOKIE.encode() not in raw  # erased before the row was kept
    for args in (["--mode", "replay", "--store", str(killed)], ["merge", str(tmp_path / "out.lmdb"), str(killed)]):
        out = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", *args], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode != 0 and "12 answered exchanges that a killed nfproxy did not finish writing" in \
            out.stderr and f"nfproxy repair {killed}" in out.stderr, out.stderr
        assert len([line for line in out.stderr.splitlines() if "answered exchanges" in line]) == 1, out.stderr
    out = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "log", "--store", str(killed), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "" and "12 answered exchanges" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "repair", "--store", str(killed)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "12 answered exchanges written" in out.stdout, out.stderr
    assert _log_json(killed) == _log_json(whole)
    got = _tables(killed)
    assert got == _tables(whole)
    assert len(got["lookups"]) >= 12 * 16  # each request's 16 bands among them: its sketch was rebuilt
    with Store.open(killed, write=False) as s:
        assert s.answered.unfinished() == 0 and s.answered.rows() == []


def test_a_recorder_opening_the_store_writes_a_killed_ones_rows_before_numbering_its_own(tmp_path):
    path = tmp_path / "s.lmdb"
    _record(path, deferred=True, n=5, drain=False)
    with Store.open(path, write=True) as s:
        rec = Recorder(s, Rules())
        assert len(s) == 5 and s.answered.unfinished() == 0 and rec.stats.exchanges == 0
        p = rec.begin(_chat(0), Labels("s0", task="t0"))  # asked again: its occurrence follows the written one
        assert p.prepared.occurrence == 1
        rec.finish(p, _answer(0))
        assert len(s) == 6


def test_a_damaged_row_is_refused_by_name_and_nothing_is_written(tmp_path):
    path = tmp_path / "s.lmdb"
    _record(path, deferred=True, n=3, drain=False)
    with Store.open(path, write=True) as s:
        db = s.answered.table(create=False)
        with s.tables.env.begin(write=True, db=db) as txn:
            k, v = next(iter(txn.cursor()))
            txn.put(k, v[:40] + bytes([v[40] ^ 1]) + v[41:])  # one bit
            k2, v2 = list(txn.cursor())[1]
            body = answered_rows._ENCODER.encode(["not", "an", "answer"])  # a CRC that checks, the wrong fields
            txn.put(k2, bytes([answered_rows.VERSION]) + answered_rows.zlib.crc32(body).to_bytes(4, "big") + body)
    out = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "repair", "--store", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "answered row 1" in out.stderr and "CRC does not match" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    with Store.open(path, write=False) as s:
        assert len(s) == 0 and s.answered.unfinished() == 3
    with pytest.raises(ValueError, match="does not decode"):
        answered_rows.decode(bytes([answered_rows.VERSION]) + answered_rows.zlib.crc32(body).to_bytes(4, "big") + body)
    with pytest.raises(ValueError, match="version"):
        answered_rows.decode(b"")


def test_an_exchange_that_cannot_be_written_after_its_release_keeps_its_row_and_is_told(tmp_path):
    """One failing write does not stop the next; the failure is one line without the caller's key."""
    path = tmp_path / "s.lmdb"
    told: list[str] = []
    with Store.open(path, write=True, create=True) as s:
        rec = Recorder(s, Rules())
        rec.on_unwritten = told.append
        real = s.append
        calls = iter([True, False, False])

        def append(*a, **k):
            if next(calls):
                raise StoreError(f"the disk is full (while writing a request with {SECRET})")
            return real(*a, **k)

        s.append = append  # type: ignore[method-assign]
        for i in range(3):
            rec.finish(rec.begin(_chat(i), Labels("s")), _answer(i), defer_tracking=True)
        rec.track_answers()
        assert len(s) == 2 and rec.stats.unwritten == 1 and s.answered.unfinished() == 1
        assert len(told) == 1 and "disk is full" in told[0] and SECRET not in told[0]
        assert "NOT written: run `nfproxy repair" in rec.stats.summary("record", str(path))
    with Store.open(path, write=True) as s:
        assert Writer(s).finish_unwritten() == (1, 0) and len(s) == 3 and s.answered.unfinished() == 0


def test_a_live_recorders_rows_are_not_a_killed_ones(store, upstream, proxies):
    """While nfproxy records, a reader opening the store does not call its rows unfinished; after
    SIGKILL, whatever rows are left are written by repair, and every answered exchange replays."""
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, "--session", "s")
    proxies.append(rec)
    bodies = [{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"kill test {i}"}]} for i in range(40)]
    with httpx.Client(timeout=10) as client:
        for b in bodies:
            assert client.post(rec.url + "/v1/chat/completions", json=b).status_code == 200
            with Store.open(store, write=False) as s:
                assert s.answered.unfinished() == 0
    rec.stop(signal.SIGKILL)
    out = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "repair", "--store", str(store)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    with Store.open(store, write=False) as s:
        assert len(s) == 40 and s.answered.unfinished() == 0
    rep = start_nfproxy("--mode", "replay", "--store", str(store), "--session", "s")
    proxies.append(rep)
    with httpx.Client(timeout=10) as client:
        for b in bodies:
            r = client.post(rep.url + "/v1/chat/completions", json=b)
            assert r.status_code == 200 and r.headers.get("x-nf-replay") == "hit", r.text


def _forge(path: Path, rows: dict[bytes, bytes]) -> None:
    with Store.open(path, write=True) as s, s.tables.env.begin(write=True, db=s.answered.table(create=False)) as txn:
        for k, v in rows.items():
            txn.put(k, v)


def _repair(path: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "repair", "--store", str(path), *more],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("forged", ["not_an_object", "empty_object", "other_body", "digest_not_hex", "key_not_hex",
                                    "short_key", "negative_seq"])
def test_a_row_forged_with_a_valid_crc_is_refused_by_name_or_dropped_never_written(tmp_path, forged):
    """What a row says is checked as a stored record is read (its record reads back as one, its
    body hashes to its digest, its key is a row number): refused before anything is written, in
    one line; `--drop-damaged` writes the others and drops it; the store then lists."""
    path = tmp_path / "s.lmdb"
    _record(path, deferred=True, n=3, drain=False)
    with Store.open(path, write=False) as s:
        (k, a), *_ = s.answered.rows()
    change = {"not_an_object": {"request_json": "[1, 2]"}, "empty_object": {"request_json": "{}"},
              "other_body": {"request_body": b"another body"}, "digest_not_hex": {"request_digest": "zz" * 32},
              "key_not_hex": {"key": "not hex"}, "negative_seq": {"seq": -1}}.get(forged)
    if change is None:  # a key that is not a row number, the row itself sound
        _forge(path, {b"\x01": answered_rows.encode(a)})
    else:
        _forge(path, {k: answered_rows.encode(msgspec.structs.replace(a, **change))})
    out = _repair(path)
    assert out.returncode != 0 and "is damaged" in out.stderr and "--drop-damaged" in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
    with Store.open(path, write=False) as s:
        assert len(s) == 0
    out = _repair(path, "--drop-damaged")
    assert out.returncode == 0 and "1 damaged answered row dropped" in out.stdout, (out.stdout, out.stderr)
    log = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "log", "--store", str(path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert log.returncode == 0 and log.stderr == "", log.stderr
    assert len(log.stdout.splitlines()) == (3 if forged == "short_key" else 2)


def test_labels_that_are_not_utf8_are_kept_in_the_row_and_recorded_as_without_it(tmp_path):
    """A session or task header byte that is not UTF-8 (kept as a lone surrogate, as a record's JSON
    keeps it): the row takes the escaped form, and repair writes what the synchronous write does."""
    def record(path: Path, deferred: bool) -> None:
        with Store.open(path, write=True, create=True) as s:
            rec = Recorder(s, Rules())
            begun = [rec.begin(_chat(i), Labels(f"s\udcff{i}", task="t\udcfe")) for i in range(3)]
            for i, p in enumerate(begun):
                rec.finish(p, _answer(i), end=200.0 + i, defer_tracking=deferred)
            rec._unwritten.clear()

    record(tmp_path / "killed.lmdb", True)
    record(tmp_path / "whole.lmdb", False)
    with Store.open(tmp_path / "killed.lmdb", write=False) as s, s.tables.env.begin(db=s.answered.table(False)) as txn:
        assert s.answered.unfinished() == 3
        assert {v[:1] for _, v in txn.cursor()} == {bytes([answered_rows.ESCAPED])}
    assert _repair(tmp_path / "killed.lmdb").returncode == 0
    assert _tables(tmp_path / "killed.lmdb") == _tables(tmp_path / "whole.lmdb")


def test_a_reader_asking_for_rows_does_not_keep_a_recorder_from_starting(tmp_path):
    """`unfinished` holds the record lock shared for a moment; taking it waits that moment out."""
    import fcntl
    import threading
    import time

    path = tmp_path / "s.lmdb"
    _record(path, deferred=True, n=2, drain=False)
    fd = open(path / answered_rows.LOCK, "a+")  # noqa: SIM115 - closed below
    fcntl.flock(fd, fcntl.LOCK_SH)  # a reader's check, held 30 ms
    threading.Timer(0.03, fd.close).start()
    start = time.monotonic()
    with Store.open(path, write=True) as s:
        s.lock_for_recording()
        assert time.monotonic() - start < 5 and Writer(s).finish_unwritten() == (2, 0)


def test_an_answer_header_that_is_not_utf8_is_recorded_whole_and_listed(tmp_path):
    """A response header byte that is not UTF-8 (a lone surrogate in the record's JSON, which
    msgspec refuses): the record is kept whole rather than the write failing after the release."""
    for deferred in (True, False):
        path = tmp_path / f"{deferred}.lmdb"
        with Store.open(path, write=True, create=True) as s:
            rec = Recorder(s, Rules())
            p = rec.begin(_chat(0), Labels("s"))
            odd = ResponseData(200, (("content-type", "application/json"), ("x-odd", "caf\udcff")), b'{"choices": []}')
            rec.finish(p, odd, defer_tracking=deferred)
            rec.track_answers()
            assert rec.stats.unwritten == 0 and len(s) == 1 and s.answered.unfinished() == 0
        log = subprocess.run([sys.executable, "-m", "noisefloor.proxy.cli", "log", "--store", str(path), "--json"],
                             capture_output=True, text=True, timeout=60)
        assert log.returncode == 0 and len(log.stdout.splitlines()) == 1, log.stderr
        with Store.open(path, write=False) as s:
            assert ("x-odd", "caf\udcff") in map(tuple, s.exchange(1).response["headers"])
