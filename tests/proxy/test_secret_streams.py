"""A key echoed in a streamed answer, split into 3-character deltas with the ids, object and model
strings every real event carries between them, through a real nfproxy and a real aiohttp upstream
on loopback, for every provider module's stream: OpenAI chat (content and tool-call arguments),
Mistral (the same module, forced with --profile), the Responses API, Anthropic (text and
tool-input deltas), Gemini (SSE and the JSON array), Bedrock (ConverseStream and InvokeModel's
stream, AWS event-stream frames, the latter Anthropic events in base64). The assembled texts
carry the key raw, as base64 and base64url at another offset, and as a 25-character partial
echo; the requests carry it in labels (x-nf-session, x-nf-task, x-nf-condition) too. Nothing of
it may be in the store (every LMDB value, each stored stream's assembled texts), in `nfproxy
show`, `log --json`, the HAR and JSONL exports or nfview's API."""

from __future__ import annotations

import base64
import json
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from noisefloor.proxy.request import erasure
from noisefloor.proxy.store.log import Store
from tests import loopback
from tests.conftest import nfproxy_argv, start_nfproxy
from tests.fake_upstream import FakeUpstream
from tests.secret_scan import every_value

KEY = "sk-proj-Q7ZX4KW9MB2RT6VN8HJ3PL5CD1FG0YSA9EU7IO4TZ"
B64_AT_1 = base64.b64encode(b"x" + KEY.encode()).decode()  # the key one byte into a base64 text
URL_AT_2 = base64.urlsafe_b64encode(b"xy" + KEY.encode()).decode()
ECHO = f"Your key is {KEY}; as base64 {B64_AT_1}; as base64url {URL_AT_2}; in part {KEY[7:32]}; done."
TOOL_ARGS = json.dumps({"api_key": KEY, "note": "echoed"})
PIECES = [ECHO[i:i + 3] for i in range(0, len(ECHO), 3)]
ARG_PIECES = [TOOL_ARGS[i:i + 3] for i in range(0, len(TOOL_ARGS), 3)]


def forbidden() -> list[bytes]:
    """Every 20-character run of the key and of its base64 / base64url spellings at each offset."""
    spelled = {KEY}
    for shift in range(3):
        enc = base64.b64encode(bytes(shift) + KEY.encode()).decode()[3:-3]
        spelled |= {enc, enc.replace("+", "-").replace("/", "_")}
    return sorted({s[i:i + erasure.RUN].encode() for s in spelled for i in range(len(s) - erasure.RUN + 1)})


def leaked(data: bytes) -> list[bytes]:
    return [r for r in forbidden() if r in data]


# -- the upstream: each provider's stream framing -----------------------------------------------


def _sse(events: list[dict[str, Any]], named: bool = False) -> bytes:
    return b"".join((f"event: {e['type']}\n" if named else "").encode() + b"data: " + json.dumps(e).encode() + b"\n\n"
                    for e in events)


def openai_chat(tools: bool) -> bytes:
    head = {"id": "chatcmpl-9x8Yz", "object": "chat.completion.chunk", "created": 1733000000, "model": "gpt-4o-mini",
            "system_fingerprint": "fp_0123"}
    if tools:
        events = [{**head, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "save", "arguments": ""}}]}}]}]
        events += [{**head, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}}]}
                   for p in ARG_PIECES]
    else:
        events = [{**head, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in PIECES]
    return _sse(events) + b"data: [DONE]\n\n"


def responses() -> bytes:
    events = [{"type": "response.created", "response": {"id": "resp_1", "model": "gpt-4o", "status": "in_progress"}}]
    events += [{"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0,
                "sequence_number": n, "delta": p} for n, p in enumerate(PIECES)]
    events += [{"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1,
                "sequence_number": 900 + n, "delta": p} for n, p in enumerate(ARG_PIECES)]
    events.append({"type": "response.completed", "response": {"id": "resp_1", "model": "gpt-4o", "status": "completed",
                                                              "output": [{"type": "message", "role": "assistant",
                                                                          "content": [{"type": "output_text",
                                                                                       "text": ECHO}]}]}})
    return _sse(events, named=True)


def anthropic_events() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {"id": "msg_01ab", "model": "claude-x",
                                                                          "usage": {"input_tokens": 3}}},
                                    {"type": "content_block_start", "index": 0, "content_block": {"type": "text",
                                                                                                  "text": ""}}]
    events += [{"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}} for p in PIECES]
    events += [{"type": "content_block_stop", "index": 0},
               {"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "save", "input": {}}}]
    events += [{"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": p}}
               for p in ARG_PIECES]
    return events + [{"type": "content_block_stop", "index": 1},
                     {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
                     {"type": "message_stop"}]


def gemini_events() -> list[dict[str, Any]]:
    return [{"candidates": [{"content": {"parts": [{"text": p}], "role": "model"}, "index": 0}],
             "modelVersion": "gemini-2.0-flash", "responseId": "resp-gx"} for p in PIECES]


def aws_frame(event_type: str, payload: dict[str, Any]) -> bytes:
    name, value = b":event-type", event_type.encode()
    headers = bytes([len(name)]) + name + b"\x07" + struct.pack(">H", len(value)) + value
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 16 + len(headers) + len(body), len(headers))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    message = prelude + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


def converse_stream() -> bytes:
    frames = [aws_frame("messageStart", {"role": "assistant", "p": "abcd"})]
    frames += [aws_frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}, "p": "abcdefgh"})
               for p in PIECES]
    frames += [aws_frame("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"toolUse": {"input": p}}, "p": "ab"})
               for p in ARG_PIECES]
    return b"".join(frames + [aws_frame("messageStop", {"stopReason": "end_turn", "p": "a"})])


def invoke_stream() -> bytes:
    return b"".join(aws_frame("chunk", {"bytes": base64.b64encode(json.dumps(e).encode()).decode(), "p": "abc"})
                    for e in anthropic_events())


@dataclass
class StreamingUpstream(FakeUpstream):
    """The tests' loopback upstream, answering each provider's streaming route in pieces."""

    def _routes(self, app: web.Application) -> None:
        app.router.add_route("POST", "/{tail:.*}", self._answer)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        path = request.path
        kind = "text/event-stream"
        if path.endswith("/chat/completions"):
            body = openai_chat(tools=bool(doc.get("tools")))
        elif path.endswith("/responses"):
            body = responses()
        elif path.endswith("/messages"):
            body = _sse(anthropic_events(), named=True)
        elif ":streamGenerateContent" in path:
            if request.query.get("alt") == "sse":
                body = _sse(gemini_events())
            else:
                body, kind = ("[" + ",\r\n".join(json.dumps(e) for e in gemini_events()) + "]").encode(), \
                    "application/json"
        elif path.endswith("/converse-stream"):
            body, kind = converse_stream(), "application/vnd.amazon.eventstream"
        else:
            body, kind = invoke_stream(), "application/vnd.amazon.eventstream"
        resp = web.StreamResponse(headers={"content-type": kind})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for i in range(0, len(body), 97):  # pieces that cut events apart, as a network does
            await resp.write(body[i:i + 97])
        await resp.write_eof()
        return resp


# -- the client ----------------------------------------------------------------------------------

LABELS = {"x-nf-session": f"s-{KEY}", "x-nf-task": f"task {KEY[:30]}", "x-nf-condition": f"c/{KEY}"}
CHAT = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "echo my key"}]}
TOOL = {"type": "function", "function": {"name": "save", "parameters": {"type": "object"}}}
CALLS = [  # path, body, credential header
    ("/v1/chat/completions", CHAT, {"authorization": f"Bearer {KEY}"}),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL]}, {"authorization": f"Bearer {KEY}"}),
    ("/v1/responses", {"model": "gpt-4o", "stream": True, "input": "echo"}, {"authorization": f"Bearer {KEY}"}),
    ("/v1/messages", {"model": "claude-x", "stream": True, "max_tokens": 50,
                      "messages": [{"role": "user", "content": "echo"}]}, {"x-api-key": KEY}),
    ("/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
     {"contents": [{"role": "user", "parts": [{"text": "echo"}]}]}, {"x-goog-api-key": KEY}),
    ("/v1beta/models/gemini-2.0-flash:streamGenerateContent",
     {"contents": [{"role": "user", "parts": [{"text": "echo again"}]}]}, {"x-goog-api-key": KEY}),
    ("/model/anthropic.claude-x/converse-stream", {"messages": [{"role": "user", "content": [{"text": "echo"}]}]},
     {"authorization": f"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20250101/us-east-1/bedrock/aws4_request, "
                       f"SignedHeaders=host, Signature={KEY}"}),
    ("/model/anthropic.claude-x/invoke-with-response-stream",
     {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50, "messages": [{"role": "user", "content": "echo"}]},
     {"x-amz-security-token": KEY}),
]


def _send(base: str, calls: list[tuple[str, dict[str, Any], dict[str, str]]]) -> list[bytes]:
    out = []
    with loopback.client(timeout=30) as c:
        for path, body, creds in calls:
            r = c.post(base + path, json=body, headers={**creds, **LABELS})
            assert r.status_code == 200, r.text[:300]
            out.append(r.content)
    return out


# -- reading stored streams back, independently of nfproxy's own reader --------------------------

TEXT_FIELDS = ("content", "text", "arguments", "partial_json", "delta", "input")


def _events(body: bytes) -> list[Any]:
    if body[:1] == b"[":
        return json.loads(body)
    if b"data:" not in body[:64]:  # AWS frames; a chunk's payload is an event in base64
        out, pos = [], 0
        while pos < len(body):
            total, head = struct.unpack_from(">II", body, pos)
            assert zlib.crc32(body[pos:pos + total - 4]) == struct.unpack_from(">I", body, pos + total - 4)[0]
            doc = json.loads(body[pos + 12 + head:pos + total - 4])
            out.append(json.loads(base64.b64decode(doc["bytes"])) if "bytes" in doc else doc)
            pos += total
        return out
    return [json.loads(line[5:]) for line in body.split(b"\n") if line.startswith(b"data: {")]


def _texts(doc: Any, field: str | None, into: dict[str, list[str]]) -> None:
    if isinstance(doc, str) and field in TEXT_FIELDS:
        into.setdefault(field, []).append(doc)
    elif isinstance(doc, dict):
        for k, v in doc.items():
            _texts(v, k, into)
    elif isinstance(doc, list):
        for v in doc:
            _texts(v, field, into)


def assembled(body: bytes) -> dict[str, str]:
    """Each text field's strings across a stream's events, joined in order."""
    into: dict[str, list[str]] = {}
    for ev in _events(body):
        _texts(ev, None, into)
    return {k: "".join(v) for k, v in into.items()}


def pieces_left(text: str) -> list[str]:
    """The key's own 3-character deltas still written as a JSON string in `text` (a view)."""
    inner = [p for p in PIECES + ARG_PIECES if p in KEY and len(p) == 3 and p.isalnum()]
    return [p for p in inner if f'"{p}"' in text or f'\\"{p}\\"' in text]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[bytes]]]:
    where = tmp_path_factory.mktemp("streams")
    store, mistral = where / "s.lmdb", where / "m.lmdb"
    up = StreamingUpstream().start()
    try:
        url = up.url
        rec = start_nfproxy("--mode", "record", "--store", str(store), "--upstream", url)
        try:
            got = _send(rec.url, CALLS)
        finally:
            assert rec.stop() == 0, rec.output
        rec = start_nfproxy("--mode", "record", "--store", str(mistral), "--upstream", url, "--profile", "mistral")
        try:
            got += _send(rec.url, CALLS[:2])
        finally:
            assert rec.stop() == 0, rec.output
    finally:
        up.stop()
    assert KEY.encode() in got[0] or KEY[:3].encode() in got[0]  # the client got the answer as sent
    yield store, mistral, got


def _nfproxy(*args: str) -> bytes:
    r = subprocess.run([*nfproxy_argv(), *args], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


@pytest.mark.slow
def test_no_stream_of_any_provider_keeps_an_echoed_key(recorded):
    store, mistral, _ = recorded
    for path in (store, mistral):
        assert leaked(every_value(path)) == []
        with Store.open(path, write=False) as s:
            exchanges = list(s.exchanges())
            assert len(exchanges) == (len(CALLS) if path == store else 2)
            for ex in exchanges:
                body = s.bodies.decoded(ex.response)
                texts = assembled(body)
                assert texts and all("[redacted]" in t for k, t in texts.items() if k != "delta" or t), (ex.url, texts)
                for name, text in texts.items():
                    assert KEY[:12] not in text and leaked(text.encode()) == [], (ex.request["url"], name, text)
                assert "done." in "".join(texts.values()) or "echoed" in texts.get("arguments", "")  # the rest kept
                labels = json.dumps([ex.session, ex.task, ex.condition])
                assert KEY[:20] not in labels and "[redacted]" in labels, labels


@pytest.mark.slow
def test_no_view_of_the_streams_or_labels_shows_the_key(recorded, tmp_path):
    store, _, _ = recorded
    views = {"log": _nfproxy("log", "--json", "--store", str(store))}
    for n in (1, 2, 4, 7):
        views[f"show {n}"] = _nfproxy("show", str(n), "--store", str(store))
    for fmt in ("har", "jsonl"):
        _nfproxy("export", str(store), "--format", fmt, "-o", str(tmp_path / f"x.{fmt}"))
        views[fmt] = (tmp_path / f"x.{fmt}").read_bytes()
    views |= _viewer_pages(store)
    for name, data in views.items():
        assert leaked(data) == [] and KEY[:12].encode() not in data, name
        assert pieces_left(data.decode("utf-8", "replace")) == [], name
        assert b"[redacted]" in data, name


def _viewer_pages(store: Path) -> dict[str, bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "noisefloor.viewer.cli", str(store), "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("nfview: http"), line
        url = line.split()[1].rstrip("/")
        pages = {"nfview sessions": loopback.get(url + "/api/sessions").content,
                 "nfview exchanges": loopback.get(url + "/api/exchanges").content}
        for n in range(1, len(CALLS) + 1):
            pages[f"nfview {n}"] = loopback.get(url + f"/api/exchange/{n}").content
        return pages
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_a_replay_keeps_the_key_in_labels_off_the_screen(recorded):
    """Strict replay of the recorded streams with the key in the labels, one hit and one miss: its
    summary names the replay sessions (followed, diverged, served nothing) with the key erased, and
    the session is one session, not one under its raw name and another under its erased one."""
    store, _, _ = recorded
    rep = start_nfproxy("--mode", "replay", "--strict", "--store", str(store))
    try:
        with loopback.client(timeout=30) as c:
            path, body, creds = CALLS[0]
            assert c.post(rep.url + path, json=body, headers={**creds, **LABELS}).status_code == 200
            miss = {**body, "messages": [{"role": "user", "content": "not recorded"}]}
            assert c.post(rep.url + path, json=miss, headers={**creds, **LABELS}).status_code != 200
    finally:
        rep.stop()
    assert leaked(rep.output.encode()) == [] and KEY[:12] not in rep.output, rep.output
    assert [line for line in rep.output.splitlines() if line.startswith("  replay session")] == [
        "  replay session 's-[redacted]' followed recorded session 's-[redacted]' (1 answer)"], rep.output
