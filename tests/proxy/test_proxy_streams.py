"""nfproxy with real agents: SSE streaming, HTTPS forward proxying, wrapped commands, overrides."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from noisefloor import exit_codes
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import ProxyProcess, nfproxy_argv, start_nfproxy, wait_until
from tests.fake_upstream import FakeUpstream
from tests.tls import make_server_cert

STREAM = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "stream please"}], "stream": True}


def chunked_frames(port: int, body: dict, path: str = "/v1/chat/completions", timeout: float = 20) -> list[tuple[float, bytes]]:
    """POST over a raw socket and return each HTTP/1.1 chunk with its arrival time (s after sending)."""
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    start = time.monotonic()
    sock.sendall(head + payload)
    f = sock.makefile("rb")
    status = f.readline()
    assert b" 200 " in status, status
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode().partition(":")
        headers[k.strip().lower()] = v.strip()
    assert headers.get("transfer-encoding") == "chunked", headers
    frames = []
    while True:
        size = int(f.readline().split(b";")[0], 16)
        if size == 0:
            break
        data = f.read(size)
        f.read(2)
        frames.append((time.monotonic() - start, data))
    sock.close()
    return frames


def record(store: Path, upstream: FakeUpstream, proxies: list[ProxyProcess], *extra: str) -> ProxyProcess:
    p = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", upstream.url, *extra)
    proxies.append(p)
    return p


def replay(store: Path, proxies: list[ProxyProcess], *extra: str) -> ProxyProcess:
    p = start_nfproxy("--mode", "replay", "--store", str(store), *extra)
    proxies.append(p)
    return p


def first_chunk_seconds(url: str, body: dict) -> tuple[float, float]:
    with loopback.client(timeout=20) as client:
        start = time.monotonic()
        with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            it = r.iter_raw()
            next(it)
            first = time.monotonic() - start
            for _ in it:
                pass
            return first, time.monotonic() - start


def test_first_chunk_is_not_held_back_while_recording(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    slow = dict(STREAM, x_pause_ms=300, x_events=3)
    first_chunk_seconds(rec.url, slow)  # warm both paths
    first_chunk_seconds(upstream.url, slow)
    direct_first, direct_total = first_chunk_seconds(upstream.url, slow)
    proxy_first, proxy_total = first_chunk_seconds(rec.url, slow)
    assert direct_total > 1.0 and proxy_total > 1.0  # the upstream really held the rest back
    assert proxy_first < 0.25, "the proxy buffered the stream"  # the rest takes over 1 s: not buffered


ANTHROPIC_STREAM = {"model": "claude-3-5-haiku", "max_tokens": 32, "stream": True,
                    "messages": [{"role": "user", "content": "stream please"}]}


@pytest.mark.parametrize("path,body,finish", [
    ("/v1/chat/completions", STREAM, "stop"),
    ("/v1/messages", ANTHROPIC_STREAM, "end_turn"),
])
def test_replayed_stream_is_byte_identical_with_the_same_chunks(store, upstream, proxies, path, body, finish):
    rec = record(store, upstream, proxies)
    recorded = chunked_frames(rec.port, dict(body, x_events=8, x_pause_ms=15), path)
    assert rec.stop() == 0 and "0 errors" in rec.output
    upstream.stop()
    with Store.open(store, write=False) as s:
        (ex,) = list(s.exchanges())
    assert [n for _, n in ex.response["chunks"]] == [len(d) for _, d in recorded]
    assert ex.finish_reason == finish and ex.error is None and ex.response["partial"] is False
    rep = replay(store, proxies)
    replayed = chunked_frames(rep.port, dict(body, x_events=8, x_pause_ms=15), path)
    assert [d for _, d in replayed] == [d for _, d in recorded]
    assert len(recorded) >= 10  # 8 deltas and the closing events, each its own chunk
    assert rep.stop() == 0


def test_chunk_times_are_recorded_only_with_record_timing(store, upstream, proxies):
    """Without --record-timing the log keeps each chunk's size and no time (an offset of None);
    with it, each chunk's offset from the start, growing with the upstream's pauses."""
    body = dict(STREAM, x_events=4, x_pause_ms=40)
    plain = record(store, upstream, proxies, "--session", "plain")
    chunked_frames(plain.port, body)
    assert plain.stop() == 0
    timed = record(store, upstream, proxies, "--session", "timed", "--record-timing")
    frames = chunked_frames(timed.port, body)
    assert timed.stop() == 0
    with Store.open(store, write=False) as s:
        by_session = {ex.session: ex.response["chunks"] for ex in s.exchanges()}
    sizes = [len(d) for _, d in frames]
    assert by_session["plain"] == [[None, n] for n in sizes]
    offsets = [t for t, _ in by_session["timed"]]
    assert [n for _, n in by_session["timed"]] == sizes
    assert all(isinstance(t, float) for t in offsets) and offsets == sorted(offsets)
    assert offsets[-1] - offsets[0] >= 4 * 40  # five 40 ms pauses between the six events (timers round)


def test_a_replayed_stream_is_sent_by_the_proxy_itself_never_upstream(store, upstream, proxies):
    """Strict replay answers a stream without any connection: the upstream, still up, sees no
    request; a request not recorded gets the miss answer and the run fails (3)."""
    rec = record(store, upstream, proxies)
    recorded = chunked_frames(rec.port, dict(STREAM, x_events=6, x_pause_ms=5))
    assert rec.stop() == 0
    asked = len(upstream.requests)
    rep = replay(store, proxies, "--strict", "--replay-log-in-store")
    replayed = chunked_frames(rep.port, dict(STREAM, x_events=6, x_pause_ms=5))
    assert [d for _, d in replayed] == [d for _, d in recorded]
    r = loopback.post(rep.url + "/v1/chat/completions", json=dict(STREAM, x_events=7), timeout=10)
    assert r.status_code == 404 and r.headers["x-nf-replay"] == "miss"
    assert rep.stop() == 3
    assert len(upstream.requests) == asked
    with Store.open(store, write=False) as s:
        results = [ex.replay_result for ex in s.exchanges() if ex.mode == "replay"]
    assert sorted(results) == ["hit", "miss"] and len(recorded) >= 8  # 6 deltas and the closing events


def test_a_replayed_streams_head_leaves_with_its_first_chunk(store, upstream, proxies):
    """The head and the first chunk reach a client waiting in recv() in one piece (as a provider's
    server sends them), not the head alone with the chunk a scheduling delay behind."""
    rec = record(store, upstream, proxies)
    body = dict(STREAM, x_events=30, x_pause_ms=0)
    chunked_frames(rec.port, body)
    rec.stop()
    rep = replay(store, proxies, "--allow-reuse")
    payload = json.dumps(body).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
    with socket.create_connection(("127.0.0.1", rep.port), timeout=10) as sock:
        for _ in range(8):
            sock.sendall(request)
            first = sock.recv(1 << 20)  # blocked before the answer exists: woken by its first segment
            assert first.startswith(b"HTTP/1.1 200") and b"\r\n\r\n" in first
            assert b"data: " in first.split(b"\r\n\r\n", 1)[1], first
            rest = first
            deadline = time.monotonic() + 10
            while not rest.endswith(b"\r\n0\r\n\r\n") and time.monotonic() < deadline:
                rest += sock.recv(1 << 20)
    assert rep.stop() == 0


def test_sdk_streams_that_hang_up_after_the_closing_event_are_complete(store, upstream, proxies):
    """openai-python closes the connection once it has read [DONE]: that stream is whole, not an error."""
    rec = record(store, upstream, proxies)
    oa = openai.OpenAI(base_url=rec.url + "/v1", api_key="sk-test", max_retries=0)
    for i in range(6):
        stream = oa.chat.completions.create(model="gpt-4o-mini", stream=True,
                                            messages=[{"role": "user", "content": f"hi {i}"}])
        assert "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
    assert rec.stop() == 0 and "0 errors" in rec.output
    with Store.open(store, write=False) as s:
        exchanges = list(s.exchanges())
    assert len(exchanges) == 6
    assert all(ex.error is None and ex.response["partial"] is False for ex in exchanges)


def test_replay_timing_recorded_reproduces_the_gaps(store, upstream, proxies):
    rec = record(store, upstream, proxies, "--record-timing")
    body = dict(STREAM, x_events=4, x_pause_ms=150)
    chunked_frames(rec.port, body)
    rec.stop()
    fast = replay(store, proxies)
    quick = chunked_frames(fast.port, body)
    fast.stop()
    timed = replay(store, proxies, "--replay-timing", "recorded")
    slow = chunked_frames(timed.port, body)
    gaps = [b - a for (a, _), (b, _) in zip(slow, slow[1:])]
    assert [d for _, d in slow] == [d for _, d in quick]
    assert quick[-1][0] < 0.4
    assert slow[0][0] < 0.4  # the first chunk is not held behind the rest
    assert slow[-1][0] > 0.6
    assert sum(0.1 < g < 0.3 for g in gaps) >= 4, gaps
    assert timed.stop() == 0


def test_a_stream_recorded_without_times_is_replayed_at_once_when_timing_is_asked(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    body = dict(STREAM, x_events=4, x_pause_ms=150)
    recorded = chunked_frames(rec.port, body)
    rec.stop()
    timed = replay(store, proxies, "--replay-timing", "recorded")
    got = chunked_frames(timed.port, body)
    assert [d for _, d in got] == [d for _, d in recorded]
    assert got[-1][0] < 0.4
    assert timed.stop() == 0
    assert "recorded without --record-timing is replayed at once" in timed.output


def test_a_client_that_leaves_a_timed_replay_early_leaves_the_proxy_serving(store, upstream, proxies):
    """A client hangs up after the first chunk of a stream paced over seconds: the proxy drops that
    stream and answers the next request at once."""
    rec = record(store, upstream, proxies, "--record-timing")
    body = dict(STREAM, x_events=6, x_pause_ms=400)
    chunked_frames(rec.port, body)
    plain = {"model": "m", "messages": []}
    assert loopback.post(rec.url + "/v1/chat/completions", json=plain, timeout=10).status_code == 200
    rec.stop()
    rep = replay(store, proxies, "--replay-timing", "recorded", "--allow-reuse")
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", rep.port), timeout=10)
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    got = b""
    deadline = time.monotonic() + 10
    while b"data:" not in got and time.monotonic() < deadline:
        got += sock.recv(4096)
    sock.close()
    assert b" 200 " in got and b"data:" in got
    start = time.monotonic()
    r = loopback.post(rep.url + "/v1/chat/completions", json=plain, timeout=10)
    assert r.status_code == 200 and time.monotonic() - start < 2
    again = chunked_frames(rep.port, body)
    assert len(again) >= 8 and again[-1][0] > 1.5  # paced again, from the start
    assert rep.stop() == 0


def test_sdks_stream_through_record_and_replay_with_usage_in_the_log(store, upstream, proxies):
    rec = record(store, upstream, proxies)

    def run(url: str) -> tuple[str, str]:
        oa = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        text = "".join(
            (c.choices[0].delta.content or "") if c.choices else ""
            for c in oa.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                                stream=True, stream_options={"include_usage": True})
        )
        an = anthropic.Anthropic(base_url=url, api_key="sk-ant", max_retries=0)
        with an.messages.stream(model="claude-3-5-haiku", max_tokens=32,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
            atext = "".join(stream.text_stream)
        return text, atext

    recorded = run(rec.url)
    rec.stop()
    upstream.stop()
    assert recorded[0].startswith("tok0-1") and recorded[1].startswith("part0-2")
    with Store.open(store, write=False) as s:
        oa_ex, an_ex = list(s.exchanges())
    assert oa_ex.usage == {"input": 11, "output": 5} and oa_ex.finish_reason == "stop"
    assert (an_ex.model, an_ex.usage, an_ex.finish_reason) == ("claude-3-5-haiku", {"input": 7, "output": 5}, "end_turn")
    rep = replay(store, proxies)
    assert run(rep.url) == recorded
    assert rep.stop() == 0


def test_stalled_upstream_is_cut_and_logged_as_partial_error(store, upstream, proxies):
    rec = record(store, upstream, proxies, "--stream-timeout", "1")
    start = time.monotonic()
    with pytest.raises(httpx.HTTPError):
        with loopback.client(timeout=15) as client:
            with client.stream("POST", rec.url + "/v1/chat/completions", json=dict(STREAM, x_stall=True)) as r:
                for _ in r.iter_raw():
                    pass
    assert time.monotonic() - start < 10
    # the proxy keeps serving
    ok = loopback.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    assert ok.status_code == 200
    rec.stop()
    with Store.open(store, write=False) as s:
        stalled = next(s.exchanges())
    assert "stalled" in stalled.error
    assert stalled.response["partial"] is True and len(stalled.response["chunks"]) == 2


def _errors(store: Path) -> int:
    with Store.open(store, write=False) as s:
        return sum(ex.error is not None for ex in s.exchanges())


def test_client_disconnect_mid_stream_leaves_a_marked_partial_exchange(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    payload = json.dumps(dict(STREAM, x_events=20, x_pause_ms=100)).encode()
    sock = socket.create_connection(("127.0.0.1", rec.port), timeout=10)
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    got = b""
    deadline = time.monotonic() + 10
    while b"data:" not in got and time.monotonic() < deadline:  # the first event has come through
        got += sock.recv(4096)
    assert b"200" in got and b"data:" in got
    sock.close()
    wait_until(lambda: _errors(store) == 1, "the proxy recorded the cut-off stream")
    ok = loopback.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    assert ok.status_code == 200
    rec.stop()
    with Store.open(store, write=False) as s:
        broken = next(s.exchanges())
    assert broken.error and broken.response["partial"] is True
    assert 1 <= len(broken.response["chunks"]) < 22


# A stdlib agent: what the wrap form must give it is the SDKs' variable (OPENAI_BASE_URL), which
# the real SDKs are shown to follow elsewhere; importing one in each of the four runs cost more
# CPU than the proxies did.
AGENT = textwrap.dedent(
    """
    import json, os, sys, urllib.error, urllib.request
    prompt = sys.argv[1]
    body = {"model": "gpt-4o-mini", "temperature": 0.7, "messages": [{"role": "user", "content": prompt}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", method="POST",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json",
                                          "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        r = json.load(urllib.request.urlopen(req, timeout=20))
    except urllib.error.HTTPError as exc:
        print("agent error:", exc.code, exc.headers.get("x-nf-replay"))
        sys.exit(0 if "--swallow" in sys.argv else 1)
    print("ANSWER", r["choices"][0]["message"]["content"])
    """
)


def wrapped(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={"OPENAI_API_KEY": "sk-wrapped", "PATH": "/usr/bin:/bin"})


def test_wrapped_agent_records_then_replays_and_a_changed_prompt_fails(tmp_path, upstream):
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    store = str(tmp_path / "log.lmdb")
    py = sys.executable
    r = wrapped("--mode", "record", "--upstream", upstream.url, "--store", store, "--listen", "127.0.0.1:0",
                "--condition", "live", "--", py, str(agent), "add two numbers", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ANSWER answer number 1" in r.stdout
    upstream.stop()
    r = wrapped("--mode", "replay", "--replay-log-in-store", "--store", store, "--listen", "127.0.0.1:0", "--", py, str(agent),
                "add two numbers", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "ANSWER answer number 1" in r.stdout
    # the upstream is down and nothing is sent to it: the first line draws no arrow to a live host
    assert f"for {upstream.url} (answered from the store, nothing sent there)" in r.stderr
    assert f"-> {upstream.url}" not in r.stderr
    r = wrapped("--mode", "replay", "--replay-log-in-store", "--store", store, "--listen", "127.0.0.1:0", "--", py, str(agent),
                "add three numbers", cwd=tmp_path)
    assert r.returncode == exit_codes.WRAPPED_FAILED, r.stderr  # the agent's own 1 is not "a case regressed"
    assert "agent error: 404 miss" in r.stdout and "replay miss" in r.stderr
    assert f"exited 1; nfproxy exits {exit_codes.WRAPPED_FAILED}" in r.stderr
    r = wrapped("--mode", "replay", "--replay-log-in-store", "--store", store, "--listen", "127.0.0.1:0", "--", py, str(agent),
                "add three numbers", "--swallow", cwd=tmp_path)
    assert r.returncode == 3, "a strict replay with a miss fails even when the agent exits 0"
    with Store.open(Path(store), write=False) as s:
        sessions = {ex.session for ex in s.exchanges()}
    assert len(sessions) == 4  # each wrapped run is its own session


GEMINI_AGENT = textwrap.dedent(
    """
    import json, os, urllib.request
    # what the google-genai SDK sends: POST {GOOGLE_GEMINI_BASE_URL}/v1beta/models/M:generateContent
    base = os.environ["GOOGLE_GEMINI_BASE_URL"].rstrip("/")
    req = urllib.request.Request(base + "/v1beta/models/gemini-2.0-flash:generateContent", method="POST",
                                 data=json.dumps({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}).encode(),
                                 headers={"content-type": "application/json", "x-goog-api-key": os.environ["GEMINI_API_KEY"]})
    doc = json.load(urllib.request.urlopen(req, timeout=20))
    print("ANSWER", doc["candidates"][0]["content"]["parts"][0]["text"])
    """
)


def test_wrapped_gemini_agent_finds_the_proxy_through_its_sdk_variable(tmp_path, upstream):
    agent = tmp_path / "gemini_agent.py"
    agent.write_text(GEMINI_AGENT)
    store = str(tmp_path / "log.lmdb")
    env = {"GEMINI_API_KEY": "AIza-wrapped-secret-key", "PATH": "/usr/bin:/bin"}
    run = [*nfproxy_argv(), "--store", store, "--listen", "127.0.0.1:0"]
    r = subprocess.run([*run, "--mode", "record", "--upstream", upstream.url, "--", sys.executable, str(agent)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "ANSWER gemini answer 1" in r.stdout
    sent = {k.lower(): v for k, v in upstream.requests[0].headers.items()}
    assert sent["x-goog-api-key"] == env["GEMINI_API_KEY"]  # forwarded, never stored (below)
    upstream.stop()
    r = subprocess.run([*run, "--mode", "replay", "--", sys.executable, str(agent)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "ANSWER gemini answer 1" in r.stdout
    with Store.open(Path(store), write=False) as s:
        recorded = next(ex for ex in s.exchanges() if ex.mode == "record")
        assert (recorded.model, recorded.usage, recorded.finish_reason) == ("gemini-2.0-flash", {"input": 6, "output": 3},
                                                                           "STOP")
        assert env["GEMINI_API_KEY"] not in json.dumps(recorded.to_json())


def test_set_override_reaches_upstream_and_is_part_of_the_key(store, upstream, proxies):
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "x"}], "temperature": 0.7}
    rec = record(store, upstream, proxies, "--set", "/temperature=0", "--set", "/seed=7")
    assert loopback.post(rec.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
    rec.stop()
    sent = json.loads(upstream.requests[-1].body)
    assert (sent["temperature"], sent["seed"]) == (0, 7)
    with Store.open(store, write=False) as s:
        ex = next(s.exchanges())
    assert ex.overrides == {"/temperature": 0, "/seed": 7}
    plain = replay(store, proxies)
    assert loopback.post(plain.url + "/v1/chat/completions", json=body, timeout=10).status_code == 404
    plain.stop()
    same = replay(store, proxies, "--set", "/temperature=0", "--set", "/seed=7")
    assert loopback.post(same.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200
    assert same.stop() == 0


def test_https_forward_proxy_records_two_hosts_and_replays_offline(tmp_path, proxies):
    ca_bundle, server_ctx = make_server_cert(tmp_path)
    up = FakeUpstream(ssl_context=server_ctx).start()
    store = tmp_path / "log.lmdb"
    confdir = tmp_path / "ca"
    try:
        rec = start_nfproxy("--mode", "record", "--store", str(store), "--confdir", str(confdir),
                            "--upstream-ca", str(ca_bundle))
        proxies.append(rec)
        nf_ca = confdir / "mitmproxy-ca-cert.pem"
        answers = {}
        for host in ("localhost", "127.0.0.1"):
            with httpx.Client(proxy=rec.url, verify=ssl.create_default_context(cafile=nf_ca), timeout=20) as client:
                r = client.post(f"https://{host}:{up.port}/v1/chat/completions",
                                json={"model": "m", "messages": [{"role": "user", "content": host}]})
            assert r.status_code == 200
            answers[host] = r.content
        # a client that does not trust the nfproxy CA fails the TLS handshake
        with pytest.raises(httpx.ConnectError):
            httpx.post(f"https://localhost:{up.port}/v1/chat/completions", json={}, proxy=rec.url, timeout=10)
        rec.stop()
        assert "nfproxy ca" in rec.output
    finally:
        up.stop()
    rep = start_nfproxy("--mode", "replay", "--store", str(store), "--confdir", str(confdir))
    proxies.append(rep)
    for host, expected in answers.items():
        with httpx.Client(proxy=rep.url, verify=ssl.create_default_context(cafile=confdir / "mitmproxy-ca-cert.pem"),
                          timeout=20) as client:
            r = client.post(f"https://{host}:{up.port}/v1/chat/completions",
                            json={"model": "m", "messages": [{"role": "user", "content": host}]})
        assert r.content == expected
    assert rep.stop() == 0


def test_ca_command_prints_the_environment(tmp_path):
    r = subprocess.run([*nfproxy_argv(), "ca", "--confdir", str(tmp_path / "ca")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    pem = tmp_path / "ca" / "mitmproxy-ca-cert.pem"
    assert pem.read_text().startswith("-----BEGIN CERTIFICATE-----")
    for var in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS"):
        assert f"export {var}={pem.resolve()}" in r.stdout
    assert "export HTTPS_PROXY=http://127.0.0.1:8080" in r.stdout


def test_websocket_upgrade_is_refused_loudly_in_replay(store, upstream, proxies):
    rec = record(store, upstream, proxies)
    loopback.post(rec.url + "/v1/chat/completions", json={"model": "m", "messages": []}, timeout=10)
    rec.stop()
    rep = replay(store, proxies, "--replay-log-in-store")
    r = loopback.get(rep.url + "/v1/realtime", headers={"Upgrade": "websocket", "Connection": "Upgrade",
                                                      "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                                                      "Sec-WebSocket-Version": "13"}, timeout=10)
    assert r.status_code == 501 and "cannot replay WebSocket" in r.text
    assert rep.stop() == 3
    with Store.open(store, write=False) as s:  # the refusal is in the log, as every miss is
        refused = [ex for ex in s.exchanges() if ex.mode == "replay"]
    assert [(ex.replay_result, ex.replay["detail"]) for ex in refused] == [("miss", "websocket upgrade refused")]


GENAI_SDK_AGENT = textwrap.dedent(
    """
    from google import genai
    client = genai.Client()  # GEMINI_API_KEY and GOOGLE_GEMINI_BASE_URL from the environment nfproxy sets
    r = client.models.generate_content(model="gemini-2.0-flash", contents="hi")
    print("ANSWER", r.text)
    """
)


def test_the_google_genai_sdk_unchanged_through_the_wrap_form(tmp_path, upstream):
    pytest.importorskip("google.genai", reason="google-genai is in the test extra")
    agent = tmp_path / "genai_agent.py"
    agent.write_text(GENAI_SDK_AGENT)
    store = str(tmp_path / "log.lmdb")
    env = {"GEMINI_API_KEY": "AIza-genai-sdk-secret-key", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = [*nfproxy_argv(), "--store", store, "--listen", "127.0.0.1:0"]
    r = subprocess.run([*run, "--mode", "record", "--upstream", upstream.url, "--", sys.executable, str(agent)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ANSWER gemini answer 1" in r.stdout
    upstream.stop()
    r = subprocess.run([*run, "--mode", "replay", "--strict", "--", sys.executable, str(agent)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ANSWER gemini answer 1" in r.stdout and "1 hits, 0 misses" in r.stderr
    with Store.open(Path(store), write=False) as s:
        assert not any(b"AIza-genai" in body for body in s.bodies.all())
        assert all("AIza-genai" not in json.dumps(ex.request) for ex in s.exchanges())


def test_the_wrap_form_listens_on_a_free_port_by_default(tmp_path, upstream):
    """No --listen with a command to wrap: a free port, told to the command, so a busy 8080 (another
    proxy, a dev server) is no reason to refuse."""
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 8080))
        held.listen()
    except OSError:
        pass  # busy already: the same situation
    try:
        agent = tmp_path / "agent.py"
        agent.write_text(AGENT)
        r = wrapped("--mode", "record", "--upstream", upstream.url, "--store", str(tmp_path / "log.lmdb"), "--",
                    sys.executable, str(agent), "add two numbers", cwd=tmp_path)
    finally:
        held.close()
    assert r.returncode == 0, r.stderr
    assert "ANSWER answer number 1" in r.stdout and ":8080" not in r.stderr
