"""nfproxy under hostile traffic, with real processes: secrets in every encoding, a byte no header
should hold, decompression bombs, bodies that cannot be canonicalized, damaged and read-only stores,
two recorders on one store."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from urllib.parse import quote, quote_plus

import brotli
import pytest
import zstandard

from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import DATA, nfproxy_argv, start_nfproxy, wait_until
from tests.fake_upstream import FakeUpstream

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Write add(a, b)."}]}
# planted secrets, with the characters that URL encoding changes ('+', '/', '=')
BEARER = "sk-PLANTED+bearer/key=0001abcdef"
QUERY_KEY = "AIzaPLANTED+query/key0002"
AWS_TOKEN = "FwoGZXIvYXdzPLANTED+session/token=0003"
PLANTED = (BEARER, QUERY_KEY, AWS_TOKEN)


def forms(secret: str) -> set[bytes]:
    """Every spelling of a secret a body or a message could carry it in."""
    out = {secret, quote(secret, safe=""), quote_plus(secret), secret.replace("+", " "), quote(secret, safe="/+=")}
    out |= {json.dumps(f)[1:-1] for f in list(out)}
    return {f.encode() for f in out}


def every_decoding(data: bytes) -> list[bytes]:
    """`data` and whatever each Content-Encoding decoder makes of it."""
    out = [data]
    for decode in (gzip.decompress, zlib.decompress, brotli.decompress,
                   lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b)):
        try:
            out.append(decode(data))
        except Exception:  # noqa: BLE001 - not that encoding
            pass
    return out


def store_text(store: Path) -> bytes:
    """Everything the store holds, zstd-decoded, then every body also Content-Encoding-decoded."""
    chunks: list[bytes] = []
    with Store.open(store, write=False) as s:
        chunks += [json.dumps(ex.to_json()).encode() for ex in s.exchanges()]
        chunks += [json.dumps(e.__dict__).encode() for e in s.index.entries()]
        for body in s.bodies.all():
            chunks += every_decoding(body)
    assert len(chunks) > 6, "the audit read nothing"
    return b"\n".join(chunks)


def leaked(text: bytes | str) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [s for s in PLANTED for f in forms(s) if f in data]


def nfproxy_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=120)


def test_secrets_in_every_encoding_reach_neither_disk_nor_stderr(store, proxies):
    def echo(doc: dict, n: int) -> str:  # an upstream that echoes the credentials it got, in every spelling
        return " ".join(f.decode() for s in doc.get("x_echo", ()) for f in sorted(forms(s))) + f" reply {n}"

    up = FakeUpstream(responder=echo).start()
    try:
        rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", up.url)
        proxies.append(rec)
        auth = {"authorization": f"Bearer {BEARER}", "x-amz-security-token": AWS_TOKEN}
        body = json.dumps({**CHAT, "messages": [{"role": "user", "content": f"my key is {BEARER}"}],
                           "x_echo": [BEARER, AWS_TOKEN]}).encode()
        r = loopback.post(rec.url + "/v1/chat/completions", content=gzip.compress(body), timeout=20,
                       headers={**auth, "content-type": "application/json", "content-encoding": "gzip"})
        assert r.status_code == 200
        r = loopback.post(rec.url + f"/v1/chat/completions?key={QUERY_KEY}", json={**CHAT, "x_echo": PLANTED},
                       headers=auth, timeout=20)
        assert r.status_code == 200
        with loopback.stream("POST", rec.url + "/v1/chat/completions", headers=auth, timeout=20,
                          json={**CHAT, "stream": True, "x_events": 40, "x_pause_ms": 1,
                                "x_echo": [BEARER, AWS_TOKEN]}) as s:
            streamed = b"".join(s.iter_raw())
        assert BEARER.encode() not in streamed and b"[DONE]" in streamed  # split across events on the wire
        assert rec.stop() == 0
        assert leaked(store_text(store)) == []
        assert leaked(rec.output) == []
        for ex_id in (1, 2, 3):
            shown = nfproxy_cmd("show", str(ex_id), "--store", str(store))
            assert shown.returncode == 0 and "[redacted]" in shown.stdout
            assert leaked(shown.stdout) == []
        listing = nfproxy_cmd("log", "--store", str(store))
        assert listing.returncode == 0 and leaked(listing.stdout) == []
        # a replay miss and its messages carry the query key nowhere either
        rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
        proxies.append(rep)
        miss = loopback.post(rep.url + f"/v1/chat/completions?key={QUERY_KEY}", json={"other": 1}, timeout=20)
        assert miss.status_code == 404
        assert rep.stop() == 3
        assert "replay miss" in rep.output and leaked(rep.output) == []
        assert leaked(store_text(store)) == []
    finally:
        up.stop()


def test_a_byte_no_header_should_hold_does_not_change_how_the_next_request_is_treated(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    assert loopback.post(rec.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 200
    rec.stop()
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--allow-reuse", "--replay-log-in-store")
    proxies.append(rep)
    keys = (b"sk-\xff\xfe-not-utf8-PLANTED-0004", b"sk-plain-key-PLANTED-0005", b"sk-\x80-again-PLANTED-0006")
    for n, key in enumerate(keys, 1):
        r = loopback.post(rep.url + "/v1/chat/completions", json=CHAT, headers={"x-api-key": key}, timeout=20)
        assert r.status_code == 200, r.text  # every one answered, the ones after the odd byte too
        wait_until(lambda n=n: _replayed(store) == n, f"replay record {n} in the log")  # the deferred write, between them
    code = rep.stop()
    assert code == 0, rep.output
    assert "Traceback" not in rep.output and "3 hits" in rep.output
    with Store.open(store, write=False) as s:
        assert [ex.replay_result for ex in s.exchanges() if ex.mode == "replay"] == ["hit"] * 3


def _replayed(store: Path) -> int:
    with Store.open(store, write=False) as s:
        return sum(ex.mode == "replay" for ex in s.exchanges())


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM")) / 1024


def _bomb() -> bytes:
    """809 bytes of brotli that decode to 1 GiB of zeros, kept as a file: compressing the GiB costs
    2.5 CPU-s a test. Made by `brotli.Compressor(quality=4, lgwin=24)` fed 16 x 64 MiB of zeros."""
    return (DATA / "zeros-1gib.br").read_bytes()


@pytest.mark.parametrize("mode", ["record", "replay"])
def test_a_decompression_bomb_gets_413_and_other_clients_keep_going(store, upstream, proxies, mode):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    assert loopback.post(rec.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 200
    if mode == "replay":
        rec.stop()
        proxy = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--allow-reuse")
        proxies.append(proxy)
    else:
        proxy = rec
    bomb = _bomb()
    assert len(bomb) < 4096
    before = len(upstream.requests)
    latencies: list[float] = []
    stop = threading.Event()

    def other_client() -> None:
        with loopback.client(timeout=20) as c:
            for _ in range(400):  # bounded in count and in time; paced: a blocked proxy shows all the same
                if stop.wait(0.02):
                    return
                t = time.monotonic()
                assert c.post(proxy.url + "/v1/chat/completions", json=CHAT).status_code == 200
                latencies.append(time.monotonic() - t)

    t = threading.Thread(target=other_client)
    t.start()
    wait_until(lambda: latencies, "the other client's first answer")
    statuses = []
    for _ in range(3):
        r = loopback.post(proxy.url + "/v1/chat/completions", content=bomb, timeout=60,
                       headers={"content-type": "application/json", "content-encoding": "br"})
        statuses.append(r.status_code)
        assert "larger than 64 MiB" in r.json()["error"]["message"]
    stop.set()
    t.join(60)
    peak = _peak_rss_mb(proxy.proc.pid)
    worst = max(latencies)
    print(f"\n{mode}: bomb answered {statuses}; proxy peak RSS {peak:.0f} MB; other client: {len(latencies)} "
          f"requests, worst latency {worst * 1000:.0f} ms")
    assert statuses == [413, 413, 413]
    assert peak < 700, f"peak RSS {peak:.0f} MB: the cap did not hold"
    assert worst < 3.0, f"another client waited {worst:.1f} s during the bomb"
    if mode == "record":
        assert len(upstream.requests) - before == len(latencies)  # the bombs were never forwarded
    assert "Traceback" not in proxy.output


def test_bodies_that_cannot_be_canonicalized_are_forwarded_recorded_and_replayed(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(rec)
    surrogate = b'{"model": "m", "messages": [{"role": "user", "content": "cut emoji \\ud83d"}]}'
    deep = b'{"model": "m", "x": ' + b"[" * 50000 + b"]" * 50000 + b"}"  # past 3.13's json depth too
    first = []
    for body in (surrogate, deep):
        r = loopback.post(rec.url + "/v1/chat/completions", content=body, timeout=20,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text  # forwarded, answered, and recorded: never withheld
        first.append(r.content)
    assert rec.stop() == 0 and "0 errors" in rec.output
    with Store.open(store, write=False) as s:
        notes = [n for ex in s.exchanges() for n in ex.notes]
    assert len([n for n in notes if "keyed on its raw bytes" in n]) == 2
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    proxies.append(rep)
    for body, answer in zip((surrogate, deep), first):
        r = loopback.post(rep.url + "/v1/chat/completions", content=body, timeout=20,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200 and r.content == answer
    assert rep.stop() == 0


def _question(i: int) -> dict:
    return {**CHAT, "messages": [{"role": "user", "content": f"question {i} " + "pad " * 400}]}


@pytest.fixture(scope="module")
def thirty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of 30 recorded questions (1.6 kB each, so they fill pages), recorded once; each test
    that damages or replays it takes its own copy."""
    store = tmp_path_factory.mktemp("thirty") / "log.lmdb"
    up = FakeUpstream().start()
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", up.url)
    try:
        for i in range(30):
            assert loopback.post(rec.url + "/v1/chat/completions", json=_question(i), timeout=20).status_code == 200
        assert rec.stop() == 0
    finally:
        rec.stop()
        up.stop()
    return store


def _one_line_failure(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode not in (0, -7, 135), (r.returncode, r.stderr[-500:])  # -7 / 135: SIGBUS
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) <= 2, r.stderr  # click prints "Error: ..."; a progress line may precede it
    return lines[-1]


@pytest.mark.parametrize("damage", ["truncated", "pages"])
def test_a_damaged_store_is_one_clear_line_in_every_command(store, thirty, damage):
    shutil.copytree(thirty, store)
    data = store / "data.mdb"
    size = data.stat().st_size
    used = (len(data.read_bytes().rstrip(b"\0")) // 4096 + 1) * 4096
    if damage == "truncated":
        os.truncate(data, used // 2)
    else:
        with open(data, "r+b") as fh:  # garbage over every page but the two meta pages
            for off in range(2 * 4096, used, 4096):
                fh.seek(off + 16)
                fh.write(os.urandom(64))
    assert data.stat().st_size <= size
    for args in (["log", "--store", str(store)], ["show", "3", "--store", str(store)]):
        line = _one_line_failure(nfproxy_cmd(*args))
        assert str(store) in line and ("damaged" in line or "truncated" in line or "not a readable" in line), line
    bin_dir = Path(sys.executable).parent
    for cmd in ([str(bin_dir / "nfanalyze"), str(store)], [str(bin_dir / "nfverify"), "bfcl", str(store)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        line = _one_line_failure(r)
        assert str(store) in line, line


def test_a_store_truncated_under_a_running_replay_answers_500_and_exits_3(store, thirty, proxies):
    shutil.copytree(thirty, store)
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    proxies.append(rep)
    data = store / "data.mdb"
    os.truncate(data, 4 * 4096)
    r = loopback.post(rep.url + "/v1/chat/completions", timeout=20, json=_question(0))
    assert r.status_code == 500 and r.headers["x-nf-replay"] == "error"
    assert "truncated" in r.json()["error"]["message"]
    assert rep.stop() == 3
    assert "errors" in rep.output.splitlines()[-1] and "Traceback" not in rep.output


def test_a_read_only_store_replays_strictly_and_stays_unchanged(store, thirty, proxies, tmp_path):
    shutil.copytree(thirty, store)
    ro = tmp_path / "checked-out"
    shutil.copytree(store, ro)
    for p in (ro, *ro.iterdir()):
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    before = {p.name: p.read_bytes() for p in ro.iterdir()}
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(ro), "--replay-log-in-store")
    proxies.append(rep)
    for i in range(3):
        assert loopback.post(rep.url + "/v1/chat/completions", json=_question(i), timeout=20).status_code == 200
    assert loopback.post(rep.url + "/v1/chat/completions", json={"other": 1}, timeout=20).status_code == 404
    assert rep.stop() == 3  # the miss fails the strict replay, as with any store
    assert "read-only" in rep.output and "3 hits, 1 misses" in rep.output
    assert {p.name: p.read_bytes() for p in ro.iterdir()} == before


def test_two_recorders_on_one_store_are_refused(store, upstream, proxies):
    first = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(first)
    second = subprocess.run([*nfproxy_argv(), "run", "--mode", "record", "--store", str(store), "--upstream",
                             upstream.url, "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert f"being recorded by another nfproxy (pid {first.proc.pid})" in second.stderr
    assert loopback.post(first.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 200
    assert first.stop() == 0
    again = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url)
    proxies.append(again)
    assert again.stop() == 0  # the lock went with the first proxy


def test_oversized_plain_body_is_refused_before_forwarding(store, upstream, proxies):
    rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, "--max-body-mb", "1")
    proxies.append(rec)
    with socket.create_connection(("127.0.0.1", rec.port), timeout=20) as c:
        payload = b"x" * (2 << 20)
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        assert c.recv(1024).startswith(b"HTTP/1.1 413")
    assert upstream.requests == []
    rec.stop()
