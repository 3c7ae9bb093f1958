"""Recordings in and out: a HAR round trip (record through nfproxy, export, import into a new
store, strict replay) gives the same answers; imports are keyed as recorded traffic is and keep
no secret; JSON Lines export is stable for review; mitmproxy flow files import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import ProxyProcess, start_nfproxy

SECRET = "sk-transfer-test-abcdef0123456789"
REQUESTS = [
    ("s1", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one"}]}),
    ("s1", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one"}]}),  # the same again
    ("s1", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "two"}], "stream": True}),
    ("s2", {"model": "status-429", "messages": [{"role": "user", "content": "three"}]}),
]


def nfproxy(*args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("nfproxy")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)


def send(proxy: ProxyProcess) -> list[tuple[int, bytes]]:
    out = []
    with loopback.client(base_url=proxy.url, timeout=20) as c:
        for session, body in REQUESTS:
            r = c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {SECRET}",
                                                                 "x-nf-session": session, "x-nf-task": "T/1"})
            out.append((r.status_code, r.content))
    return out


def identity(path: Path) -> list[tuple]:
    with Store.open(path, write=False) as store:
        return [(ex.session, ex.task, ex.key, ex.occurrence, ex.seq, ex.rules_id, ex.response["status"],
                 store.bodies.get(ex.response["body"]), ex.response.get("chunks"), ex.request["headers"], ex.model)
                for ex in store.exchanges()]


def test_har_round_trip_replays_identically(tmp_path, upstream, proxies):
    a = tmp_path / "a.lmdb"
    rec = start_nfproxy("--mode", "record", "--upstream", upstream.url, "--store", str(a))
    live = send(rec)
    assert rec.stop() == 0, rec.output
    har = tmp_path / "a.har"
    r = nfproxy("export", str(a), "-o", str(har))
    assert r.returncode == 0, r.stderr
    doc = json.loads(har.read_text())
    assert doc["log"]["version"] == "1.2" and len(doc["log"]["entries"]) == 4 and SECRET not in har.read_text()
    b = tmp_path / "b.lmdb"
    r = nfproxy("import", str(b), str(har))
    assert r.returncode == 0 and "4 exchanges" in r.stderr, r.stderr
    assert identity(b) == identity(a)  # same keys, occurrences, labels, bodies, chunk layouts
    seen = len(upstream.requests)
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(b))
    proxies.append(rep)
    assert send(rep) == live  # statuses and bodies byte for byte, the stream included
    assert rep.stop() == 0, rep.output
    assert len(upstream.requests) == seen
    again = tmp_path / "again.har"
    assert nfproxy("export", str(b), "-o", str(again)).returncode == 0
    entries = [json.loads(again.read_text())["log"]["entries"], doc["log"]["entries"]]
    for e in entries:
        for x in e:
            x["_noisefloor"]["notes"] = [n for n in x["_noisefloor"]["notes"] if n != "imported"]
    assert entries[0] == entries[1]


def test_jsonl_export_is_stable_for_review(tmp_path, upstream):
    store = tmp_path / "s.lmdb"
    rec = start_nfproxy("--mode", "record", "--upstream", upstream.url, "--store", str(store))
    send(rec)
    assert rec.stop() == 0
    out = nfproxy("export", str(store), "--format", "jsonl")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert len(lines) == 4 and "time" not in lines[0] and lines[0]["request"]["body"]["messages"][0]["content"] == "one"
    assert lines[0]["response"]["body"]["choices"][0]["message"]["content"] == "answer number 1"
    assert out.stdout == nfproxy("export", str(store), "--format", "jsonl").stdout  # same store, same text


def foreign_har(path: Path) -> Path:
    """A HAR as a browser saves it: decoded bodies, a credential header, a key in the query, and the
    key echoed back in the answer."""
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one"}]})
    entry = {"startedDateTime": "2026-01-02T03:04:05.678Z", "time": 12.5,
             "request": {"method": "POST", "url": f"https://api.example.com/v1/chat/completions?key={SECRET}",
                         "headers": [{"name": "Authorization", "value": f"Bearer {SECRET}"},
                                     {"name": "Content-Type", "value": "application/json"},
                                     {"name": "x-nf-task", "value": "T/9"}],
                         "postData": {"mimeType": "application/json", "text": body}},
             "response": {"status": 401, "headers": [{"name": "content-type", "value": "application/json"},
                                                     {"name": "content-encoding", "value": "gzip"}],
                          "content": {"mimeType": "application/json",
                                      "text": json.dumps({"error": f"bad key {SECRET}"})}}}
    path.write_text(json.dumps({"log": {"version": "1.2", "entries": [entry]}}))
    return path


def test_import_erases_secrets_and_keys_like_a_recording(tmp_path):
    store = tmp_path / "in.lmdb"
    r = nfproxy("import", str(store), str(foreign_har(tmp_path / "browser.har")), "--session", "web")
    assert r.returncode == 0, r.stderr
    with Store.open(store, write=False) as s:
        (ex,) = list(s.exchanges())
        assert ex.session == "web" and ex.task == "T/9" and ex.response["status"] == 401
        assert SECRET not in json.dumps(ex.to_json()) and all(SECRET.encode() not in b for b in s.bodies.all())
        assert ("Authorization", "[redacted]") in [tuple(h) for h in ex.request["headers"]]
        assert not any(k.lower() == "content-encoding" for k, _ in ex.response["headers"])  # the body was decoded
        assert b"bad key" in s.bodies.get(ex.response["body"])
    from noisefloor.proxy.request.keys import Rules
    from noisefloor.proxy.request.traffic import RequestData

    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "one"}]}).encode()
    expected = RequestData("POST", "https://api.example.com/v1/chat/completions", "api.example.com",
                           "/v1/chat/completions", (), body).canonical(Rules()).key
    assert ex.key == expected  # the secret query parameter is out of the key, as in recording


def test_mitmproxy_flow_file_imports(tmp_path):
    from mitmproxy import io
    from mitmproxy.test import tflow

    flows = tmp_path / "flows.mitm"
    with flows.open("wb") as fh:
        w = io.FlowWriter(fh)
        for text in ("alpha", "beta"):
            f = tflow.tflow(resp=True)
            f.request.method, f.request.scheme, f.request.host, f.request.port = "POST", "https", "api.example.com", 443
            f.request.path = "/v1/chat/completions"
            f.request.headers["authorization"] = f"Bearer {SECRET}"
            f.request.content = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
            f.response.content = json.dumps({"choices": [{"message": {"content": f"re {text}"}}], "model": "m-1"}).encode()
            w.add(f)
    store = tmp_path / "flows.lmdb"
    r = nfproxy("import", str(store), str(flows))
    assert r.returncode == 0 and "2 exchanges" in r.stderr, r.stderr
    with Store.open(store, write=False) as s:
        got = list(s.exchanges())
        assert [ex.session for ex in got] == ["import-flows", "import-flows"] and [ex.seq for ex in got] == [0, 1]
        assert [ex.model for ex in got] == ["m-1", "m-1"] and len({ex.key for ex in got}) == 2
        assert all(SECRET not in json.dumps(ex.to_json()) for ex in got)
    assert "replay answers for https://api.example.com" in r.stderr


def test_an_imported_store_replays_with_nothing_the_recording_did_not_need(tmp_path, proxies):
    """A capture of api.example.com imported into a new store remembers its origin as a recording
    remembers --upstream: a strict replay needs no --upstream (the issue: all misses, "differs
    first at /host"). Two origins (a forward-proxy capture) remember none."""
    body = {"model": "m", "messages": [{"role": "user", "content": "alpha"}]}
    one = [_entry(request={**_entry()["request"], "url": "https://api.example.com:8443/v1/chat/completions",
                           "postData": {"mimeType": "application/json", "text": json.dumps(body)}})]
    har = tmp_path / "one.har"
    har.write_text(json.dumps({"log": {"entries": one}}))
    store = tmp_path / "one.lmdb"
    r = nfproxy("import", str(store), str(har))
    assert r.returncode == 0 and "replay answers for https://api.example.com:8443" in r.stderr, r.stderr
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    proxies.append(rep)
    got = loopback.post(rep.url + "/v1/chat/completions", json=body, timeout=20)
    assert got.status_code == 200 and got.headers["x-nf-replay"] == "hit", got.text
    assert rep.stop() == 0, rep.output
    two = [*one, _entry(request={**one[0]["request"], "url": "https://other.example.org/v1/chat/completions"})]
    har.write_text(json.dumps({"log": {"entries": two}}))
    r = nfproxy("import", str(tmp_path / "two.lmdb"), str(har))
    assert r.returncode == 0 and "replay answers for" not in r.stderr
    with Store.open(tmp_path / "two.lmdb", write=False) as s:
        assert s.meta("upstream") is None


def test_a_hostile_url_is_never_remembered_as_an_upstream():
    from noisefloor.proxy.transfer.formats import _origin

    assert _origin("https://user:pw@api.example.com/v1") == "https://api.example.com"
    assert _origin("http://[::1]:9100/x") == "http://[::1]:9100"
    assert _origin("ftp://api.example.com/") is None and _origin("https://bad host\x1b]/") is None
    assert _origin("https://api.example.com:99999/") is None


def test_a_file_that_is_not_har_is_one_line(tmp_path):
    bad = tmp_path / "bad.har"
    bad.write_text("{not json")
    r = nfproxy("import", str(tmp_path / "x.lmdb"), str(bad))
    assert r.returncode == 5 and r.stderr.count("\n") == 1 and "is not a HAR file" in r.stderr



def _entry(**over: object) -> dict:
    """A browser-style entry; `over` replaces top-level fields."""
    e = {"startedDateTime": "2026-01-02T03:04:05Z", "time": 5,
         "request": {"method": "POST", "url": "https://api.example.com/v1/chat/completions",
                     "headers": [{"name": "content-type", "value": "application/json"}],
                     "postData": {"mimeType": "application/json", "text": '{"model": "m", "messages": []}'}},
         "response": {"status": 200, "headers": [{"name": "content-type", "value": "application/json"}],
                      "content": {"mimeType": "application/json", "text": '{"choices": []}'}}}
    e.update(over)
    return e


def _with(path: str, value: object) -> dict:
    e = _entry()
    *parents, last = path.split(".")
    node = e
    for p in parents:
        node = node[p]
    node[last] = value
    return e


HOSTILE_ENTRIES = {
    "request is a list": _entry(request=[]),
    "_noisefloor is a list": _entry(_noisefloor=[1]),
    "postData is a string": _with("request.postData", "text"),
    "body text is a number": _with("response.content.text", 5),
    "body text is an object": _with("request.postData.text", {"a": 1}),
    "chunks of the wrong shape": _entry(_noisefloor={"chunks": [[1]]}),
    "chunks a string": _entry(_noisefloor={"chunks": "ab"}),
    "end a string": _entry(_noisefloor={"end": "x"}),
    "a label an object": _entry(_noisefloor={"session": {"a": 1}}),
    "startedDateTime a number": _entry(startedDateTime=5),
    "time a string": _entry(time="abc"),
    "status a string": _with("response.status", "abc"),
    "status out of range": _with("response.status", 10 ** 30),
    "method with CRLF": _with("request.method", "GET\r\nX-Injected: 1"),
    "url unparseable": _with("request.url", "https://[::1"),
    "header with a newline": _with("request.headers", [{"name": "a\nb", "value": "c"}]),
    "header value not a string": _with("request.headers", [{"name": "a", "value": 5}]),
    "base64 not base64": _with("response.content", {"text": "!!!", "encoding": "base64"}),
}


def test_hostile_har_entries_import_nothing_and_say_why(tmp_path):
    """Each malformed entry, placed after a good one: a TransferError naming the entry, and the
    store exactly as it was (the good entry before it not imported either)."""
    from noisefloor.proxy.transfer.formats import TransferError, har_items, import_into

    store = tmp_path / "kept.lmdb"
    good = tmp_path / "good.har"
    good.write_text(json.dumps({"log": {"entries": [_entry()]}}))
    assert import_into(store, har_items(good), "first").exchanges == 1
    before = identity(store)
    for name, bad in HOSTILE_ENTRIES.items():
        f = tmp_path / "bad.har"
        f.write_text(json.dumps({"log": {"entries": [_entry(), bad]}}))
        with pytest.raises(TransferError, match="entry 2|exchange 2") as info:
            import_into(store, har_items(f), "second")
        assert "\n" not in str(info.value), name
        assert identity(store) == before, name
    for text in ("[" * 100_000 + "]" * 100_000, "[1, 2]", '{"log": null}', '{"log": {"entries": {}}}'):
        f = tmp_path / "odd.har"
        f.write_text(text)
        with pytest.raises(TransferError, match="is not a HAR file"):
            import_into(store, har_items(f), "third")
    assert identity(store) == before


def test_every_secret_field_of_a_har_is_erased_on_import(tmp_path):
    """Authorization, Cookie (header and cookies list), a key in the query, secret form params,
    Set-Cookie in the answer: none reaches the store, though the answer echoes them all."""
    from noisefloor.proxy.transfer.formats import har_items, import_into

    s = {k: f"{k}-SECRET-0123456789" for k in ("auth", "cookie", "other", "query", "form", "setcookie")}
    entry = {"startedDateTime": "2026-01-02T03:04:05Z", "time": 5,
             "request": {"method": "POST", "url": f"https://api.example.com/v1/x?api_key={s['query']}",
                         "headers": [{"name": "content-type", "value": "application/x-www-form-urlencoded"},
                                     {"name": "Authorization", "value": f"Bearer {s['auth']}"},
                                     {"name": "Cookie", "value": f"sid={s['cookie']}"}],
                         "cookies": [{"name": "sid", "value": s["cookie"]}, {"name": "pref", "value": s["other"]}],
                         "queryString": [{"name": "api_key", "value": s["query"]}],
                         "postData": {"mimeType": "application/x-www-form-urlencoded",
                                      "text": f"x=1&api_key={s['form']}",
                                      "params": [{"name": "x", "value": "1"}, {"name": "api_key", "value": s["form"]}]}},
             "response": {"status": 200, "headers": [{"name": "Set-Cookie", "value": f"sid={s['setcookie']}"},
                                                      {"name": "content-type", "value": "application/json"}],
                          "cookies": [{"name": "sid", "value": s["setcookie"]}],
                          "content": {"mimeType": "application/json", "text": json.dumps({"echo": list(s.values())})}}}
    failed = {**entry, "response": {"status": 0, "_error": f"refused {s['auth']} {s['other']}"}}
    har = tmp_path / "secrets.har"
    har.write_text(json.dumps({"log": {"entries": [entry, failed]}}))
    store = tmp_path / "s.lmdb"
    assert import_into(store, har_items(har), "web").exchanges == 2
    on_disk = b"".join(p.read_bytes() for p in store.iterdir())
    with Store.open(store, write=False) as st:
        text = json.dumps([ex.to_json() for ex in st.exchanges()]) + "".join(
            b.decode("utf-8", "replace") for b in st.bodies.all())
        (ex, ex2) = list(st.exchanges())
        assert b"x=1" in st.bodies.get(ex.request["body"]) and ex2.error.startswith("refused")
    for value in s.values():
        assert value not in text and value.encode() not in on_disk, value
