"""nfproxy end to end: a real nfproxy subprocess, a real aiohttp upstream, real SDK clients."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from noisefloor import exit_codes
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import ProxyProcess, delete_exchanges, have_curl, nfproxy_argv, start_nfproxy
from tests.fake_upstream import FakeUpstream

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Write add(a, b)."}], "temperature": 0.7}


def record(store: Path, upstream: FakeUpstream, proxies: list[ProxyProcess], *extra: str) -> ProxyProcess:
    p = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, *extra)
    proxies.append(p)
    return p


def replay(store: Path, proxies: list[ProxyProcess], *extra: str) -> ProxyProcess:
    p = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), *extra)
    proxies.append(p)
    return p


def post(proxy: ProxyProcess, body: dict | bytes, path: str = "/v1/chat/completions", **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"content-type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return loopback.post(proxy.url + path, content=content, headers=h, timeout=20)


def test_openai_and_anthropic_sdks_replay_byte_identical_with_upstream_stopped(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    oa = openai.OpenAI(base_url=rec.url + "/v1", api_key="sk-record-key", max_retries=0)
    an = anthropic.Anthropic(base_url=rec.url, api_key="sk-ant-record-key", max_retries=0)
    raw_oa = oa.chat.completions.with_raw_response.create(**CHAT)
    raw_an = an.messages.with_raw_response.create(
        model="claude-3-5-haiku", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    )
    recorded = (raw_oa.http_response.content, raw_an.http_response.content)
    assert rec.stop() == 0
    upstream.stop()

    rep = replay(store, proxies)
    oa2 = openai.OpenAI(base_url=rep.url + "/v1", api_key="sk-a-rotated-key", max_retries=0)
    an2 = anthropic.Anthropic(base_url=rep.url, api_key="sk-ant-rotated", max_retries=0)
    got_oa = oa2.chat.completions.with_raw_response.create(**CHAT)
    got_an = an2.messages.with_raw_response.create(
        model="claude-3-5-haiku", max_tokens=64, messages=[{"role": "user", "content": "hello"}]
    )
    assert (got_oa.http_response.content, got_an.http_response.content) == recorded
    assert got_oa.parse().choices[0].message.content == "answer number 1"
    assert got_an.parse().content[0].text == "anthropic answer 2"
    assert rep.stop() == 0
    assert "2 hits, 0 misses, 0 order violations" in rep.output


def test_identical_requests_replay_in_order_then_miss(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    answers = [post(rec, CHAT).json()["choices"][0]["message"]["content"] for _ in range(3)]
    assert len(set(answers)) == 3
    rec.stop()
    rep = replay(store, proxies)
    assert [post(rep, CHAT).json()["choices"][0]["message"]["content"] for _ in range(3)] == answers
    fourth = post(rep, CHAT)
    assert fourth.status_code == 404
    assert fourth.headers["x-nf-replay"] == "miss"
    assert fourth.headers["x-nf-occurrence"] == "3"
    assert fourth.json()["error"]["recorded_occurrences"] == 3
    assert rep.stop() == 3  # strict replay that missed exits non-zero
    assert "3 hits, 1 misses" in rep.output


def test_unrecorded_request_is_a_miss_naming_the_nearest_with_a_diff(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    post(rec, CHAT)
    post(rec, {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "something else entirely"}]})
    rec.stop()
    rep = replay(store, proxies)
    changed = dict(CHAT, messages=[{"role": "user", "content": "Write sub(a, b)."}])
    r = post(rep, changed)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["type"] == "nfproxy_replay_miss" and "never recorded" in err["message"]
    diff = "\n".join(err["nearest"]["diff"])
    assert '-/body/messages/0/content = "Write add(a, b)."' in diff
    assert '+/body/messages/0/content = "Write sub(a, b)."' in diff
    assert err["nearest"]["exchange_id"] == 1


def test_key_is_stable_across_key_order_whitespace_compression_and_api_key(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    first = post(rec, CHAT, authorization="Bearer sk-one")
    rec.stop()
    rep = replay(store, proxies, "--allow-reuse")
    variants = [
        json.dumps(dict(reversed(list(CHAT.items())))).encode(),  # key order
        json.dumps(CHAT, indent=4).encode(),  # whitespace
    ]
    for body in variants:
        r = post(rep, body, authorization="Bearer sk-two")
        assert r.status_code == 200 and r.content == first.content
    gz = post(rep, gzip.compress(json.dumps(CHAT).encode()), content_encoding="gzip", x_api_key="other")
    assert gz.status_code == 200 and gz.content == first.content
    # a retry header and a label header do not move the key either
    r = post(rep, CHAT, x_stainless_retry_count="1", x_nf_session="s9")
    assert r.status_code == 200 and r.content == first.content
    # but a change the model would see does
    assert post(rep, dict(CHAT, temperature=0)).status_code == 404


def test_replay_opens_no_upstream_connection(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    post(rec, CHAT)
    rec.stop()
    before_conns, before_reqs = upstream.connections, len(upstream.requests)
    assert before_conns >= 1
    # upstream still running and reachable: replay must still not touch it, hit or miss
    rep = replay(store, proxies, "--upstream", upstream.url)
    assert post(rep, CHAT).status_code == 200
    assert post(rep, CHAT).status_code == 404
    assert post(rep, {"other": 1}).status_code == 404
    r = loopback.get(rep.url + "/v1/models", timeout=10)
    assert r.status_code == 404
    rep.stop()
    assert (upstream.connections, len(upstream.requests)) == (before_conns, before_reqs)


SECRETS = {
    "authorization": "Bearer sk-PLANTED-authorization-0001",
    "x-api-key": "PLANTED-x-api-key-0002",
    "api-key": "PLANTED-azure-api-key-0003",
    "x-goog-api-key": "PLANTED-goog-key-0004",
    "cookie": "session=PLANTED-cookie-0005",
}
QUERY_SECRET = "PLANTED-query-key-0006"


def _all_store_text(store_path: Path) -> bytes:
    """Everything the store holds, decompressed: records, replay index, every stored body."""
    chunks: list[bytes] = []
    with Store.open(store_path, write=False) as s:
        chunks += [json.dumps(ex.to_json()).encode() for ex in s.exchanges()]
        chunks += [json.dumps(e.__dict__).encode() for e in s.index.entries()]
        chunks += list(s.bodies.all())
        assert len(chunks) > 4, "the audit read nothing"
    return b"\n".join(chunks)


def test_a_replay_that_breaks_answers_an_error_and_still_never_calls_upstream(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    post(rec, CHAT)
    rec.stop()
    before = (upstream.connections, len(upstream.requests))
    rep = replay(store, proxies, "--upstream", upstream.url)
    # another process damages the store under the running replay: the recorded exchange is gone
    delete_exchanges(store, [1])
    r = post(rep, CHAT)
    assert r.status_code == 500
    assert r.headers["x-nf-replay"] == "error"
    assert "not forwarded upstream" in r.json()["error"]["message"]
    assert rep.stop() == 3  # a strict replay that could not answer fails
    assert "1 errors" in rep.output
    assert (upstream.connections, len(upstream.requests)) == before


def test_no_upstream_guard_fires_inside_a_running_replay_proxy(store, upstream, proxies):
    """Traffic the replay hook cannot answer (raw TCP after CONNECT, not HTTP) reaches the guard:
    the connection is refused, the target never sees it, and the strict replay fails."""
    import socket

    rec = start_nfproxy("--mode", "record", "--store", str(store))  # regular (forward) proxy mode
    proxies.append(rec)
    assert loopback.post(upstream.url + "/v1/chat/completions", json=CHAT, proxy=rec.url, timeout=20).status_code == 200
    rec.stop()
    target = socket.socket()
    target.bind(("127.0.0.1", 0))
    target.listen(1)
    target.settimeout(1.0)
    port = target.getsockname()[1]
    rep = replay(store, proxies)  # regular mode, as recorded: clients CONNECT through it
    with socket.create_connection(("127.0.0.1", rep.port), timeout=10) as c:
        c.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head = c.recv(4096)
        assert b" 200 " in head, head.decode(errors="replace")
        c.sendall(b"\x00\x01 raw bytes that are neither TLS nor HTTP\r\n\r\n")
        c.settimeout(10)
        try:
            while c.recv(1024):
                pass
        except (ConnectionResetError, TimeoutError):
            pass
    with pytest.raises(TimeoutError):
        target.accept()  # nothing ever connected to the target
    target.close()
    assert rep.stop() == 3
    assert "refused an upstream connection" in rep.output


def test_a_full_disk_withholds_the_answer_and_keeps_every_recorded_exchange(small_disk, upstream, proxies):
    store = small_disk / "log.lmdb"
    rec = record(store, upstream, proxies)
    rng = random.Random(7)
    answered, refused = 0, []
    for i in range(120):  # 32 MB reserved at start; the map cannot grow by its 64 MB step on 40 MB
        text = base64.b64encode(rng.randbytes(700_000)).decode()  # under aiohttp's 1 MiB body limit
        r = post(rec, {"model": "m", "messages": [{"role": "user", "content": f"{i} {text}"}]})
        if r.status_code == 200:
            answered += 1
            continue
        refused.append(r)
        if len(refused) == 2:
            break
    assert answered >= 5 and len(refused) == 2, (answered, [r.status_code for r in refused])
    for r in refused:
        assert r.status_code == 507 and r.headers["x-nf-record"] == "error"
        assert "cannot reserve 96 MB" in r.json()["error"]["message"]
    assert rec.proc.poll() is None  # still serving: no SIGBUS, no crash
    assert rec.stop() == exit_codes.INPUT  # the recording has holes: not a clean exit (5)
    assert "2 errors" in rec.output and "2 exchanges NOT recorded" in rec.output
    with Store.open(store, write=False) as s:
        kept = list(s.exchanges())
    assert len(kept) == answered and all(ex.response["status"] == 200 for ex in kept)


def test_planted_secrets_never_reach_the_store(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    r = post(rec, CHAT, **{k.replace("-", "_"): v for k, v in SECRETS.items()})
    assert r.status_code == 200
    q = loopback.post(rec.url + f"/v1beta/models/gemini:generateContent?key={QUERY_SECRET}&alt=json", json=CHAT,
                   headers=SECRETS, timeout=20)
    assert q.status_code == 200
    rec.stop()
    # the upstream did get them: secrets are only removed from what is written
    assert upstream.requests[0].headers["x-api-key"] == SECRETS["x-api-key"]
    assert QUERY_SECRET in upstream.requests[1].path
    planted = [*SECRETS.values(), QUERY_SECRET, "cookie-secret"]
    raw = b"".join(f.read_bytes() for f in store.iterdir() if f.is_file())
    text = _all_store_text(store)
    for secret in planted:
        token = secret.split("=")[-1].replace("Bearer ", "").encode()
        assert token not in raw, f"{secret} found in raw LMDB files"
        assert token not in text, f"{secret} found in decompressed store contents"
    # and yet the stored request says which headers were sent
    with Store.open(store, write=False) as s:
        first = next(s.exchanges())
    assert ("x-api-key", "[redacted]") in [tuple(h) for h in first.request["headers"]]


def test_32_concurrent_clients_lose_and_duplicate_no_occurrence(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    clients, each = 32, 4

    async def one_client(client: httpx.AsyncClient) -> list[str]:
        out = []
        for _ in range(each):
            r = await client.post(rec.url + "/v1/chat/completions", json=CHAT, timeout=30)
            out.append(r.json()["id"])
        return out

    async def main() -> list[str]:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=clients)) as client:
            results = await asyncio.gather(*(one_client(client) for _ in range(clients)))
        return [i for r in results for i in r]

    ids = asyncio.run(main())
    rec.stop()
    assert len(set(ids)) == clients * each
    with Store.open(store, write=False) as s:
        exchanges = list(s.exchanges())
        served = {json.loads(s.bodies.get(e.response["body"]))["id"]: e.occurrence for e in exchanges}
    assert sorted(e.occurrence for e in exchanges) == list(range(clients * each))
    assert set(served) == set(ids)


def test_sigkill_mid_recording_leaves_every_answered_exchange(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    answered: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        with loopback.client(timeout=5) as client:
            for i in range(2000):  # bounded in count and (below) in time
                if stop.is_set():
                    return
                try:
                    r = client.post(rec.url + "/v1/chat/completions", json=dict(CHAT, seed=i))
                except httpx.HTTPError:
                    return
                answered.append(r.json()["id"])

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(answered) < 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    rec.proc.send_signal(signal.SIGKILL)
    rec.proc.wait(10)
    stop.set()
    for t in threads:
        t.join(10)
    assert len(answered) >= 60
    # the store stays usable for more recording: the next recorder first writes in full what the
    # killed one had answered and only kept as answered rows (`answered_rows`)
    again = record(store, upstream, proxies)
    assert post(again, CHAT).status_code == 200
    again.stop()
    with Store.open(store, write=False) as s:
        stored = {json.loads(s.bodies.get(e.response["body"]))["id"] for e in s.exchanges()}
        assert s.answered.unfinished() == 0
    missing = set(answered) - stored
    assert not missing, f"{len(missing)} answered exchanges lost"


def test_upstream_errors_and_connection_failures_are_recorded_and_replayed(store, upstream, proxies, tmp_path):
    rec = record(store, upstream, proxies)
    assert post(rec, dict(CHAT, model="status-429")).status_code == 429
    assert post(rec, dict(CHAT, model="status-500")).status_code == 500
    rec.stop()
    assert "upstream error statuses: 1x429, 1x500" in rec.output
    rep = replay(store, proxies)
    r429 = post(rep, dict(CHAT, model="status-429"))
    assert r429.status_code == 429 and r429.json()["error"]["message"] == "injected 429"
    assert post(rep, dict(CHAT, model="status-500")).status_code == 500
    rep.stop()

    dead_store = tmp_path / "dead.lmdb"
    dead = start_nfproxy("--mode", "record", "--store", str(dead_store), "--upstream", "http://127.0.0.1:9")
    proxies.append(dead)
    assert post(dead, CHAT).status_code == 502
    dead.stop()
    with Store.open(dead_store, write=False) as s:
        (ex,) = list(s.exchanges())
    assert ex.response is None and ex.error
    rep2 = replay(dead_store, proxies)
    r = post(rep2, CHAT)
    assert r.status_code == 502 and r.json()["error"]["type"] == "nfproxy_recorded_error"


def test_bad_bodies_are_keyed_raw_and_never_crash(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    bodies = [b"{not json", bytes(range(256)) * 4, b""]
    for body in bodies:
        assert post(rec, body, path="/v1/anything").status_code == 200
    rec.stop()
    rep = replay(store, proxies)
    for body in bodies:
        r = post(rep, body, path="/v1/anything")
        assert r.status_code == 200 and r.content.startswith(b"echo")
    assert post(rep, b"{not json!", path="/v1/anything").status_code == 404
    rep.stop()
    with Store.open(store, write=False) as s:
        notes = [n for ex in s.exchanges() for n in ex.notes]
    assert any("not JSON" in n for n in notes)


def test_session_header_keeps_occurrences_per_session_and_is_stripped(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    a = [post(rec, CHAT, x_nf_session="rep-0", x_nf_task="HumanEval/0").json()["id"] for _ in range(2)]
    b = [post(rec, CHAT, x_nf_session="rep-1").json()["id"] for _ in range(2)]
    rec.stop()
    assert all(not any(h.lower().startswith("x-nf-") for h in r.headers) for r in upstream.requests)
    rep = replay(store, proxies, "--replay-session", "rep-1")
    got = [post(rep, CHAT, x_nf_session=f"replay-{i}").json()["id"] for i in (0, 1)]
    assert got == [b[0], b[0]]  # each replay session starts at occurrence 0 of the chosen recording
    rep.stop()
    with Store.open(store, write=False) as s:
        first = next(s.exchanges())
    assert (first.session, first.task, first.occurrence) == ("rep-0", "HumanEval/0", 0)
    assert a[0] != b[0]


def test_call_order_violation_is_reported_and_strict_fails(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    one, two = dict(CHAT, seed=1), dict(CHAT, seed=2)
    post(rec, one)
    post(rec, two)
    rec.stop()
    content = replay(store, proxies)  # two carries nothing of one's answer: asked first it is an order note
    r = post(content, two)
    assert r.status_code == 200 and r.headers["x-nf-replay"] == "hit"
    assert content.stop() == 0 and "1 order notes" in content.output
    rep = replay(store, proxies, "--replay-order", "recorded", "--order-wait", "0.5")
    r = post(rep, two)  # recorded after one's answer, asked first: the agent changed its order
    assert r.status_code == 412 and r.headers["x-nf-replay"] == "order_violation"
    err = r.json()["error"]
    assert "has not asked it (waited 0.5" in err["message"]
    assert err["should_come_first"]["exchange"] == 1  # names the request that had to come first
    assert rep.stop() == 3
    lax = start_nfproxy("--mode", "replay", "--no-strict", "--store", str(store), "--order-wait", "0.5",
                        "--replay-order", "recorded")
    proxies.append(lax)
    assert post(lax, two).status_code == 200
    assert lax.stop() == 0
    assert "1 order violations" in lax.output


@pytest.mark.skipif(not have_curl(), reason="curl is not installed")
def test_curl_records_and_replays(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    cmd = ["curl", "-sS", "--max-time", "20", "-H", "content-type: application/json", "-d", json.dumps(CHAT)]
    first = subprocess.run([*cmd, rec.url + "/v1/chat/completions"], capture_output=True, check=True).stdout
    rec.stop()
    rep = replay(store, proxies)
    again = subprocess.run([*cmd, rep.url + "/v1/chat/completions"], capture_output=True, check=True).stdout
    assert again == first and b"answer number 1" in again


def test_log_and_show_commands(store, upstream, proxies):
    rec = record(store, upstream, proxies, "--session", "demo", "--condition", "live")
    post(rec, CHAT, authorization="Bearer sk-show-secret")
    rec.stop()
    log = subprocess.run([*nfproxy_argv(), "log", "--store", str(store)], capture_output=True, text=True, check=True)
    assert "demo: 1 exchanges (record) condition=live" in log.stdout
    assert "POST http://127.0.0.1" in log.stdout
    show = subprocess.run([*nfproxy_argv(), "show", "1", "--store", str(store)], capture_output=True, text=True,
                          check=True)
    doc = json.loads(show.stdout)
    assert doc["response"]["body_text"]["choices"][0]["message"]["content"] == "answer number 1"
    assert doc["request"]["body_text"]["messages"][0]["content"] == "Write add(a, b)."
    assert doc["model"] == "gpt-4o-mini-2024-07-18" and doc["fingerprint"] == "fp_1"
    assert doc["usage"] == {"input": 11, "output": 1}
    assert "sk-show-secret" not in show.stdout
    rows = subprocess.run([*nfproxy_argv(), "log", "--store", str(store), "--json", "--condition", "live"],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    assert [json.loads(r)["session"] for r in rows] == ["demo"]
    none = subprocess.run([*nfproxy_argv(), "log", "--store", str(store), "--json", "--task", "other"],
                          capture_output=True, text=True, check=True)
    assert none.stdout == ""
    # an option before the subcommand is that subcommand's option, not a proxy run of `log`
    before = subprocess.run([*nfproxy_argv(), "--store", str(store), "log", "--sessions-only"],
                            capture_output=True, text=True, timeout=60)
    assert before.returncode == 0 and "demo: 1 exchanges" in before.stdout, before.stderr


def test_every_command_has_version_and_nfproxy_help_shows_the_run_options():
    import sys as _sys
    from pathlib import Path as P

    for cmd in ("nfproxy", "nfanalyze", "nfverify", "nfladder"):
        r = subprocess.run([str(P(_sys.executable).with_name(cmd)), "--version"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and "(noisefloor)" in r.stdout, (cmd, r.stderr)
    helptext = subprocess.run([*nfproxy_argv(), "--help"], capture_output=True, text=True, timeout=60).stdout
    for option in ("--mode", "--upstream", "--store", "--strict", "--order-wait", "--max-body-mb"):
        assert option in helptext
