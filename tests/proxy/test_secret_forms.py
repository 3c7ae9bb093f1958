"""Secrets in every form and every place (issue 24, item 1), with real processes: a hostile
upstream on loopback that echoes what it was sent (whole, in part, escaped, in response headers,
in its status line), clients sending keys in every form; then every LMDB value (decompressed),
`nfproxy show`, `nfproxy log --json` and every line the proxies printed are scanned for each
secret's spellings and for every run of 20 of its characters."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import subprocess
import threading
from urllib.parse import quote, quote_plus

import httpx
import pytest

from noisefloor.proxy.request import erasure, secrets
from tests import loopback
from tests.conftest import ROOT, nfproxy_argv, start_nfproxy
from tests.secret_scan import every_value

BEARER = "sk-proj-PLANTEDbearerKEY0123456789abcdefghijklmnopqrstuvwx"
QUERY = "AIzaPLANTEDqueryKEY0123456789abcdefghij"
PASSWORD = "PLANTEDbasicPASSWORD0123456789xyz"
DIGEST = "6629fae49393a05397450978507c4ef1PLANTED"
FORM = "sk-formFIELDplanted0123456789abcdefgh"
PLANTED = (BEARER, QUERY, PASSWORD, DIGEST, FORM)


def spellings(secret: str) -> set[bytes]:
    out = {secret, quote(secret, safe=""), quote_plus(secret), json.dumps(secret)[1:-1],
           "".join(f"\\u{ord(c):04x}" for c in secret)}
    return {s.encode() for s in out}


def leaks(data: bytes) -> list[str]:
    """Each planted secret some spelling or some 20-character run of which `data` holds."""
    found = []
    for s in PLANTED:
        runs = {s[i:i + erasure.RUN].encode() for i in range(len(s) - erasure.RUN + 1)}
        if any(f in data for f in spellings(s)) or any(r in data for r in runs):
            found.append(s)
    return found


class HostileUpstream:
    """A raw HTTP/1.1 server on loopback: it answers what the path asks for, echoing secrets."""

    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HostileUpstream:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = next((int(v) for k, _, v in (x.partition(":") for x in lines[1:])
                           if k.lower() == "content-length"), 0)
            body = await reader.readexactly(length) if length else b""
            writer.write(self._answer(path, head + body))
            await writer.drain()
        finally:
            writer.close()

    @staticmethod
    def _sent(raw: bytes) -> list[str]:
        """The planted secrets this request carried, however it spelled them."""
        text = raw.decode("latin-1")
        for word in text.replace("\r\n", " ").split(" "):
            try:
                text += " " + base64.b64decode(word, validate=True).decode("latin-1")
            except ValueError:
                pass
        text += " " + json.loads(json.dumps(text).replace("\\\\u", "\\u"))
        return [s for s in PLANTED if s in text or quote(s, safe="") in text]

    @classmethod
    def _answer(cls, path: str, raw: bytes) -> bytes:
        sent = cls._sent(raw)
        if path.startswith("/status-line"):  # an invalid status line carrying the key
            return f"HTTP/1.1 2x0 bad key {' '.join(sent)}\r\n\r\n".encode()
        extra = "".join(f"X-Echo-Token-{i}: {s}\r\nLocation: https://elsewhere.example/next?key={s}&k2={s}\r\n"
                        for i, s in enumerate(sent))
        echoes = []
        for s in sent:  # two thirds, \u-escaped, and whole
            echoes += [s[: 2 * len(s) // 3], "".join(f"\\u{ord(c):04x}" for c in s), s]
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "x"}}]})[:-1].encode()
        body += b', "echo": "' + " ".join(echoes).encode() + b'"}'
        return (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}"
                "connection: close\r\n\r\n").encode() + body


def _nfproxy(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*nfproxy_argv(), *args], capture_output=True, timeout=120)


CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}


def _requests(base: str) -> list[httpx.Response]:
    auth = {"authorization": f"Bearer {BEARER}"}
    out = []
    with loopback.client(timeout=20) as c:
        body = json.dumps({**CHAT, "note": BEARER}, ensure_ascii=True)
        body = body.replace(BEARER[:4], "".join(f"\\u{ord(ch):04x}" for ch in BEARER[:4]))  # \u-escaped in part
        out.append(c.post(base + "/v1/chat/completions", content=body.encode(),
                          headers={**auth, "content-type": "application/json", "x-unnamed": BEARER}))
        out.append(c.post(base + f"/headers?key={QUERY}&other={QUERY}", json=CHAT, headers=auth))
        basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
        out.append(c.post(base + "/v1/chat/completions?basic=1", json=CHAT, headers={"authorization": f"Basic {basic}"}))
        digest = (f'Digest username="bob", realm="api", nonce="abcdef0123456789", uri="/v1/chat/completions", '
                  f'response="{DIGEST}", cnonce="0a4f113b"')
        out.append(c.post(base + "/v1/chat/completions?digest=1", json=CHAT, headers={"authorization": digest}))
        multipart = (f'--nfb\r\nContent-Disposition: form-data; name="api_key"\r\n\r\n{FORM}\r\n'
                     f'--nfb\r\nContent-Disposition: form-data; name="file"; filename="{BEARER}.txt"; '
                     f"filename*=UTF-8''{quote(BEARER, safe='')}.txt\r\n\r\nfile content\r\n--nfb--\r\n")
        out.append(c.post(base + "/upload", headers={**auth, "content-type": "multipart/form-data; boundary=nfb"},
                          content=multipart.encode()))
        out.append(c.post(base + "/status-line", json=CHAT, headers=auth))
    return out


@pytest.mark.slow
def test_no_secret_form_and_no_20_character_run_is_stored_or_printed(tmp_path, proxies):
    store = tmp_path / "s.lmdb"
    with HostileUpstream() as up:
        rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", f"http://127.0.0.1:{up.port}")
        proxies.append(rec)
        answers = _requests(rec.url)
        assert [r.status_code for r in answers[:5]] == [200] * 5, [r.text[:200] for r in answers]
        assert answers[5].status_code == 502  # the broken status line: an error exchange
        # the upstream did echo each secret to the client (the proxy erases only what it keeps)
        assert sorted(leaks(b"".join(r.content + str(r.headers).encode() for r in answers))) == sorted(PLANTED)
        assert rec.stop() == 0
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store), "--replay-log-in-store")
    proxies.append(rep)
    replayed = _requests(rep.url)
    assert [r.status_code for r in replayed] == [200] * 5 + [502], [r.text[:300] for r in replayed]
    assert BEARER not in replayed[5].text  # the recorded error, replayed as the 502 body
    with loopback.client(timeout=20) as c:  # a miss: its answer quotes the asked request in a diff
        miss = c.post(rep.url + "/v1/chat/completions", json={**CHAT, "note": f"the key {BEARER} again"},
                      headers={"authorization": f"Bearer {BEARER}"})
    assert miss.status_code == 404 and "nearest" in miss.text
    assert leaks(miss.content) == []
    assert rep.stop() == 3
    stored = every_value(store)
    assert b"[redacted]" in stored
    assert leaks(stored) == []
    assert leaks(rec.output.encode()) == [] and leaks(rep.output.encode()) == []
    listing = _nfproxy("log", "--json", "--store", str(store))
    assert listing.returncode == 0 and listing.stdout.count(b"\n") >= 13
    assert leaks(listing.stdout + listing.stderr) == []
    for exchange_id in (1, 2, 5, 6, 13):  # echoed body, echoed headers, multipart, status line, the miss
        shown = _nfproxy("show", str(exchange_id), "--store", str(store))
        assert shown.returncode == 0, shown.stderr
        assert leaks(shown.stdout + shown.stderr) == [], exchange_id


def test_the_rule_in_isolation_runs_escapes_and_the_limit():
    values = secrets.secret_values("https://h/p?key=" + QUERY, [("authorization", f"Bearer {BEARER}")])
    assert secrets.erase(f"x {BEARER[5:25]} y".encode(), values) == b"x [redacted] y"  # a 20-run
    assert secrets.erase(f"x {BEARER[5:24]} y".encode(), values) == f"x {BEARER[5:24]} y".encode()  # 19: the limit
    mixed = BEARER[:3] + "".join(f"\\u{ord(c):04x}" for c in BEARER[3:9]) + BEARER[9:30]
    assert secrets.erase(f'"{mixed}"'.encode(), values) == b'"[redacted]"'
    assert secrets.erase("%2F".join([QUERY[:10], QUERY[10:]]).encode(), values) != QUERY.encode()
    pct = "".join(f"%{ord(c):02X}" for c in QUERY)
    assert secrets.erase(f"filename*=UTF-8''{pct}.txt".encode(), values) == b"filename*=UTF-8''[redacted].txt"
    assert secrets.erase_text(f"status line {BEARER}", values) == "status line [redacted]"
    # a stream: the run split across events is erased from the text they assemble to
    events = "".join(f'data: {json.dumps({"d": BEARER[i:i + 7]})}\n\n' for i in range(0, 28, 7)).encode()
    cleaned = secrets.erase_events(events, values)
    assert cleaned is not None and BEARER[:7].encode() not in cleaned


def test_runs_inside_a_long_base64_stretch_are_found_exactly():
    """The vectorized search of long stretches (a base64 image) finds every run of 20 or more and
    nothing shorter, wherever it lies, the stretch's first and last bytes included."""
    import random

    rng = random.Random(7)
    values = secrets.secret_values("https://h/p", [("authorization", f"Bearer {BEARER}")])
    blob = base64.urlsafe_b64encode(bytes(rng.getrandbits(8) for _ in range(30_000)))
    for _ in range(200):
        n = rng.randint(15, len(BEARER))
        start = rng.randint(0, len(BEARER) - n)
        at = rng.choice([0, len(blob), rng.randint(0, len(blob))])
        data = blob[:at] + BEARER[start:start + n].encode() + blob[at:]
        hit = [(a, b) for a, b in erasure.spans(data, values) if a < at + n and at < b]
        if n >= erasure.RUN:
            assert hit and hit[0][0] <= at and at + n <= hit[0][1], (n, start, at)
        else:
            assert not hit, (n, start, at)


def _spelled(name: str) -> tuple[bytes, bytes]:
    """A body holding BEARER spelled as docs/secrets.md's row `name` says, and what it becomes."""
    k = BEARER
    if name == "raw":
        return f'{{"echo": "{k}"}}'.encode(), b'{"echo": "[redacted]"}'
    if name == "url":
        return f"next?to={k[:3]}%{ord(k[3]):02X}{k[4:]}&x=1".encode(), b"next?to=[redacted]&x=1"
    if name == "json":  # SLASHED's "/" written as JSON may write it
        return b'{"echo": "' + SLASHED.replace("/", "\\/").encode() + b'"}', b'{"echo": "[redacted]"}'
    if name == "unicode-escape":
        return ('"' + k[:2] + "".join(f"\\u{ord(c):04x}" for c in k[2:9]) + k[9:] + '"').encode(), b'"[redacted]"'
    if name in ("base64", "base64url"):
        enc = base64.b64encode if name == "base64" else base64.urlsafe_b64encode
        blob = enc(b"prefix\xfb\xff" + k.encode() + b"suffix\xfb\xff")
        return blob, b"[redacted]"  # checked below: the key's characters are gone from the blob
    if name == "split across chunks":
        events = "".join(f'data: {json.dumps({"id": "c-1", "model": "m", "choices": [{"delta": {"content": k[i:i + 3]}}]})}\n\n'
                         for i in range(0, len(k), 3))
        return events.encode(), b"[redacted]"
    if name == "partial echo":
        return f"...{k[10:31]}...".encode(), b"...[redacted]..."
    if name == "content-encoding":
        return gzip.compress(f'{{"echo": "{k}"}}'.encode()), b'{"echo": "[redacted]"}'
    raise AssertionError(name)


SLASHED = "sk-with/slash+plus0123456789abcdefgh"
SPELLINGS = ("raw", "url", "json", "unicode-escape", "base64", "base64url", "split across chunks", "partial echo",
             "content-encoding")


def test_the_docs_list_exactly_the_spellings_tested():
    doc = (ROOT / "docs" / "secrets.md").read_text()
    table = doc.split("| spelling |")[1].split("\n\n")[0]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert tuple(rows) == SPELLINGS


@pytest.mark.parametrize("name", SPELLINGS)
def test_each_spelling_is_erased(name):
    """One row of docs/secrets.md each, through the path a recorded answer takes (`without`)."""
    from noisefloor.proxy.providers import PROVIDERS
    from noisefloor.proxy.request.traffic import ResponseData

    values = secrets.secret_values("https://h/p", [("authorization", f"Bearer {BEARER}"), ("api-key", SLASHED)])
    body, expected = _spelled(name)
    headers = (("content-type", "text/event-stream" if name == "split across chunks" else "application/json"),)
    if name == "content-encoding":
        headers += (("content-encoding", "gzip"),)
    layout = ((0.0, len(body)),) if name == "split across chunks" else None
    stored = ResponseData(200, headers, body, layout).without(values, PROVIDERS["openai"]).raw_body
    if name.startswith("base64"):
        dec = base64.b64decode if name == "base64" else base64.urlsafe_b64decode
        assert b"[redacted]" in stored and BEARER[2:12].encode() not in dec(stored.replace(b"[redacted]", b"")[:16])
        assert not any(f.encode() in stored for f in secrets._base64_forms(BEARER.encode()))
    elif name == "split across chunks":
        text = "".join(json.loads(line[6:])["choices"][0]["delta"]["content"]
                       for line in stored.split(b"\n") if line.startswith(b"data: "))
        assert text == "[redacted]"
    else:
        assert stored == expected


def test_a_key_split_across_plain_text_events_is_erased():
    """Server-sent events whose data is text, not JSON (an API nfproxy has no module for): the
    generic provider assembles the text events' data, so a key spread over them is found."""
    values = secrets.secret_values("https://h/p", [("authorization", f"Bearer {BEARER}")])
    text = f"the key {BEARER} ends here"
    body = "".join(f"event: token\r\ndata: {text[i:i + 4]}\r\n\r\n" for i in range(0, len(text), 4)).encode()
    erased = secrets.erase_events(body, values, None, "text/event-stream")
    assert erased is not None and BEARER[:8].encode() not in erased
    data = [line[6:].rstrip("\r") for line in erased.decode().split("\n") if line.startswith("data: ")]
    assert "".join(data) == "the key [redacted] ends here"


def test_aws_frames_with_a_text_payload_or_unreadable_keep_no_key():
    """Bedrock's event-stream frames: a payload that is not JSON is erased as text and framed
    again; frames that cannot be read at all lose the key all the same (their framing second)."""
    import struct
    import zlib

    from noisefloor.proxy.providers import PROVIDERS
    from noisefloor.proxy.request.traffic import ResponseData

    def frame(payload: bytes) -> bytes:
        prelude = struct.pack(">II", 16 + len(payload), 0)
        prelude += struct.pack(">I", zlib.crc32(prelude))
        return prelude + payload + struct.pack(">I", zlib.crc32(prelude + payload))

    values = secrets.secret_values("https://h/p", [("x-amz-security-token", BEARER)])
    kind = (("content-type", "application/vnd.amazon.eventstream"),)
    body = frame(f"plain text {BEARER} echoed".encode()) + frame(b'{"delta": {"text": "ok"}}')
    stored = ResponseData(200, kind, body, ((0.0, len(body)),)).without(values, PROVIDERS["bedrock"]).raw_body
    total = struct.unpack_from(">I", stored)[0]
    assert stored[12:total - 4] == b"plain text [redacted] echoed"
    assert zlib.crc32(stored[:total - 4]) == struct.unpack_from(">I", stored, total - 4)[0]
    broken = body[:-3]  # the last frame cut short: no frame is read
    stored = ResponseData(200, kind, broken, ((0.0, len(broken)),)).without(values, PROVIDERS["bedrock"]).raw_body
    assert BEARER[:20].encode() not in stored and b"[redacted]" in stored


def test_a_key_written_as_a_header_name_is_erased_in_both_directions():
    """A header's name is written by the client (request) or the upstream (response) as freely
    as its value."""
    from noisefloor.proxy.request.traffic import RequestData, ResponseData

    values = secrets.secret_values("https://h/p", [("authorization", f"Bearer {BEARER}")])
    request = RequestData("POST", "https://h/p", "h", "/p", (("authorization", f"Bearer {BEARER}"),
                                                              (f"x-{BEARER}", "1")), b"")
    assert BEARER[:20] not in json.dumps(request.record())
    response = ResponseData(200, ((f"x-echo-{BEARER}", "1"), ("content-type", "text/plain")), b"ok").without(values)
    assert BEARER[:20] not in json.dumps(response.record()) and "[redacted]" in json.dumps(response.record())


def test_a_stream_with_odd_event_fields_is_still_searched():
    """A hostile upstream's events whose choice index is a list (unhashable): the texts are found
    by path instead, and the key erased; the recorder never fails on them."""
    from noisefloor.proxy.providers import PROVIDERS

    values = secrets.secret_values("https://h/p", [("authorization", f"Bearer {BEARER}")])
    body = "".join(f'data: {json.dumps({"choices": [{"index": [1], "delta": {"content": BEARER[i:i + 5]}}]})}\n\n'
                   for i in range(0, len(BEARER), 5)).encode()
    erased = secrets.erase_events(body, values, PROVIDERS["openai"], "text/event-stream")
    assert erased is not None and b"[redacted]" in erased and BEARER[:10].encode() not in erased


def test_a_stream_echoing_the_key_at_every_turn_is_erased_in_linear_work(monkeypatch):
    """An upstream echoing the key in 3-character deltas hundreds of times: every echo erased, and
    each event's cut visits only the spans reaching into it (not all of them for every event, which
    made a 20 MB stream take minutes to record)."""
    key = "sk-proj-Q7ZX4KW9MB2RT6VN8HJ3PL5CD1FG0YSA9EU7IO4TZ"
    echoes = 400
    text = ("say " + key + " again ") * echoes
    events = [{"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": text[i:i + 3]}}]}
              for i in range(0, len(text), 3)]
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    visits = [0]

    class Counted(list):  # the spans erase_events walks, counting each one it looks at
        def __iter__(self):  # type: ignore[no-untyped-def]
            for item in super().__iter__():
                visits[0] += 1
                yield item

        def __getitem__(self, k):  # type: ignore[no-untyped-def]
            visits[0] += 1
            return super().__getitem__(k)

    real = erasure.spans
    monkeypatch.setattr(erasure, "spans", lambda *a, **kw: Counted(real(*a, **kw)))
    out = secrets.erase_events(body, [key])
    assert out is not None
    assembled = "".join(json.loads(line[6:])["choices"][0]["delta"]["content"]
                        for line in out.split(b"\n\n") if line.startswith(b"data: {"))
    assert key[:12] not in assembled and assembled.count(secrets.REDACTED) == echoes
    assert assembled.replace(secrets.REDACTED, key) == text
    assert visits[0] <= 4 * (len(events) + echoes), visits[0]  # linear, not len(events) * echoes
