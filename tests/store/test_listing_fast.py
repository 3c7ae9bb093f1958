"""The listing's fast paths give what the slow paths give, byte for byte, on hostile labels:
`Visible` (each distinct text escaped once) against `visible`, `json_line` (ASCII passed through)
against `json_text`, and `nfproxy log` reading heads against the same lines built from whole
exchanges with no memo. A fast path never skips an escape. A real store, a real nfproxy process."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import msgspec
import pytest

from noisefloor.display import Visible, json_line, json_text, visible
from noisefloor.proxy.cli._listing_cmds import _encoded, _Line, _summary
from noisefloor.proxy.store import exchange as exchange_record
from noisefloor.proxy.store.log import Store
from tests.conftest import nfproxy_argv

SECRET = "sk-listing-secret-0123456789"
HOSTILE = [
    "plain-session", "s1\x1b]0;pwned\x07", "\x1b[2J\x1b[31mred", "\x9b31m", "del\x7f", "tab\tnew\nline\r",
    "bidi\u202eevil\u202c", "iso\u2066x\u2069", "arabic\u061cmark", "lines\u2028\u2029", "lone\ud800high",
    "lone\udcffescape", "snow\u2603 caf\u00e9", "\x00nul", f"key {SECRET} inside", "",
]
# the characters a terminal obeys: none may reach the output raw
RAW = [chr(c) for c in (*range(0x20), *range(0x7f, 0xa0))] + ["\u061c", "\u200e", "\u200f", "\u2028", "\u2029",
                                                              *map(chr, range(0x202a, 0x202f)),
                                                              *map(chr, range(0x2066, 0x206a))]


@pytest.fixture
def secret_env(monkeypatch):
    monkeypatch.setenv("NF_TEST_API_KEY", SECRET)


def test_visible_memo_is_visible_on_hostile_text(secret_env):
    for limit in (1 << 16, 3):  # 3: the memo is cleared again and again
        shown = Visible(limit=limit)
        for _ in range(3):  # a hit gives what a miss gave
            for text in [*HOSTILE, 1, True, None, 1.5]:
                assert shown(text) == visible(text), repr(text)
    assert SECRET not in Visible()(HOSTILE[14])
    assert not any(c in Visible()("".join(HOSTILE)) for c in RAW if c != "\x00") and "\x00" not in visible("\x00")


def test_json_line_is_json_text_byte_for_byte():
    for text in HOSTILE:
        raw = json.dumps({"session": text}, ensure_ascii=False)
        for data in (json.dumps({"session": text}).encode(), raw.encode("utf-8", "replace"),
                     raw.encode("utf-8", "surrogateescape") if "\ud800" not in text else b"{}",  # bytes not UTF-8
                     msgspec.json.encode({"session": text, "n": 1}) if "lone" not in text else b"{}"):
            slow = json_text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
            assert json_line(data) == slow, repr(text)
            assert not any(c.encode("utf-8", "surrogatepass") in json_line(data) for c in RAW), repr(text)
    assert json_line(b'{"a":"\x7f"}') == b'{"a":"\\u007f"}'  # ASCII, yet DEL: not passed through


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory) -> Path:
    """One exchange per hostile label, in session, method, URL and mode; some replayed, one an error."""
    store = tmp_path_factory.mktemp("fast") / "s.lmdb"
    with Store.open(store, write=True, create=True) as s:
        for i, text in enumerate(HOSTILE):
            s.append({"time": 1.7e9 + i, "mode": "record" if i % 3 else f"replay{text}", "session": text,
                      "condition": text or None, "key": f"{i:064x}", "occurrence": 0, "seq": i, "rules_id": "r",
                      "request": {"method": f"POST{text}", "url": f"http://up/v1/{text}", "headers": []},
                      "response": None if i % 5 == 0 else {"status": 200, "headers": []},
                      "replay": {"result": "miss"} if i % 4 == 0 else None,
                      "error": "boom" if i % 5 == 0 else None}, {}, None)
        for i in range(40):  # labels repeating, as a session's exchanges do
            s.append({"time": 1.8e9 + i, "mode": "record", "session": HOSTILE[i % 4], "key": "ab" * 32,
                      "occurrence": i, "seq": i, "rules_id": "r",
                      "request": {"method": "POST", "url": "http://up/", "headers": []},
                      "response": {"status": 500, "headers": []}}, {}, None)
    return store


def run(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, timeout=120, check=True,
                          env={**os.environ, "NF_TEST_API_KEY": SECRET})


def test_log_reading_heads_gives_the_slow_path_lines(hostile_store, secret_env):
    out = run("log", "--store", str(hostile_store)).stdout
    with Store.open(hostile_store, write=False) as s:
        exchanges = list(s.exchanges())
    slow = _Line(visible)  # whole exchanges, every text escaped afresh
    per_session: dict[str, list] = {}
    for ex in exchanges:
        p = per_session.setdefault(ex.session, [0, set(), ex.condition])
        p[0] += 1
        p[1].add(ex.mode)
    expected = _encoded(_summary(per_session, hostile_store, visible)) + _encoded(slow(ex) for ex in exchanges)
    listing, heading, trajectories = out.partition(b"replay trajectories:\n")  # replay sessions: a section of their own
    assert listing == expected and heading
    assert trajectories.count(b"  replay session ") == sum("replay" in p[1] for p in per_session.values())
    text = out.decode("utf-8")  # valid UTF-8: a lone surrogate is written as its escape
    assert not any(c in text for c in RAW if c != "\n") and SECRET not in text
    assert "\\x1b]0;pwned\\x07" in text and "\\u202e" in text and "\\ud800" in text
    assert len(listing.decode("utf-8").splitlines()) == 1 + len(per_session) + len(exchanges)


def test_log_json_gives_the_slow_path_objects(hostile_store):
    """Unfiltered, each stored record's text is passed through (checked, its implicit fields added):
    the same JSON objects the slow path prints, and nothing a terminal obeys left raw."""
    out = run("log", "--json", "--store", str(hostile_store)).stdout
    filtered = run("log", "--json", "--status", "error", "--store", str(hostile_store)).stdout  # the slow path
    with Store.open(hostile_store, write=False) as s:
        exchanges = list(s.exchanges())
    slow = [json_text(ex.json_bytes().decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
            for ex in exchanges]
    lines = out.split(b"\n")
    assert lines[-1] == b"" and [json.loads(a) for a in lines[:-1]] == [json.loads(b) for b in slow]
    assert filtered.splitlines() == [line for line, ex in zip(slow, exchanges, strict=True)
                                     if ex.error or ex.response is None]
    sessions = [json.loads(line)["session"] for line in lines[:len(HOSTILE)]]
    assert [a for a, t in zip(sessions, HOSTILE, strict=True) if "lone" not in t] == [
        t for t in HOSTILE if "lone" not in t]  # what was sent (a lone surrogate is written replaced)
    assert not any(c.encode("utf-8") in out + filtered for c in RAW if c != "\n")


GOOD = {"id": 1, "time": 1.5, "mode": "record", "session": "s", "key": "k" * 64, "occurrence": 0, "seq": 0,
        "rules_id": "r", "request": {"method": "GET", "url": "http://up/", "headers": [["a", "b"]], "body": None},
        "response": {"status": 200, "headers": [], "body_size": 3, "chunks": [[0.1, "x"]]}, "task": "t",
        "usage": {"input": 1}, "replay": {"result": "hit"}, "notes": ["n"], "truncated": None, "version": 1}
WRONG = {"str": 5, "int": "5", "float": "x", "dict": [], "list": {}, "bool": 1, "null": None, "true": True}


def _mutations():
    """GOOD with one field given each wrong kind of value, dropped, or added (top level and parts)."""
    yield GOOD
    for name in GOOD:
        for value in WRONG.values():
            yield {**GOOD, name: value}
        yield {k: v for k, v in GOOD.items() if k != name}
    for part in ("request", "response"):
        for name in [*GOOD[part], "body", "body_size", "chunks", "extra"]:
            for value in WRONG.values():
                yield {**GOOD, part: {**GOOD[part], name: value}}
            yield {**GOOD, part: {k: v for k, v in GOOD[part].items() if k != name}}
    yield {**GOOD, "unknown_key": 1}
    yield {**GOOD, "version": 2}
    yield {**GOOD, "notes": ["a", 1]}
    yield {**GOOD, "id": 2}


def test_a_record_is_passed_through_only_where_the_full_parse_reads_it_the_same():
    """The fast check never accepts what the record type refuses, and what it passes is the object
    the full parse gives; a record it leaves alone is the full parse's to read (or refuse)."""
    passed = 0
    for doc in _mutations():
        for data in (json.dumps(doc).encode(), msgspec.json.encode(doc), json.dumps(doc, indent=1).encode()):
            fast = exchange_record.listed(data, 1)
            try:
                ex = exchange_record.parse(data)
            except (TypeError, ValueError):
                assert fast is None, data
                continue
            if fast is not None:
                passed += 1
                assert ex.id == 1 and json.loads(fast) == json.loads(ex.json_bytes()), data
                assert b"\n" not in fast
    assert passed > 20


def test_outcome_rows_read_by_msgspec_and_json_alike(tmp_path):
    """Rows msgspec refuses (NaN, a lone surrogate) are read by json, as before; the rest are the same."""
    rows = [{"task_id": "t1", "condition": "live", "replicate": 0, "outcome": 1, "score": 0.25},
            {"task_id": "t2", "condition": "live", "replicate": 0, "outcome": 0, "score": float("inf")},
            {"task_id": "t\ud800", "condition": "live", "replicate": 1, "outcome": 1}]
    with Store.open(tmp_path / "s.lmdb", write=True, create=True) as s:
        s.outcomes.put(rows)
        got = sorted(s.outcome_rows(), key=lambda r: (r["replicate"], r["task_id"]))
    assert json.dumps(got) == json.dumps(sorted(rows, key=lambda r: (r["replicate"], r["task_id"])))
